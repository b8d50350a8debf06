"""Strong solution (eq. 11): the public PyTorch implementation privacygp vs ours, side by side.

Usage::

    python benchmarks/peer/privacygp_strong.py PEER_CHECKOUT --peer-python PEER_PYTHON
        [--case 0.5:100,200,500,1000,2000,4000 --case 0.001:1000,2000] [--seeds 0 1 2 3 4] [--repeats R] [--quick]
        [--json benchmarks/results/privacygp_strong.json] [--peer-commit SHA]

``PEER_CHECKOUT`` is a checkout of github.com/hchen19/privacygp (BENCHMARKS.md used commit 9067e7f); nothing of
it is copied here. ``PEER_PYTHON`` is a Python with torch and gpytorch 1.13 (privacygp imports ``gpytorch.lazy``),
which need not have TensorFlow: for each case this script writes the inputs to a temporary ``.npz`` and runs
itself under ``PEER_PYTHON`` with ``--peer-worker``, which imports only numpy, torch and the checkout's
``privacygp`` package and sends back the seconds and the root R of privacygp's Σ = RRᵀ.

Problem per case ``ℓ:N,…`` and seed: X ~ U[0, 10] (sorted), Y = sin X + 0.1ε (``privacygp_weak.training_data``),
SE kernel (lengthscale ℓ, variance 1), V = 0.01, γ = 20 evenly spaced training inputs sensitive. privacygp:
``PrivacyGP(X, Y, train=False, noise=0.01, lengthscale=ℓ, outputscale=1, alpha=0.5, privacy_idx=idx)
.obfuscate()`` in float64 (its ``alpha = a`` means Ξ = (1 − a)K_SS, so a = 0.5 ↔ H = 0.5K). Ours:
``synthetic_noise_covariance(k, X, X[idx], ProportionalKernel(k, 0.5), noise_variance=0.01)`` +
``obfuscate(Y, Σ, insecure_noise_seed=0)``. Both timed as the best of ``R`` runs (default 7 for N ≤ 1000, 3
above), the peer and ours alternating case by case. Per case the table gives the seconds, tr Σ of each,
``‖Σ_privacygp − Σ_ours‖_F / ‖Σ_ours‖_F``, the ranks and the strong margin ``λ_min(Cov[f(S) | W] − Ξ)`` of each Σ
from our dense oracle ``verify_privacy`` (≥ −1e-8: the guarantee holds); a last table summarises each case over
the seeds (default 0–4; seed 0 alone is the protocol of the first comparison): mean ± sd of the seconds and of
their ratio, the largest ‖ΔΣ‖_F/‖Σ‖_F, the rank range and the smallest margins.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import numpy as np

GAMMA = 20
NOISE = 0.01
ALPHA = 0.5
DEFAULT_CASES = ["0.5:100,200,500,1000,2000,4000", "0.001:1000,2000"]
QUICK_CASES = ["0.5:100,500", "0.001:500"]


def parse_case(text: str) -> Tuple[float, List[int]]:
    """``"0.5:100,200"`` → ``(0.5, [100, 200])``."""
    try:
        lengthscale, sizes = text.split(":")
        return float(lengthscale), [int(n) for n in sizes.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"a case is LENGTHSCALE:N[,N...], got {text!r}") from None


def sensitive_indices(N: int, gamma: int = GAMMA) -> np.ndarray:
    """``[γ]`` evenly spaced indices into the sorted training inputs (the sensitive ones)."""
    if not 0 < gamma <= N:
        raise ValueError(f"need 0 < gamma <= N, got gamma={gamma}, N={N}")
    return np.round(np.linspace(0, N - 1, gamma)).astype(np.int64)


def best_of(repeats: int, run) -> Tuple[float, object]:
    """The fastest of ``repeats`` timed calls of ``run()`` and the last call's result."""
    seconds, result = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        result = run()
        seconds.append(time.perf_counter() - t)
    return min(seconds), result


def peer_worker(checkout: Path, problem: Path) -> None:
    """Under the peer's Python: time privacygp's ``obfuscate`` on ``problem`` and save its seconds and Σ's root."""
    import torch

    sys.path.insert(0, str(checkout))
    from privacygp.privacygp import PrivacyGP  # the peer's module

    torch.set_default_dtype(torch.float64)  # its likelihood and kernel parameters are created in the default dtype
    data = np.load(problem)
    X, Y = torch.from_numpy(data["X"]), torch.from_numpy(data["Y"][:, 0])
    idx = torch.from_numpy(data["idx"])
    lengthscale, repeats = float(data["lengthscale"]), int(data["repeats"])

    def run():
        gp = PrivacyGP(
            X, Y, train=False, noise=NOISE, lengthscale=lengthscale, outputscale=1, alpha=ALPHA, privacy_idx=idx
        )
        gp.obfuscate()
        return gp

    seconds, gp = best_of(repeats, run)
    np.savez(problem.with_suffix(".peer.npz"), seconds=seconds, root=gp.opt_cov.root.to_dense().detach().numpy())


