"""The round loop every runtime shares; runtimes differ only in how one phase's messages travel.

:func:`run_rounds` is the loop, written once, from the initial state to the result: it resumes from a
checkpoint if asked, runs :func:`train_round` for each round (select the round's clients, run its phases,
build its history entry), evaluates every ``eval_every`` rounds, records DP releases, saves checkpoints, calls
the monitor, and finishes with :func:`final_phases`. One phase (:meth:`Server.phase`) is
``Algorithm.broadcast``, then :meth:`~gpflow_fed.federated.aggregator.Aggregator.aggregate` (the runtime's
:class:`~gpflow_fed.federated.transport.Transport` carries the messages; the aggregator records, screens,
protects and reduces them), then ``Algorithm.server_update``.

:class:`RoundLoopRuntime` is the base of the runtimes whose clients live in this process: it builds the
clients, the :class:`~gpflow_fed.federated.FederationInfo` and the ledger, and is the run's transport.
:class:`~gpflow_fed.federated.LocalRuntime` asks its clients one after the other;
:class:`~gpflow_fed.federated.DistributeRuntime` spreads them over the replicas of a ``tf.distribute``
strategy. The Flower ServerApp (:class:`~gpflow_fed.federated.runtimes.flower_server.FlowerServer`), which
holds no client, runs the same :func:`run_rounds` with Flower messages as its transport.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from ...progress import tqdm

from ...data.dataset import FederatedDataset
from ..protection.dp import PrivacyAccountant
from ..algorithm import Aggregate, Algorithm, FederationInfo
from ..checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    restore_clients,
    restore_objects,
    save_checkpoint,
    state_classes,
)
from ..client import Client
from ..faults import ClientUpdateError, FaultPolicy, reply_fault, weight_fault
from ..fingerprint import describe_settings
from ..ledger import Channel, CommunicationLedger
from ..messages import SERVER, Message
from ..result import FederatedResult
from ..aggregator import Aggregator
from ...validation import integer
from ..transport import Broadcast, Reply, Transport
from .base import Runtime, evaluate_model, make_clients

__all__ = [
    "ClientPool",
    "RoundLoopRuntime",
    "Server",
    "final_phases",
    "record_releases",
    "run_rounds",
    "train_round",
]


@dataclass(frozen=True)
class Server:
    """The server's side of a run: the algorithm, the runtime's transport, the aggregator, the ledger's channel
    and the fault policy."""

    algorithm: Algorithm
    transport: Transport
    aggregator: Aggregator
    channel: Channel
    faults: FaultPolicy

    @property
    def ledger(self) -> CommunicationLedger:
        return self.channel.ledger

    def phase(
        self, state: Any, round: int, phase: str, cohort: Sequence[str], purpose: str
    ) -> Tuple[Any, Aggregate, Dict[str, str]]:
        """One phase: ``Algorithm.broadcast``, ``Aggregator.aggregate``, ``Algorithm.server_update``.

        :return: the new state, the phase's aggregate and ``{client: reason}`` of the excluded clients.
        :raises FloatingPointError: a non-finite broadcast (nothing is sent).
        """
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
        aggregation = algorithm.aggregation(phase)
        broadcast = Broadcast(
            Message(sender=SERVER, round=round, phase=phase, arrays=arrays, weight=0.0),
            purpose,
            aggregation,
            self.aggregator.protects(phase, aggregation),
            state,
        )
        aggregate, excluded = self.aggregator.aggregate(
            self.transport,
            broadcast,
            cohort,
            channel=self.channel,
            faults=self.faults,
            spec=algorithm.reply_spec(state, round, phase),
        )
        return algorithm.server_update(state, aggregate), aggregate, excluded


def train_round(
    server: Server, state: Any, round: int, ids: Sequence[str], rng: np.random.Generator
) -> Tuple[Any, Dict[str, Any], int]:
    """Round ``round`` of the loop every runtime shares, whatever carries its messages.

    Selects the round's clients with ``Algorithm.select_clients(round, ids, rng)``, runs each of
    ``Algorithm.phases(round)`` in turn (a later phase goes to the clients whose replies the previous one
    aggregated) and builds the round's history entry: ``round``, ``clients`` (those aggregated in the last
    phase), ``bytes_up``/``bytes_down`` (the round's traffic in the ledger), ``Algorithm.round_metrics``,
    ``seconds`` and, if any client was excluded, ``excluded`` (``{client: reason}``).

    :return: the new server state, the history entry and the number of clients selected (the sample size
        a privacy accountant needs).
    """
    t0 = time.perf_counter()
    algorithm, ledger = server.algorithm, server.ledger
    before = (ledger.total_bytes(direction="up"), ledger.total_bytes(direction="down"))
    selected = algorithm.select_clients(round, ids, rng)
    sample_size = len(selected)
    aggregates: List[Aggregate] = []
    excluded: Dict[str, str] = {}
    for phase in algorithm.phases(round):
        state, aggregate, dropped = server.phase(state, round, phase, selected, "train")
        selected = list(aggregate.senders)
        aggregates.append(aggregate)
        excluded.update(dropped)
    entry: Dict[str, Any] = {
        "round": round,
        "clients": len(selected),
        "bytes_up": ledger.total_bytes(direction="up") - before[0],
        "bytes_down": ledger.total_bytes(direction="down") - before[1],
    }
    entry.update(algorithm.round_metrics(state, aggregates))
    entry["seconds"] = time.perf_counter() - t0
    if excluded:
        entry["excluded"] = excluded
    return state, entry, sample_size


def final_phases(server: Server, state: Any, round: int, ids: Sequence[str], purpose: str = "final") -> Any:
    """Run ``Algorithm.final_phases()`` with every client in ``ids`` (a later phase with those aggregated).

    :param round: the round number the final messages carry (``algorithm.rounds`` after the last round).
    :param purpose: ``"final"``, or ``"evaluate"`` for a mid-training evaluation on a copy of the state.
    :return: the server state from which ``Algorithm.result`` builds the returned model.
    """
    selected: Sequence[str] = ids
    for phase in server.algorithm.final_phases():
        state, aggregate, _ = server.phase(state, round, phase, selected, purpose)
        selected = list(aggregate.senders)
    return state


def record_releases(
    accountant: Optional[PrivacyAccountant],
    aggregator: Aggregator,
    algorithm: Algorithm,
    phases: Sequence[str],
    num_clients: int,
    sample_size: int,
) -> None:
    """Tell ``accountant`` (None without DP: nothing to do) about the noised sums of ``phases``.

    ``sample_size`` clients of ``num_clients`` were sampled; subsampling amplifies privacy only for the
    default uniform sampling without replacement, so any other ``select_clients`` is accounted as if every
    client took part.
    """
    if accountant is None:
        return
    uniform = type(algorithm).select_clients is Algorithm.select_clients
    noised = sum(aggregator.noised(p, algorithm.aggregation(p)) for p in phases)
    accountant.record(num_clients, sample_size if uniform else num_clients, noised)


@dataclass
class ClientPool:
    """The clients of a run held in this process, and what asking one of them needs.

    :param ready: the clients set up so far (``Algorithm.setup_client`` runs before a client's first update).
    :param timed: ``(client, phase)`` pairs that answered once: a first answer includes one-off tracing, so it
        is not timed.
    """

    algorithm: Algorithm
    clients: Mapping[str, Client]
    info: FederationInfo
    faults: FaultPolicy
    aggregator: Aggregator
    ready: set = field(default_factory=set)
    timed: set = field(default_factory=set)

    def ask(self, cid: str, broadcast: Broadcast, cohort_size: int, *, raise_now: bool) -> Reply:
        """Client ``cid``'s reply to ``broadcast`` (setting the client up on first use), checked on its side:
        a :class:`Message` from ``cid`` for this exchange, finite, with the expected weight, in time, and, in a
        protected phase, prepared by the aggregator (kept in the reply's ``prepared`` until it is masked).

        :param raise_now: raise :class:`ClientUpdateError` at a fault under ``FaultPolicy(on_error="raise")``
            (else the aggregator decides, once every client has answered).
        """
        algorithm, down = self.algorithm, broadcast.message
        try:
            if cid not in self.ready:
                algorithm.setup_client(self.clients[cid], broadcast.state)
                self.ready.add(cid)
            started = time.perf_counter()
            reply = algorithm.client_update(self.clients[cid], down)
            elapsed = time.perf_counter() - started
        except Exception as exc:
            if raise_now and self.faults.on_error == "raise":
                raise ClientUpdateError(cid, down.round, down.phase, exc) from exc
            return Reply(fault=f"raised {type(exc).__name__}: {exc}", error=exc)
        first = (cid, down.phase) not in self.timed
        self.timed.add((cid, down.phase))
        fault = reply_fault(reply, cid, down)
        if fault is None:
            size = self.info.client_sizes[cid]
            fault = weight_fault(reply, algorithm.expected_weight(down.phase, size), size)
        if fault is None and self.faults.timeout is not None and not first and elapsed > self.faults.timeout:
            fault = f"timed out ({elapsed:.3g} s > {self.faults.timeout} s)"
        prepared = None
        if fault is None and broadcast.protected:
            try:
                prepared = self.aggregator.prepare(reply, broadcast.aggregation, cohort_size)
            except ValueError as exc:
                fault = str(exc)
        if fault is not None and raise_now and self.faults.on_error == "raise":
            raise ClientUpdateError(cid, down.round, down.phase, ValueError(fault))
        message = reply if isinstance(reply, Message) else None
        return Reply(message, fault, prepared=prepared)


def check_loop_settings(eval_every: int, checkpoint_dir: Optional[str], checkpoint_every: int, resume: bool) -> None:
    """The round loop's own settings (see :func:`run_rounds`).

    :raises ValueError: a bad ``eval_every``/``checkpoint_every``, or ``resume`` without ``checkpoint_dir``.
    """
    integer(eval_every, "eval_every", minimum=0)
    integer(checkpoint_every, "checkpoint_every", minimum=1)
    if resume and checkpoint_dir is None:
        raise ValueError("resume=True needs checkpoint_dir, the folder the interrupted run wrote to")


class RoundLoopRuntime(Runtime, Transport):
    """Base of the runtimes whose clients live in this process; each is its own run's transport.

    A subclass implements :meth:`~gpflow_fed.federated.transport.Transport.exchange` (and ``masked`` for
    protected phases) over :attr:`pool`, the run's clients.

    :param progress: show a tqdm progress bar over rounds.
    :param keep_payloads: keep every message in the ledger (for privacy audits and tests).
    :param eval_every: evaluate test metrics every this many rounds (0: only at the end).
    :param faults: how faulty clients are treated (:class:`FaultPolicy`).
    :param aggregator: the reduction seam (secure aggregation, DP).
    :param checkpoint_dir: folder for checkpoints, or None.
    :param checkpoint_every: rounds between checkpoints (≥ 1).
    :param resume: continue from the latest checkpoint in ``checkpoint_dir``.
    :raises ValueError: a bad ``eval_every``/``checkpoint_every``, or ``resume`` without ``checkpoint_dir``.
    """

    def __init__(
        self,
        *,
        progress: bool,
        keep_payloads: bool,
        eval_every: int,
        faults: Optional[FaultPolicy],
        aggregator: Aggregator,
        checkpoint_dir: Optional[str] = None,
        checkpoint_every: int = 1,
        resume: bool = False,
    ) -> None:
        check_loop_settings(eval_every, checkpoint_dir, checkpoint_every, resume)
        if faults is not None and not isinstance(faults, FaultPolicy):
            raise TypeError(f"faults must be a FaultPolicy, got {type(faults).__name__}")
        self.progress = progress
        self.keep_payloads = keep_payloads
        self.eval_every = eval_every
        self.faults = faults or FaultPolicy()
        self.aggregator = aggregator
        self.checkpoint_dir = None if checkpoint_dir is None else os.fspath(checkpoint_dir)
        self.checkpoint_every = checkpoint_every
        self.resume = bool(resume)
        self.pool: Optional[ClientPool] = None

    def prepare(self, algorithm: Algorithm, dataset: FederatedDataset) -> None:
        """Checks before any client work (subclasses add theirs); raise ``ValueError``/``TypeError``."""

    def execute(
        self,
        algorithm: Algorithm,
        dataset: FederatedDataset,
        *,
        monitor: Optional[Any] = None,
        seed: int = 0,
    ) -> FederatedResult:
        start = time.perf_counter()
        settings = describe_settings(algorithm)  # before anything touches the algorithm (checkpoint fingerprint)
        algorithm.validate(dataset)
        self.aggregator.check(algorithm)
        self.aggregator.start()
        self.prepare(algorithm, dataset)
        clients, sampling_rng = make_clients(dataset, seed)
        sampling_rng = self.aggregator.sampling_rng(sampling_rng)
        ids = [c.id for c in clients]
        by_id = {c.id: c for c in clients}
        info = FederationInfo(
            client_ids=tuple(ids),
            client_sizes={c.id: c.num_data for c in clients},
            input_dim=dataset.input_dim,
            output_dim=dataset.output_dim,
            seed=int(seed),
        )
        self.pool = ClientPool(algorithm, by_id, info, self.faults, self.aggregator)
        channel = Channel(CommunicationLedger(keep_payloads=self.keep_payloads))
        server = Server(algorithm, self, self.aggregator, channel, self.faults)
        return run_rounds(
            server,
            info,
            sampling_rng,
            settings=settings,
            test=dataset.test,
            clients=by_id,
            ready=self.pool.ready,
            progress=self.progress,
            eval_every=self.eval_every,
            checkpoint_dir=self.checkpoint_dir,
            checkpoint_every=self.checkpoint_every,
            resume=self.resume,
            monitor=monitor,
            start=start,
        )


def run_rounds(
    server: Server,
    info: FederationInfo,
    sampling_rng: np.random.Generator,
    *,
    settings: Any,
    test: Optional[Tuple[np.ndarray, np.ndarray]] = None,
    clients: Optional[Mapping[str, Client]] = None,
    ready: Optional[set] = None,
    progress: bool = False,
    eval_every: int = 0,
    checkpoint_dir: Optional[str] = None,
    checkpoint_every: int = 1,
    resume: bool = False,
    monitor: Optional[Any] = None,
    start: Optional[float] = None,
) -> FederatedResult:
    """The round loop of every runtime, from the initial state to the result.

    Resumes from the latest checkpoint if asked, runs :func:`train_round` for each remaining round (recording
    DP releases, evaluating every ``eval_every`` rounds on ``test`` with the final phases run on a copy of the
    state, saving a checkpoint every ``checkpoint_every`` rounds, calling ``monitor``), then the final phases,
    and returns the :class:`FederatedResult`. Training ends early where ``Algorithm.stop_early(history)`` says so.

    :param server: the algorithm, the runtime's transport, the aggregator, the ledger's channel, the fault policy.
    :param sampling_rng: the server's client-sampling generator (already protected under DP).
    :param settings: the algorithm's settings fingerprint (:func:`~gpflow_fed.federated.fingerprint.describe_settings`).
    :param clients: the clients held in this process (empty for a Flower server) and ``ready``, those set up.
    """
    start = time.perf_counter() if start is None else start
    clients = {} if clients is None else clients
    ready = set() if ready is None else ready
    ids = list(info.client_ids)
    algorithm, aggregator, ledger = server.algorithm, server.aggregator, server.ledger
    state = algorithm.initial_state(info)
    history: List[Dict[str, Any]] = []
    accountant = aggregator.accountant()
    meta = {
        "algorithm": algorithm.name,
        "seed": int(info.seed),
        "clients": list(ids),
        "secure_aggregation": repr(aggregator.secure),
        "differential_privacy": repr(aggregator.dp),
        "settings": settings,
    }
    first_round = 0
    checkpoint = latest_checkpoint(checkpoint_dir) if resume and checkpoint_dir else None
    if checkpoint is not None:
        record, saved = load_checkpoint(checkpoint, meta, clients, state_classes(state))
        state = record["state"]
        sampling_rng.bit_generator.state = record["sampling_rng"]
        history = record["history"]
        ledger.extend(record["ledger"])
        if accountant is not None:
            accountant.restore(record["releases"])
        for cid in record["ready"]:
            if cid in clients:
                algorithm.setup_client(clients[cid], state)
                ready.add(cid)
        restore_clients(record, saved, clients)
        restore_objects(checkpoint, algorithm, clients, [c for c in ids if c in ready])
        first_round = int(record["round"]) + 1

    def finalize(state: Any, round: int, purpose: str) -> Any:
        state = final_phases(server, state, round, ids, purpose)
        record_releases(accountant, aggregator, algorithm, algorithm.final_phases(), len(ids), len(ids))
        return state

    rounds = range(first_round, algorithm.rounds)
    last = algorithm.rounds  # the round number of the final messages: fewer if ``Algorithm.stop_early`` ends training
    for r in tqdm(rounds, desc=algorithm.name, disable=not progress, leave=False):
        state, entry, sample_size = train_round(server, state, r, ids, sampling_rng)
        record_releases(accountant, aggregator, algorithm, algorithm.phases(r), len(ids), sample_size)
        if test is not None and eval_every and (r + 1) % eval_every == 0:
            entry.update(evaluate_model(algorithm.result(finalize(algorithm.copy_state(state), r, "evaluate")), test))
        if accountant is not None:
            entry["epsilon"] = accountant.epsilon()
        history.append(entry)
        if checkpoint_dir is not None and ((r + 1) % checkpoint_every == 0 or r + 1 == algorithm.rounds):
            run_record = {
                "state": state,
                "sampling_rng": sampling_rng,
                "history": history,
                "ledger": ledger.entries,
                "releases": accountant.releases if accountant is not None else (),
                "meta": meta,
            }
            save_checkpoint(checkpoint_dir, r, run_record, algorithm, clients, [c for c in ids if c in ready])
        if monitor is not None:
            monitor(r, history=history, state=state, algorithm=algorithm)
        if algorithm.stop_early(history):
            last = r + 1
            break

    state = finalize(state, last, "final")
    model = algorithm.result(state)
    return FederatedResult(
        model=model,
        history=history,
        ledger=ledger,
        state=state,
        metrics=evaluate_model(model, test) if test is not None else {},
        seconds=time.perf_counter() - start,
        privacy=accountant.report() if accountant is not None else None,
    )
