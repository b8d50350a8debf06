"""PVI's result model (FederatedDPOSVGP with q(Z), q(log β)): the batched Monte Carlo over (Z, β) equals a
per-sample oracle built from GPflow's own SquaredExponential and one DPOPosterior per sample (spec §4), for
learned and fixed hyperparameters, DPO and CPO factors, and a non-Gaussian likelihood."""

import gpflow
import numpy as np
import pytest

from gpflow_fed.inducing_variables import GaussianInducingPoints, NaturalFactor, PseudoObservations
from gpflow_fed.models import FederatedDPOSVGP
from gpflow_fed.posteriors import DPOPosterior, LogNormalHyperparameters, dpo_mixture

D, M, J = 2, 5, 9


def _model(learn: bool, likelihood=None, num_samples=7, cpo=False):
    rng = np.random.default_rng(1)
    kernel = gpflow.kernels.SquaredExponential(lengthscales=np.full(D, 0.8) if learn else 0.8)
    lik = likelihood or gpflow.likelihoods.Gaussian(0.1)
    Z = rng.standard_normal((M, D))
    if cpo:
        R = rng.standard_normal((M, M))
        factor = NaturalFactor(rng.standard_normal((M, 1)), R @ R.T, Z=Z)
    else:
        factor = PseudoObservations(
            rng.standard_normal((J, D)), rng.standard_normal((J, 1)), rng.uniform(0.05, 0.5, J), Z=Z
        )
    H = D + 1 + int(isinstance(lik, gpflow.likelihoods.Gaussian))
    q_beta = LogNormalHyperparameters(np.log(np.r_[np.full(D, 0.8), 1.0, 0.1][:H]), 0.05, D) if learn else None
    return FederatedDPOSVGP(
        kernel, lik, factor, GaussianInducingPoints(Z, 0.02), q_beta, num_predict_samples=num_samples
    )


def _oracle(model, X):
    """Per-sample (μ_s, v_s) from a DPOPosterior at Z_s with a GPflow SquaredExponential at β_s."""
    Zs, _, _, _, betas = (c.numpy() for c in model.posterior().cache)
    means, variances = [], []
    for s in range(Zs.shape[0]):
        if model.q_beta is None:
            kernel = model.kernel
        else:
            kernel = gpflow.kernels.SquaredExponential(lengthscales=betas[s, :D], variance=betas[s, D])
        f = model.pseudo
        if isinstance(f, NaturalFactor):
            factor = NaturalFactor(f.eta.numpy(), f.Lam.numpy(), Z=Zs[s])
        else:
            factor = PseudoObservations(f.V.numpy(), f.m.numpy(), f.S_diag.numpy(), Z=Zs[s])
        mean, var = DPOPosterior(kernel, factor, jitter=model.jitter).fused_predict_f(X)
        means.append(mean.numpy())
        variances.append(var.numpy())
    return np.stack(means), np.stack(variances), betas


@pytest.mark.parametrize("learn, cpo", [(True, False), (False, False), (True, True)])
def test_batched_prediction_equals_per_sample_oracle(learn, cpo, monkeypatch):
    monkeypatch.setattr(dpo_mixture, "PREDICT_CHUNK", 4)  # several chunks of test inputs
    model = _model(learn, cpo=cpo)
    X = np.random.default_rng(2).standard_normal((11, D))
    Y = np.random.default_rng(3).standard_normal((11, 1))
    mu, var, betas = _oracle(model, X)
    means, variances, _ = model.posterior().predict_f_samples(X)
    np.testing.assert_allclose(means.numpy(), mu, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(variances.numpy(), var, rtol=1e-9, atol=1e-11)
    noise = betas[:, D + 1][:, None, None] if learn else 0.1
    mean = mu.mean(0)
    np.testing.assert_allclose(model.predict_f(X)[1].numpy(), (var + mu**2).mean(0) - mean**2, rtol=1e-9)
    py_mean, py_var = model.predict_y(X)
    np.testing.assert_allclose(py_mean.numpy(), mean, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(py_var.numpy(), (var + noise + mu**2).mean(0) - mean**2, rtol=1e-9)
    tot = var + noise
    per = -0.5 * np.log(2 * np.pi * tot) - 0.5 * (Y[None] - mu) ** 2 / tot
    expected = np.log(np.mean(np.exp(per[..., 0]), axis=0))
    np.testing.assert_allclose(model.predict_log_density((X, Y)).numpy(), expected, rtol=1e-9)
    # the full covariance's diagonal is the marginal variance
    full = model.predict_f(X, full_cov=True)[1].numpy()
    np.testing.assert_allclose(np.diag(full[0]), model.predict_f(X)[1].numpy()[:, 0], rtol=1e-9, atol=1e-12)


def test_non_gaussian_likelihood_prediction_matches_per_sample_gpflow():
    lik = gpflow.likelihoods.Bernoulli()
    model = _model(False, likelihood=lik)
    X = np.random.default_rng(4).standard_normal((6, D))
    Y = (np.random.default_rng(5).uniform(size=(6, 1)) > 0.5).astype(float)
    mu, var, _ = _oracle(model, X)
    per = np.stack([lik.predict_log_density(X, mu[s], var[s], Y).numpy() for s in range(mu.shape[0])])
    np.testing.assert_allclose(
        model.predict_log_density((X, Y)).numpy(), np.log(np.mean(np.exp(per), axis=0)), rtol=1e-9
    )
    ym = np.stack([lik.predict_mean_and_var(X, mu[s], var[s])[0].numpy() for s in range(mu.shape[0])])
    np.testing.assert_allclose(model.predict_y(X)[0].numpy(), ym.mean(0), rtol=1e-9)