def run_peer(peer_python: str, checkout: Path, X, Y, idx, lengthscale: float, repeats: int) -> Tuple[float, np.ndarray]:
    """Run :func:`peer_worker` under ``peer_python``; return its best seconds and the ``[N, r]`` root of its Σ."""
    with tempfile.TemporaryDirectory() as folder:
        problem = Path(folder) / "problem.npz"
        np.savez(problem, X=X, Y=Y, idx=idx, lengthscale=lengthscale, repeats=repeats)
        subprocess.run(
            [peer_python, os.path.abspath(__file__), str(checkout), "--peer-worker", str(problem)], check=True
        )
        with np.load(problem.with_suffix(".peer.npz")) as result:
            return float(result["seconds"]), result["root"]


def compare(X, Y, idx, lengthscale: float, repeats: int, peer_seconds: float, peer_root: np.ndarray) -> Dict:
    """Time ours on the same problem and compare its Σ with the peer's ``Σ = RRᵀ`` (one table row)."""
    import gpflow

    from gpflow_fed.release import ProportionalKernel, obfuscate, synthetic_noise_covariance, verify_privacy

    k = gpflow.kernels.SquaredExponential(lengthscales=lengthscale)
    H, S = ProportionalKernel(k, ALPHA), X[idx]

    def run():
        Sigma = synthetic_noise_covariance(k, X, S, H, noise_variance=NOISE)
        obfuscate(Y, Sigma, insecure_noise_seed=0)
        return Sigma

    seconds, Sigma = best_of(repeats, run)
    ours, peer = np.asarray(Sigma), peer_root @ peer_root.T
    margin = {
        name: verify_privacy(k, X, S, H, matrix, noise_variance=NOISE).strong_margin
        for name, matrix in (("peer", peer), ("ours", ours))
    }
    return dict(
        lengthscale=lengthscale,
        N=X.shape[0],
        gamma=idx.shape[0],
        repeats=repeats,
        peer_seconds=peer_seconds,
        ours_seconds=seconds,
        peer_trace=float(np.trace(peer)),
        ours_trace=float(np.trace(ours)),
        rel_frobenius=float(np.linalg.norm(peer - ours) / np.linalg.norm(ours)),
        peer_rank=int(peer_root.shape[1]),
        ours_rank=int(getattr(Sigma, "rank", np.linalg.matrix_rank(ours))),
        peer_margin=margin["peer"],
        ours_margin=margin["ours"],
    )


HEADER = (
    "| N | seed | privacygp s | ours s | privacygp/ours | tr Σ privacygp | tr Σ ours | ‖ΔΣ‖_F/‖Σ‖_F | rank privacygp "
    "| rank ours | strong margin privacygp | strong margin ours |\n" + "|---" * 12 + "|"
)
SUMMARY_HEADER = (
    "| ℓ | N | seeds | privacygp s | ours s | privacygp/ours | max ‖ΔΣ‖_F/‖Σ‖_F | rank privacygp | rank ours "
    "| min strong margin privacygp | min strong margin ours |\n|---|---|---|---|---|---|---|---|---|---|---|"
)


def table_row(row: Dict) -> str:
    """One Markdown row of :data:`HEADER`."""
    return (
        f"| {row['N']} | {row['seed']} | {row['peer_seconds']:.3f} | {row['ours_seconds']:.3f} "
        f"| {row['peer_seconds'] / row['ours_seconds']:.1f} | {row['peer_trace']:.6g} | {row['ours_trace']:.6g} "
        f"| {row['rel_frobenius']:.1e} | {row['peer_rank']} | {row['ours_rank']} | {row['peer_margin']:.1e} "
        f"| {row['ours_margin']:.1e} |"
    )


def mean_sd(values: Sequence[float]) -> Tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    values = np.asarray(values, dtype=float)
    return float(values.mean()), (float(values.std(ddof=1)) if values.size > 1 else 0.0)


def summarise(rows: Sequence[Dict]) -> List[Dict]:
    """Per (ℓ, N), over the seeds: mean and sd of the seconds and their ratio, the worst ΔΣ, ranks and margins."""
    cases: Dict[Tuple[float, int], List[Dict]] = {}
    for row in rows:
        cases.setdefault((row["lengthscale"], row["N"]), []).append(row)
    out = []
    for (lengthscale, N), group in cases.items():
        out.append(
            dict(
                lengthscale=lengthscale,
                N=N,
                seeds=len(group),
                peer_seconds=mean_sd([r["peer_seconds"] for r in group]),
                ours_seconds=mean_sd([r["ours_seconds"] for r in group]),
                ratio=mean_sd([r["peer_seconds"] / r["ours_seconds"] for r in group]),
                max_rel_frobenius=max(r["rel_frobenius"] for r in group),
                peer_rank=(min(r["peer_rank"] for r in group), max(r["peer_rank"] for r in group)),
                ours_rank=(min(r["ours_rank"] for r in group), max(r["ours_rank"] for r in group)),
                min_peer_margin=min(r["peer_margin"] for r in group),
                min_ours_margin=min(r["ours_margin"] for r in group),
            )
        )
    return out


