"""Weak SDP (eq. 10): the public privacygp SDP script (cvxpy + SCS) vs our certified Krylov reduction.

Usage::

    python benchmarks/peer/privacygp_weak.py PEER_CHECKOUT [--sizes 100 200 500 1000] [--gamma 2]
        [--json benchmarks/results/privacygp_weak.json] [--peer-commit SHA]

``PEER_CHECKOUT`` is a checkout of github.com/hchen19/privacygp (the design notes used commit 9067e7f); nothing
of it is copied here. The harness imports its ``experiments/example.py`` and calls ``SDP.solve_sdp`` exactly as
its Examples do: ``min tr X s.t. X ⪰ 0, X ⪰ ssᵢ`` with ``ssᵢ = bᵢbᵢᵀ/mᵢ − (K + V)``, solved by SCS at its
default settings (the method does not use ``self``, so no folders are created in the checkout).

Problem: X ~ U[0, 10] (sorted, seed 0), SE kernel ℓ = 0.5 (variance 1), V = 0.01, γ sensitive inputs evenly
spaced in [0.25, 9.75], ξ = 0.5 (mᵢ = 0.5). For each Σ the table reports the trace, the seconds, and the
feasibility as our dense oracle sees it: ``min_i (Var[f(sᵢ) | W] − ξᵢ)`` (``verify_privacy``; < 0 breaks a
tolerance) and the most negative eigenvalue of Σ (< 0: not a covariance).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import gpflow
import numpy as np

from gpflow_fed.release import synthetic_noise_covariance, verify_privacy


def load_peer(checkout: Path):
    """Import ``experiments/example.py`` of the peer checkout and return its ``SDP`` class."""
    experiments = checkout / "experiments"
    if not (experiments / "example.py").is_file():
        raise SystemExit(f"{checkout} is not a privacygp checkout (no experiments/example.py)")
    sys.path.insert(0, str(experiments))
    import example  # noqa: E402  (the peer's module)

    return example.SDP


def training_data(N: int, seed: int = 0) -> "tuple[np.ndarray, np.ndarray]":
    """``[N, 1]`` inputs X ~ U[0, 10] (sorted) and outputs Y = sin X + 0.1ε, both from ``default_rng(seed)``."""
    rng = np.random.default_rng(seed)
    X = np.sort(rng.uniform(0, 10, (N, 1)), 0)
    return X, np.sin(X) + 0.1 * rng.standard_normal((N, 1))


def resolve_peer_commit(checkout: Path, given: "str | None") -> str:
    """``given`` (for an export, which has no ``.git``), else the checkout's ``HEAD``, else ``"unknown"``."""
    if given:
        return given
    head = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True)
    return head.stdout.strip() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("peer", type=Path, help="path of a privacygp checkout")
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 200, 500, 1000])
    parser.add_argument("--gamma", type=int, default=2)
    parser.add_argument("--json", default="benchmarks/results/privacygp_weak.json")
    parser.add_argument("--peer-commit", default=None, help="the peer's commit, when the checkout is an export")
    args = parser.parse_args()
    SDP = load_peer(args.peer.resolve())
    peer_commit = resolve_peer_commit(args.peer, args.peer_commit)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    record = dict(
        command="python benchmarks/peer/privacygp_weak.py PEER " + " ".join(sys.argv[2:]),
        commit=commit,
        peer_commit=peer_commit,
        load_start=os.getloadavg()[0],
        rows=[],
    )
    print(f"load average at start: {record['load_start']:.1f}; ours {commit}; privacygp {peer_commit}")
    print(
        "| N | γ | privacygp (SCS) s | ours s | privacygp/ours | tr Σ privacygp | tr Σ ours | rel. diff "
        "| min (Var − ξ) privacygp | min (Var − ξ) ours | λ_min Σ privacygp | certified gap ours |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for N in args.sizes:
        X, _ = training_data(N)
        S = np.linspace(0.25, 9.75, args.gamma)[:, None]
        k = gpflow.kernels.SquaredExponential(lengthscales=0.5)
        C = k.K(X).numpy() + 0.01 * np.eye(N)
        B = k.K(X, S).numpy()
        ss = [np.outer(B[:, i], B[:, i]) / 0.5 - C for i in range(args.gamma)]
        t = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):  # the peer prints its optimum and diagonal
            peer = SDP.solve_sdp(None, ss)
        t_peer = time.perf_counter() - t
        peer_sigma = np.asarray(peer["optimal_solution"], dtype=float)
        peer_sigma = 0.5 * (peer_sigma + peer_sigma.T)
        t = time.perf_counter()
        ours = synthetic_noise_covariance(k, X, S, 0.5, noise_variance=0.01, method="weak")
        t_ours = time.perf_counter() - t
        m_peer = verify_privacy(k, X, S, 0.5, peer_sigma, noise_variance=0.01).weak_margin
        m_ours = verify_privacy(k, X, S, 0.5, ours, noise_variance=0.01).weak_margin
        tr_peer, tr_ours = float(np.trace(peer_sigma)), ours.trace()
        row = dict(
            N=N,
            gamma=args.gamma,
            peer_seconds=t_peer,
            ours_seconds=t_ours,
            peer_trace=tr_peer,
            ours_trace=tr_ours,
            rel_diff=abs(tr_peer - tr_ours) / tr_ours,
            peer_margin=m_peer,
            ours_margin=m_ours,
            peer_min_eig=float(np.linalg.eigvalsh(peer_sigma)[0]),
            ours_gap=ours.certificate.relative_gap,
        )
        record["rows"].append(row)
        print(
            f"| {N} | {args.gamma} | {t_peer:.2f} | {t_ours:.2f} | {t_peer / t_ours:.1f} | {tr_peer:.8g} "
            f"| {tr_ours:.8g} | {row['rel_diff']:.1e} | {m_peer:.1e} | {m_ours:.1e} | {row['peer_min_eig']:.1e} "
            f"| {row['ours_gap']:.1e} |",
            flush=True,
        )
    record["load_end"] = os.getloadavg()[0]
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as fh:
            json.dump(record, fh, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
