"""HeterogeneousLikelihood: index validation, agreement with the per-type likelihoods, splitting."""

import gpflow
import numpy as np
import pytest
import tensorflow as tf

from gpflow_fed.likelihoods import HeterogeneousLikelihood


@pytest.fixture
def lik():
    return HeterogeneousLikelihood([gpflow.likelihoods.Gaussian(0.3), gpflow.likelihoods.Bernoulli(invlink=tf.sigmoid)])


def test_matches_component_likelihoods(lik):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((6, 1))
    mu, var = rng.standard_normal((6, 1)), rng.uniform(0.1, 1.0, (6, 1))
    y = np.array([[0.4], [1.0], [-1.2], [0.0], [1.0], [2.0]])
    idx = np.array([[0], [1], [0], [1], [1], [0]], dtype=float)
    Y = np.concatenate([y, idx], axis=1)
    ve = lik.variational_expectations(X, mu, var, Y).numpy()
    for j, component in enumerate(lik.likelihoods):
        rows = idx[:, 0] == j
        expected = component.variational_expectations(X[rows], mu[rows], var[rows], y[rows]).numpy()
        np.testing.assert_allclose(ve[rows], expected, rtol=1e-12)
    # the Bernoulli term is GPflow's 20-point Gauss–Hermite quadrature of log σ(f) (spec §1.2)
    x, w = np.polynomial.hermite.hermgauss(20)
    f = mu[1, 0] + np.sqrt(2 * var[1, 0]) * x
    np.testing.assert_allclose(ve[1], np.sum(w / np.sqrt(np.pi) * -np.log1p(np.exp(-f))), rtol=1e-10)


def test_index_validation(lik):
    X, mu, var = np.zeros((2, 1)), np.zeros((2, 1)), np.ones((2, 1))
    with pytest.raises(ValueError, match=r"integer in \[0, 2\)"):
        lik.variational_expectations(X, mu, var, np.array([[0.0, 0.0], [1.0, 2.0]]))
    with pytest.raises(ValueError, match="integer"):
        lik.check_index(np.array([[0.0, 0.5]]))
    with pytest.raises(ValueError, match="last column"):
        lik.check_index(np.zeros((3, 1)))
    with pytest.raises(ValueError, match="at least one"):
        HeterogeneousLikelihood([])
    compiled = tf.function(lambda Y: lik.predict_log_density(X, mu, var, Y))
    with pytest.raises(tf.errors.InvalidArgumentError, match="out of range"):
        compiled(tf.constant([[0.0, 0.0], [1.0, 5.0]], dtype=gpflow.default_float()))


def test_split_and_with_index(lik):
    X = np.arange(4.0)[:, None]
    Y = np.concatenate([lik.with_index(np.array([[0.1], [0.2]]), 0), lik.with_index(np.array([[1.0], [0.0]]), 1)])
    parts = lik.split(X, Y)
    np.testing.assert_array_equal(parts[0][0], [[0.0], [1.0]])
    np.testing.assert_array_equal(parts[1][1], [[1.0], [0.0]])
