"""Recyclable GPs on the real banana data: four quadrant classifiers recycled into one ensemble vs one SVGP.

Protocol (spec ``recyclable-gp.md`` §6.2 (vii)): the 5,300 points of ``benchmarks/data/banana.mat`` (the classic
Rätsch banana set, vendored from the authors' repository; see ``benchmarks/data/README.md``), labels {0, 1}. Per
trial with seed s: ``numpy.random.default_rng(s).permutation`` draws the 67/33 train/test split (3,551 / 1,749
rows, the sizes of scikit-learn's ``test_size=0.33``); inputs are standardised with the training rows' mean and
sd; the training rows are split into the four quadrants by the sign of each coordinate (``quadrant_tasks``).

* **local models:** one fit per quadrant by one ``LocalSVGPTrainer`` (what ``train_local_svgp`` runs, its L-BFGS
  loop traced once for all four), Bernoulli likelihood with the logit link, M_k = 3×3
  inducing points on the grid mean ± sd of the quadrant's inputs, SE kernel started at σ² = 2, ℓ = 0.7,
  everything (q, Z, θ) fitted by L-BFGS; exported with ``export_svgp``;
* **recycled ensemble:** ``EnsembleSVGP`` over the four exported models, M_* = 5×5 inducing points on
  [−2, 2]², same kernel start, collapsed bound then closed-form q (it sees no data);
* **single SVGP:** ``train_local_svgp`` on all training rows, M = 5×5 on [−2, 2]² (the paper's baseline), and
  one with M = 8×8 on [−2.5, 2.5]² (≥ the 4·9 + 25 = 61 inducing points the ensemble's pipeline uses in all).

If the ensemble's fit raises (``K_**⁻¹ + B`` not positive definite: a local model wider than its own prior,
``S_k ⋠ K_k``, which nothing guarantees for a Bernoulli local fit), the trial records the failure and NaN scores, and
the summary averages over the trials that have scores. Scores on the test rows: NLPD = mean −log p(y* | x*)
and the error rate of the 0.5 threshold on p(y* = 1 | x*).
Per trial also the fit seconds, the fitted kernels (ensemble, single SVGPs, every local model) and the
ensemble's final bound. The JSON (``benchmarks/results/recyclable_banana.json``, or ``--out``) is
saved through :mod:`provenance` after every trial, with per-method mean ± sd over the trials and the paired
difference ensemble − single SVGP (5×5) in NLPD. ``--quick``: 2 trials, 30 L-BFGS iterations, saved to
``runs/bench/recyclable_banana_quick.json``.

Every fit runs up to ``--maxiter`` L-BFGS iterations (default 1,000; BENCHMARKS.md also reports 300, the
notebook's recipe, and 3,000).

Usage: ``python benchmarks/recyclable_banana.py [--trials 10] [--maxiter 1000] [--out PATH] [--quick]``
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import warnings
from typing import Dict, List, Optional, Tuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import gpflow  # noqa: E402
import numpy as np  # noqa: E402
import scipy.io  # noqa: E402
import tensorflow as tf  # noqa: E402

from gpflow_fed.data import quadrant_tasks  # noqa: E402
from gpflow_fed.models import EnsembleSVGP, LocalSVGPTrainer, RecyclableWarning, export_svgp  # noqa: E402
from gpflow_fed.models import train_local_svgp  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from provenance import save  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "banana.mat")
DEFAULT_OUT = "benchmarks/results/recyclable_banana.json"
QUICK_OUT = "runs/bench/recyclable_banana_quick.json"
NUM_DATA, CLASS_COUNTS = 5300, (2924, 2376)  # zeros, ones
TEST_FRACTION = 0.33
KERNEL = (2.0, 0.7)  # SE variance and lengthscale every model starts from
ENSEMBLE, SINGLE, LARGE = "recycled ensemble (4 × 3×3 → 5×5)", "single SVGP (5×5)", "single SVGP (8×8)"
METHODS = (ENSEMBLE, SINGLE, LARGE)
Row = Dict[str, object]


def load_banana(path: str = DATA) -> Tuple[np.ndarray, np.ndarray]:
    """``(X [5300, 2], Y [5300, 1])`` in float64 with Y in {0, 1}; refuses any file that is not the vendored set."""
    data = scipy.io.loadmat(path)
    keys = sorted(k for k in data if not k.startswith("__"))
    if keys != ["banana_X", "banana_Y"]:
        raise ValueError(f"{path}: expected the keys banana_X and banana_Y, found {keys}")
    X, Y = np.asarray(data["banana_X"], dtype=np.float64), np.asarray(data["banana_Y"], dtype=np.float64)
    if X.shape != (NUM_DATA, 2) or Y.shape != (NUM_DATA, 1):
        raise ValueError(
            f"{path}: expected banana_X [{NUM_DATA}, 2], banana_Y [{NUM_DATA}, 1]; got {X.shape}, {Y.shape}"
        )
    if not (np.all(np.isfinite(X)) and np.all(np.isfinite(Y))):
        raise ValueError(f"{path}: banana_X or banana_Y holds NaN or inf")
    labels = set(np.unique(Y).tolist())
    if not labels <= {0.0, 1.0}:
        raise ValueError(f"{path}: labels must be coded {{0, 1}}, found {sorted(labels)}")
    counts = (int(np.sum(Y == 0)), int(np.sum(Y == 1)))
    if counts != CLASS_COUNTS:
        raise ValueError(f"{path}: expected {CLASS_COUNTS} zeros/ones (the banana set), found {counts}")
    return X, Y


def split(X: np.ndarray, Y: np.ndarray, seed: int) -> Tuple[np.ndarray, ...]:
    """The 67/33 split of ``seed`` (``default_rng(seed).permutation``; ⌈0.33 N⌉ test rows), inputs standardised
    by the training rows' mean and sd. Returns ``X_train, Y_train, X_test, Y_test``."""
    perm = np.random.default_rng(seed).permutation(len(X))
    num_test = math.ceil(TEST_FRACTION * len(X))
    test, train = perm[:num_test], perm[num_test:]
    mean, sd = X[train].mean(axis=0), X[train].std(axis=0)
    return (X[train] - mean) / sd, Y[train], (X[test] - mean) / sd, Y[test]


