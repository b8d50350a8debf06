"""Held-out metrics a user can judge: in the target's units, beside a predict-the-mean baseline, with a warning
when the predictive intervals are too narrow. Shared by :func:`gpflow_fed.fit` and the command line.

For a model that predicts in the target's units (a :class:`~gpflow_fed.models.StandardizedModel`) and a test
set ``(X, Y)`` in those units, :func:`held_out_metrics` gives

* ``test_rmse``, ``test_mae``, ``test_nlpd`` in the target's units (NLPD of the Gaussian ``predict_y`` moments,
  per point, in nats);
* ``test_rmse_standardized``, ``test_nlpd_standardized``: the same after ``y ↦ (y − μ_Y)/σ_Y`` with the moments
  the parties agreed on (so ``test_nlpd = test_nlpd_standardized + mean log σ_Y``);
* ``test_coverage_90``: the fraction of test points inside the central 90 % predictive interval.

:func:`mean_baseline` scores the model that predicts ``N(μ_Y, σ_Y²)`` everywhere, from the same public moments:
a model should beat its RMSE. :func:`calibration_message` says (and :func:`fit <gpflow_fed.fit>` and the command
line then warn, :class:`OverconfidenceWarning`) when the 90 % interval covers fewer than :data:`MIN_COVERAGE` of
at least :data:`MIN_TEST_POINTS` test points.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np

__all__ = [
    "COVERAGE_LEVEL",
    "MIN_COVERAGE",
    "MIN_TEST_POINTS",
    "OverconfidenceWarning",
    "calibration_message",
    "held_out_metrics",
    "mean_baseline",
]

#: the central predictive interval whose coverage is reported and checked.
COVERAGE_LEVEL = 0.9
#: below this coverage of the 90 % interval, a fit is reported as over-confident.
MIN_COVERAGE = 0.7
#: fewer test points than this give too noisy a coverage to warn about.
MIN_TEST_POINTS = 10


class OverconfidenceWarning(UserWarning):
    """The held-out 90 % predictive interval covers far fewer than 90 % of the test points."""


def _scores(Y: np.ndarray, mean: np.ndarray, var: np.ndarray, standardizer: Any) -> Dict[str, float]:
    from . import metrics

    _, (coverage,) = metrics.interval_coverage(Y, mean, var, levels=[COVERAGE_LEVEL])
    out = {
        "test_rmse": metrics.rmse(Y, mean),
        "test_mae": metrics.mae(Y, mean),
        "test_nlpd": metrics.nlpd(Y, mean, var),
        "test_coverage_90": float(coverage),
    }
    if standardizer is not None:
        mu, sd = np.asarray(standardizer.Y_mean), np.asarray(standardizer.Y_std)
        Ys, ms, vs = (Y - mu) / sd, (mean - mu) / sd, var / sd**2
        out.update(test_rmse_standardized=metrics.rmse(Ys, ms), test_nlpd_standardized=metrics.nlpd(Ys, ms, vs))
    return out


def held_out_metrics(
    model: Any, test: Tuple[np.ndarray, np.ndarray], standardizer: Optional[Any] = None
) -> Dict[str, float]:
    """The metrics of the module docstring for ``model.predict_y`` on ``test`` (both in the target's units).

    :param standardizer: the moments the model was trained with, for the standardised columns (optional).
    """
    X, Y = test
    mean, var = (np.asarray(t) for t in model.predict_y(X))
    return _scores(np.asarray(Y, dtype=float), mean, var, standardizer)


def mean_baseline(test: Tuple[np.ndarray, np.ndarray], standardizer: Any) -> Dict[str, float]:
    """The metrics of predicting ``N(μ_Y, σ_Y²)`` (the agreed training moments) at every test point."""
    _, Y = test
    Y = np.asarray(Y, dtype=float)
    mean = np.broadcast_to(np.asarray(standardizer.Y_mean, dtype=float), Y.shape)
    var = np.broadcast_to(np.asarray(standardizer.Y_std, dtype=float) ** 2, Y.shape)
    return _scores(Y, mean, var, standardizer)


def calibration_message(scores: Dict[str, float], num_test: int, what: str = "the model") -> Optional[str]:
    """The over-confidence warning's text when the held-out 90 % interval of ``scores`` covers fewer than
    :data:`MIN_COVERAGE` of ``num_test`` ≥ :data:`MIN_TEST_POINTS` points; ``None`` otherwise."""
    coverage = scores.get("test_coverage_90")
    if coverage is None or num_test < MIN_TEST_POINTS or coverage >= MIN_COVERAGE:
        return None
    return (
        f"{what} is over-confident: its 90 % predictive interval covers {coverage:.0%} of the {num_test} held-out "
        f"points (expected about 90 %, warning below {MIN_COVERAGE:.0%}); its error bars are too narrow; compare "
        "test_nlpd with the predict-the-mean baseline, or train longer or with more inducing points"
    )
