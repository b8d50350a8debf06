"""LocalRuntime: every client in one process; the reference behaviour of every algorithm."""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Sequence

from tqdm.auto import tqdm

from ...data.dataset import FederatedDataset
from ..algorithm import Aggregate, Algorithm, FederationInfo, reduce_messages
from ..ledger import Channel, CommunicationLedger
from ..messages import SERVER, Message
from ..result import FederatedResult
from .base import ClientUpdateError, Runtime, evaluate_model, make_clients
from .faults import FaultPolicy, RoundFailedError, log_exclusions, reply_fault, shape_faults


class LocalRuntime(Runtime):
    """Runs an :class:`Algorithm` with all clients in this process.

    :param progress: show a tqdm progress bar over rounds.
    :param keep_payloads: keep every message in the ledger (for privacy audits and tests).
    :param faults: how faulty clients are treated (see :class:`FaultPolicy`); by default the first fault
        stops the run with an error naming the client.
    :param eval_every: evaluate test metrics every this many rounds (0: only at the end). Evaluation runs
        the algorithm's final phases on a copy of the state; its messages are recorded with purpose
        ``"evaluate"`` so they can be told apart from training traffic.
    """

    def __init__(
        self,
        *,
        progress: bool = False,
        keep_payloads: bool = False,
        eval_every: int = 0,
        faults: Optional[FaultPolicy] = None,
    ) -> None:
        if isinstance(eval_every, bool) or not isinstance(eval_every, int) or eval_every < 0:
            raise ValueError(f"eval_every must be a non-negative integer, got {eval_every!r}")
        self.progress = progress
        self.keep_payloads = keep_payloads
        self.eval_every = eval_every
        self.faults = faults or FaultPolicy()

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

        def exchange(state: Any, round: int, phase: str, selected: Sequence[str]) -> tuple:
            """One phase: broadcast, client updates, fault screening, reduction, server update."""
            arrays = algorithm.broadcast(state, round, phase)
            replies: List[Message] = []
            excluded: Dict[str, str] = {}
            for cid in selected:
                down = channel.send(Message(sender=SERVER, round=round, phase=phase, arrays=arrays, weight=0.0), cid)
                started = time.perf_counter()
                try:
                    if cid not in ready:
                        algorithm.setup_client(by_id[cid], state)
                        ready.add(cid)
                    reply = algorithm.client_update(by_id[cid], down)
                except Exception as exc:
                    if self.faults.on_error == "raise":
                        raise ClientUpdateError(cid, round, phase, exc) from exc
                    excluded[cid] = f"raised {type(exc).__name__}: {exc}"
                    continue
                elapsed = time.perf_counter() - started
                if isinstance(reply, Message):
                    channel.send(reply, SERVER)
                fault = reply_fault(reply, cid, down)
                if fault is None and self.faults.timeout is not None and elapsed > self.faults.timeout:
                    fault = f"timed out ({elapsed:.3g} s > {self.faults.timeout} s)"
                if fault is None:
                    replies.append(reply)
                elif self.faults.on_error == "raise":
                    raise ClientUpdateError(cid, round, phase, ValueError(fault))
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
            aggregate = reduce_messages(replies, algorithm.aggregation(phase))
            return algorithm.server_update(state, aggregate), aggregate, list(aggregate.senders), excluded

        def finalize(state: Any, round: int) -> Any:
            selected: Sequence[str] = ids
            for phase in algorithm.final_phases():
                state, _, selected, _ = exchange(state, round, phase, selected)
            return state

        rounds = range(algorithm.rounds)
        for r in tqdm(rounds, desc=algorithm.name, disable=not self.progress, leave=False):
            t0 = time.perf_counter()
            before = (ledger.total_bytes(direction="up"), ledger.total_bytes(direction="down"))
            selected = algorithm.select_clients(r, ids, sampling_rng)
            aggregates: List[Aggregate] = []
            excluded: Dict[str, str] = {}
            for phase in algorithm.phases(r):
                state, aggregate, selected, dropped = exchange(state, r, phase, selected)
                aggregates.append(aggregate)
                excluded.update(dropped)
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
            history.append(entry)
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
        )


__all__ = ["LocalRuntime"]