def _grid(side: int, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """``side × side`` points on the box ``[lo, hi]`` (one pair of bounds per input dimension)."""
    a, b = (np.linspace(lo[d], hi[d], side) for d in range(2))
    return np.stack(np.meshgrid(a, b), axis=-1).reshape(-1, 2)


def _kernel() -> gpflow.kernels.Kernel:
    return gpflow.kernels.SquaredExponential(variance=KERNEL[0], lengthscales=KERNEL[1])


def _likelihood() -> gpflow.likelihoods.Likelihood:
    return gpflow.likelihoods.Bernoulli(invlink=tf.sigmoid)  # the paper's logit link (GPflow's default is probit)


def _scores(model: gpflow.models.GPModel, X: np.ndarray, Y: np.ndarray) -> Dict[str, float]:
    nlpd = -float(np.mean(model.predict_log_density((X, Y)).numpy()))
    p = model.predict_y(X)[0].numpy()
    return {"nlpd": nlpd, "error": float(np.mean((p > 0.5) != (Y > 0.5)))}


def _kernel_of(model) -> Dict[str, float]:
    """The fitted SE kernel's variance and lengthscale (of a kernel, or of a model's ``.kernel``)."""
    kernel = getattr(model, "kernel", model)
    return {"variance": float(kernel.variance.numpy()), "lengthscale": float(kernel.lengthscales.numpy())}


def run_trial(X: np.ndarray, Y: np.ndarray, seed: int, maxiter: int) -> List[Row]:
    """One trial: the split of ``seed``, the four local models, the ensemble and both single SVGPs."""
    X_tr, Y_tr, X_te, Y_te = split(X, Y, seed)
    t0 = time.perf_counter()
    trainer = LocalSVGPTrainer(_kernel(), _likelihood(), maxiter=maxiter)  # train_local_svgp's, traced once
    local = []
    tasks = quadrant_tasks(X_tr, Y_tr)
    for k, (X_k, Y_k) in enumerate(tasks):
        m, s = X_k.mean(axis=0), X_k.std(axis=0)
        local.append(export_svgp(trainer.fit(X_k, Y_k, _grid(3, m - s, m + s)), name=f"quadrant_{k + 1}"))
    local_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecyclableWarning)
        ensemble = EnsembleSVGP(local, _kernel(), _grid(5, -2.0 * np.ones(2), 2.0 * np.ones(2)), _likelihood())
        try:
            bound, failed = ensemble.fit(maxiter=maxiter, method="collapsed"), None
        except ValueError as error:  # the bound is unbounded in q (a local model wider than its prior): no model
            bound, failed = float("nan"), str(error)
    scores = _scores(ensemble, X_te, Y_te) if failed is None else {"nlpd": float("nan"), "error": float("nan")}
    rows: List[Row] = [
        {
            "method": ENSEMBLE,
            **scores,
            "fit_s": time.perf_counter() - t0,
            "local_s": local_s,
            **_kernel_of(ensemble),
            "bound": bound,
            "failed": failed,
            "max_prior_width_ratio": float(ensemble.prior_width_ratios.max()),  # > 1: some S_k ⋠ K_k
            "local": [{"num_data": len(Y_k), **_kernel_of(m.build_kernel())} for m, (_, Y_k) in zip(local, tasks)],
        }
    ]
    for name, side, half in ((SINGLE, 5, 2.0), (LARGE, 8, 2.5)):
        t0 = time.perf_counter()
        Z = _grid(side, -half * np.ones(2), half * np.ones(2))
        single = train_local_svgp(X_tr, Y_tr, Z, _kernel(), _likelihood(), maxiter=maxiter)
        fit_s = time.perf_counter() - t0
        rows.append({"method": name, **_scores(single, X_te, Y_te), "fit_s": fit_s, **_kernel_of(single)})
    for r in rows:
        r.update(seed=seed, num_train=len(X_tr), num_test=len(X_te))
    return rows


