"""The one seam between the round loop and a runtime: how one phase's messages travel, and nothing else.

A runtime is a :class:`Transport`. For each phase the round loop hands it a :class:`Broadcast` and the
phase's cohort; :meth:`Transport.exchange` delivers the broadcast and returns each client's :class:`Reply`.
Everything after that (the ledger, fault screening, secure aggregation, differential privacy, the reduction)
is :meth:`~gpflow_fed.federated.aggregator.Aggregator.aggregate`'s, written once for every runtime. Only a
phase the aggregator protects needs a second trip, :meth:`Transport.masked`: once the cohort is fixed, each
client sends its prepared message masked against that cohort (or the transport runs its own secure
summation, such as Flower's SecAgg+, and returns a :class:`SecureSum`).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from .messages import Message

if TYPE_CHECKING:
    from .aggregator import ExchangeContext

__all__ = ["Broadcast", "Reply", "SecureSum", "Transport"]


@dataclass(frozen=True)
class Broadcast:
    """What the server sends in one phase, and what a transport needs to deliver it.

    :param message: the server's message (sender ``SERVER``, the round, the phase, ``Algorithm.broadcast``).
    :param purpose: ``"train"``, ``"evaluate"`` or ``"final"`` (see :class:`~gpflow_fed.federated.LedgerEntry`).
    :param aggregation: the phase's ``Algorithm.aggregation``.
    :param protected: whether the aggregator protects the phase: clients then prepare their replies (clip,
        fixed point) and send them only masked, in :meth:`Transport.masked`.
    :param state: the server state the broadcast was made from (an in-process client is set up from it).
    """

    message: Message
    purpose: str
    aggregation: str
    protected: bool
    state: Any = None

    @property
    def round(self) -> int:
        return self.message.round

    @property
    def phase(self) -> str:
        return self.message.phase


@dataclass(frozen=True)
class Reply:
    """One client's reply to a :class:`Broadcast`, as it reached the server.

    :param message: the client's :class:`~gpflow_fed.federated.Message`; in a protected phase only its layout
        counts (array names and shapes: the server checks them before anyone masks). None if there is none.
    :param fault: why the reply is unusable (the client raised, timed out, answered malformed), or None.
    :param error: the exception behind ``fault``, for ``ClientUpdateError``'s cause.
    :param prepared: in a protected phase, the client's prepared message, which stays with the client until
        :meth:`Transport.masked` (in-process transports only).
    """

    message: Optional[Message] = None
    fault: Optional[str] = None
    error: Optional[BaseException] = field(default=None, compare=False)
    prepared: Optional[Message] = None


@dataclass(frozen=True)
class SecureSum:
    """What a transport's own secure summation returns instead of masked messages.

    :param sums: ``Σ_k y_k mod 2^64`` per array name, over ``survivors`` (see ``Aggregator.finish``).
    :param survivors: the cohort members whose masks were removed, in cohort order.
    :param dropped: ``{client: reason}`` of the cohort members that dropped out during the protocol.
    """

    sums: Mapping[str, np.ndarray]
    survivors: Tuple[str, ...]
    dropped: Mapping[str, str]


class Transport(abc.ABC):
    """How one phase's messages travel between the server and the clients (see the module docstring)."""

    @abc.abstractmethod
    def exchange(self, broadcast: Broadcast, cohort: Sequence[str]) -> Dict[str, Reply]:
        """Deliver ``broadcast`` to every client of ``cohort`` and return ``{client: reply}`` for each."""

    def masked(self, context: "ExchangeContext", replies: Mapping[str, Reply]) -> Union[Dict[str, Message], SecureSum]:
        """A protected phase's second trip: the cohort's messages masked against ``context.cohort``.

        :param replies: the cohort's replies from :meth:`exchange`.
        :raises NotImplementedError: a transport that cannot carry protected phases.
        """
        raise NotImplementedError(f"{type(self).__name__} carries no secure aggregation or differential privacy")
