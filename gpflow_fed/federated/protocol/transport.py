"""The one seam between the phase owner and a runtime: requests go out, raw responses come back.

A runtime is a :class:`Transport`. The phase owner (:mod:`gpflow_fed.federated.engine.exchange`) hands it one stage of
an
exchange at a time — ``{client: Request}`` — and :meth:`Transport.send` returns each client's :class:`Response`, as
it arrived. A transport only moves messages: it does not record, screen, protect or reduce anything (the phase owner
does, once, for every runtime). Every stage has the same shape (request → response), so a multi-stage protected
exchange (key advertisement, masked input, unmasking) runs through the same owner on every runtime.

On the client's side every runtime hands the request to the party's
:class:`~gpflow_fed.federated.engine.endpoint.ClientEndpoint`, which answers it.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Dict, Mapping, Optional, Tuple

from .messages import Message

__all__ = ["PROTOCOL_STAGES", "Request", "Response", "SETUP_STAGES", "STAGES", "Transport", "UPDATE"]

#: the stage that asks a client for its update (``Algorithm.client_update``); protected exchanges add their own
UPDATE = "update"
#: the secure-aggregation protocol's set-up stages, made once per run (job)
SETUP_STAGES: Tuple[str, ...] = ("advertise", "share", "store")
#: the secure-aggregation protocol's stages (:mod:`~gpflow_fed.federated.protection.secagg`), in the order a run uses
#: them (``consistency`` only with a roster); the one definition both sides use
PROTOCOL_STAGES: Tuple[str, ...] = (*SETUP_STAGES, "masked_input", "consistency", "unmask")
#: every stage a client answers
STAGES: Tuple[str, ...] = (UPDATE, *PROTOCOL_STAGES)


@dataclass(frozen=True)
class Request:
    """What the server sends a client in one stage.

    :param stage: the stage (:data:`UPDATE`, or a protection stage).
    :param message: the server's message (sender ``SERVER``); for :data:`UPDATE`, ``Algorithm.broadcast``.
    :param purpose: ``"train"``, ``"evaluate"`` or ``"final"`` (the ledger's purposes).
    :param config: small public settings the stage needs (JSON-able values: the phase's aggregation, the server's
        protection request, the cohort, …).
    """

    stage: str
    message: Message
    purpose: str
    config: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "config", MappingProxyType(dict(self.config)))


@dataclass(frozen=True)
class Response:
    """One client's answer to a :class:`Request`, as it reached the server.

    :param message: what the client sent, or None (a fault, or a layout-only answer).
    :param fault: why there is no usable answer (the client raised, refused, timed out), or None.
    :param error: the exception behind ``fault``, for ``ClientUpdateError``'s cause (in-process runtimes).
    :param seconds: the client's own time for the stage, None when not timed (a client's first answer includes
        one-off tracing and set-up; remote runtimes cannot time it).
    :param layout: in a protected update, the names and shapes of the client's encoded payload (the payload
        itself stays with the client until it is masked).
    :param config: small public values that travel with ``message`` (JSON-able: a protocol message's structure).
    """

    message: Optional[Message] = None
    fault: Optional[str] = None
    error: Optional[BaseException] = field(default=None, compare=False)
    seconds: Optional[float] = None
    layout: Optional[Mapping[str, Tuple[int, ...]]] = None
    config: Mapping[str, Any] = field(default_factory=dict)


class Transport(abc.ABC):
    """How one stage's requests reach the clients and their responses come back (module docstring)."""

    #: what every request through this transport carries beside its :class:`Request` that a party's answer depends
    #: on (a Flower table run's job and agreed moments), as bytes: the server binds it into each protected request's
    #: view (:func:`~gpflow_fed.federated.protection.wire.request_view`), as each party binds what it received
    context: bytes = b""

    @abc.abstractmethod
    def send(self, requests: Mapping[str, Request]) -> Dict[str, Response]:
        """Deliver ``requests[client]`` to each client and return ``{client: Response}`` for every one of them
        (a client that does not answer gets a :class:`Response` with its ``fault``)."""
