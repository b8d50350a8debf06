"""DPOSVGP: the centralized DPO model equals SGPR when the pseudo-data are the data; q(Z) and quadrature paths."""

import gpflow
import numpy as np
import pytest
import tensorflow as tf

from gpflow_fed.inducing_variables import GaussianInducingPoints, PseudoObservations
from gpflow_fed.models import DPOSVGP


@pytest.fixture
def data():
    rng = np.random.default_rng(5)
    X = rng.uniform(-2, 2, (40, 1))
    return X, np.sin(2 * X) + 0.1 * rng.normal(size=(40, 1)), np.linspace(-2, 2, 7)[:, None]


def test_elbo_and_predictions_equal_sgpr(data):
    X, Y, Z = data
    k = gpflow.kernels.SquaredExponential(lengthscales=0.7)
    model = DPOSVGP((X, Y), k, gpflow.likelihoods.Gaussian(0.02), PseudoObservations(X, Y, np.full(40, 0.02), Z=Z))
    sgpr = gpflow.models.SGPR((X, Y), k, Z, noise_variance=0.02)
    np.testing.assert_allclose(model.elbo().numpy(), sgpr.elbo().numpy(), rtol=1e-10)
    for a, b in zip(model.predict_f(X[:5]), sgpr.predict_f(X[:5])):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(
        model.predict_log_density((X, Y)).numpy(), sgpr.predict_log_density((X, Y)).numpy(), rtol=1e-8
    )


def test_q_Z_elbo_is_mc_average_minus_alpha_kl(data):
    """With q(Z) of tiny variance the MC ELBO approaches the point-Z ELBO minus α·KL[q(Z) ‖ N(0, I)]."""
    X, Y, Z = data
    k = gpflow.kernels.SquaredExponential(lengthscales=0.7)
    pseudo = PseudoObservations(X[::2], Y[::2], np.full(20, 0.05), Z=Z)
    lik = gpflow.likelihoods.Gaussian(0.02)
    point = DPOSVGP((X, Y), k, lik, pseudo).elbo().numpy()
    qZ = GaussianInducingPoints(Z, 1e-12)
    model = DPOSVGP((X, Y), k, lik, pseudo, qZ, alpha=0.3, num_samples=2, num_predict_samples=3)
    np.testing.assert_allclose(model.elbo().numpy(), point - 0.3 * qZ.kl_divergence().numpy(), rtol=1e-6)
    mean, var = model.predict_f(X[:4])
    assert mean.shape == (4, 1) and np.all(var.numpy() > 0)
    assert model.predict_log_density((X, Y)).shape == (40,)
    loss = model.training_loss_closure(compile=False)
    with tf.GradientTape() as tape:
        value = loss()
    grads = tape.gradient(value, model.trainable_variables)
    assert all(g is not None and np.all(np.isfinite(g.numpy())) for g in grads)


def test_non_gaussian_likelihood_uses_quadrature(data):
    X, Y, Z = data
    Yb = (Y > 0).astype(float)
    k = gpflow.kernels.SquaredExponential()
    pseudo = PseudoObservations(X[:10], np.zeros(10), np.full(10, 1.0), Z=Z)
    model = DPOSVGP((X, Yb), k, gpflow.likelihoods.Bernoulli(), pseudo)
    mean, var = model.predict_f(X)
    ref = gpflow.likelihoods.Bernoulli().variational_expectations(X, mean, var, Yb)
    kl = gpflow.kullback_leiblers.prior_kl(pseudo, k, None, None)
    np.testing.assert_allclose(model.elbo().numpy(), np.sum(ref.numpy()) - kl.numpy(), rtol=1e-10)


def test_bad_input(data):
    X, Y, Z = data
    k, lik = gpflow.kernels.SquaredExponential(), gpflow.likelihoods.Gaussian()
    pseudo = PseudoObservations(X[:5], Y[:5], np.full(5, 0.1), Z=Z)
    with pytest.raises(ValueError, match="alpha"):
        DPOSVGP((X, Y), k, lik, pseudo, GaussianInducingPoints(Z), alpha=1.5)
    with pytest.raises(ValueError, match="inducing inputs Z"):
        DPOSVGP((X, Y), k, lik, PseudoObservations(X[:5], Y[:5], np.full(5, 0.1)))
    with pytest.raises(TypeError, match="PseudoObservations"):
        DPOSVGP((X, Y), k, lik, Z)
    with pytest.raises(ValueError, match="NaN"):
        DPOSVGP((X, Y * np.nan), k, lik, pseudo)


def test_mean_function_shifts_every_sample_of_the_mixture(data):
    """With q(Z), a constant mean function c moves the mixture mean by c and leaves the variance unchanged."""
    X, Y, Z = data
    k, lik = gpflow.kernels.SquaredExponential(lengthscales=0.7), gpflow.likelihoods.Gaussian(0.02)
    pseudo = PseudoObservations(X[::2], Y[::2], np.full(20, 0.05), Z=Z)

    def model(mf):
        return DPOSVGP((X, Y), k, lik, pseudo, GaussianInducingPoints(Z, 0.01), num_predict_samples=4, mean_function=mf)

    plain, shifted = model(None), model(gpflow.mean_functions.Constant(1.5))
    (m0, v0), (m1, v1) = plain.predict_f(X[:5]), shifted.predict_f(X[:5])
    np.testing.assert_allclose(m1.numpy() - m0.numpy(), 1.5, rtol=1e-12)
    np.testing.assert_allclose(v1.numpy(), v0.numpy(), rtol=1e-10)
    np.testing.assert_allclose(
        shifted.predict_log_density((X, Y + 1.5)).numpy(), plain.predict_log_density((X, Y)).numpy(), rtol=1e-10
    )


def test_q_beta_elbo_approaches_point_beta_elbo_minus_kl(data):
    """A q(log β) of tiny variance at log β = log(ℓ, σ_f², σ_n²) gives the point-β ELBO minus KL[q(β) ‖ p(β)],
    and the kernel's own parameters are then not trainable."""
    from gpflow_fed.posteriors import LogNormalHyperparameters

    X, Y, Z = data
    pseudo = PseudoObservations(X[::2], Y[::2], np.full(20, 0.05), Z=Z)
    point = (
        DPOSVGP(
            (X, Y),
            gpflow.kernels.SquaredExponential(lengthscales=0.7, variance=1.3),
            gpflow.likelihoods.Gaussian(0.02),
            pseudo,
        )
        .elbo()
        .numpy()
    )
    q_beta = LogNormalHyperparameters(np.log([0.7, 1.3, 0.02]), 1e-14, 1)
    kernel = gpflow.kernels.SquaredExponential()
    model = DPOSVGP((X, Y), kernel, gpflow.likelihoods.Gaussian(), pseudo, q_beta=q_beta, num_samples=2)
    np.testing.assert_allclose(model.elbo().numpy(), point - q_beta.kl_divergence().numpy(), rtol=1e-6)
    assert not any(p.trainable for p in (kernel.lengthscales, kernel.variance, model.likelihood.variance))
    with pytest.raises(ValueError, match="D \\+ 1"):
        LogNormalHyperparameters(np.zeros(5), 1.0, 1)
    with pytest.raises(ValueError, match="positive"):
        LogNormalHyperparameters(np.zeros(3), -1.0, 1)
    with pytest.raises(ValueError, match="Gaussian"):
        DPOSVGP((X, Y), kernel, gpflow.likelihoods.Bernoulli(), pseudo, q_beta=q_beta)
