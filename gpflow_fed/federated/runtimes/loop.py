"""The round loop every runtime shares; runtimes differ only in how a phase's client work runs.

:func:`train_round` (select the round's clients, run its phases, build its history entry) and
:func:`final_phases` are the loop itself, written once: a runtime supplies a :data:`Gather`, its part of
one phase. They are used by :class:`RoundLoopRuntime` and by the Flower ServerApp
(:class:`~gpflow_fed.federated.runtimes.flower_server.FlowerServer`), which holds no
:class:`~gpflow_fed.data.FederatedDataset`, only a :class:`~gpflow_fed.federated.FederationInfo`.
:func:`screen` is the fault screening (shapes, ``min_clients``) every runtime applies to a phase's replies.

:class:`RoundLoopRuntime` owns everything around the clients: seeding, the server state, client selection,
phases and final phases, the ledger, history, evaluation every ``eval_every`` rounds, the privacy
accountant, checkpoints and the monitor. A subclass implements :meth:`RoundLoopRuntime.gather`: given the
broadcast of one phase and the selected clients, run the clients' updates, screen faults and return the
server's :class:`~gpflow_fed.federated.Aggregate`. :class:`~gpflow_fed.federated.LocalRuntime` does that
in a loop in this process; :class:`~gpflow_fed.federated.DistributeRuntime` spreads the clients over the
replicas of a ``tf.distribute`` strategy and all-reduces their partial sums.
"""

from __future__ import annotations

import abc
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from ...progress import tqdm

from ...data.dataset import FederatedDataset
from ..protection.dp import PrivacyAccountant
from ..algorithm import Aggregate, Algorithm, FederationInfo
from ..checkpoint import (latest_checkpoint, load_checkpoint, restore_clients, restore_objects, save_checkpoint,
                          state_classes)
from ..client import Client
from ..fingerprint import describe_settings
from ..ledger import Channel, CommunicationLedger
from ..messages import Message
from ..result import FederatedResult
from ..aggregator import Aggregator
from ...validation import integer
from .base import ClientUpdateError, Runtime, evaluate_model, make_clients
from .faults import FaultPolicy, RoundFailedError, log_exclusions, reply_fault, spec_faults, weight_fault

__all__ = [
    "Answer", "FederationRun", "Gather", "RoundLoopRuntime", "final_phases", "record_releases", "run_rounds", "screen",
    "train_round",
]

#: A runtime's part of one phase: ``gather(state, round, phase, arrays, selected) -> (aggregate, excluded)``
#: sends the broadcast ``arrays`` to the ``selected`` clients, runs or awaits their updates, screens faults
#: and returns the server's :class:`Aggregate` of the good replies and ``{client: reason}`` of the excluded
#: ones. ``state`` is the server state the broadcast was made from (for ``Algorithm.setup_client``).
Gather = Callable[[Any, int, str, Mapping[str, np.ndarray], Sequence[str]], Tuple[Aggregate, Dict[str, str]]]


def _exchange(
    algorithm: Algorithm, gather: Gather, state: Any, round: int, phase: str, selected: Sequence[str]
) -> Tuple[Any, Aggregate, Dict[str, str]]:
    """One phase: ``Algorithm.broadcast``, the runtime's ``gather``, ``Algorithm.server_update``."""
    arrays = algorithm.broadcast(state, round, phase)
    for name, value in arrays.items():
        value = np.asarray(value)
        if value.dtype.kind in "fc" and not np.all(np.isfinite(value)):
            raise FloatingPointError(
                f"{algorithm.name}, round {round}, phase {phase!r}: the server's broadcast {name!r} is not finite; "
                "the server state broke in the previous update (with differential privacy: the noised sums were "
                "unusable, see the DifferentialPrivacy settings), so nothing is sent to the clients"
            )
    aggregate, excluded = gather(state, round, phase, arrays, selected)
    return algorithm.server_update(state, aggregate), aggregate, excluded


def train_round(
    algorithm: Algorithm,
    state: Any,
    round: int,
    ids: Sequence[str],
    rng: np.random.Generator,
    gather: Gather,
    ledger: CommunicationLedger,
) -> Tuple[Any, Dict[str, Any], int]:
    """Round ``round`` of the loop every runtime shares (DESIGN.md §3), whatever carries its messages.

    Selects the round's clients with ``Algorithm.select_clients(round, ids, rng)``, runs each of
    ``Algorithm.phases(round)`` in turn (a later phase goes to the clients whose replies the previous one
    aggregated) and builds the round's history entry: ``round``, ``clients`` (those aggregated in the last
    phase), ``bytes_up``/``bytes_down`` (the round's traffic in ``ledger``), ``Algorithm.round_metrics``,
    ``seconds`` and, if any client was excluded, ``excluded`` (``{client: reason}``).

    :return: the new server state, the history entry and the number of clients selected (the sample size
        a privacy accountant needs).
    """
    t0 = time.perf_counter()
    before = (ledger.total_bytes(direction="up"), ledger.total_bytes(direction="down"))
    selected = algorithm.select_clients(round, ids, rng)
    sample_size = len(selected)
    aggregates: List[Aggregate] = []
    excluded: Dict[str, str] = {}
    for phase in algorithm.phases(round):
        state, aggregate, dropped = _exchange(algorithm, gather, state, round, phase, selected)
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


