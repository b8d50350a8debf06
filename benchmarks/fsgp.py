"""FSGP benchmark: the paper's experiments 1 and 2 (synthetic) and a real 8-D dataset in place of KIN40K.

For each dataset and number of inducing points M it trains, from the same initial (θ = 1, σ² = 0.1 and Z a
random subset of the pooled X, as in the paper §4):

* FSGP-fedavg: R rounds, P local Adam steps (λ), ``max(⌈Kρ⌉, 1)`` clients per round;
* FSGP-exact: R·P rounds (one global Adam step each) — must equal centralized SGPR;
* centralized SGPR and local-only SGPR: R·P Adam steps each (the sequential steps a FedAvg model sees);
* FGP: FedAvg over client exact-GP likelihoods (R rounds, P steps, same ρ, and the same sampled clients as
  FSGP-fedavg: both draw them from the run's seed), rBCM prediction;

and prints a Markdown table of test RMSE. The federation overhead is FSGP-fedavg's wall time divided by
centralized SGPR's wall time at the same *total* number of gradient steps (R·⌈Kρ⌉·P), both measured in this
run, side by side.

Usage: ``python benchmarks/fsgp.py [--quick] [--rounds R] [--overhead-rounds R] [--datasets NAME ...] [--seed S]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Dict, List, Sequence, Tuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import gpflow  # noqa: E402
import numpy as np  # noqa: E402

from gpflow_fed.baselines import centralized_sgpr, local_only_sgpr  # noqa: E402
from gpflow_fed.data import FederatedDataset, fsgp_synthetic_1, fsgp_synthetic_2, load_dataset, make_federated  # noqa: E402
from gpflow_fed.data.partition import size_imbalance  # noqa: E402
from gpflow_fed.federated import run  # noqa: E402
from gpflow_fed.federated.algorithms import FGP, FSGP, initial_inducing_inputs  # noqa: E402

LOCAL_STEPS, LEARNING_RATE = 3, 0.1  # the paper's P and λ


def _synthetic(which: int, num_clients: int, imbalance: int, seed: int) -> FederatedDataset:
    data = fsgp_synthetic_1(seed) if which == 1 else fsgp_synthetic_2(seed)
    return make_federated(
        data.X_train,
        data.Y_train,
        partition="random_sizes",
        num_clients=num_clients,
        imbalance=imbalance,
        test=(data.X_test, data.Y_test),
        seed=seed,
        name=f"synthetic-{which}",
    )


def _real(num_clients: int, seed: int) -> FederatedDataset:
    data = load_dataset("concrete")
    X = (data.X - data.X.mean(0)) / data.X.std(0)  # standardised on the pooled data (benchmark only)
    Y = (data.Y - data.Y.mean(0)) / data.Y.std(0)
    return make_federated(
        X, Y, partition="random_sizes", num_clients=num_clients, test_fraction=0.2, seed=seed, name="concrete"
    )


def _kernel(D: int) -> gpflow.kernels.Kernel:
    return gpflow.kernels.SquaredExponential(variance=1.0, lengthscales=[1.0] * D)


def _row(dataset: FederatedDataset, M: int, rounds: int, rho: float, seed: int) -> Dict[str, float]:
    D = dataset.input_dim
    Z = initial_inducing_inputs(dataset.pooled()[0], M, seed=seed)
    steps = rounds * LOCAL_STEPS
    out: Dict[str, float] = {}
    fed = run(FSGP(_kernel(D), Z, 0.1, rounds, LOCAL_STEPS, LEARNING_RATE, client_fraction=rho), dataset, seed=seed)
    out["fedavg"], out["fedavg_s"] = fed.metrics["test_rmse"], fed.seconds
    exact = run(FSGP(_kernel(D), Z, 0.1, steps, LOCAL_STEPS, LEARNING_RATE, mode="exact"), dataset, seed=seed)
    out["exact"], out["exact_s"] = exact.metrics["test_rmse"], exact.seconds
    central = centralized_sgpr(dataset, _kernel(D), Z, 0.1, steps, LEARNING_RATE)
    out["central"], out["central_s"] = central.metrics["test_rmse"], central.seconds
    ours, ref = gpflow.utilities.read_values(exact.model), gpflow.utilities.read_values(central.model)
    out["exact_gap"] = max(
        float(np.max(np.abs(ours[k] - ref[k]) / np.maximum(np.abs(ref[k]), 1e-12)))
        for k in (".kernel.variance", ".kernel.lengthscales", ".likelihood.variance", ".inducing_variable.Z")
    )
    out["local"] = local_only_sgpr(dataset, _kernel(D), Z, 0.1, steps, LEARNING_RATE).metrics["test_rmse"]
    fgp = run(FGP(_kernel(D), 0.1, rounds, LOCAL_STEPS, LEARNING_RATE, rho), dataset, seed=seed)
    out["fgp"] = fgp.metrics["test_rmse"]
    return out


def _overhead(dataset: FederatedDataset, M: int, rounds: int, rho: float, seed: int) -> Tuple[float, float, int]:
    """FSGP-fedavg wall time and centralized SGPR wall time at the same total gradient steps R·⌈Kρ⌉·P,
    measured back to back (both include building the models and tracing their compiled loops)."""
    D = dataset.input_dim
    Z = initial_inducing_inputs(dataset.pooled()[0], M, seed=seed)
    fed = run(FSGP(_kernel(D), Z, 0.1, rounds, LOCAL_STEPS, LEARNING_RATE, client_fraction=rho), dataset, seed=seed)
    total = rounds * max(int(np.ceil(dataset.num_clients * rho - 1e-9)), 1) * LOCAL_STEPS
    central = centralized_sgpr(dataset, _kernel(D), Z, 0.1, total, LEARNING_RATE)
    return fed.seconds, central.seconds, total


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="few rounds and M values (a smoke run)")
    parser.add_argument("--rounds", type=int, default=None, help="FedAvg rounds R (default 200, quick 20)")
    parser.add_argument(
        "--overhead-rounds", type=int, default=None, help="rounds of the overhead run (default 600, quick 40)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--datasets",
        nargs="+",
        choices=("synthetic1", "synthetic2", "concrete"),
        default=None,
        help="run only these datasets (default all three; the overhead run needs synthetic2)",
    )
    args = parser.parse_args(list(argv))
    rounds = args.rounds if args.rounds is not None else (20 if args.quick else 200)
    overhead_rounds = args.overhead_rounds if args.overhead_rounds is not None else (40 if args.quick else 600)
    experiments: List[Tuple[str, FederatedDataset, float, List[int]]] = [
        ("synthetic 1 (K=5, Kρ=2)", _synthetic(1, 5, 59, args.seed), 0.4, [5, 10, 20]),
        ("synthetic 2 (K=10, Kρ=5)", _synthetic(2, 10, 634, args.seed), 0.5, [10, 20, 40]),
        ("concrete (K=10, Kρ=5)", _real(10, args.seed), 0.5, [10, 25, 50]),
    ]
    if args.quick:
        experiments = [(n, d, r, ms[1:2]) for n, d, r, ms in experiments]
    keys = ("synthetic1", "synthetic2", "concrete")
    chosen = set(args.datasets or keys)
    overhead_experiment = experiments[1] if "synthetic2" in chosen else None
    experiments = [e for k, e in zip(keys, experiments) if k in chosen]
    print(
        f"R = {rounds} rounds, P = {LOCAL_STEPS}, λ = {LEARNING_RATE}; centralized/local/exact: R·P = "
        f"{rounds * LOCAL_STEPS} steps; seed {args.seed}\n"
    )
    print("Test RMSE\n")
    print(
        "| dataset | N (max−min N_k) | M | FSGP-fedavg | FSGP-exact | centralized SGPR | fedavg ÷ central | "
        "exact vs central (max rel. param gap) | FGP (rBCM) | local-only |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, dataset, rho, Ms in experiments:
        spread = size_imbalance([np.arange(n) for n in dataset.client_sizes])
        for M in Ms:
            r = _row(dataset, M, rounds, rho, args.seed)
            print(
                f"| {name} | {dataset.num_data} ({spread}) | {M} | {r['fedavg']:.4f} | {r['exact']:.4f} | "
                f"{r['central']:.4f} | {r['fedavg'] / r['central']:.3f} | {r['exact_gap']:.1e} | {r['fgp']:.4f} | "
                f"{r['local']:.4f} |",
                flush=True,
            )
    if overhead_experiment is None:
        return 0
    name, dataset, rho, _ = overhead_experiment
    fed_s, central_s, total = _overhead(dataset, 20, overhead_rounds, rho, args.seed)
    print(f"\nFederation overhead on {name}, M = 20, R = {overhead_rounds} rounds\n")
    print("| total gradient steps R·⌈Kρ⌉·P | FSGP-fedavg s | centralized SGPR s | overhead (ratio) |")
    print("|---|---|---|---|")
    print(f"| {total} | {fed_s:.1f} | {central_s:.1f} | {fed_s / central_s:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    start = time.perf_counter()
    status = main(sys.argv[1:])
    print(f"\ntotal wall time {time.perf_counter() - start:.0f} s")
    sys.exit(status)
