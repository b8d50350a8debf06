"""Channel and CommunicationLedger: every message is recorded (round, sender, names, shapes, bytes)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, List, Optional, Tuple

from .messages import SERVER, Message


@dataclass(frozen=True)
class LedgerEntry:
    """One recorded message.

    ``purpose`` is ``"train"`` for the algorithm's rounds, ``"final"`` for the exchanges that build the
    returned model, and ``"evaluate"`` for exchanges made only to monitor test metrics during training.
    """

    round: int
    phase: str
    purpose: str
    sender: str
    receiver: str
    names: Tuple[str, ...]
    shapes: Tuple[Tuple[int, ...], ...]
    dtypes: Tuple[str, ...]
    nbytes: int

    @property
    def direction(self) -> str:
        """``"up"`` for client → server, ``"down"`` for server → client."""
        return "down" if self.sender == SERVER else "up"


@functools.lru_cache(maxsize=None)
def _dtype_name(dtype: Any) -> str:
    """``str(dtype)``, once per dtype (numpy formats it anew on every call, twice per message of a round)."""
    return str(dtype)


class CommunicationLedger:
    """The audit of everything that crossed a channel.

    :param keep_payloads: also keep the messages themselves (for privacy tests); off by default because
        payloads can be large.
    """

    def __init__(self, keep_payloads: bool = False) -> None:
        self.keep_payloads = keep_payloads
        self._entries: List[LedgerEntry] = []
        self._messages: List[Message] = []
        self._bytes = {"up": 0, "down": 0}  # running totals, so per-round accounting stays O(1)

    def _append(self, entry: LedgerEntry) -> None:
        self._entries.append(entry)
        self._bytes[entry.direction] += entry.nbytes

    def record(self, message: Message, receiver: str, purpose: str) -> None:
        names = tuple(message.arrays)
        self._append(
            LedgerEntry(
                round=message.round,
                phase=message.phase,
                purpose=purpose,
                sender=message.sender,
                receiver=receiver,
                names=names,
                shapes=tuple(message.arrays[n].shape for n in names),
                dtypes=tuple(_dtype_name(message.arrays[n].dtype) for n in names),
                nbytes=message.nbytes,
            )
        )
        if self.keep_payloads:
            self._messages.append(message)

    def extend(self, entries: Iterable[LedgerEntry]) -> None:
        """Append entries recorded earlier (used when a run resumes from a checkpoint)."""
        for entry in entries:
            self._append(entry)

    @property
    def entries(self) -> Tuple[LedgerEntry, ...]:
        return tuple(self._entries)

    @property
    def messages(self) -> Tuple[Message, ...]:
        """The kept messages (empty unless ``keep_payloads=True``)."""
        return tuple(self._messages)

    def __iter__(self) -> Iterator[LedgerEntry]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def select(
        self,
        *,
        direction: Optional[str] = None,
        sender: Optional[str] = None,
        round: Optional[int] = None,
        phase: Optional[str] = None,
        purpose: Optional[str] = None,
    ) -> List[LedgerEntry]:
        """Entries matching every given filter."""
        if direction not in (None, "up", "down"):
            raise ValueError(f"direction must be 'up', 'down' or None, got {direction!r}")
        return [
            e
            for e in self._entries
            if (direction is None or e.direction == direction)
            and (sender is None or e.sender == sender)
            and (round is None or e.round == round)
            and (phase is None or e.phase == phase)
            and (purpose is None or e.purpose == purpose)
        ]

    def total_bytes(self, **filters: Any) -> int:
        """Total bytes of the entries matching ``filters`` (same keywords as :meth:`select`)."""
        if set(filters) <= {"direction"} and filters.get("direction") in (None, "up", "down"):
            direction = filters.get("direction")
            return sum(self._bytes.values()) if direction is None else self._bytes[direction]
        return sum(e.nbytes for e in self.select(**filters))


class Channel:
    """Records every message in a ledger before delivering it (the message object itself: it is immutable)."""

    def __init__(self, ledger: CommunicationLedger) -> None:
        self.ledger = ledger

    def send(self, message: Message, receiver: str, purpose: str) -> Message:
        """Record ``message`` to ``receiver`` under ``purpose`` (see :class:`LedgerEntry`) and return it."""
        self.ledger.record(message, receiver, purpose)
        return message