def final_phases(algorithm: Algorithm, state: Any, round: int, ids: Sequence[str], gather: Gather) -> Any:
    """Run ``Algorithm.final_phases()`` with every client in ``ids`` (a later phase with those aggregated).

    :param round: the round number the final messages carry (``algorithm.rounds`` after the last round).
    :return: the server state from which ``Algorithm.result`` builds the returned model.
    """
    selected: Sequence[str] = ids
    for phase in algorithm.final_phases():
        state, aggregate, _ = _exchange(algorithm, gather, state, round, phase, selected)
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
class Answer:
    """One client's answer to one phase.

    :param reply: what ``client_update`` returned (normally a :class:`Message`; anything else is a fault).
    :param prepared: the reply after the aggregator's client-side encoding (clipping, fixed point), or None.
    :param fault: why the answer is unusable, or None.
    :param error: the exception the client raised, if it raised.
    """

    reply: Any = None
    prepared: Optional[Message] = None
    fault: Optional[str] = None
    error: Optional[BaseException] = None


@dataclass
class FederationRun:
    """What one run's phases need: the algorithm, its clients, the channel and the runtime's policies."""

    algorithm: Algorithm
    seed: int
    clients: Mapping[str, Client]
    channel: Channel
    faults: FaultPolicy
    aggregator: Aggregator
    info: Optional[FederationInfo] = None
    ready: set = field(default_factory=set)
    #: ``(client, phase)`` pairs that answered once: a first answer includes one-off tracing, so it is not timed
    timed: set = field(default_factory=set)
    #: the server state of the current phase (what ``Algorithm.setup_client`` is given)
    state: Any = None

    @property
    def ledger(self) -> CommunicationLedger:
        return self.channel.ledger

    def ask(self, cid: str, down: Message, cohort_size: int, *, raise_now: bool) -> Answer:
        """Client ``cid``'s answer to ``down`` (setting the client up on first use), screened for faults.

        :param raise_now: raise :class:`ClientUpdateError` at a fault under ``FaultPolicy(on_error="raise")``
            (else the caller decides, e.g. after every worker has reported).
        """
        algorithm = self.algorithm
        try:
            if cid not in self.ready:
                algorithm.setup_client(self.clients[cid], self.state)
                self.ready.add(cid)
            started = time.perf_counter()
            reply = algorithm.client_update(self.clients[cid], down)
            elapsed = time.perf_counter() - started
        except Exception as exc:
            if raise_now and self.faults.on_error == "raise":
                raise ClientUpdateError(cid, down.round, down.phase, exc) from exc
            return Answer(fault=f"raised {type(exc).__name__}: {exc}", error=exc)
        first = (cid, down.phase) not in self.timed
        self.timed.add((cid, down.phase))
        fault = reply_fault(reply, cid, down)
        if fault is None and self.info is not None:
            size = self.info.client_sizes[cid]
            fault = weight_fault(reply, algorithm.expected_weight(down.phase, size), size)
        if fault is None and self.faults.timeout is not None and not first and elapsed > self.faults.timeout:
            fault = f"timed out ({elapsed:.3g} s > {self.faults.timeout} s)"
        prepared = None
        if fault is None:
            try:
                prepared = self.aggregator.prepare(reply, algorithm.aggregation(down.phase), cohort_size)
            except ValueError as exc:
                fault = str(exc)
        if fault is not None and raise_now and self.faults.on_error == "raise":
            raise ClientUpdateError(cid, down.round, down.phase, ValueError(fault))
        return Answer(reply, prepared, fault)

        size = int(self.info.client_sizes[cid])
        expected = self.algorithm.expected_weight(phase, size)
        if expected is not None and not np.isclose(reply.weight, expected, rtol=1e-12, atol=0.0):
            return f"claims weight {reply.weight:g}; the server expects {expected:g} for its {size} registered points"
        if reply.weight > size:
            return f"claims weight {reply.weight:g}, more than its {size} registered data points"
        return None


