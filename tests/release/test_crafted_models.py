"""Crafted ``model.npz`` files that load but predict nonsense (issue 44): refused at load, or predictions refused.

Every file is built here from a small released model (``tmp_path``); the rule is
:func:`gpflow_fed.release.linalg.check_kernel_numerics` and the load's check of the model's predictions at its own
inputs; predictions at a user's inputs go through :func:`gpflow_fed.release.linalg.check_predictions`.
"""

from __future__ import annotations

from pathlib import Path

import gpflow
import numpy as np
import pytest

from gpflow_fed.models import PrivacyAwareGPR
from gpflow_fed.release.lowrank import LowRankCovariance

N = 20


def _model(noise_variance: float = 0.01) -> PrivacyAwareGPR:
    """A released-like model: ``N`` inputs on [0, 1], a rank-1 Σ, SE(ℓ = 0.2, v = 1.3), a Constant mean."""
    rng = np.random.default_rng(0)
    X = np.linspace(0.0, 1.0, N)[:, None]
    W = np.sin(6 * X) + 0.1 * rng.standard_normal(X.shape)
    kernel = gpflow.kernels.SquaredExponential(lengthscales=0.2, variance=1.3)
    Sigma = LowRankCovariance(np.array([0.5]), np.full((N, 1), 1 / np.sqrt(N)))
    return PrivacyAwareGPR((X, W), kernel, Sigma, gpflow.mean_functions.Constant(0.0), noise_variance)


def _crafted(tmp_path: Path, name: str, model: PrivacyAwareGPR | None = None, **changes: np.ndarray) -> Path:
    """The saved ``model`` (default :func:`_model`) with some arrays replaced, as ``tmp_path / name``."""
    good = (model or _model()).save(tmp_path / "good.npz")
    with np.load(good, allow_pickle=False) as data:
        arrays = dict(data)
    arrays.update(changes)
    path = tmp_path / name
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
    return path


def test_a_model_file_with_inputs_beyond_float64s_kernel_range_is_one_value_error(tmp_path: Path) -> None:
    # control: the untouched file loads and predicts a finite mean and a variance ≥ 0
    mean, var = PrivacyAwareGPR.load(_crafted(tmp_path, "ok.npz")).predict_f(np.array([[0.5]]))
    assert np.isfinite(mean.numpy()).all() and (var.numpy() >= 0).all()
    # X = 1e300 (finite) once loaded and predicted NaN; X = 1e9 (‖x/ℓ‖ = 5e9 > 1/√ε) predicted round-off
    for value in (1e300, 1e9):
        path = _crafted(tmp_path, "x.npz", X=np.full((N, 1), value))
        with pytest.raises(ValueError, match="lengthscales from the origin"):
            PrivacyAwareGPR.load(path)


def test_a_model_file_with_a_lengthscale_beyond_float64s_kernel_range_is_one_value_error(tmp_path: Path) -> None:
    # ℓ = 1e-300 once loaded and predicted NaN (X/ℓ overflows when squared)
    path = _crafted(tmp_path, "ls.npz", **{"param.kernel.lengthscales": np.array(1e-300)})
    with pytest.raises(ValueError, match="lengthscales from the origin"):
        PrivacyAwareGPR.load(path)


def test_an_ill_conditioned_model_file_is_one_value_error(tmp_path: Path) -> None:
    # a kernel variance of 1e300 beside σ² = 0.01 once loaded and predicted a variance of −2.7e285
    path = _crafted(tmp_path, "var.npz", **{"param.kernel.variance": np.array(1e300)})
    with pytest.raises(ValueError, match="ill-conditioned"):
        PrivacyAwareGPR.load(path)


def test_a_model_file_whose_predictions_at_its_own_inputs_are_not_finite_is_one_value_error(tmp_path: Path) -> None:
    # σ² = 0 (allowed: deterministic simulators) and every row the same input with different W: C = K + Σ is
    # singular, which no bound on the parameters shows; the predictions at the file's own X decide
    model = _model(noise_variance=0.0)
    X = np.full((N, 1), 0.5)
    path = _crafted(tmp_path, "singular.npz", model, X=X)
    with pytest.raises(ValueError, match="own inputs|Cholesky"):
        PrivacyAwareGPR.load(path)


def test_predictions_that_are_not_finite_at_a_users_inputs_are_one_value_error_not_nan() -> None:
    model = _model()
    # far from the data the SE model predicts its prior, finite, even at 1e300
    mean, var = model.predict_f(np.array([[0.5], [3.0], [1e300]]))
    assert np.isfinite(mean.numpy()).all() and (var.numpy() >= 0).all()
    for full_cov in (False, True):
        for bad in (np.inf, np.nan):  # once returned NaN
            with pytest.raises(ValueError, match="non-finite mean at the inputs given"):
                model.predict_f(np.array([[0.5], [bad]]), full_cov=full_cov)
    # a linear kernel's prior variance v·x² overflows at x = 1e300: once a NaN variance
    X, W = (t.numpy() for t in model.data)
    linear = PrivacyAwareGPR((X, W), gpflow.kernels.Linear(), np.zeros((N, N)), None, 0.01)
    with pytest.raises(ValueError, match="non-finite variance at the inputs given"):
        linear.predict_f(np.array([[0.5], [1e300]]))
