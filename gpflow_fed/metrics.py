"""Predictive metrics: RMSE, MAE, NLPD, calibration of central predictive intervals (ECE/MCE), Brier, and the
evaluation of a model on a test set (:func:`evaluate_model`, :func:`log_likelihood_per_point`).

The metric functions take numpy arrays (or anything ``np.asarray`` accepts) of matching shape and return floats.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence, Tuple

import numpy as np
from check_shapes import check_shapes
from scipy import stats

if TYPE_CHECKING:
    import gpflow

    from .data.standardize import Standardizer

DEFAULT_LEVELS: Tuple[float, ...] = tuple(np.round(np.arange(0.05, 1.0, 0.05), 2))


def _pair(y: object, mean: object) -> Tuple[np.ndarray, np.ndarray]:
    y_arr, m_arr = np.asarray(y, dtype=float), np.asarray(mean, dtype=float)
    if y_arr.shape != m_arr.shape:
        raise ValueError(f"targets have shape {y_arr.shape} but predictions have shape {m_arr.shape}")
    if y_arr.size == 0:
        raise ValueError("metrics need at least one point")
    return y_arr, m_arr


def _variance(var: object, shape: Tuple[int, ...]) -> np.ndarray:
    v = np.asarray(var, dtype=float)
    if v.shape != shape:
        raise ValueError(f"variances have shape {v.shape}, expected {shape}")
    if np.any(v <= 0) or not np.all(np.isfinite(v)):
        raise ValueError("predictive variances must be finite and positive")
    return v


@check_shapes("y: [N, P]", "mean: [N, P]")
def rmse(y: np.ndarray, mean: np.ndarray) -> float:
    """Root mean squared error ``sqrt(mean((y - mean)²))`` (FSGP paper eq. 20)."""
    y_arr, m_arr = _pair(y, mean)
    return float(np.sqrt(np.mean((y_arr - m_arr) ** 2)))


@check_shapes("y: [N, P]", "mean: [N, P]")
def mae(y: np.ndarray, mean: np.ndarray) -> float:
    """Mean absolute error ``mean(|y - mean|)``."""
    y_arr, m_arr = _pair(y, mean)
    return float(np.mean(np.abs(y_arr - m_arr)))


@check_shapes("y: [N, P]", "mean: [N, P]", "var: [N, P]")
def nlpd(y: np.ndarray, mean: np.ndarray, var: np.ndarray) -> float:
    """Mean negative log predictive density of Gaussian predictions,
    ``mean(½ log(2π var) + (y − mean)² / (2 var))``."""
    y_arr, m_arr = _pair(y, mean)
    v = _variance(var, y_arr.shape)
    return float(np.mean(0.5 * np.log(2 * np.pi * v) + 0.5 * (y_arr - m_arr) ** 2 / v))


@check_shapes("y: [N, P]", "mean: [N, P]", "var: [N, P]", "return[0]: [L]", "return[1]: [L]")
def interval_coverage(
    y: np.ndarray, mean: np.ndarray, var: np.ndarray, levels: Sequence[float] = DEFAULT_LEVELS
) -> Tuple[np.ndarray, np.ndarray]:
    """Empirical coverage of the central predictive intervals at each confidence level.

    For level p the central interval is ``mean ± z·sqrt(var)`` with ``z = Φ⁻¹((1 + p)/2)``.

    :return: ``(levels, coverage)``, both ``[L]``.
    """
    y_arr, m_arr = _pair(y, mean)
    v = _variance(var, y_arr.shape)
    p = np.asarray(levels, dtype=float)
    if p.ndim != 1 or p.size == 0 or np.any((p <= 0) | (p >= 1)):
        raise ValueError("levels must be a non-empty 1-D sequence in (0, 1)")
    z = stats.norm.ppf((1 + p) / 2)
    standardized = np.abs(y_arr - m_arr).ravel() / np.sqrt(v).ravel()
    coverage = np.mean(standardized[None, :] <= z[:, None], axis=1)
    return p, coverage


@check_shapes("y: [N, P]", "mean: [N, P]", "var: [N, P]")
def calibration_errors(
    y: np.ndarray, mean: np.ndarray, var: np.ndarray, levels: Sequence[float] = DEFAULT_LEVELS
) -> Tuple[float, float]:
    """Regression calibration errors of central predictive intervals.

    ``ECE = mean_p |coverage(p) − p|`` and ``MCE = max_p |coverage(p) − p|`` over the confidence levels.
    """
    p, coverage = interval_coverage(y, mean, var, levels)
    gap = np.abs(coverage - p)
    return float(np.mean(gap)), float(np.max(gap))


@check_shapes("y: [N, P]", "mean: [N, P]", "var: [N, P]")
def ece(y: np.ndarray, mean: np.ndarray, var: np.ndarray, levels: Sequence[float] = DEFAULT_LEVELS) -> float:
    """Expected calibration error (see :func:`calibration_errors`)."""
    return calibration_errors(y, mean, var, levels)[0]


@check_shapes("y: [N, P]", "mean: [N, P]", "var: [N, P]")
def mce(y: np.ndarray, mean: np.ndarray, var: np.ndarray, levels: Sequence[float] = DEFAULT_LEVELS) -> float:
    """Maximum calibration error (see :func:`calibration_errors`)."""
    return calibration_errors(y, mean, var, levels)[1]


@check_shapes("y: [N, P]", "prob: [N, P]")
def brier(y: np.ndarray, prob: np.ndarray) -> float:
    """Brier score ``mean((prob − y)²)`` for binary targets ``y ∈ {0, 1}`` and predicted ``P(y = 1)``."""
    y_arr, p_arr = _pair(y, prob)
    if not np.all(np.isin(y_arr, (0.0, 1.0))):
        raise ValueError("Brier score needs binary targets in {0, 1}")
    if np.any((p_arr < 0) | (p_arr > 1)):
        raise ValueError("probabilities must lie in [0, 1]")
    return float(np.mean((p_arr - y_arr) ** 2))


def evaluate_model(
    model: "gpflow.models.GPModel", test: Tuple[np.ndarray, np.ndarray], standardizer: "Optional[Standardizer]" = None
) -> Dict[str, float]:
    """``test_rmse``, ``test_mae`` and ``test_nlpd`` (per point) of ``model.predict_y`` on ``test = (X, Y)``.

    :param standardizer: for a model trained on standardised data and a ``test`` set in the data's units: the
        inputs are standardised before prediction and the predictive mean and variance mapped back, so the
        metrics are in the data's units.
    """
    X, Y = test
    mean, var = (t.numpy() for t in model.predict_y(X if standardizer is None else standardizer.transform(X)))
    if standardizer is not None:
        mean, var = standardizer.inverse_transform(mean, var)
    return {"test_rmse": rmse(Y, mean), "test_mae": mae(Y, mean), "test_nlpd": nlpd(Y, mean, var)}


def log_likelihood_per_point(model: Any, data: Tuple[np.ndarray, np.ndarray]) -> float:
    """The test log-likelihood per point, ``(1/N) Σ_n log p(y_n | x_n)``, of ``model.predict_log_density(data)``.

    Unlike ``−nlpd`` of ``predict_y``'s moments it is the model's own predictive density: for a mixture such as
    :class:`~gpflow_fed.models.FederatedDPOSVGP` (over q(Z) and q(log β)) the mixture's, not a Gaussian's.
    """
    return float(np.mean(model.predict_log_density(data).numpy()))
