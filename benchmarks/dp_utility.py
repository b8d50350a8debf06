"""Utility vs ε of FSGP's privacy-preserving prediction with DP on the final ``"predict"`` sums.

FSGP (FedAvg, the paper's settings: P = 3 local Adam steps, λ = 0.1) is trained on FSGP synthetic dataset 1
(eq. 18; 500 training points, iid over K clients); training exchanges are not noised. The final phase's
summed statistics ``Σ_k (C_k C_kᵀ, C_k y_k, ‖y_k‖², tr K_ff,k, N_k)`` are clipped per client to L2 norm C and
released with Gaussian noise ``N(0, (zC)²)`` (``DifferentialPrivacy(phases=("predict",))``); ε at δ = 1e-5 is
from dp_accounting's PLD accountant (one release, replace-one-client adjacency). C is a public constant,
chosen here from a non-private pilot run (the largest client payload norm, rounded up to two significant digits), which the table
prints. The same seed gives the same training, so rows differ only in the noise. FSGP's server projects the noised
``Σ C Cᵀ`` onto the symmetric PSD cone (post-processing, free under DP) before building the model.

Usage: ``python benchmarks/dp_utility.py [--clients K] [--rounds R] [--seed S]``; prints a Markdown table.
"""

from __future__ import annotations

import argparse
import math
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import gpflow  # noqa: E402
import numpy as np  # noqa: E402

from gpflow_fed.data import FederatedDataset, fsgp_synthetic_1  # noqa: E402
from gpflow_fed.data.partition import iid_partition  # noqa: E402
from gpflow_fed.federated import LocalRuntime, run  # noqa: E402
from gpflow_fed.federated.algorithms import FSGP, initial_inducing_inputs  # noqa: E402
from gpflow_fed.privacy.dp import DifferentialPrivacy  # noqa: E402

NOISE_MULTIPLIERS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--inducing", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    data = fsgp_synthetic_1(seed=args.seed)
    parts = iid_partition(len(data.X_train), args.clients, seed=args.seed)
    dataset = FederatedDataset(
        clients=[(data.X_train[p], data.Y_train[p]) for p in parts], test=(data.X_test, data.Y_test), name="fsgp-1"
    )
    Z = initial_inducing_inputs(data.X_train, args.inducing, seed=args.seed)

    def algorithm() -> FSGP:
        return FSGP(gpflow.kernels.SquaredExponential(), Z, 0.1, rounds=args.rounds, local_steps=3, learning_rate=0.1)

    pilot = run(algorithm(), dataset, runtime=LocalRuntime(keep_payloads=True), seed=args.seed)
    norms = [
        math.sqrt(sum(float(np.sum(a**2)) for a in m.arrays.values()))
        for m in pilot.ledger.messages
        if m.sender != "server" and m.phase == "predict"
    ]
    scale = 10 ** (math.floor(math.log10(max(norms))) - 1)
    clip = float(math.ceil(max(norms) / scale) * scale)  # two significant digits, rounded up
    print(f"K = {args.clients}, R = {args.rounds}, M = {args.inducing}; client 'predict' payload norms "
          f"{min(norms):.4g}..{max(norms):.4g}; clip norm C = {clip:g}; delta = 1e-5\n")
    print("| noise multiplier z | ε (δ = 1e-5) | test RMSE | test NLPD |")
    print("|---|---|---|---|")
    print(f"| no DP | ∞ | {pilot.metrics['test_rmse']:.4f} | {pilot.metrics['test_nlpd']:.4f} |")
    for z in NOISE_MULTIPLIERS:
        dp = DifferentialPrivacy(noise_multiplier=z, clip_norm=clip, phases=("predict",), accountant="pld")
        try:
            result = run(algorithm(), dataset, runtime=LocalRuntime(differential_privacy=dp), seed=args.seed)
            cells = f"{result.privacy['epsilon']:.3g} | {result.metrics['test_rmse']:.4f} | {result.metrics['test_nlpd']:.4f}"
        except Exception as exc:  # a noised C Cᵀ can lose positive definiteness: report it, do not hide it
            cells = f"– | fails: {type(exc).__name__}: {str(exc)[:60]} | –"
        print(f"| {z:g} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