def screen(
    faults: FaultPolicy,
    round: int,
    phase: str,
    selected: Sequence[str],
    replies: Sequence[Any],
    excluded: Dict[str, str],
    spec: Optional[Mapping[str, Tuple[Optional[int], ...]]] = None,
) -> List[str]:
    """Exclude replies that differ from the server's expectation, log every exclusion, check ``min_clients``.

    :param replies: the well-formed replies so far (objects with ``sender`` and ``arrays``), in order.
    :param excluded: ``{client: reason}`` of earlier faults; extended in place.
    :param spec: :meth:`Algorithm.reply_spec` of the phase (see :func:`~.faults.spec_faults`).
    :return: the senders whose replies are aggregated, in order.
    :raises ClientUpdateError: a wrongly shaped reply under ``on_error="raise"``.
    :raises RoundFailedError: fewer than ``min_clients`` good replies.
    """
    bad_shapes = spec_faults(replies, spec)
    if bad_shapes and faults.on_error == "raise":
        cid, reason = next(iter(bad_shapes.items()))
        raise ClientUpdateError(cid, round, phase, ValueError(reason))
    excluded.update(bad_shapes)
    good = [m.sender for m in replies if m.sender not in bad_shapes]
    log_exclusions(round, phase, excluded)
    if len(good) < faults.min_clients:
        raise RoundFailedError(
            f"round {round}, phase {phase!r}: {len(good)} of {len(selected)} clients answered well, "
            f"fewer than min_clients={faults.min_clients}; excluded: {excluded}"
        )
    return good


def check_loop_settings(eval_every: int, checkpoint_dir: Optional[str], checkpoint_every: int, resume: bool) -> None:
    """The round loop's own settings (see :func:`run_rounds`).

    :raises ValueError: a bad ``eval_every``/``checkpoint_every``, or ``resume`` without ``checkpoint_dir``.
    """
    integer(eval_every, "eval_every", minimum=0)
    integer(checkpoint_every, "checkpoint_every", minimum=1)
    if resume and checkpoint_dir is None:
        raise ValueError("resume=True needs checkpoint_dir, the folder the interrupted run wrote to")


class RoundLoopRuntime(Runtime):
    """Base of the runtimes that run the round loop in this process (see the module docstring).

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

    @abc.abstractmethod
    def gather(
        self, run: FederationRun, round: int, phase: str, arrays: Mapping[str, np.ndarray], selected: Sequence[str]
    ) -> Tuple[Aggregate, Dict[str, str]]:
        """Run one phase on the ``selected`` clients: broadcast ``arrays``, collect, screen and reduce.

        :return: the server's aggregate of the good replies and ``{client: reason}`` of the excluded ones.
        """

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
        ledger = CommunicationLedger(keep_payloads=self.keep_payloads)
        channel = Channel(ledger)
        run = FederationRun(algorithm, int(seed), by_id, channel, self.faults, self.aggregator, info)

        def gather(
            state: Any, round: int, phase: str, arrays: Mapping[str, np.ndarray], selected: Sequence[str]
        ) -> Tuple[Aggregate, Dict[str, str]]:
            run.state = state
            return self.gather(run, round, phase, arrays, selected)

        return run_rounds(
            algorithm, info, gather, channel, self.aggregator, sampling_rng,
            settings=settings, test=dataset.test, clients=by_id, ready=run.ready, progress=self.progress,
            eval_every=self.eval_every, checkpoint_dir=self.checkpoint_dir, checkpoint_every=self.checkpoint_every,
            resume=self.resume, monitor=monitor, start=start,
        )


def run_rounds(
    algorithm: Algorithm,
    info: FederationInfo,
    gather: Gather,
    channel: Channel,
    aggregator: Aggregator,
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
    """The round loop of every runtime, from the initial state to the result (DESIGN.md §3).

    Resumes from the latest checkpoint if asked, runs :func:`train_round` for each remaining round (recording
    DP releases, evaluating every ``eval_every`` rounds on ``test`` with the final phases run on a copy of the
    state, saving a checkpoint every ``checkpoint_every`` rounds, calling ``monitor``), then the final phases,
    and returns the :class:`FederatedResult`.

    :param gather: the runtime's part of one phase (:data:`Gather`).
    :param channel: the channel whose ledger records the run (its ``purpose`` is set here).
    :param sampling_rng: the server's client-sampling generator (already protected under DP).
    :param settings: the algorithm's settings fingerprint (:func:`~gpflow_fed.federated.fingerprint.describe_settings`).
    :param clients: the clients held in this process (empty for a Flower server) and ``ready``, those set up.
    """
    start = time.perf_counter() if start is None else start
    clients = {} if clients is None else clients
    ready = set() if ready is None else ready
    ids = list(info.client_ids)
    ledger = channel.ledger
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

    def finalize(state: Any, round: int) -> Any:
        state = final_phases(algorithm, state, round, ids, gather)
        record_releases(accountant, aggregator, algorithm, algorithm.final_phases(), len(ids), len(ids))
        return state

    rounds = range(first_round, algorithm.rounds)
    for r in tqdm(rounds, desc=algorithm.name, disable=not progress, leave=False):
        channel.purpose = "train"
        state, entry, sample_size = train_round(algorithm, state, r, ids, sampling_rng, gather, ledger)
        record_releases(accountant, aggregator, algorithm, algorithm.phases(r), len(ids), sample_size)
        if test is not None and eval_every and (r + 1) % eval_every == 0:
            channel.purpose = "evaluate"
            entry.update(evaluate_model(algorithm.result(finalize(algorithm.copy_state(state), r)), test))
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

    channel.purpose = "final"
    state = finalize(state, algorithm.rounds)
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
