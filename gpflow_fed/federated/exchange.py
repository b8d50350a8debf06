"""The phase owner: one exchange of a round, end to end, the same on every runtime.

:meth:`PhaseOwner.run` is the only code that drives an exchange. For phase ``p`` of round ``r`` it

1. **broadcasts** ``Algorithm.broadcast(state, r, p)`` (refused if not finite) as an ``update`` request to the cohort;
2. **asks** the runtime's :class:`~gpflow_fed.federated.transport.Transport` to deliver it and collects the raw
   responses;
3. **records** every message that crossed in the ledger (the broadcast to each client, then its reply);
4. **screens** the responses and applies the fault policy, once (:func:`~gpflow_fed.federated.faults.screen`);
5. **protects**: in a phase the run's :class:`~gpflow_fed.federated.protection.request.Protection` covers, the
   clients prepared (clipped, encoded) their replies; under secure aggregation the owner fixes the cohort, relays
   the cohort's public keys (stage ``keys``, once per client and run) and asks for the masked payloads (stage
   ``mask``), recording each stage;
6. **reduces** with the :class:`~gpflow_fed.federated.protection.reduction.Reducer` (plain, robust, or decode and
   noise the protected sum);
7. hands the aggregate to ``Algorithm.server_update``.

A runtime is only a transport; a protection lives in the client's encoder and the reducer; neither drives an exchange.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Sequence, Tuple

import numpy as np

from .algorithm import Aggregate, Algorithm, FederationInfo
from .endpoint import public_keys_message
from .faults import ClientUpdateError, FaultPolicy, RoundFailedError, screen
from .ledger import Channel, CommunicationLedger
from .messages import SERVER, Message
from .protection.masking import sum_masked
from .protection.reduction import ExchangeContext, Reducer
from .transport import UPDATE, Request, Response, Transport

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
    _public_keys: Dict[str, bytes] = field(default_factory=dict)

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
        if protected:
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
        )
        context = self.reducer.context(purpose, round, phase, aggregation, good)
        if protected and protection.secure is not None:
            aggregate, dropped = self._masked_sum(context)
            excluded.update(dropped)
        else:
            aggregate = self.reducer.reduce([responses[cid].message for cid in good], context)  # type: ignore[misc]
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
            if weight is not None and aggregation == "mean" and protection.noised(phase, aggregation):
                weight = min(weight, protection.dp.weight_bound)  # type: ignore[union-attr]
            expected[cid] = weight
        return expected

    # --- secure aggregation ------------------------------------------------------------------------------
    def _stage(self, stage: str, requests: Mapping[str, Request], phase: str) -> Dict[str, Response]:
        """One protocol stage: send, and record what crossed (the requests, then the answers)."""
        responses = self.transport.send(requests)
        for cid, request in requests.items():
            self.channel.send(request.message, cid, request.purpose)
            answer = responses[cid].message
            if answer is not None:
                self.channel.send(answer, SERVER, request.purpose)
        return responses

    def _fail_or_drop(self, context: ExchangeContext, responses: Mapping[str, Response]) -> Dict[str, str]:
        failed = {cid: r.fault or "sent nothing" for cid, r in responses.items() if r.fault or r.message is None}
        if failed and self.faults.on_error == "raise":
            cid = next(c for c in context.cohort if c in failed)
            error = responses[cid].error or RuntimeError(failed[cid])
            raise ClientUpdateError(cid, context.round, context.phase, error) from error
        return failed

    def _masked_sum(self, context: ExchangeContext) -> Tuple[Aggregate, Dict[str, str]]:
        """Fix the cohort, relay its public keys, collect the masked payloads and decode their sum."""
        self.reducer.check_cohort(context)
        round, phase, purpose = context.round, context.phase, context.purpose
        run_id = self.reducer.run_id.hex()
        missing = [cid for cid in context.cohort if cid not in self._public_keys]
        dropped: Dict[str, str] = {}
        if missing:
            down = Message(SERVER, round, f"{phase}/secagg/keys", {}, weight=0.0)
            ask = Request("keys", down, purpose, {"run_id": run_id})
            answers = self._stage("keys", {cid: ask for cid in missing}, phase)
            dropped = self._fail_or_drop(context, answers)
            for cid in missing:
                if cid not in dropped:
                    self._public_keys[cid] = answers[cid].message.arrays["public_key"].tobytes()  # type: ignore[union-attr]
            if dropped:
                context = self.reducer.context(purpose, round, phase, context.aggregation, _without(context, dropped))
                self.reducer.check_cohort(context)
        keys = public_keys_message(round, f"{phase}/secagg/mask", {c: self._public_keys[c] for c in context.cohort})
        config = {"run_id": run_id, "purpose": purpose, "round": round, "phase": phase, "cohort": list(context.cohort)}
        answers = self._stage("mask", {cid: Request("mask", keys, purpose, config) for cid in context.cohort}, phase)
        failed = self._fail_or_drop(context, answers)
        if failed:
            raise RoundFailedError(
                f"round {round}, phase {phase!r}: {sorted(failed)} did not send their masked payload after the cohort "
                f"was fixed ({failed}); the pairwise masks cancel only over the whole cohort, so the sum is refused"
            )
        masked: List[Message] = [answers[cid].message for cid in context.cohort]  # type: ignore[misc]
        stale = [m.sender for m in masked if (m.round, m.phase) != (round, phase)]
        if stale:
            raise RoundFailedError(f"round {round}, phase {phase!r}: {stale} answered for another exchange; refused")
        sums = sum_masked([m.arrays for m in masked])
        return self.reducer.finish(sums, context, masked=True), dropped


def _without(context: ExchangeContext, dropped: Mapping[str, str]) -> List[str]:
    return [cid for cid in context.cohort if cid not in dropped]
