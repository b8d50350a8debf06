"""Cost of secure aggregation in a whole FSGP round: plain vs secure (drop-out recovery), with drop-outs, all pairs.

FSGP (FedAvg, M = 50 inducing points, N_k = 15 points per client, 3 local Adam steps) on FSGP synthetic dataset 1,
every client every round, ``LocalRuntime``. For each K the configurations run side by side in one process
(``--repeats`` times in turn; each ratio is to the plain run of the same repeat, the row its median), and each
round's wall time comes from ``history[r]["seconds"]``; round 0 (client set-up, tracing) is reported apart from the
steady rounds 1…R−1. Secure runs are the default secure round of an in-process runtime: every party has an Ed25519
signing key and the roster of them all (``identity.PartyIdentity.federation``), so the once-per-run setup (stages
``advertise``, ``share``, ``store``: keys, their signatures checked by every party, Shamir shares of every client's
self-mask seed; in round 0) is authenticated and every exchange runs the consistency round (each survivor signs the
survivor set, every client checks a quorum's signatures before it unmasks). ``sparse`` is ``SecureAggregation()``
(degree 2⌈log₂ K⌉, as SecAgg+; the default protection); ``unauthenticated`` (with ``--unauthenticated``) is the same
without signing keys or roster (no signatures at setup, no consistency round: what authentication adds);
``dropouts`` is the same as ``sparse`` with 10 % of each exchange's cohort lost after it answered its update (their
masked inputs never arrive: the survivors' sum is recovered, and the lost clients take no further part);
``all-pairs`` is ``SecureAggregation(degree=K-1)``, the cost of classic pairwise masking. Secure rounds include each
client's fixed-point encoding, its self-mask and pads (X25519, HKDF, AES-CTR), the consistency round, the unmasking
stage, and the server's decoding.

:class:`StageClock` times the setup apart (``protocol.setup_s``) and each steady round's stages (``masked_input``,
``consistency``, ``unmask``: the clients' answers through the transport, packing and ledger included) and the
server's own protocol work, and counts the consistency round's signatures, survivors, quorum and the Ed25519
verifications computed.

Usage: ``python benchmarks/secure_round.py [--clients 100 300 1000] [--all-pairs-up-to 300] [--rounds 3]
[--repeats 1] [--unauthenticated] [--out benchmarks/results/secure_round.json]``; prints two Markdown tables (rounds;
the steady round's stages) and saves the JSON (with the git commit and the command, :func:`provenance.save`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import gpflow  # noqa: E402
import numpy as np  # noqa: E402

from gpflow_fed.data import FederatedDataset, fsgp_synthetic_1  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from provenance import save  # noqa: E402
from gpflow_fed.data.partition import iid_partition  # noqa: E402
from gpflow_fed.federated import FaultPolicy, LocalRuntime, Protection, RunOptions, SecureAggregation, run  # noqa: E402
from gpflow_fed.federated.protocol.transport import SETUP_STAGES, Response  # noqa: E402

#: the share of each secure exchange's cohort that drops out after answering its update (``dropouts``)
DROPOUT = 0.1


class DroppingRuntime(LocalRuntime):
    """``LocalRuntime`` whose network loses the masked inputs of ``DROPOUT`` of each exchange's cohort."""

    def send(self, requests):  # type: ignore[no-untyped-def]
        responses = super().send(requests)
        first = next(iter(requests.values()), None)
        if first is None or first.stage != "masked_input":
            return responses
        lost = sorted(requests)[:: int(round(1 / DROPOUT))]
        return {cid: Response(fault="lost on the network") if cid in lost else r for cid, r in responses.items()}


from gpflow_fed.federated.algorithms import FSGP, initial_inducing_inputs  # noqa: E402
from gpflow_fed.federated.engine.exchange import PhaseOwner  # noqa: E402
from gpflow_fed.federated.protection import identity, secagg  # noqa: E402
from gpflow_fed.federated.runtimes import base as runtime_base  # noqa: E402


