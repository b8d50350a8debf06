"""BayesianLinearRegression equals GPR with the same URK kernel (eqs. 2.4, 2.6, 2.8 vs 2.17, 2.18, 2.26)."""

from __future__ import annotations

import gpflow
import numpy as np
import pytest
import tensorflow as tf
from gpflow.keras import tf_keras

from gpflow_fed.kernels import URK
from gpflow_fed.models import BayesianLinearRegression, blr_statistics

RNG = np.random.default_rng(1)
X = RNG.uniform(-3, 3, size=(40, 2))
Y = np.concatenate([np.sin(X[:, :1]), np.cos(X[:, 1:])], axis=1) + 0.2 * RNG.normal(size=(40, 2))
X_NEW = RNG.uniform(-4, 4, size=(7, 2))


@pytest.mark.parametrize("prior_variance", [1.0, 2.5])
@pytest.mark.parametrize("feature_map", ["fourier", "exponential", "polynomial"])
def test_blr_equals_gpr_with_the_same_urk(prior_variance: float, feature_map: str) -> None:
    scale = 0.3 if feature_map == "exponential" else 1.0
    kernel = URK(2, num_samples=30, seed=3, feature_map=feature_map)
    blr = BayesianLinearRegression((X * scale, Y), kernel, noise_variance=0.3, prior_variance=prior_variance)
    gp_kernel = URK(2, num_samples=30, seed=3, feature_map=feature_map, variance=prior_variance)  # λ²·k
    gpr = gpflow.models.GPR((X * scale, Y), gp_kernel, noise_variance=0.3)
    np.testing.assert_allclose(
        blr.log_marginal_likelihood().numpy(), gpr.log_marginal_likelihood().numpy(), rtol=1e-10, atol=1e-8
    )
    for full_cov in (False, True):
        mb, vb = blr.predict_f(X_NEW * scale, full_cov=full_cov)
        mg, vg = gpr.predict_f(X_NEW * scale, full_cov=full_cov)
        np.testing.assert_allclose(mb.numpy(), mg.numpy(), atol=1e-8)
        np.testing.assert_allclose(vb.numpy(), vg.numpy(), atol=1e-8)
    yb, yv = blr.predict_y(X_NEW * scale)
    gb, gv = gpr.predict_y(X_NEW * scale)
    np.testing.assert_allclose(yv.numpy(), gv.numpy(), atol=1e-8)


def test_gradients_equal_gpr_gradients() -> None:
    net = tf_keras.Sequential([tf_keras.layers.Dense(3, activation="tanh", dtype=gpflow.default_float())])
    kernel = URK(2, num_samples=20, seed=0, feature_extractor=net)
    blr = BayesianLinearRegression((X, Y), kernel, noise_variance=0.4)
    gpr = gpflow.models.GPR((X, Y), kernel, noise_variance=0.4)
    variables = kernel.trainable_variables
    with tf.GradientTape(persistent=True) as tape:
        lb, lg = blr.training_loss(), gpr.training_loss()
    for gb, gg in zip(tape.gradient(lb, variables), tape.gradient(lg, variables)):
        np.testing.assert_allclose(gb.numpy(), gg.numpy(), atol=1e-8)


def test_posterior_weights_closed_form_eq_2_4() -> None:
    kernel = URK(2, num_samples=15, seed=2)
    blr = BayesianLinearRegression((X, Y), kernel, noise_variance=0.5, prior_variance=2.0)
    Phi = kernel.features(X).numpy()
    A = Phi.T @ Phi / 0.5 + np.eye(Phi.shape[1]) / 2.0
    w_mean, a_inv = blr.posterior_weights()
    np.testing.assert_allclose(a_inv.numpy(), np.linalg.inv(A), atol=1e-10)
    np.testing.assert_allclose(w_mean.numpy(), np.linalg.solve(A, Phi.T @ Y) / 0.5, atol=1e-10)


def test_from_statistics_equals_data_model_and_trains_variances() -> None:
    kernel = URK(2, num_samples=15, seed=2)
    blr = BayesianLinearRegression((X, Y), kernel, noise_variance=0.5)
    stats = {k: v.numpy() for k, v in blr_statistics(kernel.features(X), Y).items()}
    summed = BayesianLinearRegression.from_statistics(stats, kernel, noise_variance=0.5)
    np.testing.assert_allclose(
        summed.log_marginal_likelihood().numpy(), blr.log_marginal_likelihood().numpy(), rtol=1e-12
    )
    np.testing.assert_allclose(summed.predict_f(X_NEW)[1].numpy(), blr.predict_f(X_NEW)[1].numpy(), atol=1e-12)
    # the statistics fix the features: only σ² and λ² are trainable, so Scipy runs on trainable_variables
    # (issue 18; the kernel, shared with blr here, is frozen for both)
    assert {id(v) for v in summed.trainable_variables} == {
        id(summed.likelihood.variance.unconstrained_variable),
        id(summed.prior_variance.unconstrained_variable),
    }
    assert not kernel.trainable_variables
    gpflow.optimizers.Scipy().minimize(summed.training_loss, summed.trainable_variables, options={"maxiter": 50})
    gpflow.optimizers.Scipy().minimize(blr.training_loss, blr.trainable_variables, options={"maxiter": 50})
    np.testing.assert_allclose(summed.likelihood.variance.numpy(), blr.likelihood.variance.numpy(), rtol=1e-6)


def test_bad_input() -> None:
    kernel = URK(2, num_samples=5)
    with pytest.raises(ValueError, match="noise_variance"):
        BayesianLinearRegression((X, Y), kernel, noise_variance=0.0)
    with pytest.raises(ValueError, match="prior_variance"):
        BayesianLinearRegression((X, Y), kernel, prior_variance=-1.0)
    with pytest.raises(TypeError, match="features"):
        BayesianLinearRegression((X, Y), gpflow.kernels.SquaredExponential())
    with pytest.raises(ValueError, match="exactly one"):
        BayesianLinearRegression(None, kernel)
    with pytest.raises(ValueError, match="missing"):
        BayesianLinearRegression.from_statistics({"phi_t_phi": np.eye(10)}, kernel)
    with pytest.raises(ValueError, match="phi_t_phi"):
        BayesianLinearRegression.from_statistics(
            {"phi_t_phi": np.eye(3), "phi_t_y": np.zeros((10, 1)), "y_t_y": np.ones(1), "num_data": 3.0}, kernel
        )
    with pytest.raises(TypeError, match="dtype"):
        BayesianLinearRegression((X.astype(np.float32), Y.astype(np.float32)), kernel)
