"""LocalRuntime: every client in one process; the reference behaviour of every algorithm."""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
from tqdm.auto import tqdm

from ...data.dataset import FederatedDataset
from ..algorithm import Aggregate, Algorithm, FederationInfo, reduce_messages
from ..client import Client
from ..ledger import Channel, CommunicationLedger
from ..messages import SERVER, Message
from ..result import FederatedResult
from .base import ClientUpdateError, Runtime, evaluate_model, make_clients


class LocalRuntime(Runtime):
    """Runs an :class:`Algorithm` with all clients in this process.

    :param progress: show a tqdm progress bar over rounds.
    :param keep_payloads: keep every message in the ledger (for privacy audits and tests).
    :param eval_every: evaluate test metrics every this many rounds (0: only at the end). Evaluation runs
        the algorithm's final phases on a copy of the state; its messages are recorded with purpose
        ``"evaluate"`` so they can be told apart from training traffic.
    """

    def __init__(self, *, progress: bool = False, keep_payloads: bool = False, eval_every: int = 0) -> None:
        if isinstance(eval_every, bool) or not isinstance(eval_every, int) or eval_every < 0:
            raise ValueError(f"eval_every must be a non-negative integer, got {eval_every!r}")
        self.progress = progress
        self.keep_payloads = keep_payloads
        self.eval_every = eval_every

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
            arrays = algorithm.broadcast(state, round, phase)
            replies = []
            for cid in selected:
                client = by_id[cid]
                down = channel.send(Message(sender=SERVER, round=round, phase=phase, arrays=arrays, weight=0.0), cid)
                try:
                    if cid not in ready:
                        algorithm.setup_client(client, state)
                        ready.add(cid)
                    reply = algorithm.client_update(client, down)
                except Exception as exc:
                    raise ClientUpdateError(cid, round, phase, exc) from exc
                replies.append(channel.send(reply, SERVER))
            aggregate = reduce_messages(replies, algorithm.aggregation(phase))
            return algorithm.server_update(state, aggregate), aggregate

        def finalize(state: Any, round: int) -> Any:
            for phase in algorithm.final_phases():
                state, _ = exchange(state, round, phase, ids)
            return state

        rounds = range(algorithm.rounds)
        for r in tqdm(rounds, desc=algorithm.name, disable=not self.progress, leave=False):
            t0 = time.perf_counter()
            before = (ledger.total_bytes(direction="up"), ledger.total_bytes(direction="down"))
            selected = algorithm.select_clients(r, ids, sampling_rng)
            aggregates: List[Aggregate] = []
            for phase in algorithm.phases(r):
                state, aggregate = exchange(state, r, phase, selected)
                aggregates.append(aggregate)
            entry: Dict[str, Any] = {
                "round": r,
                "clients": len(selected),
                "bytes_up": ledger.total_bytes(direction="up") - before[0],
                "bytes_down": ledger.total_bytes(direction="down") - before[1],
            }
            entry.update(algorithm.round_metrics(state, aggregates))
            entry["seconds"] = time.perf_counter() - t0
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