class StageClock:
    """Where a secure run's time goes, stage by stage, and the consistency round's Ed25519 work.

    While :meth:`watching`, it wraps the phase owner's ``_send`` (one protocol stage through the transport: every
    client's answer, packing and the ledger) and ``_drive`` (a whole protocol generator, the server's own work
    included) and the server's ``_consistency`` (the cohort, the survivors, the signatures collected and the quorum
    the clients will require, :func:`~gpflow_fed.federated.protection.identity.quorum`). Ed25519 verifications
    are counted from :func:`~gpflow_fed.federated.protection.identity.verify`'s cache: its misses are the
    verifications computed (the K in-process parties share the cache, so a signature is verified once between them;
    a deployed party verifies ``q`` per exchange itself).
    """

    def __init__(self) -> None:
        self.setup_s = 0.0
        self.setup_verifications = 0
        self.drive_s: Dict[int, float] = {}  # round -> seconds in secure_sum_stages (server and clients)
        self.stage_s: Dict[Tuple[int, str], float] = {}  # (round, stage) -> seconds through the transport
        self.verifications: Dict[int, int] = {}  # round -> Ed25519 verifications computed at the unmask
        self.consistency: List[Dict[str, int]] = []

    @contextlib.contextmanager
    def watching(self) -> Iterator["StageClock"]:
        """Patch the three methods for the ``with`` block, restoring them after."""
        send, drive, consistency = PhaseOwner._send, PhaseOwner._drive, secagg.SecAggServer._consistency
        clock = self

        def timed_send(owner: Any, stage: str, requests: Any, where: Tuple[int, str, str]) -> Any:
            misses = identity.verify.cache_info().misses
            begin = time.perf_counter()
            try:
                return send(owner, stage, requests, where)
            finally:
                key = (where[0], stage)
                clock.stage_s[key] = clock.stage_s.get(key, 0.0) + time.perf_counter() - begin
                if stage == "unmask":
                    done = identity.verify.cache_info().misses - misses
                    clock.verifications[where[0]] = clock.verifications.get(where[0], 0) + done

        def timed_drive(owner: Any, stages: Any, where: Tuple[int, str, str]) -> Any:
            setup = getattr(getattr(stages, "gi_code", None), "co_name", "") == "setup_stages"
            misses = identity.verify.cache_info().misses
            begin = time.perf_counter()
            try:
                return drive(owner, stages, where)
            finally:
                seconds = time.perf_counter() - begin
                if setup:
                    clock.setup_s += seconds
                    clock.setup_verifications += identity.verify.cache_info().misses - misses
                else:
                    clock.drive_s[where[0]] = clock.drive_s.get(where[0], 0.0) + seconds

        def counted_consistency(server: Any, exchange: Any, base: Any, survivors: Any, tally: Any) -> Any:
            certificate = yield from consistency(server, exchange, base, survivors, tally)
            n = len(exchange.cohort)
            bound = max(secagg.default_colluders(n, server.threshold), server.colluders or 0)
            clock.consistency.append(
                {
                    "cohort": n,
                    "survivors": len(survivors),
                    "signatures": len(certificate),
                    "quorum": identity.quorum(n, bound),
                }
            )
            return certificate

        PhaseOwner._send, PhaseOwner._drive = timed_send, timed_drive  # type: ignore[method-assign,assignment]
        secagg.SecAggServer._consistency = counted_consistency  # type: ignore[method-assign,assignment]
        try:
            yield self
        finally:
            PhaseOwner._send, PhaseOwner._drive = send, drive  # type: ignore[method-assign]
            secagg.SecAggServer._consistency = consistency  # type: ignore[method-assign]

    def summary(self, rounds: int) -> Dict[str, Any]:
        """The run's set-up (once, in round 0) and the mean steady round (1…R−1): each stage's seconds, the server's
        own (the protocol's time outside the transport), the verifications and the consistency round's counts."""
        steady = range(1, rounds)
        stages = sorted({s for r, s in self.stage_s if r in steady and s not in SETUP_STAGES})

        def mean(values: List[float]) -> float:
            return float(np.mean(values)) if values else 0.0

        per_stage = {s: mean([self.stage_s.get((r, s), 0.0) for r in steady]) for s in stages}
        protocol = mean([self.drive_s.get(r, 0.0) for r in steady])
        return {
            "setup_s": self.setup_s,
            "setup_verifications": self.setup_verifications,
            "steady_protocol_s": protocol,
            "steady_stage_s": per_stage,
            "steady_server_s": protocol - sum(per_stage.values()),
            "steady_verifications": mean([float(self.verifications.get(r, 0)) for r in steady]),
            "consistency": self.consistency,
        }


