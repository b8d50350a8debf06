"""One party's side of a run: it answers the server's requests, stage by stage, on every runtime.

A :class:`ClientEndpoint` holds what one party holds: its :class:`~gpflow_fed.federated.Client` (private data, model,
optimizer state), its copy of the run's algorithm, the :class:`~gpflow_fed.federated.FederationInfo`, and its
:class:`~gpflow_fed.federated.protection.encoder.ClientEncoder` (its own protection policy and keys). In-process
runtimes call :meth:`ClientEndpoint.handle` directly; the Flower ClientApp calls it for each Flower message. Whatever
happens on the client (its algorithm raises, its own policy refuses), the server gets a
:class:`~gpflow_fed.federated.protocol.transport.Response` with the reason, never an exception.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Optional, Union

import numpy as np

from ..protocol.algorithm import Algorithm, BroadcastRefused, FederationInfo
from ..protocol.client import Client
from ..protocol.domain import DataDomain
from ..protocol.faults import envelope_fault, value_fault, weight_fault
from ..protocol.messages import Message
from ..protection.encoder import (
    DATA_FAULT,
    UPDATE_FAULT,
    ClientEncoder,
    EncoderRefusal,
)
from ..protection.request import Protection
from ..protection.wire import broadcast_digest, pack, request_view, unpack
from ..protocol.transport import PROTOCOL_STAGES, UPDATE, Request, Response

__all__ = ["Admitted", "ClientEndpoint", "fault_response", "protocol_response"]

LOG = logging.getLogger(__name__)


class ClientEndpoint:
    """A party: its client, its copy of the algorithm and its encoder (module docstring).

    :param algorithm: the party's bound algorithm (``Algorithm.bind``).
    :param client: the party's :class:`Client`.
    :param info: the federation, as the server announced it.
    :param encoder: the party's :class:`ClientEncoder`.
    """

    def __init__(self, algorithm: Algorithm, client: Client, info: FederationInfo, encoder: ClientEncoder) -> None:
        self.algorithm = algorithm
        self.client = client
        self.info = info
        self.encoder = encoder
        #: what the runtime's requests carry beside the update that this party's answer depends on (its
        #: ``Transport.context``, e.g. a Flower table run's agreed moments), bound into each protected request's view
        self.context = b""
        encoder.sizes = info.client_sizes  # public, read only and shared (a copy per client would cost O(K²))
        self.ready = False
        self._timed: set = set()
        self._domain: Optional[DataDomain] = None

    @property
    def domain(self) -> DataDomain:
        """The party's :class:`~gpflow_fed.federated.protocol.domain.DataDomain`, from its own data (once)."""
        if self._domain is None:
            self._domain = DataDomain.of(*self.client.data)
        return self._domain

    def setup(self) -> None:
        """``Algorithm.setup_client`` once, before the client's first update (also on resume)."""
        if not self.ready:
            self.algorithm.setup_client(self.client, self.info)
            self.ready = True

    def handle(self, request: Request) -> Response:
        """The client's :class:`Response` to one request (a fault instead of an exception)."""
        try:
            if request.stage == UPDATE:
                return self._update(request)
            if request.stage in PROTOCOL_STAGES:
                return self._protocol(request)
            return Response(fault=f"unknown stage {request.stage!r}", error=ValueError(request.stage))
        except Exception as exc:  # noqa: BLE001 - every client-side failure becomes a fault the server screens
            return fault_response(exc)

    def _protocol(self, request: Request) -> Response:
        """One stage of the secure-aggregation protocol, answered by the encoder (:func:`protocol_response`)."""
        return protocol_response(self.encoder, self.client.id, request)

    def _small_alone(self, phase: str) -> str:
        """The small-cohort rule for a plain answer, where the client's payload is summed alone."""
        needed = self.algorithm.min_cohort_data(phase)
        if needed is None or not self.encoder.policy.protect_small_cohorts or self.client.num_data >= needed:
            return ""
        return (
            f"phase {phase!r}: this client's {self.client.num_data} points are fewer than the {needed} its payload "
            "needs not to determine them, and the server asked for it in plain; refused (its policy protects small "
            "cohorts)"
        )

    def _data_fault(self, detail: str, seconds: Optional[float], fault: str = DATA_FAULT) -> Response:
        """A protected update that raised, or a reply that failed the client's own checks: the details go to this
        party's log only, the server gets ``fault`` (:data:`~.protection.encoder.DATA_FAULT` or ``UPDATE_FAULT``,
        the same words whatever happened), and the encoder refuses the run's later protected exchanges."""
        LOG.warning("client %s: %s", self.client.id, detail)
        self.encoder.stop()
        return Response(fault=fault, error=ValueError(fault), seconds=seconds)

    def _update(self, request: Request) -> Response:
        admitted = self.admit(request)
        if isinstance(admitted, Response):
            return admitted
        started = time.perf_counter()
        try:
            outcome: Union[Message, Exception] = self.algorithm.client_update(self.client, admitted.broadcast)
        except Exception as exc:  # noqa: BLE001 - answered as the per-client rules say (answer)
            outcome = exc
        return self.answer(admitted, outcome, time.perf_counter() - started)

    def admit(self, request: Request) -> Union[Response, "Admitted"]:
        """The client's checks of an update request before any work on its data: its schedule and its own policy (both
        decided by its encoder, :meth:`ClientEncoder.refusal`), the claim of a protected exchange (once), then
        ``Algorithm.setup_client`` on first use.

        :return: the refusal to send, or what :meth:`answer` needs once the update is computed (by
            ``Algorithm.client_update``, or for a whole cohort by ``Algorithm.client_updates``).
        """
        algorithm, phase = self.algorithm, request.message.phase
        aggregation = algorithm.aggregation(phase)  # its own algorithm's, whatever the request says
        # a request without a protection entry asks for none (a "collect" phase); the client's encoder decides
        request_protection = Protection.from_config(request.config.get("protection", {"secure-aggregation": False}))
        refusal = self.encoder.refusal(request_protection, phase, aggregation, (algorithm, request))
        if refusal:  # its schedule or its own policy: nothing of its payload is sent
            return Response(fault=refusal, error=PermissionError(refusal))
        down = algorithm.read_broadcast(request.message)  # only what the phase reads reaches the update
        protected = request_protection.protects(down.phase, aggregation)
        claimed = protected and request_protection.secure is not None
        if claimed:  # once, before anything depends on the data
            self.encoder.claim(request.purpose, down.round, down.phase)
        self.setup()
        return Admitted(request, down, aggregation, request_protection, protected, claimed)

    def answer(self, admitted: "Admitted", outcome: Union[Message, Exception], elapsed: float) -> Response:
        """The client's response once its update is computed: ``outcome`` is the reply of ``Algorithm.client_update``
        or the exception it raised, ``elapsed`` the client's seconds for it. The envelope, the small-cohort rule of a
        plain answer, and on a protected phase its own value checks (under DP), its weight check and its encoding
        (its policy).

        :raises BroadcastRefused: the update refused the broadcast's form (sent as it is, by :meth:`handle`).
        :raises Exception: the update's error on an unprotected phase (sent as it is, by :meth:`handle`).
        """
        algorithm, config, down = self.algorithm, admitted.request.config, admitted.broadcast
        request_protection, aggregation = admitted.protection, admitted.aggregation
        if isinstance(outcome, BroadcastRefused):
            raise outcome  # the broadcast's form, not the data: its reason is sent
        if isinstance(outcome, Exception):  # on a protected phase an error may depend on the data
            if not admitted.claimed:
                raise outcome
            return self._data_fault(f"raised {type(outcome).__name__}: {outcome}", None, UPDATE_FAULT)
        reply = outcome
        first = down.phase not in self._timed
        self._timed.add(down.phase)
        seconds: Optional[float] = None if first else elapsed
        fault = envelope_fault(reply, self.client.id, down)  # what its algorithm returned, not its data
        if fault is not None:
            return Response(fault=fault, error=ValueError(fault), seconds=seconds)
        if not admitted.protected:
            small = self._small_alone(down.phase)
            if small:
                return Response(fault=small, error=PermissionError(small), seconds=seconds)
            return Response(message=reply, seconds=seconds)  # the server screens what it can read
        # under DP the client checks its own reply (once encoded, no one can); under secure aggregation alone its
        # encoding carries any value, NaN and ±inf included, clipped and counted (ClientEncoder): no value refuses
        fault = value_fault(reply) if request_protection.noised(down.phase, aggregation) else None
        if fault is not None:
            return self._data_fault(fault, seconds)
        size = self.client.num_data
        fault = weight_fault(reply, algorithm.expected_weight(down.phase, size), size)  # public sizes only
        if fault is not None:
            return Response(fault=fault, error=ValueError(fault), seconds=seconds)
        min_data = algorithm.min_cohort_data(down.phase)
        # the public bound of what a masked phase may encode, from the broadcast and the party's domain: nothing is
        # clipped beyond it, and a DP clip binds only under noise the party trusts (ClientEncoder.prepare)
        bound = algorithm.payload_bound(down, self.domain) if request_protection.secure is not None else None
        try:
            # keyed by what the phase computes, not its name (as the server's exchange keys its view)
            digest = broadcast_digest(down, computation=algorithm.computation(down.phase))
            cohort_size = int(config["cohort_size"])
            prepared = self.encoder.prepare(
                reply,
                request_protection,
                aggregation,
                cohort_size,
                admitted.request.purpose,
                min_data,
                broadcast=digest,
                view=request_view(digest, request_protection.to_config(), cohort_size, aggregation, self.context),
                bound=bound,
            )
        except EncoderRefusal as exc:  # a request the client refuses (not its data)
            return Response(fault=str(exc), error=exc, seconds=seconds)
        except ValueError as exc:  # a value its encoding cannot carry
            return self._data_fault(str(exc), seconds)
        if request_protection.secure is None:
            return Response(message=prepared, seconds=seconds)
        layout = {name: tuple(np.shape(value)) for name, value in prepared.arrays.items()}
        return Response(layout=layout, seconds=seconds)


