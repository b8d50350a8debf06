"""Privacy-aware GPR: certified low-rank (block Krylov) vs dense strong solution Σ (eq. 11), side by side;
with ``--weak``, the weak solution (eq. 10) by certified Krylov reduction vs the dense SDP.

Usage: ``python benchmarks/privacy_aware.py [--sizes 1000 2000 4000 8000] [--gamma 20] [--dense-max 8000]``;
``python benchmarks/privacy_aware.py --weak [--scale 1000:50 8000:20] [--json PATH]`` (see :func:`weak_main`).
Prints the load average and a Markdown table: N, γ, seconds of ``synthetic_noise_covariance`` (dense eigh /
low-rank, both including the kernel matrices), their ratio, the rank, the Krylov dimension and steps, the
certified margin ``λ_min(I − Bᵀ(K + V + Σ)⁻¹B)`` (≥ −1e-9 means the guarantee is proved), the relative Frobenius
difference of the two Σ (dense only up to ``--dense-max``) and the process's peak RSS so far. Kernel
SE(ℓ = 0.5) on [0, 10], V = 0.01, H = 0.5K, γ sensitive inputs evenly spaced. Run one large N per process to
read its peak memory.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import gpflow
import numpy as np

from gpflow_fed.release import LowRankCovariance, ProportionalKernel, synthetic_noise_covariance, verify_privacy
from gpflow_fed.release.linalg import kernel_matrix
from gpflow_fed.release.lowrank import krylov_positive_part
from gpflow_fed.release.obfuscation import positive_part_of_difference, strong_factor
from gpflow_fed.release.regions import pivoted_region_factor


#: Oracle cases of ``--weak``: (kernel name, lengthscale, N, γ, V, ξ as a fraction of the prior variance).
#: The dense N×N SDP (Clarabel, γ cones of size N) is the oracle for γ > 1; for γ = 1 the weak and strong
#: problems coincide, so the closed form (eq. 8) is the oracle up to N = 150.
WEAK_ORACLE_CASES = [
    ("SE", 0.2, 30, 2, 1e-2, 0.5),
    ("SE", 0.1, 40, 3, 1e-3, 0.7),
    ("Matern52", 0.3, 50, 2, 0.1, 0.3),
    ("Matern32", 0.25, 60, 4, 1e-4, 0.6),
    ("SE", 0.1, 80, 3, 1e-2, 0.5),
    ("SE", 0.2, 150, 1, 1e-2, 0.5),
    ("Matern52", 0.1, 150, 1, 1e-3, 0.8),
]


def _kernel(name: str, lengthscale: float) -> gpflow.kernels.Kernel:
    return {
        "SE": gpflow.kernels.SquaredExponential,
        "Matern52": gpflow.kernels.Matern52,
        "Matern32": gpflow.kernels.Matern32,
    }[name](lengthscales=lengthscale)


def _weak_row(k, X, S, alpha, noise):
    """Krylov weak solve (timed with its kernel matrices), full check, Theorem 2 against strong H = αK."""
    H = ProportionalKernel(k, alpha)
    t = time.perf_counter()
    weak = synthetic_noise_covariance(k, X, S, H, noise_variance=noise, method="weak")
    seconds = time.perf_counter() - t
    try:
        strong, strong_kind = synthetic_noise_covariance(k, X, S, H, noise_variance=noise), "eq. 11"
    except ValueError:
        # K_SS − H_SS numerically singular (dense sensitive inputs): the strong solution on the pivoted
        # well-conditioned subset P ⊆ S of the region code (G(P) = G(S) to PIVOT_RTOL; eq. 12–13).
        M = kernel_matrix(k, S) - kernel_matrix(H, S)
        B, P = pivoted_region_factor(kernel_matrix(k, X, S), 0.5 * (M + M.T))
        strong = positive_part_of_difference(B, kernel_matrix(k, X), np.full(X.shape[0], noise), low_rank=True)
        strong_kind = f"pivoted, |P| = {P.shape[0]}"
    tr_strong = strong.trace() if isinstance(strong, LowRankCovariance) else float(np.trace(strong))
    check = verify_privacy(k, X, S, H, weak, noise_variance=noise)
    c = weak.certificate
    return weak, dict(
        seconds=seconds,
        trace=weak.trace(),
        lower_bound=c.lower_bound,
        gap=c.relative_gap,
        margin=c.feasibility_margin,
        oracle_margin=check.weak_margin,
        k=c.krylov_dimension,
        steps=c.steps,
        rank=weak.rank,
        strong_trace=tr_strong,
        strong_kind=strong_kind,
        # The weak optimum lies in [lower bound, tr Σ_weak]: Theorem 2 is confirmed when tr Σ_weak ≤
        # tr Σ_strong up to the certified gap (when weak = strong, e.g. far-apart sensitive inputs).
        theorem2=bool(weak.trace() <= tr_strong * (1 + max(c.relative_gap, 1e-9))),
    )


def weak_main(argv: "list[str]") -> None:
    """``--weak``: (1) equality to the dense oracle for N ≤ 150; (2) the scale targets; JSON with the commit.

    Scale cases ``N:γ``: SE(ℓ = 0.5) on [0, 10] (X ~ U, seed 0), V = 0.01, γ evenly spaced sensitive inputs,
    tolerance H = 0.5K (ξᵢ = 0.5 K(sᵢ,sᵢ) for the weak method; the strong solution with Ξ = H_SS has the same
    diagonal, so Theorem 2 says tr Σ_weak ≤ tr Σ_strong). Seconds include the kernel matrices.
    """
    parser = argparse.ArgumentParser(prog="privacy_aware.py --weak")
    parser.add_argument("--scale", nargs="*", default=["1000:50", "8000:20"], help="N:γ cases")
    parser.add_argument("--no-oracle", action="store_true", help="skip the dense-oracle table")
    parser.add_argument("--json", default="benchmarks/results/privacy_weak.json")
    parser.add_argument(
        "--oracle-cases", type=int, nargs="*", default=None, help="indices into WEAK_ORACLE_CASES to run (default: all)"
    )
    parser.add_argument(
        "--compare-small",
        action="store_true",
        help="also time solve_weak_krylov on each scale case with small_solver='clarabel' and "
        "'barrier' side by side (same C, B, m)",
    )
    args = parser.parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True).stdout.strip())
    record = dict(
        command="python benchmarks/privacy_aware.py --weak " + " ".join(argv),
        commit=commit,
        dirty_tree=dirty,
        load_start=os.getloadavg()[0],
        oracle=[],
        scale=[],
        small_solvers=[],
    )
    print(f"load average at start: {record['load_start']:.1f} (1 min), {os.cpu_count()} CPUs; commit {commit}")
    if not args.no_oracle:
        print(
            "| kernel | ℓ | N | γ | V | ξ/K | oracle | oracle s | Krylov s | tr oracle | tr Krylov | rel. diff "
            "| certified gap | margin (full dim) | k |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        chosen = range(len(WEAK_ORACLE_CASES)) if args.oracle_cases is None else args.oracle_cases
        for name, ls, N, gamma, noise, frac in (WEAK_ORACLE_CASES[i] for i in chosen):
            rng = np.random.default_rng(N + gamma)
            X = np.sort(rng.uniform(0, 1, (N, 1)), 0)
            S = rng.uniform(0.1, 0.9, (gamma, 1))
            k = _kernel(name, ls)
            xi = frac * float(k.variance.numpy())
            t = time.perf_counter()
            red = synthetic_noise_covariance(k, X, S, xi, noise_variance=noise, method="weak")
            t_red = time.perf_counter() - t
            t = time.perf_counter()
            if gamma == 1:
                oracle, kind = synthetic_noise_covariance(k, X, S, xi, noise_variance=noise, low_rank=False), "eq. 8"
            else:
                oracle, kind = (
                    synthetic_noise_covariance(k, X, S, xi, noise_variance=noise, method="weak", solver="dense"),
                    "dense SDP",
                )
            t_oracle = time.perf_counter() - t
            tr_o, tr_r = float(np.trace(np.asarray(oracle))), red.trace()
            c = red.certificate
            row = dict(
                kernel=name,
                lengthscale=ls,
                N=N,
                gamma=gamma,
                noise=noise,
                xi=xi,
                oracle=kind,
                oracle_seconds=t_oracle,
                krylov_seconds=t_red,
                oracle_trace=tr_o,
                krylov_trace=tr_r,
                rel_diff=abs(tr_r - tr_o) / tr_o,
                gap=c.relative_gap,
                margin=c.feasibility_margin,
                k=c.krylov_dimension,
            )
            record["oracle"].append(row)
            _dump(record, args.json)
            print(
                f"| {name} | {ls} | {N} | {gamma} | {noise:g} | {frac} | {kind} | {t_oracle:.2f} | {t_red:.2f} "
                f"| {tr_o:.8g} | {tr_r:.8g} | {row['rel_diff']:.1e} | {c.relative_gap:.1e} "
                f"| {c.feasibility_margin:.1e} | {c.krylov_dimension} |",
                flush=True,
            )
    print(
        "\n| N | γ | Krylov s | tr Σ_weak | certified lower bound | certified gap | margin (Krylov, full dim) "
        "| margin (verify_privacy) | k (steps) | rank | tr Σ_strong (Ξ = H_SS) | Theorem 2 | peak RSS GiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for case in args.scale:
        N, gamma = (int(v) for v in case.split(":"))
        rng = np.random.default_rng(0)
        X = np.sort(rng.uniform(0, 10, (N, 1)), 0)
        S = np.linspace(0.25, 9.75, gamma)[:, None]
        k = gpflow.kernels.SquaredExponential(lengthscales=0.5)
        _, row = _weak_row(k, X, S, 0.5, 0.01)
        row.update(N=N, gamma=gamma, peak_rss_gib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)
        record["scale"].append(row)
        _dump(record, args.json)
        print(
            f"| {N} | {gamma} | {row['seconds']:.1f} | {row['trace']:.10g} | {row['lower_bound']:.10g} "
            f"| {row['gap']:.1e} | {row['margin']:.1e} | {row['oracle_margin']:.1e} | {row['k']} ({row['steps']}) "
            f"| {row['rank']} | {row['strong_trace']:.10g} ({row['strong_kind']}) | "
            f"{'yes' if row['theorem2'] else 'NO'} "
            f"| {row['peak_rss_gib']:.2f} |",
            flush=True,
        )
    if args.compare_small:
        _compare_small(args.scale, record, args.json)
    record["load_end"] = os.getloadavg()[0]
    print(f"load average at end: {record['load_end']:.1f} (1 min)")
    _dump(record, args.json)
    print(f"wrote {args.json}")


def _compare_small(cases: "list[str]", record: dict, path: str) -> None:
    """The reduced SDP by Clarabel (bordered LMI) vs the numpy barrier, on the same scale cases (Krylov s only)."""
    from gpflow_fed.release.weak import solve_weak_krylov

    print("\n| N | γ | small solver | Krylov s | tr Σ_weak | certified gap | margin (full dim) | k (steps) |")
    print("|---|---|---|---|---|---|---|---|")
    for case in cases:
        N, gamma = (int(v) for v in case.split(":"))
        rng = np.random.default_rng(0)
        X = np.sort(rng.uniform(0, 10, (N, 1)), 0)
        S = np.linspace(0.25, 9.75, gamma)[:, None]
        k = gpflow.kernels.SquaredExponential(lengthscales=0.5)
        C = kernel_matrix(k, X) + 0.01 * np.eye(N)
        B = kernel_matrix(k, X, S)
        m = 0.5 * np.diag(kernel_matrix(k, S))
        traces = {}
        for solver in ("clarabel", "barrier"):
            t = time.perf_counter()
            sigma = solve_weak_krylov(C, B, m, small_solver=solver)
            seconds = time.perf_counter() - t
            c = sigma.certificate
            traces[solver] = sigma.trace()
            row = dict(
                N=N,
                gamma=gamma,
                small_solver=solver,
                seconds=seconds,
                trace=sigma.trace(),
                lower_bound=c.lower_bound,
                gap=c.relative_gap,
                margin=c.feasibility_margin,
                k=c.krylov_dimension,
                steps=c.steps,
            )
            record["small_solvers"].append(row)
            _dump(record, path)
            print(
                f"| {N} | {gamma} | {solver} | {seconds:.1f} | {sigma.trace():.10g} | {c.relative_gap:.1e} "
                f"| {c.feasibility_margin:.1e} | {c.krylov_dimension} ({c.steps}) |",
                flush=True,
            )
        del C
        print(
            f"relative trace difference barrier vs Clarabel: "
            f"{abs(traces['barrier'] - traces['clarabel']) / traces['clarabel']:.1e}",
            flush=True,
        )


def _dump(record: dict, path: str) -> None:
    """Write the record so far (each row is saved as soon as it is measured)."""
    if path:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as fh:
            json.dump(record, fh, indent=1)


def main() -> None:
    if "--weak" in sys.argv[1:]:
        weak_main([a for a in sys.argv[1:] if a != "--weak"])
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 2000, 4000, 8000])
    parser.add_argument("--gamma", type=int, default=20)
    parser.add_argument("--dense-max", type=int, default=8000)
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.1f} (1 min), {os.cpu_count()} CPUs")
    warm = np.linspace(0, 10, 300)[:, None]  # untimed warm-up: TensorFlow's first kernel calls
    kw = gpflow.kernels.SquaredExponential(lengthscales=0.5)
    for low_rank in (True, False):
        synthetic_noise_covariance(
            kw, warm, warm[::30], ProportionalKernel(kw, 0.5), noise_variance=0.01, low_rank=low_rank
        )
    print(
        "| N | γ | dense s | low-rank s | dense/low-rank | rank | Krylov dim (steps) | certified margin "
        "| ‖ΔΣ‖_F/‖Σ‖_F | peak RSS GiB |"
    )
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
        print(f"| {N} | {args.gamma} | {cols} | {low.rank} | {diag} | {margin} | {err_text} | {rss:.2f} |", flush=True)
    print(f"load average at end: {os.getloadavg()[0]:.1f} (1 min)")


if __name__ == "__main__":
    main()
