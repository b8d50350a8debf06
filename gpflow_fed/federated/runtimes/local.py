"""LocalRuntime: every client in one process; the reference behaviour of every algorithm."""

from __future__ import annotations

import os
import time
from typing import Any, Dict, List, Optional, Sequence, Union

from tqdm.auto import tqdm

from ...data.dataset import FederatedDataset
from ...privacy.dp import DifferentialPrivacy
from ...privacy.secure_aggregation import SecureAggregation
from ..algorithm import Aggregate, Algorithm, FederationInfo
from ..checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    restore_clients,
    restore_objects,
    save_checkpoint,
)
from ..ledger import Channel, CommunicationLedger
from ..messages import SERVER, Message
from ..result import FederatedResult
from ..secure_aggregation import Aggregator, ExchangeContext
from .base import ClientUpdateError, Runtime, evaluate_model, make_clients
from .faults import (
    FaultPolicy,
    RoundFailedError,
    log_exclusions,
    reply_fault,
    shape_faults,
)


class LocalRuntime(Runtime):
    """Runs an :class:`Algorithm` with all clients in this process.

    :param progress: show a tqdm progress bar over rounds.
    :param keep_payloads: keep every message in the ledger (for privacy audits and tests).
    :param faults: how faulty clients are treated (see :class:`FaultPolicy`); by default the first fault
        stops the run with an error naming the client.
    :param eval_every: evaluate test metrics every this many rounds (0: only at the end). Evaluation runs
        the algorithm's final phases on a copy of the state; its messages are recorded with purpose
        ``"evaluate"`` so they can be told apart from training traffic.
    :param secure_aggregation: ``True`` (or a :class:`~gpflow_fed.privacy.SecureAggregation`) to mask every
        ``"sum"``/``"mean"`` payload pairwise, so the server and the ledger see only masked payloads and the
        exact sum (see :mod:`gpflow_fed.federated.secure_aggregation` for the threat model).
    :param differential_privacy: a :class:`~gpflow_fed.privacy.DifferentialPrivacy`: clients clip their
        payloads, the server adds Gaussian noise to each sum; the spent (ε, δ) is in ``result.privacy`` and
        the cumulative ε in each round's history (``"epsilon"``).
    :param checkpoint_dir: write a checkpoint to this folder after every ``checkpoint_every`` rounds (and
        after the last); see :mod:`gpflow_fed.federated.checkpoint`.
    :param checkpoint_every: rounds between checkpoints (≥ 1).
    :param resume: continue from the latest checkpoint in ``checkpoint_dir`` if there is one (else start
        afresh); the result is identical to an uninterrupted run with the same seed.
    :raises ValueError: a collect phase with secure aggregation or DP (at the start of the run), a bad
        ``eval_every``/``checkpoint_every``, ``resume`` without ``checkpoint_dir``, or a checkpoint written
        by a different run.
    """

    def __init__(
        self,
        *,
        progress: bool = False,
        keep_payloads: bool = False,
        eval_every: int = 0,
        faults: Optional[FaultPolicy] = None,
        secure_aggregation: Union[bool, SecureAggregation] = False,
        differential_privacy: Optional[DifferentialPrivacy] = None,
        checkpoint_dir: Optional[Union[str, os.PathLike]] = None,
        checkpoint_every: int = 1,
        resume: bool = False,
    ) -> None:
        if isinstance(eval_every, bool) or not isinstance(eval_every, int) or eval_every < 0:
            raise ValueError(f"eval_every must be a non-negative integer, got {eval_every!r}")
        if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int) or checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be a positive integer, got {checkpoint_every!r}")
        if resume and checkpoint_dir is None:
            raise ValueError("resume=True needs checkpoint_dir, the folder the interrupted run wrote to")
        self.progress = progress
        self.keep_payloads = keep_payloads
        self.eval_every = eval_every
        self.faults = faults or FaultPolicy()
        self.aggregator = Aggregator(secure=secure_aggregation, dp=differential_privacy)
        self.checkpoint_dir = None if checkpoint_dir is None else os.fspath(checkpoint_dir)
        self.checkpoint_every = checkpoint_every
        self.resume = bool(resume)

    def execute(
        self,
        algorithm: Algorithm,
        dataset: FederatedDataset,
        *,
        monitor: Optional[Any] = None,
        seed: int = 0,
    ) -> FederatedResult:
        start = time.perf_counter()
        algorithm.validate(dataset)
        self.aggregator.check(algorithm)
        clients, sampling_rng = make_clients(dataset, seed)
        ids = [c.id for c in clients]
        by_id = {c.id: c for c in clients}
        info = FederationInfo(
            client_ids=tuple(ids),
            client_sizes={c.id: c.num_data for c in clients},
            input_dim=dataset.input_dim,
            output_dim=dataset.output_dim,
            seed=int(seed),
        )
        ledger = CommunicationLedger(keep_payloads=self.keep_payloads)
        channel = Channel(ledger)
        state = algorithm.initial_state(info)
        history: List[Dict[str, Any]] = []
        ready: set = set()
        aggregator = self.aggregator
        accountant = aggregator.accountant()
        # Subsampling amplifies privacy only for the default uniform sampling without replacement.
        uniform_sampling = type(algorithm).select_clients is Algorithm.select_clients
        meta = {
            "algorithm": algorithm.name,
            "seed": int(seed),
            "clients": list(ids),
            "secure_aggregation": repr(aggregator.secure),
            "differential_privacy": repr(aggregator.dp),
        }
        first_round = 0
        checkpoint = latest_checkpoint(self.checkpoint_dir) if self.resume and self.checkpoint_dir else None
        if checkpoint is not None:
            record, arrays = load_checkpoint(checkpoint, meta)
            state = record["state"]
            sampling_rng.bit_generator.state = record["sampling_rng"]
            history = record["history"]
            ledger.extend(record["ledger"])
            if accountant is not None:
                accountant.restore(record["releases"])
            for cid in record["ready"]:
                algorithm.setup_client(by_id[cid], state)
                ready.add(cid)
            restore_clients(record, arrays, by_id)
            restore_objects(checkpoint, algorithm, by_id, [c for c in ids if c in ready])
            first_round = int(record["round"]) + 1

        def ask(state: Any, cid: str, down: Message, protect: bool, cohort_size: int) -> tuple:
            """One client's answer, prepared for aggregation, or the reason it is unusable."""
            started = time.perf_counter()
            try:
                if cid not in ready:
                    algorithm.setup_client(by_id[cid], state)
                    ready.add(cid)
                reply = algorithm.client_update(by_id[cid], down)
            except Exception as exc:
                if self.faults.on_error == "raise":
                    raise ClientUpdateError(cid, down.round, down.phase, exc) from exc
                return None, None, f"raised {type(exc).__name__}: {exc}"
            elapsed = time.perf_counter() - started
            if isinstance(reply, Message) and not protect:
                channel.send(reply, SERVER)
            fault = reply_fault(reply, cid, down)
            if fault is None and self.faults.timeout is not None and elapsed > self.faults.timeout:
                fault = f"timed out ({elapsed:.3g} s > {self.faults.timeout} s)"
            prepared = None
            if fault is None:
                try:
                    prepared = aggregator.prepare(reply, algorithm.aggregation(down.phase), cohort_size)
                except ValueError as exc:
                    fault = str(exc)
            if fault is not None and self.faults.on_error == "raise":
                raise ClientUpdateError(cid, down.round, down.phase, ValueError(fault))
            return reply, prepared, fault

        def exchange(state: Any, round: int, phase: str, selected: Sequence[str]) -> tuple:
            """One phase: broadcast, client updates, fault screening, masking, reduction, server update."""
            arrays = algorithm.broadcast(state, round, phase)
            aggregation = algorithm.aggregation(phase)
            protect = aggregator.protects(phase, aggregation)
            replies: List[Message] = []
            prepared: Dict[str, Message] = {}
            excluded: Dict[str, str] = {}
            for cid in selected:
                down = channel.send(Message(sender=SERVER, round=round, phase=phase, arrays=arrays, weight=0.0), cid)
                reply, ready_reply, fault = ask(state, cid, down, protect, len(selected))
                if fault is None:
                    replies.append(reply)
                    prepared[cid] = ready_reply
                else:
                    excluded[cid] = fault
            bad_shapes = shape_faults(replies)
            if bad_shapes and self.faults.on_error == "raise":
                cid, reason = next(iter(bad_shapes.items()))
                raise ClientUpdateError(cid, round, phase, ValueError(reason))
            excluded.update(bad_shapes)
            replies = [m for m in replies if m.sender not in bad_shapes]
            log_exclusions(round, phase, excluded)
            if len(replies) < self.faults.min_clients:
                raise RoundFailedError(
                    f"round {round}, phase {phase!r}: {len(replies)} of {len(selected)} clients answered well, "
                    f"fewer than min_clients={self.faults.min_clients}; excluded: {excluded}"
                )
            # The cohort is fixed only now, after every exclusion, so the pairwise masks cancel.
            context = ExchangeContext(int(seed), channel.purpose, round, phase, aggregation, tuple(m.sender for m in replies))
            if protect:
                replies = [channel.send(aggregator.mask(prepared[m.sender], context), SERVER) for m in replies]
            aggregate = aggregator.reduce(replies, context)
            return algorithm.server_update(state, aggregate), aggregate, list(aggregate.senders), excluded

        def account(phases: Sequence[str], sample_size: int) -> None:
            if accountant is not None:
                noised = sum(aggregator.noised(p, algorithm.aggregation(p)) for p in phases)
                accountant.record(len(ids), sample_size if uniform_sampling else len(ids), noised)

        def finalize(state: Any, round: int) -> Any:
            selected: Sequence[str] = ids
            for phase in algorithm.final_phases():
                state, _, selected, _ = exchange(state, round, phase, selected)
            account(algorithm.final_phases(), len(ids))
            return state

        rounds = range(first_round, algorithm.rounds)
        for r in tqdm(rounds, desc=algorithm.name, disable=not self.progress, leave=False):
            t0 = time.perf_counter()
            before = (ledger.total_bytes(direction="up"), ledger.total_bytes(direction="down"))
            selected = algorithm.select_clients(r, ids, sampling_rng)
            sample_size = len(selected)
            aggregates: List[Aggregate] = []
            excluded: Dict[str, str] = {}
            for phase in algorithm.phases(r):
                state, aggregate, selected, dropped = exchange(state, r, phase, selected)
                aggregates.append(aggregate)
                excluded.update(dropped)
            account(algorithm.phases(r), sample_size)
            entry: Dict[str, Any] = {
                "round": r,
                "clients": len(selected),
                "bytes_up": ledger.total_bytes(direction="up") - before[0],
                "bytes_down": ledger.total_bytes(direction="down") - before[1],
            }
            entry.update(algorithm.round_metrics(state, aggregates))
            entry["seconds"] = time.perf_counter() - t0
            if excluded:
                entry["excluded"] = excluded
            if dataset.test is not None and self.eval_every and (r + 1) % self.eval_every == 0:
                channel.purpose = "evaluate"
                try:
                    entry.update(evaluate_model(algorithm.result(finalize(algorithm.copy_state(state), r)), dataset.test))
                finally:
                    channel.purpose = "train"
            if accountant is not None:
                entry["epsilon"] = accountant.epsilon()
            history.append(entry)
            if self.checkpoint_dir is not None and ((r + 1) % self.checkpoint_every == 0 or r + 1 == algorithm.rounds):
                run_record = {
                    "state": state,
                    "sampling_rng": sampling_rng,
                    "history": history,
                    "ledger": ledger.entries,
                    "releases": accountant.releases if accountant is not None else (),
                    "meta": meta,
                }
                save_checkpoint(self.checkpoint_dir, r, run_record, algorithm, by_id, [c for c in ids if c in ready])
            if monitor is not None:
                monitor(r, history=history, state=state, algorithm=algorithm)

        channel.purpose = "final"
        state = finalize(state, algorithm.rounds)
        model = algorithm.result(state)
        metrics = evaluate_model(model, dataset.test) if dataset.test is not None else {}
        return FederatedResult(
            model=model,
            history=history,
            ledger=ledger,
            state=state,
            metrics=metrics,
            seconds=time.perf_counter() - start,
            privacy=accountant.report() if accountant is not None else None,
        )


__all__ = ["LocalRuntime"]