@dataclass(frozen=True)
class Admitted:
    """An update request a client admitted (:meth:`ClientEndpoint.admit`), waiting for its update to be computed.

    :param request: the request.
    :param broadcast: the part of its broadcast the phase reads (``Algorithm.read_broadcast``).
    :param aggregation: the phase's aggregation, as the client's own algorithm has it.
    :param protection: the protection the request asks for.
    :param protected: the phase is protected (clipped, encoded).
    :param claimed: the exchange is masked and the client claimed it (an update's error then stops its protected
        answers for the run).
    """

    request: Request
    broadcast: Message
    aggregation: str
    protection: Protection
    protected: bool
    claimed: bool


def fault_response(exc: BaseException) -> Response:
    """The response of a client whose handling of a request raised ``exc`` (never an exception to the server)."""
    return Response(fault=f"raised {type(exc).__name__}: {exc}", error=exc)


def protocol_response(encoder: ClientEncoder, client_id: str, request: Request) -> Response:
    """Client ``client_id``'s answer to one stage of the secure-aggregation protocol, from its ``encoder`` alone (a
    refusal is a fault): what :meth:`ClientEndpoint.handle` sends for a protocol stage, and what a Flower ClientApp
    process sends without building its algorithm or reading its data (no TensorFlow)."""
    down = request.message
    try:
        answer = encoder.respond(request.stage, unpack(request.config.get("protocol"), down.arrays))
    except ValueError as refusal:  # the client's own rules: nothing is sent
        return Response(fault=str(refusal), error=refusal)
    structure, arrays = pack(answer)
    message = Message(client_id, down.round, down.phase, arrays, weight=0.0)
    return Response(message=message, config={"protocol": structure})
