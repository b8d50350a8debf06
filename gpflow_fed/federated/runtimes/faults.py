"""Client faults: a client that raises, times out, or answers with NaN or wrongly shaped payloads.

Under :class:`FaultPolicy` ``on_error="raise"`` (the default) the first fault stops the run with a
:class:`~gpflow_fed.federated.ClientUpdateError` naming the client; under ``"exclude"`` the faulty client is
left out of the round (and of the round's later phases), the reason is logged and recorded in the round's
history, and the round goes on if at least ``min_clients`` clients answered well.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from typing import Dict, Optional, Sequence

import numpy as np

from ..messages import Message

logger = logging.getLogger("gpflow_fed.federated")

ON_ERROR = ("raise", "exclude")


class RoundFailedError(RuntimeError):
    """Fewer than ``min_clients`` clients answered a phase well; the server state was not changed."""


@dataclass(frozen=True)
class FaultPolicy:
    """How a runtime treats faulty clients.

    :param on_error: ``"raise"`` stops at the first fault; ``"exclude"`` drops the client from the round.
    :param min_clients: the fewest good answers a phase needs (else :class:`RoundFailedError`).
    :param timeout: seconds a client may take for one update; a later answer is discarded as a time-out
        (an in-process client cannot be pre-empted, so its work is finished and then ignored).
    """

    on_error: str = "raise"
    min_clients: int = 1
    timeout: Optional[float] = None

    def __post_init__(self) -> None:
        if self.on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {self.on_error!r}")
        if isinstance(self.min_clients, bool) or not isinstance(self.min_clients, int) or self.min_clients < 1:
            raise ValueError(f"min_clients must be a positive integer, got {self.min_clients!r}")
        if self.timeout is not None and not (self.timeout > 0):
            raise ValueError(f"timeout must be positive seconds or None, got {self.timeout!r}")


def reply_fault(reply: object, client_id: str, broadcast: Message) -> Optional[str]:
    """Why a single reply is unusable (wrong type, sender, round or phase; non-finite values), or None."""
    if not isinstance(reply, Message):
        return f"returned {type(reply).__name__}, not a Message"
    if reply.sender != client_id:
        return f"reply claims sender {reply.sender!r}"
    if (reply.round, reply.phase) != (broadcast.round, broadcast.phase):
        return f"reply is for round {reply.round}, phase {reply.phase!r}"
    for name, array in reply.arrays.items():
        if np.issubdtype(array.dtype, np.number) and not np.all(np.isfinite(array)):
            return f"payload {name!r} has NaN or inf values"
    if not all(np.isfinite(v) for v in reply.metrics.values()):
        return "a metric is NaN or inf"
    return None


def shape_faults(replies: Sequence[Message]) -> Dict[str, str]:
    """Replies whose array names/shapes differ from the majority's, as ``{sender: reason}``."""
    signatures = {m.sender: tuple((n, m.arrays[n].shape) for n in m.arrays) for m in replies}
    if not signatures:
        return {}
    counts = Counter(signatures.values())
    best = max(counts.values())
    majority = next(sig for sig in signatures.values() if counts[sig] == best)  # ties: the first sender's
    expected = ", ".join(f"{n}{list(s)}" for n, s in majority)
    return {
        sender: f"payload shapes differ from the other clients' ({expected})"
        for sender, sig in signatures.items()
        if sig != majority
    }


def log_exclusions(round: int, phase: str, excluded: Dict[str, str]) -> None:
    for client_id, reason in excluded.items():
        logger.warning("round %d, phase %r: excluded %s: %s", round, phase, client_id, reason)

