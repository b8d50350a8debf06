"""Utility of distributed DP (the distributed discrete Gaussian) next to central DP, at the same (ε, δ).

The released quantity is the sum of K clients' payloads clipped to L2 norm c = 1 (d numbers each; payloads
``N(0, I_d)`` scaled to norms uniform in [0.5, 2], so about two thirds are clipped). Both mechanisms use
replace-one-client adjacency and spend ε = 3 at δ = 1e-5 (defaults) over R releases of such sums, all K clients in
each; the error is measured against the clipped sum, which both aim at:

* **central (PLD)**: the project's central mechanism
  (:class:`~gpflow_fed.federated.protection.dp.DifferentialPrivacy`, the server adds ``N(0, (z c)²)``), z from its
  ``for_target`` with the PLD accountant (tight for Gaussians); MSE per coordinate ``(z c)²``, also measured;
* **central (zCDP)**: the same Gaussian mechanism accounted as the distributed one is (ρ = 2/z² a release, CKS20's
  conversion): what the looser accounting alone costs (analytic);
* **distributed, t honest**: :class:`~gpflow_fed.federated.protection.distributed_dp.DistributedDP` with
  ``honest_clients = t`` (z from its ``for_target``), every one of the K clients encoding (clip, round, its
  share) and the sum decoded as the server would; the shares are sized for t, so the release carries K/t times
  the target variance. Measured over ``--trials`` draws (randomness from the OS, as deployed), with the analytic
  value ``K σ² γ²`` beside it (rounding adds at most ``K γ²/4``, negligible at the default γ = c/2^30).

The table gives z, the per-coordinate MSE and its ratio to central (PLD), and the encoding time per number
(the exact sampler, pure Python).

Usage: ``python benchmarks/dp_distributed_utility.py [--epsilon 3] [--delta 1e-5] [--clients 10 100]
[--dimensions 100 1000] [--honest 1 0.5 0.1] [--releases 1 10] [--trials 3] [--quick]
[--out benchmarks/results/dp_distributed_utility.json]``; prints a Markdown table.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Any, Dict, List

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from provenance import save  # noqa: E402
from gpflow_fed.federated.protection.distributed_dp import (  # noqa: E402
    DistributedDP,
    DistributedPrivacyAccountant,
    NoiseSource,
    zcdp_epsilon,
)
from gpflow_fed.federated.protection.dp import DifferentialPrivacy, PrivacyAccountant  # noqa: E402


def payloads(K: int, d: int, clip: float, rng: np.random.Generator) -> np.ndarray:
    """K payloads [K, d]: Gaussian directions with norms uniform in [c/2, 2c]."""
    x = rng.normal(size=(K, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True) * rng.uniform(0.5 * clip, 2.0 * clip, size=(K, 1))


def clipped_sum(x: np.ndarray, clip: float) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.sum(x * np.minimum(1.0, clip / norms), axis=0)


def zcdp_noise_multiplier(epsilon: float, delta: float, releases: int) -> float:
    """z of the central Gaussian (std z c, sensitivity 2c: ρ = 2/z² a release) whose R releases reach ε by (C)."""
    low, high = 1e-8, 1e4
    while high / low > 1 + 1e-9:
        mid = math.sqrt(low * high)
        low, high = (mid, high) if zcdp_epsilon(releases * mid, delta) <= epsilon else (low, mid)
    return math.sqrt(2.0 / low)


def measure(K: int, d: int, R: int, args: argparse.Namespace, seed: int) -> List[Dict[str, Any]]:
    rng = np.random.default_rng(seed)
    c = args.clip
    central = DifferentialPrivacy.for_target(
        args.epsilon, args.delta, clip_norm=c, num_clients=K, rounds=0, final_sums=R, accountant="pld"
    )
    accountant = PrivacyAccountant(central)
    accountant.record(K, K, R)
    central_errors = []
    for _ in range(args.trials):  # the release minus the clipped sum is the noise
        noise = rng.normal(0.0, central.noise_std("sum"), size=d)  # benchmark draws; the project's come from the OS
        central_errors.append(float(np.mean(noise**2)))
    base = {"K": K, "d": d, "releases": R, "epsilon_target": args.epsilon, "delta": args.delta}
    rows = [
        {
            **base,
            "mechanism": "central (PLD)",
            "z": central.noise_multiplier,
            "epsilon_spent": accountant.epsilon(),
            "mse_analytic": central.noise_std("sum") ** 2,
            "mse_measured": float(np.mean(central_errors)),
        }
    ]
    z_zcdp = zcdp_noise_multiplier(args.epsilon, args.delta, R)
    rows.append(
        {
            **base,
            "mechanism": "central (zCDP)",
            "z": z_zcdp,
            "epsilon_spent": zcdp_epsilon(R * 2.0 / z_zcdp**2, args.delta),
            "mse_analytic": (z_zcdp * c) ** 2,
            "mse_measured": None,
        }
    )
    for fraction in args.honest:
        t = max(1, int(round(fraction * K)))
        ddp = DistributedDP.for_target(args.epsilon, args.delta, [(R, d)], clip_norm=c, honest_clients=t)
        ddp_accountant = DistributedPrivacyAccountant(ddp)
        ddp_accountant.record(K, K, R, dimension=d)
        errors, seconds = [], 0.0
        for _ in range(args.trials):
            x = payloads(K, d, c, rng)
            source = NoiseSource()
            total = np.zeros(d, dtype=np.uint64)
            start = time.perf_counter()
            for k in range(K):
                total += ddp.encode(x[k], K, source).view(np.uint64)  # wraps modulo 2^64, as masking does
            seconds += time.perf_counter() - start
            errors.append(float(np.mean((ddp.decode(total) - clipped_sum(x, c)) ** 2)))
        rows.append(
            {
                **base,
                "mechanism": f"distributed, t = {t}",
                "honest_clients": t,
                "z": ddp.noise_multiplier,
                "epsilon_spent": ddp_accountant.epsilon(),
                "mse_analytic": K * float(ddp.share_variance(d)) * ddp.step**2,
                "mse_measured": float(np.mean(errors)),
                "mse_measured_se": float(np.std(errors) / math.sqrt(len(errors))) if len(errors) > 1 else None,
                "encode_us_per_number": 1e6 * seconds / (args.trials * K * d),
            }
        )
    for row in rows:
        row["mse_ratio_to_central_pld"] = row["mse_analytic"] / rows[0]["mse_analytic"]
    return rows


def main(argv: List[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epsilon", type=float, default=3.0)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--dimensions", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--honest", type=float, nargs="+", default=[1.0, 0.5, 0.1], help="t as fractions of K")
    parser.add_argument("--releases", type=int, nargs="+", default=[1, 10])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0, help="payloads and the central benchmark's noise only")
    parser.add_argument("--quick", action="store_true", help="K = 10, d = 100, one release, one trial")
    parser.add_argument("--out", default=None, help="save the rows as JSON here")
    args = parser.parse_args(argv)
    if args.quick:
        args.clients, args.dimensions, args.releases, args.trials = [10], [100], [1], 1
    rows: List[Dict[str, Any]] = []
    for K in args.clients:
        for d in args.dimensions:
            for R in args.releases:
                rows += measure(K, d, R, args, args.seed)
                print(f"K={K} d={d} R={R} done", file=sys.stderr, flush=True)
    print(f"ε = {args.epsilon:g}, δ = {args.delta:g}, c = {args.clip:g}; MSE per coordinate of the released sum")
    print()
    print("| K | d | R | mechanism | z | ε spent | MSE (analytic) | MSE (measured) | ÷ central PLD | µs/number |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        measured = "—" if r["mse_measured"] is None else f"{r['mse_measured']:.4g}"
        speed = f"{r['encode_us_per_number']:.1f}" if "encode_us_per_number" in r else "—"
        print(
            f"| {r['K']} | {r['d']} | {r['releases']} | {r['mechanism']} | {r['z']:.4g} | {r['epsilon_spent']:.4g} | "
            f"{r['mse_analytic']:.4g} | {measured} | {r['mse_ratio_to_central_pld']:.3f} | {speed} |"
        )
    if args.out:
        settings = {k: v for k, v in vars(args).items() if k != "out"}
        save(args.out, {"settings": settings, "rows": rows}, __file__, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
