"""Channel and CommunicationLedger: every message is recorded (round, sender, names, shapes, bytes)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

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


#: what a :class:`LedgerEntry` records of its message, all but its sender and receiver: ``(round, phase, purpose,
#: names, shapes, dtypes, nbytes)``; the messages of one exchange share one (interned) form
_Form = Tuple[int, str, str, Tuple[str, ...], Tuple[Tuple[int, ...], ...], Tuple[str, ...], int]
#: the broadcasts whose form the ledger keeps to reuse (a round's broadcasts; a longer run starts the cache anew)
_BROADCAST_CACHE = 16


def _form(message: Message, purpose: str) -> _Form:
    names = tuple(message.arrays)
    arrays = message.arrays
    return (
        message.round,
        message.phase,
        purpose,
        names,
        tuple(arrays[n].shape for n in names),
        tuple(_dtype_name(arrays[n].dtype) for n in names),
        message.nbytes,
    )


def _entry(form: _Form, sender: str, receiver: str) -> LedgerEntry:
    round, phase, purpose, names, shapes, dtypes, nbytes = form
    return LedgerEntry(round, phase, purpose, sender, receiver, names, shapes, dtypes, nbytes)


class CommunicationLedger:
    """The audit of everything that crossed a channel.

    :param keep_payloads: also keep the messages themselves (for privacy tests); off by default because
        payloads can be large.
    """

    def __init__(self, keep_payloads: bool = False) -> None:
        self.keep_payloads = keep_payloads
        # each recorded message as (its form, sender, receiver), in order: a broadcast to a cohort of K clients is
        # measured once and its K replies of one layout share one form (:data:`_Form`, interned), so a round records
        # small triples, not 2K entries with their own tuples (fewer objects for the garbage collector to traverse);
        # :attr:`entries` builds the LedgerEntry objects when read
        self._records: List[Tuple[_Form, str, str]] = []
        self._forms: Dict[_Form, _Form] = {}  # every distinct form, once
        self._broadcasts: Dict[Tuple[int, str], Tuple[Message, _Form]] = {}  # id(message), purpose -> its form
        self._messages: List[Message] = []
        self._bytes = {"up": 0, "down": 0}  # running totals, so per-round accounting stays O(1)

    def __getstate__(self) -> Dict[str, Any]:
        """A copy or pickle leaves out the cache of broadcasts (messages, whose read-only mappings do not pickle)."""
        state = dict(self.__dict__)
        state["_broadcasts"] = {}
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)

    def _intern(self, form: _Form) -> _Form:
        return self._forms.setdefault(form, form)

    def _append(self, form: _Form, sender: str, receiver: str) -> None:
        self._records.append((form, sender, receiver))
        self._bytes["down" if sender == SERVER else "up"] += form[6]

    def record(self, message: Message, receiver: str, purpose: str) -> None:
        """Record ``message`` sent to ``receiver`` under ``purpose`` (a :class:`LedgerEntry`; a message is immutable,
        so a broadcast sent to many clients is measured once)."""
        if message.sender == SERVER:
            key = (id(message), purpose)
            cached = self._broadcasts.get(key)
            if cached is None or cached[0] is not message:  # an id is only reused once its message is gone
                if len(self._broadcasts) >= _BROADCAST_CACHE:
                    self._broadcasts.clear()
                cached = self._broadcasts[key] = (message, self._intern(_form(message, purpose)))
            form = cached[1]
        else:
            form = self._intern(_form(message, purpose))
        self._append(form, message.sender, receiver)
        if self.keep_payloads:
            self._messages.append(message)

    def extend(self, entries: Iterable[LedgerEntry]) -> None:
        """Append entries recorded earlier (used when a run resumes from a checkpoint)."""
        for e in entries:
            form = self._intern((e.round, e.phase, e.purpose, e.names, e.shapes, e.dtypes, e.nbytes))
            self._append(form, e.sender, e.receiver)

    @property
    def entries(self) -> Tuple[LedgerEntry, ...]:
        return tuple(_entry(*record) for record in self._records)

    @property
    def messages(self) -> Tuple[Message, ...]:
        """The kept messages (empty unless ``keep_payloads=True``)."""
        return tuple(self._messages)

    def __iter__(self) -> Iterator[LedgerEntry]:
        return (_entry(*record) for record in self._records)

    def __len__(self) -> int:
        return len(self._records)

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
            _entry(form, who, receiver)
            for form, who, receiver in self._records
            if (direction is None or (who == SERVER) == (direction == "down"))
            and (sender is None or who == sender)
            and (round is None or form[0] == round)
            and (phase is None or form[1] == phase)
            and (purpose is None or form[2] == purpose)
        ]

    def total_bytes(self, **filters: Any) -> int:
        """Total bytes of the entries matching ``filters`` (same keywords as :meth:`select`)."""
        if set(filters) <= {"direction"} and filters.get("direction") in (None, "up", "down"):
            direction = filters.get("direction")
            return sum(self._bytes.values()) if direction is None else self._bytes[direction]
        return sum(e.nbytes for e in self.select(**filters))  # the selected entries' own sizes, so exact


class Channel:
    """Records every message in a ledger before delivering it (the message object itself: it is immutable)."""

    def __init__(self, ledger: CommunicationLedger) -> None:
        self.ledger = ledger

    def send(self, message: Message, receiver: str, purpose: str) -> Message:
        """Record ``message`` to ``receiver`` under ``purpose`` (see :class:`LedgerEntry`) and return it."""
        self.ledger.record(message, receiver, purpose)
        return message
