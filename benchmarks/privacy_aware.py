"""Privacy-aware GPR: certified low-rank (block Krylov) vs dense strong solution Σ (eq. 11), side by side.

Usage: ``python benchmarks/privacy_aware.py [--sizes 1000 2000 4000 8000] [--gamma 20] [--dense-max 8000]``.
Prints the load average and a Markdown table: N, γ, seconds of ``synthetic_noise_covariance`` (dense eigh /
low-rank, both including the kernel matrices), their ratio, the rank, the Krylov dimension and steps, the
certified margin ``λ_min(I − Bᵀ(K + V + Σ)⁻¹B)`` (≥ −1e-9 means the guarantee is proved), the relative Frobenius
difference of the two Σ (dense only up to ``--dense-max``) and the process's peak RSS so far. Kernel
SE(ℓ = 0.5) on [0, 10], V = 0.01, H = 0.5K, γ sensitive inputs evenly spaced. Run one large N per process to
read its peak memory.
"""

import argparse
import os
import resource
import time

import gpflow
import numpy as np

from gpflow_fed.privacy import ProportionalKernel, synthetic_noise_covariance
from gpflow_fed.privacy._linalg import kernel_matrix
from gpflow_fed.privacy.lowrank import krylov_positive_part
from gpflow_fed.privacy.obfuscation import strong_factor


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 2000, 4000, 8000])
    parser.add_argument("--gamma", type=int, default=20)
    parser.add_argument("--dense-max", type=int, default=8000)
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.1f} (1 min), {os.cpu_count()} CPUs")
    warm = np.linspace(0, 10, 300)[:, None]  # untimed warm-up: TensorFlow's first kernel calls
    kw = gpflow.kernels.SquaredExponential(lengthscales=0.5)
    for low_rank in (True, False):
        synthetic_noise_covariance(kw, warm, warm[::30], ProportionalKernel(kw, 0.5), noise_variance=0.01,
                                   low_rank=low_rank)
    print("| N | γ | dense s | low-rank s | dense/low-rank | rank | Krylov dim (steps) | certified margin "
          "| ‖ΔΣ‖_F/‖Σ‖_F | peak RSS GiB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for N in args.sizes:
        rng = np.random.default_rng(0)
        X = np.sort(rng.uniform(0, 10, (N, 1)), 0)
        S = np.linspace(0.25, 9.75, args.gamma)[:, None]
        k = gpflow.kernels.SquaredExponential(lengthscales=0.5)
        H = ProportionalKernel(k, 0.5)
        t = time.perf_counter()
        low = synthetic_noise_covariance(k, X, S, H, noise_variance=0.01, low_rank=True)
        t_low = time.perf_counter() - t
        KSS = kernel_matrix(k, S)
        B = strong_factor(kernel_matrix(k, X, S), KSS, 0.5 * KSS)
        _, info = krylov_positive_part(B, kernel_matrix(k, X), np.full(N, 0.01))
        del B
        diag = f"{info.basis_size} ({info.steps})"
        margin = "–" if info.certified_margin is None else f"{info.certified_margin:.1e}"
        if N <= args.dense_max:
            t = time.perf_counter()
            dense = synthetic_noise_covariance(k, X, S, H, noise_variance=0.01, low_rank=False)
            t_dense = time.perf_counter() - t
            err = np.linalg.norm(np.asarray(low) - dense) / np.linalg.norm(dense)
            del dense
            cols = f"{t_dense:.2f} | {t_low:.2f} | {t_dense / t_low:.1f}"
            err_text = f"{err:.1e}"
        else:
            cols, err_text = f"– | {t_low:.2f} | –", "–"
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        print(f"| {N} | {args.gamma} | {cols} | {low.rank} | {diag} | {margin} | {err_text} | {rss:.2f} |",
              flush=True)
    print(f"load average at end: {os.getloadavg()[0]:.1f} (1 min)")


if __name__ == "__main__":
    main()