def _mean_sd(values: List[float]) -> Dict[str, float]:
    """Mean and sd (ddof 1) over the finite values (a failed fit scores NaN), and how many there were."""
    finite = [v for v in values if np.isfinite(v)]
    return {
        "mean": float(np.mean(finite)) if finite else float("nan"),
        "sd": float(np.std(finite, ddof=1)) if len(finite) > 1 else 0.0,
        "n": len(finite),
    }


def summarise(rows: List[Row]) -> Dict[str, object]:
    """Per method: mean ± sd (ddof 1) of every score and time over the trials it did not fail; and the paired NLPD
    difference ensemble − single SVGP (5×5) over the trials both have, with the number where the ensemble's NLPD
    is lower."""
    methods: Dict[str, object] = {}
    for method in METHODS:
        mine = [r for r in rows if r["method"] == method]
        keys = [k for k in ("nlpd", "error", "fit_s", "local_s") if mine and k in mine[0]]
        failed = sum(bool(r.get("failed")) for r in mine)
        methods[method] = {
            "trials": len(mine),
            "failed": failed,
            **{k: _mean_sd([float(r[k]) for r in mine]) for k in keys},
        }
    by_seed = {(r["seed"], r["method"]): float(r["nlpd"]) for r in rows}
    seeds = sorted({r["seed"] for r in rows})
    diff = [by_seed[(s, ENSEMBLE)] - by_seed[(s, SINGLE)] for s in seeds]
    diff = [d for d in diff if np.isfinite(d)]
    return {
        "methods": methods,
        "paired_nlpd_ensemble_minus_single": {
            **_mean_sd(diff),
            "per_trial": diff,
            "ensemble_better": int(sum(d < 0 for d in diff)),
            "trials": len(diff),
        },
    }


def parse_trial_arguments(
    parser: argparse.ArgumentParser, argv: Optional[List[str]], default_out: str, quick_out: str
) -> Tuple[argparse.Namespace, str]:
    """``--trials`` (seeds 0..N−1), ``--maxiter``, ``--quick`` (2 trials, 30 iterations) and ``--out``, parsed and
    checked (also for ``recyclable_standins.py``); returns the arguments and the JSON path."""
    parser.add_argument("--trials", type=int, default=10, help="trials with seeds 0..N-1")
    parser.add_argument(
        "--maxiter", type=int, default=1000, help="L-BFGS iterations of every fit (0: all at their start)"
    )
    parser.add_argument("--quick", action="store_true", help=f"2 trials, 30 iterations, saved to {quick_out}")
    parser.add_argument("--out", default=None, help=f"JSON path (default {default_out}; with --quick {quick_out})")
    args = parser.parse_args(argv)
    if args.quick:
        args.trials, args.maxiter = 2, 30
    if args.trials < 1 or args.maxiter < 0:
        parser.error("--trials must be ≥ 1 and --maxiter ≥ 0")
    return args, args.out or (quick_out if args.quick else default_out)


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args, out = parse_trial_arguments(parser, argv, DEFAULT_OUT, QUICK_OUT)
    X, Y = load_banana()
    config = {"trials": args.trials, "maxiter": args.maxiter, "kernel_start": KERNEL, "test_fraction": TEST_FRACTION}
    rows: List[Row] = []
    print("| seed | method | NLPD | error rate | fit (s) | local fits (s) |\n|---|---|---|---|---|---|", flush=True)
    for seed in range(args.trials):
        new = run_trial(X, Y, seed, args.maxiter)
        rows += new
        for r in new:
            print(
                f"| {seed} | {r['method']} | {r['nlpd']:.4f} | {r['error']:.4f} | {r['fit_s']:.2f} | "
                f"{r.get('local_s', float('nan')):.2f} |",
                flush=True,
            )
        payload = {"config": config, "trials_done": seed + 1, "summary": summarise(rows), "rows": rows}
        save(out, payload, __file__, argv)
        print(f"trial {seed} done, saved {out}", file=sys.stderr, flush=True)
    paired = summarise(rows)["paired_nlpd_ensemble_minus_single"]
    print(
        f"NLPD ensemble − single SVGP (5×5): {paired['mean']:+.4f} ± {paired['sd']:.4f}; "
        f"ensemble better in {paired['ensemble_better']} of {paired['trials']} trials",
        flush=True,
    )


if __name__ == "__main__":
    main()
