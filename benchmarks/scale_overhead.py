"""A run's fixed cost, its steady round and its memory as K grows (issues 31 and 46, "Scale"), batched and per client.

For each K: an FSGP run (FedAvg, every client every round, P = 3 local Adam steps, M = 20, N_k = 10 points each of
FSGP synthetic 1) with ``R`` rounds, on each of the runtime's two paths, side by side in one invocation. With
``--algorithm fgp``: an FGP run instead (FedAvg over the clients' exact-GP likelihoods, the same P = 3, the final
``experts`` phase after the rounds); with ``--algorithm fedbnr``: a FedBNR run (phase 1 FedAvg, the same P = 3, a URK of
m = ``--inducing`` Fourier samples, then phase 2's statistics); with ``--algorithm pvi``: a synchronous PVI run (DPO
factors, q(Z) and q(log β) learned, M = ``--inducing``, 30 local Adam steps a round with a patience above that cap, so
every client takes all 30, damping 1 − 1/K); ``--points-max``: client sizes drawn uniformly from
``--points … --points-max``:

* ``batched``: ``LocalRuntime()``'s default, every cohort's local training as one compiled computation
  (``Algorithm.client_updates``);
* ``per-client``: ``LocalRuntime(batched=False)``, one compiled call per client and round (the path before issue 46);
  it runs ``--per-client-rounds`` rounds (≈ 60 s a round at K = 10,000) and not at all above ``--per-client-max``.

Each (K, path) runs in a fresh process (``multiprocessing``, spawned), so memory and one-off tracing are its own.
Reported:

* ``seeds_s``: the time to derive every client's seed (``runtimes.base.client_seed`` for k = 0 … K−1);
* ``setup_s``: from calling ``run`` to the start of round 0 (clients, fingerprints, binding, validation);
* ``first_round_s``: round 0 (each client's set-up and the one-off tracing, and under secure aggregation the
  protocol's keys and shares, made once per run);
* ``steady_round_s``: the median of rounds 1 … R−1 (a median, as this shared machine's load comes and goes);
  ``fixed_s = setup_s + first_round_s − steady_round_s``: what a run costs beyond its rounds (``round_s``: every
  round);
* ``cpu_round_s``: each round's CPU time of the process (all its threads; less sensitive than wall time to other
  processes on a shared machine), ``steady_round_cpu_s`` the median of rounds 1 … R−1;
* ``python_round_s``: each round's CPU time of the main thread alone (the run's Python, and what TensorFlow does in
  that thread; not its worker threads), ``steady_round_python_s`` the median of rounds 1 … R−1: the per-client
  Python of a round, measured apart from the batched computation's threads and from other processes' load;
* ``update_s``: of each round, the time inside the algorithm's client update (``client_updates`` for the batch, the
  sum of ``client_update`` per client); ``other_us_per_client``: the rest of the steady round per client, in µs (the
  per-client Python of a round: request, policy, encoding, ledger, screening, reduction);
* ``rss_mb_per_client``: the growth of the process's peak resident memory over the run, per client (``ru_maxrss``);
* ``speedup``: per K, the per-client path's steady round over the batched one's (both measured in this invocation).

The script needs only ``run``, ``LocalRuntime`` and ``client_seed``, so a "before" can be measured at an older commit
with ``--paths per-client`` (a runtime without the ``batched`` option runs its only path).

Usage: ``python benchmarks/scale_overhead.py [--clients 1000 10000] [--rounds 4] [--paths batched per-client]
[--per-client-rounds 3] [--per-client-max 10000] [--algorithm fsgp|fgp|fedbnr|pvi] [--points 10] [--points-max 0]
[--secure] [--batch-memory BYTES] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import inspect
import multiprocessing
import os
import resource
import sys
import time
from typing import Any, Dict, List

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

PATHS = ("batched", "per-client")


def federation(K: int, points: int, seed: int, points_max: int = 0) -> Any:
    """K clients of FSGP synthetic 1: ``points`` rows each, or (``points_max > points``) a size drawn uniformly from
    ``points … points_max`` per client (seeded), rows assigned at random."""
    import numpy as np

    from gpflow_fed.data import FederatedDataset, fsgp_synthetic_1
    from gpflow_fed.data.partition import iid_partition

    if points_max > points:
        rng = np.random.default_rng(seed)
        sizes = rng.integers(points, points_max + 1, K)
        data = fsgp_synthetic_1(seed=seed, num_train=int(sizes.sum()))
        parts = np.split(rng.permutation(len(data.X_train)), np.cumsum(sizes)[:-1])
    else:
        data = fsgp_synthetic_1(seed=seed, num_train=K * points)
        parts = iid_partition(len(data.X_train), K, seed=seed)
    return FederatedDataset([(data.X_train[p], data.Y_train[p]) for p in parts], test=(data.X_test, data.Y_test))


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def stamped(algorithm: str, per_client: bool) -> Any:
    """FSGP (or FGP) that notes when round 0 starts (its first ``select_clients``) and times its training updates per
    round: ``client_updates`` (the batch) or, for the per-client path, each ``client_update`` (an algorithm whose
    ``client_update`` is replaced is asked per client, which that path is anyway)."""
    from gpflow_fed.federated.algorithms import FGP, FSGP, PVI, FedBNR

    base: Any = {"fsgp": FSGP, "fgp": FGP, "fedbnr": FedBNR, "pvi": PVI}[algorithm]

    class StampedFSGP(base):  # type: ignore[misc]
        started: List[float] = []
        updates: Dict[int, float] = {}
        cpu: Dict[int, float] = {}  # the process's CPU time when each round starts
        thread: Dict[int, float] = {}  # the main thread's CPU time when each round starts

        def select_clients(self, round, client_ids, rng):  # type: ignore[no-untyped-def]
            if round == 0:
                StampedFSGP.started.append(time.perf_counter())
            StampedFSGP.cpu[int(round)] = time.process_time()
            StampedFSGP.thread[int(round)] = time.thread_time()
            return super().select_clients(round, client_ids, rng)

        @staticmethod
        def timed(broadcast: Any, call: Any) -> Any:
            t = time.perf_counter()
            try:
                return call()
            finally:
                if broadcast.phase in ("train", "kernel"):  # FedBNR's phase 1 is "kernel"
                    key = int(broadcast.round)
                    StampedFSGP.updates[key] = StampedFSGP.updates.get(key, 0.0) + time.perf_counter() - t

        def client_updates(self, clients, broadcast, memory_budget):  # type: ignore[no-untyped-def]
            return self.timed(
                broadcast, lambda: super(StampedFSGP, self).client_updates(clients, broadcast, memory_budget)
            )

    class PerClientFSGP(StampedFSGP):
        def client_update(self, client, broadcast):  # type: ignore[no-untyped-def]
            return self.timed(broadcast, lambda: super(PerClientFSGP, self).client_update(client, broadcast))

    return PerClientFSGP if per_client else StampedFSGP


def measure(K: int, path: str, rounds: int, args: argparse.Namespace) -> Dict[str, Any]:
    """One run of K clients on ``path`` (in this process), its row."""
    import gpflow
    import numpy as np

    from gpflow_fed.federated import LocalRuntime, Protection, run
    from gpflow_fed.federated.runtimes.base import client_seed

    t = time.perf_counter()
    for k in range(K):
        client_seed(args.seed, k, K)
    seeds = time.perf_counter() - t
    dataset = federation(K, args.points, args.seed, args.points_max)
    Z = np.linspace(-10, 10, args.inducing)[:, None]
    Stamped = stamped(args.algorithm, per_client=path == "per-client")
    if args.algorithm == "fgp":
        algorithm = Stamped(gpflow.kernels.SquaredExponential(), 0.1, rounds=rounds, local_steps=3)
    elif args.algorithm == "fedbnr":
        from gpflow_fed.kernels import URK

        algorithm = Stamped(URK(1, num_samples=args.inducing, seed=args.seed), 0.1, rounds=rounds, local_steps=3)
    elif args.algorithm == "pvi":
        kernel, likelihood = gpflow.kernels.SquaredExponential(), gpflow.likelihoods.Gaussian(0.1)
        options_pvi: Dict[str, Any] = dict(damping=1 - 1 / K, local_steps=30, patience=50, num_predict_samples=10)
        algorithm = Stamped(kernel, Z, likelihood, "dpo", "synchronous", rounds, **options_pvi)
    else:
        algorithm = Stamped(gpflow.kernels.SquaredExponential(), Z, 0.1, rounds=rounds, local_steps=3)
    options: Dict[str, Any] = {}
    accepted = inspect.signature(LocalRuntime).parameters
    if "batched" in accepted:
        options["batched"] = path == "batched"
        if path == "batched" and args.batch_memory:
            options["batch_memory"] = args.batch_memory
    elif path == "batched":
        raise SystemExit("this commit's LocalRuntime has no batched path: run with --paths per-client")
    rss0 = peak_rss_mb()
    t0 = time.perf_counter()
    ends: Dict[int, float] = {}
    thread_ends: Dict[int, float] = {}

    def monitor(r: int, **_: Any) -> None:  # after each round, in the main thread
        ends[r], thread_ends[r] = time.process_time(), time.thread_time()

    result = run(
        algorithm,
        dataset,
        runtime=LocalRuntime(protection=Protection(secure_aggregation=args.secure), **options),
        seed=args.seed,
        monitor=monitor,
    )
    round_s = [h["seconds"] for h in result.history]
    cpu_s = [ends[r] - Stamped.cpu[r] for r in range(len(round_s))]
    python_s = [thread_ends[r] - Stamped.thread[r] for r in range(len(round_s))]
    updates = [Stamped.updates.get(r, 0.0) for r in range(len(round_s))]
    setup = Stamped.started[0] - t0
    steady = float(np.median(round_s[1:]))
    other = float(np.median([s - u for s, u in zip(round_s[1:], updates[1:])]))
    return {
        "algorithm": args.algorithm,
        "K": K,
        "path": path,
        "secure": bool(args.secure),
        "seeds_s": seeds,
        "setup_s": setup,
        "first_round_s": round_s[0],
        "steady_round_s": steady,
        "round_s": round_s,
        "cpu_round_s": cpu_s,
        "steady_round_cpu_s": float(np.median(cpu_s[1:])),
        "python_round_s": python_s,
        "steady_round_python_s": float(np.median(python_s[1:])),
        "update_s": updates,
        "other_us_per_client": other / K * 1e6,
        "fixed_s": setup + round_s[0] - steady,
        "whole_run_s": result.seconds,
        "rss_mb_per_client": (peak_rss_mb() - rss0) / K,
        "test_rmse": result.metrics["test_rmse"],
        "load_average": os.getloadavg()[0],
    }


def _child(queue: Any, K: int, path: str, rounds: int, args: argparse.Namespace) -> None:
    try:
        queue.put(measure(K, path, rounds, args))
    except BaseException as exc:  # noqa: BLE001 - reported by the parent
        queue.put({"error": f"{type(exc).__name__}: {exc}"})


def measure_apart(K: int, path: str, rounds: int, args: argparse.Namespace) -> Dict[str, Any]:
    """:func:`measure` in a fresh spawned process (its own memory peak and tracing)."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_child, args=(queue, K, path, rounds, args))
    process.start()
    row = queue.get()
    process.join()
    if "error" in row:
        raise RuntimeError(f"K = {K}, {path}: {row['error']}")
    return row


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    parser.add_argument("--per-client-rounds", type=int, default=3, help="rounds of the per-client path (≥ 2)")
    parser.add_argument("--per-client-max", type=int, default=10000, help="the largest K the per-client path runs")
    parser.add_argument(
        "--batch-memory", type=int, default=0, help="LocalRuntime(batch_memory=…) in bytes (0: its default)"
    )
    parser.add_argument(
        "--algorithm",
        choices=("fsgp", "fgp", "fedbnr", "pvi"),
        default="fsgp",
        help="FSGP (M = --inducing), FGP, FedBNR (m = --inducing) or PVI (M = --inducing)",
    )
    parser.add_argument("--points", type=int, default=10)
    parser.add_argument(
        "--points-max", type=int, default=0, help="client sizes uniform in --points … --points-max (0: all --points)"
    )
    parser.add_argument("--inducing", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--secure", action="store_true", help="secure aggregation (default: plain, as the issue's figures)"
    )
    parser.add_argument("--json", default="", help="save the rows here (benchmarks/provenance.py)")
    args = parser.parse_args(argv)
    if args.rounds < 2 or args.per_client_rounds < 2:
        parser.error("--rounds and --per-client-rounds must be at least 2 (round 0 is reported apart)")
    rows: List[Dict[str, Any]] = []
    print(
        "| K | path | secure | rounds | set-up (s) | round 0 (s) | steady round (s) | its CPU (s) | main thread (s) "
        "| update (s) | other (µs/client) | fixed cost (s) | MB per client | speed-up | load |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for K in args.clients:
        steady: Dict[str, float] = {}
        for path in args.paths:
            if path == "per-client" and K > args.per_client_max:
                continue
            rounds = args.rounds if path == "batched" else args.per_client_rounds
            row = measure_apart(K, path, rounds, args)
            steady[path] = row["steady_round_s"]
            if len(steady) == 2:
                row["speedup"] = steady["per-client"] / steady["batched"]
                for other in rows:
                    if other["K"] == K:
                        other["speedup"] = row["speedup"]
            rows.append(row)
            update = float(sorted(row["update_s"][1:])[len(row["update_s"][1:]) // 2])
            speedup = f"{row['speedup']:.1f}×" if "speedup" in row else ""
            print(
                f"| {K} | {path} | {row['secure']} | {len(row['round_s'])} | {row['setup_s']:.2f} | "
                f"{row['first_round_s']:.2f} | {row['steady_round_s']:.2f} | {row['steady_round_cpu_s']:.2f} | "
                f"{row['steady_round_python_s']:.2f} | "
                f"{update:.2f} | "
                f"{row['other_us_per_client']:.0f} | {row['fixed_s']:.2f} | {row['rss_mb_per_client']:.3f} | "
                f"{speedup} | {row['load_average']:.1f} |",
                flush=True,
            )
    if args.json:
        import provenance

        provenance.save(args.json, {"rows": rows}, __file__, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