def summary_row(case: Dict) -> str:
    """One Markdown row of :data:`SUMMARY_HEADER`."""

    def pm(pair, digits) -> str:
        return f"{pair[0]:.{digits}f} ± {pair[1]:.{digits}f}"

    def span(pair) -> str:
        return str(pair[0]) if pair[0] == pair[1] else f"{pair[0]}–{pair[1]}"

    return (
        f"| {case['lengthscale']:g} | {case['N']} | {case['seeds']} | {pm(case['peer_seconds'], 3)} "
        f"| {pm(case['ours_seconds'], 3)} | {pm(case['ratio'], 1)} | {case['max_rel_frobenius']:.1e} "
        f"| {span(case['peer_rank'])} | {span(case['ours_rank'])} | {case['min_peer_margin']:.1e} "
        f"| {case['min_ours_margin']:.1e} |"
    )


def recorded_argv(argv: Sequence[str]) -> List[str]:
    """``argv`` with the two paths outside the repository replaced by ``PEER`` and ``PEER_PYTHON``."""
    out, previous = [], None
    for i, word in enumerate(argv):
        out.append("PEER" if i == 0 else "PEER_PYTHON" if previous == "--peer-python" else word)
        previous = word
    return out


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("peer", type=Path, help="path of a privacygp checkout")
    parser.add_argument("--peer-worker", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--peer-python", default=sys.executable, help="a Python with torch and gpytorch 1.13")
    parser.add_argument("--case", type=parse_case, action="append", default=None, help="LENGTHSCALE:N[,N...]")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="data seeds (--quick: 0)")
    parser.add_argument("--repeats", type=int, default=None, help="best of R (default 7 for N ≤ 1000, else 3)")
    parser.add_argument("--quick", action="store_true", help=f"cases {' '.join(QUICK_CASES)}, seed 0, best of 3")
    parser.add_argument("--json", default=None, help="default benchmarks/results/privacygp_strong.json; '' none")
    parser.add_argument("--peer-commit", default=None, help="the peer's commit, when the checkout is an export")
    args = parser.parse_args(argv)
    checkout = args.peer.resolve()
    if args.peer_worker is not None:
        peer_worker(checkout, args.peer_worker)
        return
    if not (checkout / "privacygp" / "privacygp.py").is_file():
        raise SystemExit(f"{checkout} is not a privacygp checkout (no privacygp/privacygp.py)")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from privacygp_weak import resolve_peer_commit, training_data
    from provenance import save

    cases = args.case or [parse_case(c) for c in (QUICK_CASES if args.quick else DEFAULT_CASES)]
    seeds = [0] if args.quick and "--seeds" not in argv else args.seeds
    json_path = ("" if args.quick else "benchmarks/results/privacygp_strong.json") if args.json is None else args.json
    record = dict(peer_commit=resolve_peer_commit(checkout, args.peer_commit), load_start=os.getloadavg()[0], rows=[])
    print(f"load average at start: {record['load_start']:.1f}; privacygp {record['peer_commit']}")
    X, Y = training_data(50)  # untimed warm-up of TensorFlow
    compare(X, Y, sensitive_indices(50, 5), 0.5, 1, 1.0, np.zeros((50, 1)))
    for lengthscale, sizes in cases:
        print(f"\nℓ = {lengthscale}\n\n{HEADER}")
        for N in sizes:
            for seed in seeds:
                X, Y = training_data(N, seed)
                idx = sensitive_indices(N)
                repeats = args.repeats or (3 if args.quick else 7 if N <= 1000 else 3)
                peer_seconds, peer_root = run_peer(args.peer_python, checkout, X, Y, idx, lengthscale, repeats)
                row = dict(seed=seed, **compare(X, Y, idx, lengthscale, repeats, peer_seconds, peer_root))
                record["rows"].append(row)
                print(table_row(row), flush=True)
    record["summary"] = summarise(record["rows"])
    print(f"\nover the seeds\n\n{SUMMARY_HEADER}")
    print("\n".join(summary_row(case) for case in record["summary"]))
    record["load_end"] = os.getloadavg()[0]
    print(f"load average at end: {record['load_end']:.1f}")
    if json_path:
        save(json_path, record, __file__, recorded_argv(argv))
        print(f"wrote {json_path}")


if __name__ == "__main__":
    main()