def _dataset(K: int, points: int, seed: int) -> FederatedDataset:
    data = fsgp_synthetic_1(seed=seed, num_train=K * points)
    parts = iid_partition(len(data.X_train), K, seed=seed)
    return FederatedDataset(clients=[(data.X_train[p], data.Y_train[p]) for p in parts], name="fsgp-1")


def _algorithm(dataset: FederatedDataset, M: int, rounds: int, seed: int) -> FSGP:
    Z = initial_inducing_inputs(np.concatenate([X for X, _ in dataset.clients]), M, seed=seed)
    return FSGP(gpflow.kernels.SquaredExponential(), Z, 0.1, rounds=rounds, local_steps=3, learning_rate=0.1)


@contextlib.contextmanager
def _without_rosters() -> Iterator[None]:
    """In-process parties without signing keys or roster (the unauthenticated mode: no signatures at setup, no
    consistency round), for the ``unauthenticated`` configuration: what the default secure round adds to it."""

    class NoIdentities:
        @staticmethod
        def federation(ids: Any) -> Dict[str, None]:
            return {c: None for c in ids}

    original = runtime_base.PartyIdentity
    runtime_base.PartyIdentity = NoIdentities  # type: ignore[misc,assignment]
    try:
        yield
    finally:
        runtime_base.PartyIdentity = original  # type: ignore[misc]


def measure(K: int, config: str, *, points: int, M: int, rounds: int, seed: int) -> Dict[str, Any]:
    """One run of ``config`` at ``K`` clients: its rounds' times and, if secure, :class:`StageClock`'s profile."""
    dataset = _dataset(K, points, seed)
    configs: Dict[str, Union[bool, SecureAggregation]] = {
        "plain": False,
        "sparse": SecureAggregation(),
        "unauthenticated": SecureAggregation(),
        "dropouts": SecureAggregation(),
        "all-pairs": SecureAggregation(degree=K - 1),
    }
    secure = configs[config]
    runtime_class = DroppingRuntime if config == "dropouts" else LocalRuntime
    runtime = runtime_class(protection=Protection(secure_aggregation=secure))
    options = RunOptions(faults=FaultPolicy(on_error="exclude"))
    clock = StageClock()
    start = time.perf_counter()
    with clock.watching(), _without_rosters() if config == "unauthenticated" else contextlib.nullcontext():
        result = run(_algorithm(dataset, M, rounds, seed), dataset, runtime=runtime, options=options, seed=seed)
    seconds = [h["seconds"] for h in result.history]
    degree = secure.masking_degree(K) if isinstance(secure, SecureAggregation) else 0
    return {
        "K": K,
        "config": config,
        "degree": degree,
        "round0_s": seconds[0],
        "steady_s": float(np.mean(seconds[1:])),
        "total_s": time.perf_counter() - start,
        "bytes_up_per_round": result.history[-1]["bytes_up"],
        "bytes_down_per_round": result.history[-1]["bytes_down"],
        "clients_last_round": result.history[-1]["clients"],
        "params": {k: np.asarray(v).tolist() for k, v in result.state.params.items()},
        "protocol": None if secure is False else clock.summary(rounds),
    }


