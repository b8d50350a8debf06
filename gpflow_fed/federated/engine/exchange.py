"""The phase owner: one exchange of a round, end to end, the same on every runtime.

:meth:`PhaseOwner.run` is the only code that drives an exchange. For phase ``p`` of round ``r`` it

1. **broadcasts** ``Algorithm.broadcast(state, r, p)`` (refused if not finite) as an ``update`` request to the cohort;
2. **asks** the runtime's :class:`~gpflow_fed.federated.protocol.transport.Transport` to deliver it and collects the raw
   responses;
3. **records** every message that crossed in the ledger (the broadcast to each client, then its reply);
4. **screens** the responses and applies the fault policy, once (:func:`~gpflow_fed.federated.protocol.faults.screen`);
5. **protects**: in a phase the run's :class:`~gpflow_fed.federated.protection.request.Protection` covers, the
   clients prepared (clipped, encoded) their replies; under secure aggregation the owner fixes the cohort and runs
   the protocol of :mod:`~gpflow_fed.federated.protection.secagg` through the same transport (its setup once per
   run, then masked input and unmasking, with drop-out recovery), recording every stage;
6. **reduces** with the :class:`~gpflow_fed.federated.protection.reduction.Reducer` (plain, robust, or decode and
   noise the protected sum);
7. hands the aggregate to ``Algorithm.server_update``.

A runtime is only a transport; a protection lives in the client's encoder and the reducer; neither drives an exchange.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..protocol.algorithm import Aggregate, Algorithm, FederationInfo
from ..protocol.faults import ClientUpdateError, FaultPolicy, RoundFailedError, screen
from ..protocol.ledger import Channel, CommunicationLedger
from ..protocol.messages import SERVER, Message
from ..protection.reduction import ExchangeContext, Reducer
from ..protection.request import Protection
from ..protection.secagg import SecAggAborted, SecAggServer
from ..protection.wire import broadcast_digest, pack, request_view, unpack
from ..protocol.transport import UPDATE, Request, Transport

__all__ = ["PhaseOwner"]


@dataclass
class PhaseOwner:
    """Runs every exchange of a run (module docstring).

    :param algorithm: the run's bound algorithm.
    :param transport: the runtime's transport.
    :param reducer: the server's side of the protection request.
    :param channel: the ledger's channel.
    :param faults: the fault policy.
    :param info: the federation (registered client sizes).
    """

    algorithm: Algorithm
    transport: Transport
    reducer: Reducer
    channel: Channel
    faults: FaultPolicy
    info: FederationInfo
    _secagg: Optional[SecAggServer] = None
    _protocol_faults: Dict[str, str] = field(default_factory=dict)

    @property
    def ledger(self) -> CommunicationLedger:
        return self.channel.ledger

    def run(
        self, state: Any, round: int, phase: str, cohort: Sequence[str], purpose: str
    ) -> Tuple[Any, Aggregate, Dict[str, str]]:
        """One phase: broadcast, ask, record, screen, protect, reduce, ``Algorithm.server_update``.

        :return: the new state, the phase's aggregate and ``{client: reason}`` of the excluded clients.
        :raises FloatingPointError: a non-finite broadcast (nothing is sent).
        :raises ClientUpdateError: a faulty reply under ``FaultPolicy(on_error="raise")``.
        :raises RoundFailedError: too few good replies, or a cohort too small to mask.
        """
        algorithm = self.algorithm
        down = Message(SERVER, round, phase, self._broadcast(state, round, phase), weight=0.0)
        aggregation = algorithm.aggregation(phase)
        protection = self.reducer.protection
        protected = protection.protects(phase, aggregation)
        config: Dict[str, Any] = {"aggregation": aggregation, "cohort_size": len(cohort)}
        if aggregation != "collect":  # each client checks the request against its own policy
            config["protection"] = protection.to_config()
        request = Request(UPDATE, down, purpose, config)
        responses = self.transport.send({cid: request for cid in cohort})
        for cid in cohort:
            self.channel.send(down, cid, purpose)
            reply = responses[cid].message
            if reply is not None and (not protected or protection.secure is None):
                self.channel.send(reply, SERVER, purpose)
        readable_weights = not protected or protection.secure is None
        good, excluded = screen(
            self.faults,
            round,
            phase,
            cohort,
            responses,
            spec=algorithm.reply_spec(state, round, phase),
            expected_weight=self._expected_weights(phase, aggregation, cohort) if readable_weights else None,
            sizes=self.info.client_sizes,
            verify=lambda messages: algorithm.check_replies(
                state, phase, messages, [self.info.client_sizes[m.sender] for m in messages]
            ),
        )
        context = self.reducer.context(purpose, round, phase, aggregation, good)
        if protected and protection.secure is not None:
            # the request as the server sent it, bound into the masking as each client binds its own view
            sent = Protection.from_config(config["protection"]).to_config()
            read = algorithm.read_broadcast(down)  # what each client answers is keyed by what its phase reads
            digest = broadcast_digest(read, computation=algorithm.computation(phase))  # and computes (as it keys it)
            view = request_view(digest, sent, len(cohort), aggregation, self.transport.context)
            aggregate, dropped = self._masked_sum(context, responses[good[0]].layout or {}, view)
            excluded.update(dropped)
            reason = None if aggregate.noised else algorithm.check_sum(state, aggregate)
            if reason is not None:
                check = reason.replace("its ", "")
                raise RoundFailedError(
                    f"round {round}, phase {phase!r}: the masked sum fails the server's check ({check}): a client "
                    "sent impossible values, which secure aggregation does not let the server attribute"
                )
        else:
            aggregate = self.reducer.reduce([responses[cid].message for cid in good], context)  # type: ignore[misc]  # screened: a message
        return algorithm.server_update(state, aggregate), aggregate, excluded

    def _broadcast(self, state: Any, round: int, phase: str) -> Mapping[str, np.ndarray]:
        algorithm = self.algorithm
        arrays = algorithm.broadcast(state, round, phase)
        for name, value in arrays.items():
            value = np.asarray(value)
            if value.dtype.kind in "fc" and not np.all(np.isfinite(value)):
                raise FloatingPointError(
                    f"{algorithm.name}, round {round}, phase {phase!r}: the server's broadcast {name!r} is not "
                    "finite; the server state broke in the previous update (with differential privacy: the noised "
                    "sums were unusable, see the DifferentialPrivacy settings), so nothing is sent to the clients"
                )
        return arrays

    def _expected_weights(self, phase: str, aggregation: str, cohort: Sequence[str]) -> Dict[str, Any]:
        """The weight the server expects on each readable reply (capped under DP's ``weight_bound``)."""
        protection = self.reducer.protection
        expected = {}
        for cid in cohort:
            weight = self.algorithm.expected_weight(phase, self.info.client_sizes[cid])
            # noised with readable weights: central DP (distributed DP needs secure aggregation, weights unread)
            if weight is not None and aggregation == "mean" and protection.noised(phase, aggregation):
                weight = min(weight, protection.dp.weight_bound)  # type: ignore[union-attr]  # central DP (see above)
            expected[cid] = weight
        return expected

    # --- secure aggregation ------------------------------------------------------------------------------
    def _send(
        self, stage: str, requests: Mapping[str, Mapping[str, Any]], where: Tuple[int, str, str]
    ) -> Dict[str, Any]:
        """One protocol stage through the transport, recorded in the ledger: ``{client: answer or None}``."""
        round, phase, purpose = where
        packed: Dict[int, Tuple[Dict[str, Any], Dict[str, np.ndarray]]] = {}
        outgoing: Dict[str, Request] = {}
        for cid, message in requests.items():
            if id(message) not in packed:  # one request object for many clients (the roster) is packed once
                packed[id(message)] = pack(message)
            structure, arrays = packed[id(message)]
            down = Message(SERVER, round, f"{phase}/secagg/{stage}", arrays, weight=0.0)
            outgoing[cid] = Request(stage, down, purpose, {"protocol": structure})
        responses = self.transport.send(outgoing)
        answers: Dict[str, Any] = {}
        for cid, request in outgoing.items():
            self.channel.send(request.message, cid, purpose)
            response = responses[cid]
            answers[cid] = None
            if response.fault is None and response.message is not None:
                self.channel.send(response.message, SERVER, purpose)
                try:
                    answers[cid] = unpack(response.config.get("protocol"), response.message.arrays)
                except (ValueError, TypeError):
                    answers[cid] = None
            else:
                self._protocol_faults[cid] = response.fault or "sent nothing"
        return answers

    def _drive(self, stages: Any, where: Tuple[int, str, str]) -> Any:
        """Run a protocol generator (:mod:`~.protection.secagg`): each stage it yields goes out through the transport
        and its answers go back in; the owner drives, so the protocol never calls back into it."""
        try:
            stage, requests = next(stages)
            while True:
                stage, requests = stages.send(self._send(stage, requests, where))
        except StopIteration as done:
            return done.value

    def _secure_server(self, where: Tuple[int, str, str]) -> SecAggServer:
        """The run's secure-aggregation server, set up with every client on first use (keys and shares once per
        run)."""
        if self._secagg is None:
            secure = self.reducer.protection.secure
            assert secure is not None
            distributed = self.reducer.protection.distributed
            # under distributed DP the sum carries the target noise only with ≥ honest_clients survivors
            minimum = max(secure.min_cohort, distributed.honest_clients if distributed is not None else 2)
            # the share-holder graph has the run's masking degree: each client refuses one sparser than its own
            server = SecAggServer(self.reducer.run_id, degree=secure.degree, min_survivors=minimum)
            try:
                self._drive(server.setup_stages(self.info.client_ids), where)
            except SecAggAborted as exc:
                raise RoundFailedError(f"round {where[0]}, phase {where[1]!r}: {exc}") from None
            self._secagg = server
        return self._secagg

    def _masked_sum(
        self, context: ExchangeContext, layout: Mapping[str, Tuple[int, ...]], view: bytes = b""
    ) -> Tuple[Aggregate, Dict[str, str]]:
        """The protected sum of the cohort's kept encodings: the protocol of :mod:`~.protection.secagg` (drop-out
        recovery included) over the cohort the server fixed, decoded and noised by the reducer."""
        round, phase, purpose = context.round, context.phase, context.purpose
        where = (round, phase, purpose)
        secure = self.reducer.protection.secure
        assert secure is not None
        self._protocol_faults: Dict[str, str] = {}
        self.reducer.check_cohort(context)
        server = self._secure_server(where)
        eligible = set(server.eligible)
        dropped = {
            cid: f"takes no part in secure aggregation for the rest of the run ({server.excluded.get(cid, 'no setup')})"
            for cid in context.cohort
            if cid not in eligible
        }
        self._raise_first(context, dropped)
        context = self.reducer.context(purpose, round, phase, context.aggregation, _without(context, dropped))
        self.reducer.check_cohort(context)
        names = sorted(layout)
        size = int(sum(int(np.prod(layout[n], dtype=np.int64)) for n in names))
        try:
            exchange = replace(context.exchange, view=view)
            result = self._drive(server.secure_sum_stages(exchange, size, degree=secure.degree), where)
        except SecAggAborted as exc:  # with the reasons of (at most three of) the clients that did not answer
            reasons = "; ".join(f"{cid}: {why}" for cid, why in sorted(self._protocol_faults.items())[:3])
            raise RoundFailedError(
                f"round {round}, phase {phase!r}: {exc}" + (f" (clients: {reasons})" if reasons else "")
            ) from None
        lost = {cid: self._protocol_faults.get(cid, reason) for cid, reason in result.dropped.items()}
        self._raise_first(context, lost)
        dropped.update(lost)
        if len(result.survivors) < self.faults.min_clients:
            raise RoundFailedError(
                f"round {round}, phase {phase!r}: {len(result.survivors)} clients finished the secure summation, "
                f"fewer than min_clients={self.faults.min_clients}"
            )
        sums, offset = {}, 0
        for name in names:
            count = int(np.prod(layout[name], dtype=np.int64))
            sums[name] = result.total[offset : offset + count].reshape(layout[name])
            offset += count
        survivors = replace(context, cohort=tuple(c for c in context.cohort if c in set(result.survivors)))
        return self.reducer.finish(sums, survivors, masked=True), dropped

    def _raise_first(self, context: ExchangeContext, failed: Mapping[str, str]) -> None:
        """Under ``on_error="raise"`` a client lost to the protocol stops the run, naming the first one."""
        if failed and self.faults.on_error == "raise":
            cid = next(c for c in context.cohort if c in failed)
            raise ClientUpdateError(cid, context.round, context.phase, RuntimeError(failed[cid]))


def _without(context: ExchangeContext, dropped: Mapping[str, str]) -> List[str]:
    return [cid for cid in context.cohort if cid not in dropped]
