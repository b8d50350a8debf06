"""The docs example "A useful model at a stated ε": FedBNR's global last layer under client-level DP.

K clients of N_k points each (FSGP synthetic dataset 1, iid, scaled by public constants: x/10, y/3 clipped to
±1.5) send ``(Φ_kᵀΦ_k, Φ_kᵀy_k, y_kᵀy_k, N_k)`` once (FedBNR phase 2 with ``rounds=0`` and public kernel
hyperparameters, as in ``benchmarks/dp_utility.py --part fedbnr``). The noise is calibrated to the target ε by
``DifferentialPrivacy.for_target``; the clip norm C = N_k·b is a public bound that never clips (b from
``‖φ(x)‖² = σ_f² m/(m−1)``). FedBNR's server repairs the noised ``Σ ΦᵀΦ`` as ``PSD(·) + τ I``
(:func:`gpflow_fed.federated.algorithms.postprocess.denoised_gram`). Reported per noise draw: ε spent, test RMSE and
NLPD in data units; also the no-DP run and the RMSE of a constant prediction.

Usage: ``python benchmarks/dp_example.py [--clients 1000] [--epsilon 10] [--draws 3] [--save FILE]``.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from typing import Any, Dict, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from dp_utility import point_bound, scaled_fsgp1  # noqa: E402
from gpflow_fed.data import FederatedDataset  # noqa: E402
from gpflow_fed.federated import LocalRuntime, Protection, run  # noqa: E402
from gpflow_fed.federated.algorithms import FedBNR  # noqa: E402
from gpflow_fed.federated.protection.dp import DifferentialPrivacy  # noqa: E402
from gpflow_fed.kernels import URK  # noqa: E402

FEATURES, VARIANCE, LENGTHSCALE, Y_BOUND, SCALE = 25, 1.0, 0.3, 1.5, 3.0


def example_dataset(num_clients: int, points: int, seed: int = 0) -> FederatedDataset:
    """K iid clients of ``points`` rows of FSGP synthetic dataset 1, scaled by public constants."""
    return scaled_fsgp1(num_clients, points, seed, Y_BOUND)


def public_clip_norm(points: int) -> float:
    """C = N_k·b: one point adds at most b to the payload norm (:func:`dp_utility.point_bound`)."""
    return points * point_bound(FEATURES, VARIANCE, Y_BOUND)


def fedbnr(seed: int = 0) -> FedBNR:
    """FedBNR phase 2 only: public URK hyperparameters, the exact global last layer from one summed release."""
    kernel = URK(
        1, num_samples=FEATURES, seed=seed, variance=VARIANCE, feature_map_options={"lengthscales": LENGTHSCALE}
    )
    return FedBNR(kernel, noise_variance=(0.5 / SCALE) ** 2, prior_variance=1.0, rounds=0, protocol="statistics")


def measure(
    num_clients: int, points: int, epsilon: float, draws: int, seed: int = 0, tolerance: float = 1e-3
) -> Dict[str, Any]:
    """The no-DP run and ``draws`` DP runs at the target ε (RMSE, NLPD in data units; ε spent)."""
    dataset = example_dataset(num_clients, points, seed)
    dp = DifferentialPrivacy.for_target(
        epsilon,
        1e-5,
        clip_norm=public_clip_norm(points),
        num_clients=num_clients,
        rounds=0,
        final_sums=1,
        phases=("scatter",),
        accountant="pld",
        tolerance=tolerance,
    )
    exact = run(fedbnr(seed), dataset, runtime=LocalRuntime(protection=Protection(secure_aggregation=False)), seed=seed)
    rows = []
    for draw in range(draws):
        result = run(
            fedbnr(seed),
            dataset,
            runtime=LocalRuntime(protection=Protection(secure_aggregation=False, differential_privacy=dp)),
            seed=seed + draw,
        )
        rows.append(
            {
                "epsilon": float(result.privacy["epsilon"]),
                "test_rmse": SCALE * result.metrics["test_rmse"],
                "test_nlpd": result.metrics["test_nlpd"] + math.log(SCALE),
            }
        )
    return {
        "clients": num_clients,
        "points_per_client": points,
        "target_epsilon": epsilon,
        "delta": 1e-5,
        "noise_multiplier": dp.noise_multiplier,
        "clip_norm": dp.clip_norm,
        "no_dp": {
            "test_rmse": SCALE * exact.metrics["test_rmse"],
            "test_nlpd": exact.metrics["test_nlpd"] + math.log(SCALE),
        },
        "constant_rmse": float(SCALE * np.std(dataset.test[1])),
        "draws": rows,
    }


def main(argv: Sequence[str] = ()) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--points", type=int, default=20, help="N_k")
    parser.add_argument("--epsilon", type=float, default=10.0)
    parser.add_argument("--draws", type=int, default=3)
    parser.add_argument("--tolerance", type=float, default=1e-3, help="relative precision of z (for_target)")
    parser.add_argument("--save", default="", help="write the result as JSON (with git commit and command)")
    args = parser.parse_args(list(argv) or None)
    start = time.perf_counter()
    out = measure(args.clients, args.points, args.epsilon, args.draws, tolerance=args.tolerance)
    out["seconds"] = time.perf_counter() - start
    print(
        f"K = {out['clients']} clients × {out['points_per_client']} points, target ε = {args.epsilon:g} "
        f"(δ = 1e-5): z = {out['noise_multiplier']:.4g}, C = {out['clip_norm']:.4g}\n"
    )
    print("| run | ε spent | test RMSE | test NLPD |\n|---|---|---|---|")
    print(f"| no DP | ∞ | {out['no_dp']['test_rmse']:.4f} | {out['no_dp']['test_nlpd']:.4f} |")
    for i, row in enumerate(out["draws"]):
        print(f"| DP, draw {i} | {row['epsilon']:.3f} | {row['test_rmse']:.4f} | {row['test_nlpd']:.4f} |")
    print(f"\nconstant prediction RMSE {out['constant_rmse']:.4f}; wall time {out['seconds']:.0f} s")
    if args.save:
        from provenance import save

        save(args.save, out, __file__)


if __name__ == "__main__":
    main()
