"""DPOPosterior: q(u) two ways (spec T1), KL two ways (T2), pseudo-data = data recovers SGPR (T3)."""

import gpflow
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

import gpflow_fed  # noqa: F401  (activates the registrations)
from gpflow_fed.inducing_variables import PseudoObservations
from gpflow_fed.posteriors import DPOPosterior, dpo_whitened_posterior
from gpflow_fed.posteriors.whitened import whitened_kl

JIT = gpflow.config.default_jitter()


@pytest.fixture
def problem():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(30, 2))
    Y = np.sin(X[:, :1]) + 0.1 * rng.normal(size=(30, 1))
    Z = rng.normal(size=(6, 2))
    V = rng.normal(size=(4, 2))  # M_k = 4 < M = 6: Λ̃_k is singular (spec P2)
    kernel = gpflow.kernels.SquaredExponential(lengthscales=[0.8, 1.3], variance=1.5)
    return X, Y, Z, V, kernel, rng


def natural_q_u(kernel, Z, V, m, S):
    """Reference: paper eqs. (22) and (25) (corrected), with explicit inverses."""
    Kzz = kernel(Z).numpy() + JIT * np.eye(len(Z))
    Kzz_inv = np.linalg.inv(Kzz)
    A = kernel(V, Z).numpy() @ Kzz_inv
    Sinv = np.linalg.inv(S)
    Lam = Kzz_inv + A.T @ Sinv @ A
    Sigma = np.linalg.inv(Lam)
    return Sigma @ (A.T @ Sinv @ m), Sigma


@pytest.mark.parametrize("full", [False, True])
def test_q_u_whitened_equals_natural_form(problem, full):
    X, Y, Z, V, kernel, rng = problem
    m = rng.normal(size=(4, 1))
    S = np.diag(rng.uniform(0.1, 0.5, 4))
    if full:
        R = rng.normal(size=(4, 4))
        S = S + 0.1 * R @ R.T
    iv = PseudoObservations(V, m, S if full else np.diag(S), Z=Z)
    mu, Sigma = DPOPosterior(kernel, iv).q_u()
    mu_ref, Sigma_ref = natural_q_u(kernel, Z, V, m, S)
    np.testing.assert_allclose(mu.numpy(), mu_ref, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(Sigma.numpy(), Sigma_ref, rtol=1e-7, atol=1e-9)


def test_predictive_equals_sparse_gp_formula_and_cache(problem):
    X, Y, Z, V, kernel, rng = problem
    m, s = rng.normal(size=(4, 1)), rng.uniform(0.1, 0.5, 4)
    iv = PseudoObservations(V, m, s, Z=Z)
    post = DPOPosterior(kernel, iv, precompute_cache=gpflow.posteriors.PrecomputeCacheType.TENSOR)
    mean, var = post.predict_f(X)
    mu, Sigma = natural_q_u(kernel, Z, V, m, np.diag(s))
    Kzz = kernel(Z).numpy() + JIT * np.eye(6)
    Kxz = kernel(X, Z).numpy()
    Ainv = np.linalg.solve(Kzz, Kxz.T).T
    np.testing.assert_allclose(mean.numpy(), Ainv @ mu, rtol=1e-7, atol=1e-9)
    ref_var = kernel(X, full_cov=False).numpy() - np.sum(Ainv * ((Kzz - Sigma) @ Ainv.T).T, 1)
    np.testing.assert_allclose(var.numpy()[:, 0], ref_var, rtol=1e-6, atol=1e-9)
    fused = post.fused_predict_f(X)
    np.testing.assert_allclose(fused[0].numpy(), mean.numpy(), rtol=1e-10)
    # GPflow's generic conditional() routes to DPOPosterior through get_posterior_class
    assert gpflow.posteriors.get_posterior_class(kernel, iv) is DPOPosterior
    cond = gpflow.conditionals.conditional(X, iv, kernel, np.zeros((6, 1)))
    np.testing.assert_allclose(cond[1].numpy(), var.numpy(), rtol=1e-10)


def test_kl_two_ways(problem):
    """Whitened standard KL = tfp KL = E_q[log t̄_k] − log 𝒵_k (spec §2.3, T2), cavity from other pseudo-data."""
    X, Y, Z, V, kernel, rng = problem
    Vc, mc, sc = rng.normal(size=(5, 2)), rng.normal(size=(5, 1)), rng.uniform(0.2, 0.6, 5)
    m, s = rng.normal(size=(4, 1)), rng.uniform(0.1, 0.5, 4)
    both = PseudoObservations(np.vstack([Vc, V]), np.vstack([mc, m]), np.concatenate([sc, s]), Z=Z)
    cav = PseudoObservations(Vc, mc, sc, Z=Z)
    _, mu, LB = dpo_whitened_posterior(kernel, tf.constant(Z), both)
    _, mu_c, LB_c = dpo_whitened_posterior(kernel, tf.constant(Z), cav)
    kl = whitened_kl(mu, LB, mu_c, LB_c).numpy()
    q_mu, q_S = DPOPosterior(kernel, both).q_u()
    c_mu, c_S = DPOPosterior(kernel, cav).q_u()
    mvn = tfp.distributions.MultivariateNormalFullCovariance
    ref = tfp.distributions.kl_divergence(mvn(q_mu[:, 0], q_S), mvn(c_mu[:, 0], c_S)).numpy()
    np.testing.assert_allclose(kl, ref, rtol=1e-6)
    Kzz = kernel(Z).numpy() + JIT * np.eye(6)
    A = np.linalg.solve(Kzz, kernel(Z, V).numpy()).T
    qm, qS, cm, cS = q_mu.numpy(), q_S.numpy(), c_mu.numpy(), c_S.numpy()
    from scipy.stats import multivariate_normal as mvn_np

    e_log_t = mvn_np.logpdf(m[:, 0], (A @ qm)[:, 0], np.diag(s)) - 0.5 * np.trace(np.diag(1 / s) @ A @ qS @ A.T)
    log_Z = mvn_np.logpdf(m[:, 0], (A @ cm)[:, 0], A @ cS @ A.T + np.diag(s))
    np.testing.assert_allclose(kl, e_log_t - log_Z, rtol=1e-6)


def test_pseudo_data_equal_to_data_recovers_sgpr(problem):
    """V = X, m = y, S = σ²I: the stock SVGP with a PseudoObservations inducing variable has the SGPR bound and
    predictions (paper eq. 11, spec T3)."""
    X, Y, Z, V, kernel, rng = problem
    noise = 0.05
    iv = PseudoObservations(X, Y, np.full(30, noise), Z=Z)
    sgpr = gpflow.models.SGPR((X, Y), kernel, Z, noise_variance=noise)
    svgp = gpflow.models.SVGP(kernel, gpflow.likelihoods.Gaussian(noise), iv)
    np.testing.assert_allclose(svgp.elbo((X, Y)).numpy(), sgpr.elbo().numpy(), rtol=1e-9)
    for a, b in zip(svgp.predict_f(X[:7]), sgpr.predict_f(X[:7])):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-7, atol=1e-10)


