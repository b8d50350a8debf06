"""Poisoned FSGP clients: test RMSE of the plain weighted mean against robust aggregation.

FSGP (FedAvg) on FSGP synthetic dataset 1 (eq. 18), K = 10 clients (iid), M = 20 inducing inputs from a
public grid, 10 rounds × 20 local Adam steps. The first ``b`` clients are malicious: each round they add
the broadcast plus ``fraction`` of the server's FedAvg box in every parameter (unconstrained space), with their honest
weight N_k (an inflated weight is refused by the server's check against the registered size, so it is not needed
here). The box is what Adam can move in a round (``checks.adam_displacement_bound``: ``lr · Σ_t ρ(t)`` over the
round's steps, ≈ 1.06 per coordinate in round 0 here): a reply outside it is excluded by that check alone and needs
no robust aggregation. Each
configuration runs with the same seeds: the clean run, then ``b`` ∈ {1, 2, 3} poisoned clients under the plain
weighted mean, ``RobustAggregation("median")`` and ``RobustAggregation("trimmed_mean", trim=0.3)``.

Usage: ``python benchmarks/robust.py [--seeds 0 1 2] [--fraction 0.98] [--out benchmarks/results/robust.json]``;
prints a Markdown table (mean ± sd of the test RMSE over seeds) and saves every run as JSON with the git
commit and the command.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Dict, List, Optional

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import gpflow  # noqa: E402
import numpy as np  # noqa: E402

from gpflow_fed.data import FederatedDataset, fsgp_synthetic_1  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from provenance import save  # noqa: E402
from gpflow_fed.data.partition import iid_partition  # noqa: E402
from gpflow_fed.federated import LocalRuntime, Protection, RobustAggregation, run  # noqa: E402
from gpflow_fed.federated.algorithms import FSGP  # noqa: E402
from gpflow_fed.federated.algorithms.fsgp.checks import adam_displacement_bound  # noqa: E402

CONFIGS = {
    "mean": None,
    "median": RobustAggregation("median"),
    "trimmed_mean(0.3)": RobustAggregation("trimmed_mean", trim=0.3),
}


class PoisonedFSGP(FSGP):
    """FSGP whose first ``num_bad`` clients reply the broadcast plus ``fraction`` of the server's box in every
    parameter of their ``"train"`` replies."""

    def __init__(self, *args: Any, num_bad: int = 0, fraction: float = 0.98, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.num_bad, self.fraction = num_bad, fraction

    def client_update(self, client: Any, broadcast: Any) -> Any:
        reply = super().client_update(client, broadcast)
        if broadcast.phase != "train" or int(client.id.split("_")[1]) >= self.num_bad:
            return reply
        box = adam_displacement_bound(self.learning_rate, self.local_steps, broadcast.round)
        arrays = {k: np.asarray(broadcast.arrays[k]) + self.fraction * box for k in reply.arrays}
        return self.reply(client, broadcast, arrays, reply.weight)


def federation(seed: int, num_clients: int) -> FederatedDataset:
    data = fsgp_synthetic_1(seed=seed, num_train=500)
    parts = iid_partition(len(data.X_train), num_clients, seed=seed)
    return FederatedDataset([(data.X_train[p], data.Y_train[p]) for p in parts], test=(data.X_test, data.Y_test))


def one_run(seed: int, num_bad: int, config: str, fraction: float, num_clients: int, rounds: int = 10) -> float:
    dataset = federation(seed, num_clients)
    Z = np.linspace(-10, 10, 20)[:, None]  # public: no client data
    algorithm = PoisonedFSGP(
        gpflow.kernels.SquaredExponential(),
        Z,
        0.1,
        rounds=rounds,
        local_steps=20,
        learning_rate=0.05,
        num_bad=num_bad,
        fraction=fraction,
    )
    result = run(
        algorithm,
        dataset,
        runtime=LocalRuntime(protection=Protection(secure_aggregation=False, robust=CONFIGS[config])),
        seed=seed,
    )
    return float(result.metrics["test_rmse"])


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--bad", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--fraction", type=float, default=0.98, help="of the server's box, in every coordinate")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    rows: List[Dict[str, Any]] = []
    for seed in args.seeds:
        for num_bad in [0, *args.bad]:
            for config in CONFIGS if num_bad else ["mean"]:
                rmse = one_run(seed, num_bad, config, args.fraction, args.clients, args.rounds)
                rows.append({"seed": seed, "bad": num_bad, "config": config, "test_rmse": rmse})
                print(f"seed {seed}, {num_bad} bad, {config}: RMSE {rmse:.4f}", file=sys.stderr, flush=True)
    clean = np.array([r["test_rmse"] for r in rows if r["bad"] == 0])
    print(
        f"Clean run: test RMSE {clean.mean():.4f} ± {clean.std(ddof=1) if len(clean) > 1 else 0:.4f} "
        f"({len(clean)} seeds)\n"
    )
    print("| poisoned clients | " + " | ".join(CONFIGS) + " |")
    print("|---|" + "---|" * len(CONFIGS))
    for num_bad in args.bad:
        cells = []
        for config in CONFIGS:
            v = np.array([r["test_rmse"] for r in rows if r["bad"] == num_bad and r["config"] == config])
            cells.append(f"{v.mean():.3f} ± {v.std(ddof=1) if len(v) > 1 else 0:.3f}")
        print(f"| {num_bad} of {args.clients} | " + " | ".join(cells) + " |")
    if args.out:
        save(args.out, {"rows": rows}, __file__, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
