"""A run's fixed cost, its steady round and its memory as K grows (issue 31, "Scale"), plain and secure.

For each K: an FSGP run (FedAvg, every client every round, P = 3 local Adam steps, M = 20, N_k = 10 points each of
FSGP synthetic 1) with ``R`` rounds. Reported:

* ``seeds_s``: the time to derive every client's seed (``runtimes.base.client_seed`` for k = 0 … K−1);
* ``setup_s``: from calling ``run`` to the start of round 0 (clients, fingerprints, binding, validation);
* ``first_round_s``: round 0 (each client's set-up and the one-off tracing, and under secure aggregation the
  protocol's keys and shares, made once per run);
* ``steady_round_s``: the median of rounds 1 … R−1 (a median, as this shared machine's load comes and goes);
  ``fixed_s = setup_s + first_round_s − steady_round_s``: what a
  run costs beyond its rounds (``round_s``: every round);
* ``rss_mb_per_client``: the growth of the process's peak resident memory over the run, per client.

The same script runs at an older commit (it needs only ``run``, ``LocalRuntime`` and ``client_seed``), so a "before"
and an "after" can be measured on one machine: ``python benchmarks/scale_overhead.py --clients 1000 --json OUT``.

Usage: ``python benchmarks/scale_overhead.py [--clients 1000 10000] [--rounds 4] [--secure] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from typing import Any, Dict, List

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import gpflow  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gpflow_fed.data import FederatedDataset, fsgp_synthetic_1  # noqa: E402
from gpflow_fed.data.partition import iid_partition  # noqa: E402
from gpflow_fed.federated import LocalRuntime, Protection, run  # noqa: E402
from gpflow_fed.federated.algorithms import FSGP  # noqa: E402
from gpflow_fed.federated.runtimes.base import client_seed  # noqa: E402


class StampedFSGP(FSGP):
    """FSGP that notes when round 0 starts (its first ``select_clients``)."""

    started: List[float] = []

    def select_clients(self, round, client_ids, rng):  # type: ignore[no-untyped-def]
        if round == 0:
            StampedFSGP.started.append(time.perf_counter())
        return super().select_clients(round, client_ids, rng)


def federation(K: int, points: int, seed: int) -> FederatedDataset:
    data = fsgp_synthetic_1(seed=seed, num_train=K * points)
    parts = iid_partition(len(data.X_train), K, seed=seed)
    return FederatedDataset([(data.X_train[p], data.Y_train[p]) for p in parts], test=(data.X_test, data.Y_test))


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def measure(K: int, args: argparse.Namespace) -> Dict[str, Any]:
    t = time.perf_counter()
    for k in range(K):
        client_seed(args.seed, k, K)
    seeds = time.perf_counter() - t
    dataset = federation(K, args.points, args.seed)
    Z = np.linspace(-10, 10, args.inducing)[:, None]
    algorithm = StampedFSGP(gpflow.kernels.SquaredExponential(), Z, 0.1, rounds=args.rounds, local_steps=3)
    rss0 = peak_rss_mb()
    StampedFSGP.started.clear()
    t0 = time.perf_counter()
    result = run(
        algorithm, dataset, runtime=LocalRuntime(protection=Protection(secure_aggregation=args.secure)), seed=args.seed
    )
    rounds = [h["seconds"] for h in result.history]
    setup = StampedFSGP.started[0] - t0
    steady = float(np.median(rounds[1:]))
    return {
        "K": K,
        "secure": bool(args.secure),
        "seeds_s": seeds,
        "setup_s": setup,
        "first_round_s": rounds[0],
        "steady_round_s": steady,
        "round_s": rounds,
        "fixed_s": setup + rounds[0] - steady,
        "whole_run_s": result.seconds,
        "rss_mb_per_client": (peak_rss_mb() - rss0) / K,
        "test_rmse": result.metrics["test_rmse"],
        "load_average": os.getloadavg()[0],
    }


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--points", type=int, default=10)
    parser.add_argument("--inducing", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--secure", action="store_true", help="secure aggregation (default: plain, as the issue's figures)"
    )
    parser.add_argument("--json", default="", help="save the rows here (benchmarks/provenance.py)")
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (round 0 is reported apart from the steady state)")
    rows = []
    print(
        "| K | secure | seeds (s) | set-up (s) | round 0 (s) | steady round (s) | fixed cost (s) | MB per client "
        "| load |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for K in args.clients:
        row = measure(K, args)
        rows.append(row)
        print(
            f"| {K} | {row['secure']} | {row['seeds_s']:.3f} | {row['setup_s']:.2f} | {row['first_round_s']:.2f} | "
            f"{row['steady_round_s']:.2f} | {row['fixed_s']:.2f} | {row['rss_mb_per_client']:.3f} | "
            f"{row['load_average']:.1f} |",
            flush=True,
        )
    if args.json:
        import provenance

        provenance.save(args.json, {"rows": rows}, __file__, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