def test_posterior_rejects_other_inducing_variables(problem):
    X, Y, Z, V, kernel, rng = problem
    with pytest.raises(TypeError, match="PseudoObservations"):
        DPOPosterior(kernel, gpflow.inducing_variables.InducingPoints(Z))


def test_natural_factor_of_the_data_recovers_sgpr(problem):
    """The CPO factor of the data, η = K_ZZ⁻¹K_ZX y/σ², Λ = K_ZZ⁻¹K_ZX K_XZ K_ZZ⁻¹/σ² (paper eq. 11), routes to
    DPOPosterior in a stock SVGP and gives SGPR's bound and predictions."""
    from gpflow_fed.inducing_variables import NaturalFactor

    X, Y, Z, V, kernel, rng = problem
    noise = 0.05
    A = np.linalg.solve(kernel(Z).numpy() + JIT * np.eye(6), kernel(Z, X).numpy())
    iv = NaturalFactor(A @ Y / noise, A @ A.T / noise, Z=Z)
    sgpr = gpflow.models.SGPR((X, Y), kernel, Z, noise_variance=noise)
    svgp = gpflow.models.SVGP(kernel, gpflow.likelihoods.Gaussian(noise), iv)
    np.testing.assert_allclose(svgp.elbo((X, Y)).numpy(), sgpr.elbo().numpy(), rtol=1e-8)
    for a, b in zip(svgp.predict_f(X[:7]), sgpr.predict_f(X[:7])):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-7, atol=1e-10)
    with pytest.raises(ValueError, match="symmetric"):
        NaturalFactor(np.zeros(2), np.array([[1.0, 1.0], [0.0, 1.0]]))
    with pytest.raises(ValueError, match="M = 2"):
        NaturalFactor(np.zeros(2), np.eye(3))