def _median_row(runs: List[Dict[str, Any]], plains: List[Dict[str, Any]]) -> Dict[str, Any]:
    """One row from the repeats of a configuration: the first run's fields, the medians of the times, and the
    median of the per-repeat ratios to the plain run of the same repeat (paired, so the machine's load cancels)."""
    row = dict(runs[0])
    ratios = [r["steady_s"] / p["steady_s"] for r, p in zip(runs, plains)]
    row.update(
        steady_s=statistics.median(r["steady_s"] for r in runs),
        round0_s=statistics.median(r["round0_s"] for r in runs),
        ratio=statistics.median(ratios),
        repeats=[
            {"steady_s": r["steady_s"], "round0_s": r["round0_s"], "total_s": r["total_s"], "ratio": q}
            for r, q in zip(runs, ratios)
        ],
    )
    if row["protocol"] is not None:
        row["protocol"] = dict(row["protocol"], setup_s=statistics.median(r["protocol"]["setup_s"] for r in runs))
        row["protocol"]["setup_runs"] = [r["protocol"]["setup_s"] for r in runs]
    return row


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[100, 300, 1000])
    parser.add_argument("--all-pairs-up-to", type=int, default=300, help="largest K for the all-pairs configuration")
    parser.add_argument("--unauthenticated", action="store_true", help="also run the secure round without rosters")
    parser.add_argument("--points", type=int, default=15)
    parser.add_argument("--inducing", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=1, help="run every configuration of a K this often, in turn")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="save the rows as JSON here")
    args = parser.parse_args(argv)
    if args.rounds < 2 or args.repeats < 1:
        raise SystemExit("--rounds must be ≥ 2 (round 0 is not a steady round) and --repeats ≥ 1")
    rows = []
    for K in args.clients:
        configs = ["plain", "sparse"] + (["unauthenticated"] if args.unauthenticated else []) + ["dropouts"]
        configs += ["all-pairs"] if K <= args.all_pairs_up_to else []
        runs: Dict[str, List[Dict[str, Any]]] = {c: [] for c in configs}
        for _ in range(args.repeats):
            for config in configs:
                runs[config].append(
                    measure(K, config, points=args.points, M=args.inducing, rounds=args.rounds, seed=args.seed)
                )
                print(f"K={K} {config}: steady round {runs[config][-1]['steady_s']:.2f} s", file=sys.stderr, flush=True)
        rows += [_median_row(runs[c], runs["plain"]) for c in configs]
    print("| K | masking | degree | round 0 (s) | set-up (s) | steady round (s) | steady ÷ plain | max |Δθ| vs plain |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        plain = next(r for r in rows if r["K"] == row["K"] and r["config"] == "plain")
        diff = max(float(np.max(np.abs(np.subtract(row["params"][k], plain["params"][k])))) for k in row["params"])
        row["max_param_diff"] = diff
        setup = "–" if row["protocol"] is None else f"{row['protocol']['setup_s']:.2f}"
        print(
            f"| {row['K']} | {row['config']} | {row['degree']} | {row['round0_s']:.2f} | {setup} | "
            f"{row['steady_s']:.2f} | {row['ratio']:.2f} | {diff:.1e} |"
        )
    print("\nsteady round of a secure run (first repeat): seconds per stage, the server's own, Ed25519 work")
    print("| K | masking | masked_input | consistency | unmask | server | verified | signed / survivors | quorum |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        if row["protocol"] is None:
            continue
        p, stage = row["protocol"], row["protocol"]["steady_stage_s"]
        last = p["consistency"][-1] if p["consistency"] else None  # the run's last exchange (a steady round's)
        signed = "–" if last is None else f"{last['signatures']} / {last['survivors']}"
        print(
            f"| {row['K']} | {row['config']} | {stage.get('masked_input', 0.0):.2f} | "
            f"{stage.get('consistency', 0.0):.2f} | {stage.get('unmask', 0.0):.2f} | {p['steady_server_s']:.2f} | "
            f"{p['steady_verifications']:.0f} | {signed} | {'–' if last is None else last['quorum']} |"
        )
    if args.out:
        save(args.out, {"rows": rows, "repeats": args.repeats}, __file__, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
