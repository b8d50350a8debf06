"""Secure-aggregation microbenchmark: the plain sum vs encode + mask + sum, all pairs vs the sparse graph.

For K clients each holding an FSGP-sized payload (M inducing points: a lower triangle of M(M+1)/2, an M × M
matrix, an M-vector and a weight; ≈ 3,800 floats for M = 50), one exchange is timed, side by side in one
process:

* ``plain``: the server sums the K float64 payloads;
* ``secure, all pairs`` and ``secure, sparse``: every client encodes its payload in fixed point and masks
  it (:func:`gpflow_fed.federated.protection.masking.mask`: X25519 agreement, HKDF, AES-CTR pads) over the
  masking graph of degree K − 1, resp. the default ``2 ⌈log₂ K⌉``; the server builds the graph, sums the
  masked payloads and decodes. Key generation and the first exchange (which does every key agreement; the
  graph stays the same for the same cohort) are timed once; later exchanges (new pads, cached agreements)
  ``--repeats`` times (stopping after one slower than ``--long`` seconds).

The table gives those times, the median later exchange, its ratio to the plain sum, its cost per client
and per neighbour, and the largest difference between the decoded secure sum and the plain sum. Results
go to ``--json`` with the git commit, the command and the machine's load.

Usage: ``python benchmarks/secure_aggregation.py [--clients 100,300,1000] [--inducing 50] [--repeats 3]
[--long 10] [--json benchmarks/results/secure_aggregation.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Any, Dict, List

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from provenance import command, git_commit  # noqa: E402


def payload(rng: np.random.Generator, M: int) -> Dict[str, np.ndarray]:
    """An FSGP-sized message: ``L`` (the lower triangle of an M × M factor), ``A`` (M × M), ``b`` (M × 1)."""
    return {
        "L": rng.normal(size=M * (M + 1) // 2),
        "A": rng.normal(size=(M, M)),
        "b": rng.normal(size=(M, 1)),
        "weight": np.array([rng.uniform(50, 150)]),
    }


def main(argv: Any = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="100,300,1000", help="comma-separated cohort sizes K")
    parser.add_argument("--inducing", type=int, default=50, help="M: the payload has M(M+1)/2 + M² + M + 1 floats")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--long", type=float, default=10.0, help="do not repeat a configuration slower than this (s)")
    parser.add_argument("--json", default="benchmarks/results/secure_aggregation.json", help="'' to skip")
    args = parser.parse_args(argv)
    sizes = [int(k) for k in args.clients.split(",")]
    if min(sizes) < 2 or args.inducing < 1 or args.repeats < 1:
        raise SystemExit("--clients must be ≥ 2, --inducing and --repeats ≥ 1")

    from gpflow_fed.federated.protection.masking import Exchange, MaskingKeys, SecureAggregation, mask, sum_masked
    from gpflow_fed.federated.protection.wire import FixedPoint, decode_fixed_point
    from gpflow_fed.randomness import new_run_id

    rng = np.random.default_rng(0)
    rows: List[Dict[str, Any]] = []
    run_id = new_run_id()
    for K in sizes:
        cohort = tuple(f"client_{k}" for k in range(K))
        payloads = {c: payload(rng, args.inducing) for c in cohort}
        P = sum(v.size for v in payloads[cohort[0]].values())
        truth = {n: np.sum([p[n] for p in payloads.values()], axis=0) for n in payloads[cohort[0]]}

        def plain() -> Dict[str, np.ndarray]:
            total = {n: np.array(v, dtype=np.float64, copy=True) for n, v in payloads[cohort[0]].items()}
            for c in cohort[1:]:
                for n in total:
                    total[n] += payloads[c][n]
            return total

        def secure(sa: SecureAggregation, keys: Dict[str, Any], round_: int) -> Dict[str, np.ndarray]:
            exchange = Exchange(run_id, "train", round_, "stats", cohort)
            public = {c: k.public_bytes for c, k in keys.items()}
            graph = sa.graph(exchange)
            masked = []
            for c in cohort:
                encoded = {n: FixedPoint(sa.fractional_bits, K).encode(v)[0] for n, v in payloads[c].items()}
                masked.append(mask(keys[c], c, encoded, exchange, public, graph[c]))
            return {n: decode_fixed_point(v, sa.fractional_bits) for n, v in sum_masked(masked).items()}

        def error(out: Dict[str, np.ndarray]) -> float:
            return max(float(np.max(np.abs(out[n] - truth[n]))) for n in truth)

        configs = {
            "plain": None,
            "secure, all pairs": SecureAggregation(degree=K - 1),
            "secure, sparse": SecureAggregation(),
        }
        for name, sa in configs.items():
            row: Dict[str, Any] = {"clients": K, "config": name, "payload_floats": P}
            times: List[float] = []
            if sa is None:
                row.update(degree=0, keygen_seconds=0.0, first_exchange_seconds=None)
                for _ in range(args.repeats):
                    begin = time.perf_counter()
                    out = plain()
                    times.append(time.perf_counter() - begin)
            else:
                row["degree"] = len(sa.graph(Exchange(run_id, "train", 0, "stats", cohort))[cohort[0]])
                begin = time.perf_counter()
                keys = {c: MaskingKeys() for c in cohort}
                row["keygen_seconds"] = time.perf_counter() - begin
                begin = time.perf_counter()
                out = secure(sa, keys, 0)  # first exchange: every key agreement happens here
                row["first_exchange_seconds"] = time.perf_counter() - begin
                for r in range(1, args.repeats + 1):
                    begin = time.perf_counter()
                    out = secure(sa, keys, r)  # later rounds: agreements cached, new pads
                    times.append(time.perf_counter() - begin)
                    if times[-1] > args.long:
                        break
            row.update(seconds=statistics.median(times), all_seconds=times, max_abs_error=error(out))
            rows.append(row)
            print(f"  K={K:5d} {name:18s} {row['seconds']:9.4f} s ({len(times)} runs)", flush=True)

    plain_time = {r["clients"]: r["seconds"] for r in rows if r["config"] == "plain"}
    print(f"\npayload: {rows[0]['payload_floats']} floats (M = {args.inducing}); ", end="")
    print(f"exchange: median of ≤ {args.repeats} rounds after the first")
    print(
        f"{'K':>5} {'configuration':18} {'degree':>6} {'keygen s':>8} {'1st exch s':>10} {'exchange s':>10} "
        f"{'× plain':>8} {'ms/client':>9} {'µs/neighbour':>12} {'max |err|':>9}"
    )
    for r in rows:
        first = f"{r['first_exchange_seconds']:10.3f}" if r["first_exchange_seconds"] is not None else f"{'':10}"
        per_neighbour = f"{1e6 * r['seconds'] / (r['clients'] * r['degree']):12.1f}" if r["degree"] else f"{'':12}"
        print(
            f"{r['clients']:5d} {r['config']:18} {r['degree']:6d} {r['keygen_seconds']:8.3f} {first} "
            f"{r['seconds']:10.4f} "
            f"{r['seconds'] / plain_time[r['clients']]:8.0f} {1e3 * r['seconds'] / r['clients']:9.3f} {per_neighbour} "
            f"{r['max_abs_error']:9.1e}"
        )
    result = {
        "benchmark": "secure_aggregation",
        "command": command(__file__, argv),
        "git_commit": git_commit(),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_average_after": os.getloadavg(),
        },
        "versions": {"numpy": np.__version__, "cryptography": __import__("cryptography").__version__},
        "inducing": args.inducing,
        "rows": rows,
    }
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
        print(f"\nwritten to {args.json}")
    return result


if __name__ == "__main__":
    main()
