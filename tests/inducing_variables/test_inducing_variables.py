"""PseudoObservations and GaussianInducingPoints: validation, Kuu/Kuf, sampling and KL."""

import gpflow
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

import gpflow_fed  # noqa: F401
from gpflow_fed.inducing_variables import GaussianInducingPoints, PseudoObservations


def test_pseudo_observations_shapes_and_covariances():
    rng = np.random.default_rng(0)
    V, Z, X = rng.normal(size=(4, 2)), rng.normal(size=(6, 2)), rng.normal(size=(3, 2))
    k = gpflow.kernels.SquaredExponential()
    iv = PseudoObservations(V, np.zeros(4), np.full(4, 0.1), Z=Z)
    assert iv.shape == (6, 2, 1) and int(iv.num_inducing) == 6 and iv.num_pseudo == 4
    np.testing.assert_allclose(gpflow.covariances.Kuu(iv, k, jitter=1e-3).numpy(), k(Z).numpy() + 1e-3 * np.eye(6))
    np.testing.assert_allclose(gpflow.covariances.Kuf(iv, k, X).numpy(), k(Z, X).numpy())
    coupled = PseudoObservations(V, np.zeros(4), np.full(4, 0.1))
    np.testing.assert_allclose(coupled.inducing_inputs.numpy(), V)


def test_full_S_is_stored_through_cholesky():
    R = np.random.default_rng(1).normal(size=(3, 3))
    S = R @ R.T + np.eye(3)
    iv = PseudoObservations(np.zeros((3, 1)) + np.arange(3)[:, None], np.ones(3), S)
    assert iv.full_S
    np.testing.assert_allclose(iv.S.numpy(), S, rtol=1e-12)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(S=np.array([[1.0, 2.0], [2.0, 1.0]])), "not positive definite"),
        (dict(S=np.array([[1.0, 0.5], [0.0, 1.0]])), "not symmetric"),
        (dict(S=np.array([0.1, -0.1])), "diagonal S must be"),
        (dict(S=np.array([0.1, np.nan])), "NaN"),
        (dict(m=np.zeros(3)), "m has 3 entries"),
        (dict(V=np.zeros((0, 1)), m=np.zeros(0), S=np.zeros(0)), "at least one pseudo-point"),
    ],
)
def test_pseudo_observations_bad_input(kwargs, match):
    args = dict(V=np.array([[0.0], [1.0]]), m=np.zeros(2), S=np.array([0.1, 0.1]))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        PseudoObservations(**args)


def test_gaussian_inducing_points_sampling_and_kl():
    rng = np.random.default_rng(2)
    mean, var = rng.normal(size=(5, 2)), rng.uniform(0.1, 0.3, (5, 2))
    q = GaussianInducingPoints(mean, var)
    assert q.shape == (5, 2, 1)
    eps = tf.constant(rng.normal(size=(3, 5, 2)))
    np.testing.assert_allclose(q.sample_from_noise(eps).numpy(), mean + np.sqrt(var) * eps.numpy())
    with tf.GradientTape() as tape:
        total = tf.reduce_sum(q.sample_from_noise(eps))
    assert all(
        g is not None for g in tape.gradient(total, [q.Z_mean.unconstrained_variable, q.Z_var.unconstrained_variable])
    )
    ref = tfp.distributions.kl_divergence(
        tfp.distributions.Normal(mean, np.sqrt(var)), tfp.distributions.Normal(np.zeros_like(mean), 1.0)
    )
    np.testing.assert_allclose(q.kl_divergence().numpy(), np.sum(ref.numpy()), rtol=1e-12)
    samples = q.sample(4000, tf.constant([1, 2], tf.int64)).numpy()
    np.testing.assert_allclose(samples.var(0), var, rtol=0.15)
    k = gpflow.kernels.SquaredExponential()
    np.testing.assert_allclose(gpflow.covariances.Kuu(q, k).numpy(), k(mean).numpy())
    with pytest.raises(ValueError, match="positive"):
        GaussianInducingPoints(mean, -var)


def test_dynamic_pseudo_observations_change_size_and_keep_the_floor():
    """``dynamic=True`` (a PVI cavity): V, m, S can be re-assigned with another J (0 included), and the diagonal S
    is ``S_FLOOR + exp(raw)``."""
    from gpflow_fed.inducing_variables import S_FLOOR

    iv = PseudoObservations(np.zeros((1, 2)), np.zeros(1), np.ones(1), dynamic=True)
    iv.V.assign(np.ones((3, 2))), iv.m.assign(np.zeros((3, 1))), iv.S_diag.assign(np.full(3, 0.5))
    assert iv.num_pseudo == 3
    np.testing.assert_allclose(iv.S_diag.numpy(), 0.5, rtol=1e-12)
    iv.S_diag.unconstrained_variable.assign(np.full(3, -800.0))
    np.testing.assert_allclose(iv.S_diag.numpy(), S_FLOOR, rtol=1e-12)
    iv.V.assign(np.zeros((0, 2))), iv.m.assign(np.zeros((0, 1))), iv.S_diag.assign(np.zeros(0) + 1.0)
    assert iv.num_pseudo == 0
    with pytest.raises(ValueError, match="diagonal S"):
        PseudoObservations(np.zeros((2, 1)), np.zeros(2), np.eye(2), dynamic=True)
