"""PVIPosteriorModel prediction: the compiled, vectorised Monte Carlo over (Z, β) equals the per-sample
oracle (spec §4) sample by sample, for learned and fixed hyperparameters and for a non-Gaussian likelihood."""

import gpflow
import numpy as np
import pytest
import tensorflow as tf

from gpflow_fed.federated.algorithms import pvi_model
from gpflow_fed.federated.algorithms.pvi_model import PVIPosteriorModel
from gpflow_fed.federated.algorithms.pvi_objective import HyperModel, PseudoSets, predictive_marginals

D, M, J = 2, 5, 9


def _model(learn: bool, likelihood=None, num_samples=7, cpo=False):
    rng = np.random.default_rng(1)
    kernel = gpflow.kernels.SquaredExponential(lengthscales=np.full(D, 0.8) if learn else 0.8)
    lik = likelihood or gpflow.likelihoods.Gaussian(0.1)
    hyper = HyperModel(kernel, lik, D, learn)
    if cpo:
        R = rng.standard_normal((M, M))
        sets = [PseudoSets(eta=tf.constant(rng.standard_normal((M, 1))), Lam=tf.constant(R @ R.T))]
    else:
        sets = [PseudoSets(V=tf.constant(rng.standard_normal((J, D))), m=tf.constant(rng.standard_normal((J, 1))),
                           s=tf.constant(rng.uniform(0.05, 0.5, J)))]
    rho = (np.log(np.r_[np.full(D, 0.8), 1.0, 0.1][: hyper.num_hyper]), np.full(hyper.num_hyper, 0.05)) if learn else None
    Z = rng.standard_normal((M, D))
    return PVIPosteriorModel(hyper, sets, Z, np.full((M, D), 0.02), rho, num_samples=num_samples)


def _oracle(model, X):
    Zs, betas = model.draws()
    out = [predictive_marginals(model.hyper, tf.constant(X), Zs[s], None if betas is None else betas[s], model.sets, model.jitter)
           for s in range(Zs.shape[0])]
    return np.stack([o[0].numpy() for o in out]), np.stack([o[1].numpy() for o in out]), betas


@pytest.mark.parametrize("learn, cpo", [(True, False), (False, False), (True, True)])
def test_vectorised_prediction_equals_per_sample_oracle(learn, cpo, monkeypatch):
    monkeypatch.setattr(pvi_model, "PREDICT_CHUNK", 4)  # several chunks of test inputs
    model = _model(learn, cpo=cpo)
    X = np.random.default_rng(2).standard_normal((11, D))
    Y = np.random.default_rng(3).standard_normal((11, 1))
    mu, var, betas = _oracle(model, X)
    means, variances, _ = model._per_sample(tf.constant(X))
    np.testing.assert_allclose(means.numpy(), mu, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(variances.numpy(), var, rtol=1e-10, atol=1e-12)
    noise = betas.numpy()[:, D + 1][:, None, None] if learn else 0.1
    mean = mu.mean(0)
    np.testing.assert_allclose(model.predict_f(X)[1].numpy(), (var + mu**2).mean(0) - mean**2, rtol=1e-10)
    py_mean, py_var = model.predict_y(X)
    np.testing.assert_allclose(py_mean.numpy(), mean, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(py_var.numpy(), (var + noise + mu**2).mean(0) - mean**2, rtol=1e-10)
    tot = var + noise
    per = -0.5 * np.log(2 * np.pi * tot) - 0.5 * (Y[None] - mu) ** 2 / tot
    expected = np.log(np.mean(np.exp(per[..., 0]), axis=0))
    np.testing.assert_allclose(model.predict_log_density((X, Y)).numpy(), expected, rtol=1e-10)


def test_non_gaussian_likelihood_prediction_matches_per_sample_gpflow():
    lik = gpflow.likelihoods.Bernoulli()
    model = _model(False, likelihood=lik)
    X = np.random.default_rng(4).standard_normal((6, D))
    Y = (np.random.default_rng(5).uniform(size=(6, 1)) > 0.5).astype(float)
    mu, var, _ = _oracle(model, X)
    per = np.stack([lik.predict_log_density(X, mu[s], var[s], Y).numpy() for s in range(mu.shape[0])])
    np.testing.assert_allclose(model.predict_log_density((X, Y)).numpy(), np.log(np.mean(np.exp(per), axis=0)), rtol=1e-10)
    ym = np.stack([lik.predict_mean_and_var(X, mu[s], var[s])[0].numpy() for s in range(mu.shape[0])])
    np.testing.assert_allclose(model.predict_y(X)[0].numpy(), ym.mean(0), rtol=1e-10)
