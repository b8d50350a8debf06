"""The run: one set-up and one round loop, shared by the in-process runtimes and the Flower server.

:func:`set_up_run` takes the user's algorithm (configuration, left untouched), the federation and a transport,
and does what every runtime needs the same way: it fingerprints the algorithm's settings (for checkpoints), binds
a per-run instance (``Algorithm.bind``) and validates it, checks the protection request, starts the server's side of
it (:class:`~gpflow_fed.federated.protection.reduction.Reducer`); :func:`run_rounds` builds the phase owner
(:class:`~gpflow_fed.federated.engine.exchange.PhaseOwner`); :func:`run_rounds` then runs the rounds over the runtime's
transport: resume from a checkpoint if asked, each
round's phases (:func:`train_round`), evaluation every ``eval_every`` rounds, DP releases, checkpoints, the monitor,
an early stop, the final phases, and the :class:`~gpflow_fed.federated.FederatedResult`.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ...metrics import evaluate_model
from ...progress import tqdm
from ..protocol.algorithm import Aggregate, Algorithm, FederationInfo
from ...private_files import check_folder
from .checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    restore_clients,
    restore_objects,
    save_checkpoint,
    state_classes,
)
from .endpoint import ClientEndpoint
from .exchange import PhaseOwner
from ..protocol.fingerprint import describe_settings
from ..protocol.ledger import Channel, CommunicationLedger
from .options import RunOptions
from ..protection.distributed_dp import DistributedPrivacyAccountant
from ..protection.reduction import Reducer
from ..protection.request import Protection
from .result import FederatedResult
from ..protocol.transport import Transport

__all__ = [
    "FREEZE_MIN_CLIENTS",
    "RunSetup",
    "final_phases",
    "record_releases",
    "run_rounds",
    "set_up_run",
    "train_round",
    "with_coverage_warning",
]


def train_round(
    owner: PhaseOwner, state: Any, round: int, ids: Sequence[str], rng: np.random.Generator
) -> Tuple[Any, Dict[str, Any], int]:
    """Round ``round``: select the clients (``Algorithm.select_clients``), run each of ``Algorithm.phases(round)``
    (a later phase goes to the clients the previous one aggregated) and build the round's history entry:
    ``round``, ``clients`` (those aggregated in the last phase), ``bytes_up``/``bytes_down`` (the round's traffic
    in the ledger), ``Algorithm.round_metrics``, ``seconds``, if any client was excluded, ``excluded`` and, if a masked
    sum had entries its clients clipped to their fixed-point range, ``saturated`` (``{phase: count}``).

    :return: the new server state, the history entry and the number of clients selected (the sample size a
        privacy accountant needs).
    """
    t0 = time.perf_counter()
    algorithm, ledger = owner.algorithm, owner.ledger
    before = (ledger.total_bytes(direction="up"), ledger.total_bytes(direction="down"))
    selected = algorithm.select_clients(round, ids, rng)
    sample_size = len(selected)
    aggregates: List[Aggregate] = []
    excluded: Dict[str, str] = {}
    for phase in algorithm.phases(round):
        state, aggregate, dropped = owner.run(state, round, phase, selected, "train")
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
    saturated = owner.reducer.saturation("train", round)
    if saturated:
        entry["saturated"] = saturated
    return state, entry, sample_size


def final_phases(
    owner: PhaseOwner,
    state: Any,
    round: int,
    ids: Sequence[str],
    purpose: str = "final",
    excluded: Optional[Dict[str, str]] = None,
) -> Any:
    """Run ``Algorithm.final_phases()`` (for purpose ``"evaluate"``: ``Algorithm.evaluation_phases()``) with every
    client in ``ids`` (a later phase with those aggregated).

    :param round: the round number the final messages carry (``algorithm.rounds`` after the last round).
    :param purpose: ``"final"``, or ``"evaluate"`` for a mid-training evaluation on a copy of the state.
    :param excluded: if given, ``{client: reason}`` of every client the final phases excluded is added to it (the
        run records them in its history, as it records a round's).
    :return: the server state from which ``Algorithm.result`` builds the returned model.
    """
    selected: Sequence[str] = ids
    for phase in _closing_phases(owner.algorithm, purpose):
        state, aggregate, dropped = owner.run(state, round, phase, selected, purpose)
        selected = list(aggregate.senders)
        if excluded is not None:
            excluded.update(dropped)
    return state


def _closing_phases(algorithm: Algorithm, purpose: str) -> Tuple[str, ...]:
    """The phases :func:`final_phases` runs for ``purpose``: ``Algorithm.evaluation_phases()`` for a mid-training
    evaluation (an algorithm that would otherwise ask a computation of the next round twice evaluates from its state),
    ``Algorithm.final_phases()`` otherwise."""
    return algorithm.evaluation_phases() if purpose == "evaluate" else algorithm.final_phases()


def record_releases(
    accountant: Any,
    reducer: Reducer,
    algorithm: Algorithm,
    phases: Sequence[str],
    num_clients: int,
    sample_size: int,
) -> None:
    """Tell ``accountant`` (None without DP: nothing to do) about the noised sums of ``phases``.

    ``sample_size`` clients of ``num_clients`` were sampled; subsampling amplifies central DP only for the default
    uniform sampling without replacement, so any other ``select_clients`` is accounted as if every client took part.
    Distributed DP claims no amplification (the server picks the sample) and counts each release with the number of
    values it released.
    """
    if accountant is None:
        return
    noised = [p for p in phases if reducer.protection.noised(p, algorithm.aggregation(p))]
    if isinstance(accountant, DistributedPrivacyAccountant):
        for phase in noised:
            accountant.record(num_clients, sample_size, 1, dimension=reducer.dimensions[phase])
        return
    uniform = type(algorithm).select_clients is Algorithm.select_clients
    accountant.record(num_clients, sample_size if uniform else num_clients, len(noised))


@dataclass(frozen=True)
class RunSetup:
    """A run before its first round: the settings fingerprint, the bound algorithm, the server's protection.

    Made by :func:`set_up_run`; every runtime then builds its transport for ``algorithm`` and calls :func:`run_rounds`.
    """

    settings: Mapping[str, str]
    algorithm: Algorithm
    reducer: Reducer
    info: FederationInfo
    options: RunOptions


def set_up_run(
    algorithm: Algorithm, info: FederationInfo, validation_data: Any, options: RunOptions, protection: Protection
) -> RunSetup:
    """The set-up every runtime shares (module docstring).

    :param algorithm: the user's algorithm; its settings are fingerprinted before anything else, and the run uses
        its own bound copy (``Algorithm.bind``), so the user's object is never changed.
    :param info: the federation (client ids and sizes, D, P, the seed).
    :param validation_data: what ``Algorithm.validate`` checks (the dataset in process; its shape on a Flower server).
    :raises TypeError, ValueError: an algorithm that is not an ``Algorithm``, data it cannot use, a protection
        request it cannot run under.
    """
    if not isinstance(algorithm, Algorithm):
        raise TypeError(f"algorithm must be a gpflow_fed.federated.Algorithm, got {type(algorithm).__name__}")
    settings = describe_settings(algorithm)  # the user's configuration, before the run touches anything
    bound = algorithm.bind(info)
    bound.validate(validation_data)
    protection.check(bound)
    return RunSetup(settings, bound, Reducer(protection), info, options)


def run_rounds(
    setup: RunSetup,
    transport: Transport,
    *,
    seeded_sampling: np.random.Generator,
    endpoints: Optional[Mapping[str, ClientEndpoint]] = None,
    test: Optional[Tuple[np.ndarray, np.ndarray]] = None,
    monitor: Optional[Any] = None,
    start: Optional[float] = None,
) -> FederatedResult:
    """The rounds of a set-up run over ``transport``, to the result (module docstring).

    :param seeded_sampling: the client-sampling generator from the public seed (replaced under DP).
    :param endpoints: the parties held in this process, ``{client: endpoint}`` (their state is checkpointed with
        the server's); empty for a Flower server.
    :param test: a held-out ``(X, Y)`` for the result's metrics and ``eval_every``.
    :param monitor: called after every round as ``monitor(round, history=..., state=..., algorithm=...)``.
    """
    start = time.perf_counter() if start is None else start
    options, reducer = setup.options, setup.reducer
    sampling_rng = reducer.sampling_rng(seeded_sampling)
    channel = Channel(CommunicationLedger(keep_payloads=options.keep_payloads))
    owner = PhaseOwner(setup.algorithm, transport, reducer, channel, options.faults, setup.info)
    endpoints = {} if endpoints is None else endpoints
    long_lived = _LongLived()
    try:
        return _rounds(
            owner, setup.info, sampling_rng, setup.settings, endpoints, options, test, monitor, start, long_lived
        )
    finally:  # also when a round raises: the collector is the process's, not the run's
        long_lived.release()


#: the fewest clients a run freezes its first round's objects for (:class:`_LongLived`): below, its collections are
#: cheap and the one full collection before freezing would cost more than it saves
FREEZE_MIN_CLIENTS = 1000


class _LongLived:
    """The objects a run's first round made, moved out of the cyclic garbage collector's way (``gc.freeze``).

    A run's first round (in this process: round 0, or the first round after a resume) makes what lives for the whole
    run: every client's state and data, the compiled (traced) computations, the ledger's first entries, the secure
    aggregation's keys. Python's full collections walk every tracked object, so at K = 10,000 each walks these again
    (≈ 0.2 s a round); frozen, they are skipped. Freezing changes no value, only which objects the collector visits:
    objects that become garbage later are still freed by reference counting, and a cycle among frozen objects waits
    for :meth:`release`. So, before freezing, one full collection frees round 0's cyclic garbage (tracing's, mostly),
    which a full collection of the next round would have walked anyway.

    Only a run that finds no frozen objects freezes (another run in this process, or the caller, may have frozen its
    own, and ``gc.unfreeze`` would release all of them), and only with the collector enabled; :meth:`release`
    unfreezes what this run froze when the run ends, normally or by an exception, so ``gc.get_freeze_count()`` is
    back to what it was.
    """

    def __init__(self) -> None:
        self.frozen = False

    def freeze(self) -> None:
        """Collect, then freeze every tracked object (once a run; see the class docstring for when it does not)."""
        if self.frozen or not gc.isenabled() or gc.get_freeze_count():
            return
        gc.collect()
        gc.freeze()
        self.frozen = True

    def release(self) -> None:
        """Unfreeze what :meth:`freeze` froze (nothing if it did not)."""
        if self.frozen:
            gc.unfreeze()
            self.frozen = False


def _rounds(
    owner: PhaseOwner,
    info: FederationInfo,
    sampling_rng: np.random.Generator,
    settings: Mapping[str, str],
    endpoints: Mapping[str, ClientEndpoint],
    options: RunOptions,
    test: Optional[Tuple[np.ndarray, np.ndarray]],
    monitor: Optional[Any],
    start: float,
    long_lived: _LongLived,
) -> FederatedResult:
    algorithm, reducer, ledger = owner.algorithm, owner.reducer, owner.ledger
    protection = reducer.protection
    ids = list(info.client_ids)
    clients = {cid: e.client for cid, e in endpoints.items()}
    directory = None if options.checkpoint_dir is None else str(options.checkpoint_dir)
    if directory is not None:
        check_folder(directory, "checkpoint_dir")  # refused before any training: a link, a file, another user's
    state = algorithm.initial_state(info)
    history: List[Dict[str, Any]] = []
    accountant = reducer.accountant()
    meta = {
        "algorithm": algorithm.name,
        "seed": int(info.seed),
        "clients": list(ids),
        **protection.describe(),
        "settings": settings,
    }
    first_round = 0
    final: Optional[Any] = None  # the released final state, if a checkpoint holds it already
    checkpoint = latest_checkpoint(directory) if options.resume and directory else None
    if checkpoint is not None:
        record, saved = load_checkpoint(checkpoint, meta, clients, state_classes(state))
        state = record["state"]
        sampling_rng.bit_generator.state = record["sampling_rng"]
        history = record["history"]
        ledger.extend(record["ledger"])
        if accountant is not None:
            accountant.restore(record["releases"])
        for cid in record["ready"]:
            if cid in endpoints:
                endpoints[cid].setup()
        restore_clients(record, saved, clients)
        restore_objects(checkpoint, algorithm, clients, _ready(endpoints, ids))
        first_round = int(record["round"]) + 1
        if record.get("final"):  # the run had finished: its (noised) final release is restored, never redrawn
            final, first_round = state, algorithm.rounds

    def finalize(state: Any, round: int, purpose: str) -> Tuple[Any, Dict[str, str]]:
        excluded: Dict[str, str] = {}
        state = final_phases(owner, state, round, ids, purpose, excluded)
        record_releases(accountant, reducer, algorithm, _closing_phases(algorithm, purpose), len(ids), len(ids))
        return state, excluded

    def save(round: int, state: Any, final: bool = False) -> None:
        run_record = {
            "state": state,
            "sampling_rng": sampling_rng,
            "history": history,
            "ledger": ledger.entries,
            "releases": accountant.releases if accountant is not None else (),
            "meta": meta,
            "final": final,
        }
        save_checkpoint(directory, round, run_record, algorithm, clients, _ready(endpoints, ids))  # type: ignore[arg-type]  # called only with a directory

    rounds = range(first_round, algorithm.rounds)
    # the last evaluation that ran the final phases: (its round, the state after them); an evaluation that ran other
    # phases (Algorithm.evaluation_phases) is not the final release and is never reused as it
    evaluated: Optional[Tuple[int, Any]] = None
    last = algorithm.rounds  # the round number of the final messages: fewer if ``Algorithm.stop_early`` ends training
    for r in tqdm(rounds, desc=algorithm.name, disable=not options.progress, leave=False):
        if r > first_round and len(ids) >= FREEZE_MIN_CLIENTS:  # what round 0 made lives for the run (_LongLived)
            long_lived.freeze()
        state, entry, sample_size = train_round(owner, state, r, ids, sampling_rng)
        record_releases(accountant, reducer, algorithm, algorithm.phases(r), len(ids), sample_size)
        if test is not None and options.eval_every and (r + 1) % options.eval_every == 0:
            final_now = r + 1 == algorithm.rounds  # the last round: its evaluation is the final exchange, asked once
            purpose = "final" if final_now else "evaluate"
            evaluated_state, dropped = finalize(
                algorithm.copy_state(state), algorithm.rounds if final_now else r, purpose
            )
            if final_now or algorithm.evaluation_phases() == algorithm.final_phases():
                evaluated = (r, evaluated_state)
            if dropped:  # clients the final (or evaluation) phases excluded, recorded as a round's exclusions are
                entry[f"{purpose}_excluded"] = dropped
            saturated = reducer.saturation(purpose, algorithm.rounds if final_now else r)
            if saturated:  # entries the evaluation's masked sums saturated, recorded as a round's are
                entry[f"{purpose}_saturated"] = saturated
            entry.update(evaluate_model(algorithm.result(evaluated_state), test))
        if accountant is not None:
            entry["epsilon"] = accountant.epsilon()
        history.append(entry)
        if directory is not None and ((r + 1) % options.checkpoint_every == 0 or r + 1 == algorithm.rounds):
            save(r, state)
        if monitor is not None:
            monitor(r, history=history, state=state, algorithm=algorithm)
        if algorithm.stop_early(history):
            last = r + 1
            break

    if final is None and evaluated is not None and evaluated[0] == last - 1:
        # nothing was trained since the last evaluation ran the final phases: they are not asked again (a client
        # masks one broadcast over one cohort, and the release would be the same)
        state = evaluated[1]
        if directory is not None:
            save(max(last - 1, 0), state, final=True)
    elif final is None:
        state, dropped = finalize(state, last, "final")
        saturated = reducer.saturation("final", last)
        for key, value in (("final_excluded", dropped), ("final_saturated", saturated)):
            if value:  # the final phases' exclusions and saturation enter the history like a round's
                if not history:
                    history.append({"round": last})
                history[-1][key] = value
        if directory is not None:  # a resumed run restores this release instead of drawing a new one
            save(max(last - 1, 0), state, final=True)
    else:
        state = final
    model = algorithm.result(state)
    return FederatedResult(
        model=model,
        history=history,
        ledger=ledger,
        state=state,
        metrics=evaluate_model(model, test) if test is not None else {},
        seconds=time.perf_counter() - start,
        privacy=_privacy_report(accountant, reducer, algorithm),
        accountant=accountant,
        algorithm=algorithm,
    )


def _privacy_report(accountant: Any, reducer: Reducer, algorithm: Algorithm) -> Optional[Dict[str, Any]]:
    """``result.privacy``: the accountant's report, and which phases its (ε, δ) covers and which it does not."""
    if accountant is None:
        return None
    phases = list(
        dict.fromkeys(
            [p for r in range(algorithm.rounds) for p in algorithm.phases(r)] + list(algorithm.final_phases())
        )
    )
    covered = [p for p in phases if reducer.protection.noised(p, algorithm.aggregation(p))]
    report = dict(accountant.report())
    report["phases"] = covered
    report["phases_not_covered"] = [p for p in phases if p not in covered]
    return with_coverage_warning(report)


def with_coverage_warning(report: Dict[str, Any]) -> Dict[str, Any]:
    """``report`` with a ``"warning"`` naming its ``phases_not_covered``, if any (a privacy report's caveat)."""
    if report["phases_not_covered"]:
        report["warning"] = (
            f"phases {report['phases_not_covered']} are released without DP noise: what the server (and the returned "
            "model) computes from them is a deterministic function of the clients' data, not covered by (ε, δ)"
        )
    return report


def _ready(endpoints: Mapping[str, ClientEndpoint], ids: Sequence[str]) -> List[str]:
    return [cid for cid in ids if cid in endpoints and endpoints[cid].ready]
