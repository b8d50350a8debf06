"""The public models of gpflow-fed as conformance cases: tiny instances, each with one parameter to change and
a way to build a fresh model at the changed value (the oracle of "predictions follow the parameters")."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

import gpflow
import numpy as np
import tensorflow as tf

D = 1
RNG = np.random.default_rng(18)
X = np.sort(RNG.uniform(-2, 2, (24, D)), axis=0)
Y = np.sin(2 * X) + 0.1 * RNG.standard_normal(X.shape)
XS = np.linspace(-2.5, 2.5, 7)[:, None]
YS = np.sin(2 * XS)
Z = np.linspace(-2, 2, 5)[:, None]


@dataclass
class Case:
    """``build(value)`` makes a model whose parameter ``path`` (a ``parameter_dict`` key) equals ``value``;
    ``value`` and ``changed`` are two admissible values."""

    name: str
    build: Callable[[float], Any]
    path: str
    value: float
    changed: float


def _aggregated(noise: float):
    from gpflow_fed.federated.algorithms.fsgp.statistics import sgpr_statistics
    from gpflow_fed.models import AggregatedSGPR

    kernel = gpflow.kernels.SquaredExponential(lengthscales=0.7)
    iv = gpflow.inducing_variables.InducingPoints(Z)
    s = sgpr_statistics(kernel, iv, tf.constant(X), tf.constant(Y))
    return AggregatedSGPR(
        kernel,
        Z,
        noise,
        s.kuf_kfu.numpy(),
        s.kuf_y.numpy(),
        num_data=s.num_data.numpy(),
        y_squared_sum=s.y_squared_sum.numpy(),
        trace_kff=s.trace_kff.numpy(),
    )


def _urk(lengthscale: float = 0.7):
    from gpflow_fed.kernels import URK

    return URK(D, num_samples=8, seed=3, feature_map_options={"lengthscales": lengthscale})


def _blr(lengthscale: float):
    from gpflow_fed.models import BayesianLinearRegression

    return BayesianLinearRegression((X, Y), _urk(lengthscale), noise_variance=0.1)


def _dposvgp(lengthscale: float):
    from gpflow_fed.inducing_variables import PseudoObservations
    from gpflow_fed.models import DPOSVGP

    pseudo = PseudoObservations(X[::3].copy(), Y[::3].copy(), np.full(8, 0.05), Z=Z.copy())
    return DPOSVGP(
        (X, Y), gpflow.kernels.SquaredExponential(lengthscales=lengthscale), gpflow.likelihoods.Gaussian(0.1), pseudo
    )


@functools.lru_cache(maxsize=None)
def _local_models():
    """Two local sparse GPs holding the exact posterior of their half of the data, q(u) = N(K(K + σ²I)⁻¹y,
    K − K(K + σ²I)⁻¹K) at Z_k ⊂ X_k with Z_k = X_k (no optimiser: the conformance checks need any fitted q)."""
    from gpflow_fed.models import RecyclableModel
    from gpflow_fed.models.serialization import kernel_spec

    kernel = gpflow.kernels.SquaredExponential(lengthscales=0.7)
    out = []
    for part in (slice(0, 24, 6), slice(3, 24, 6)):
        Xk, Yk = X[part], Y[part]
        K = kernel(Xk).numpy() + gpflow.config.default_jitter() * np.eye(len(Xk))
        A = np.linalg.solve(K + 0.1 * np.eye(len(Xk)), K).T
        S = K - A @ K
        out.append(
            RecyclableModel(
                A @ Yk,
                np.linalg.cholesky(0.5 * (S + S.T)),
                Xk,
                kernel_spec(kernel),
                {"class": "Gaussian", "variance": 0.1},
            )
        )
    return tuple(out)


def _ensemble(lengthscale: float, local_models=None):
    from gpflow_fed.models import EnsembleSVGP

    models = local_models if local_models is not None else _local_models()
    rng = np.random.default_rng(0)
    q_sqrt = np.tril(0.1 * rng.standard_normal((5, 5)), -1) + np.diag(rng.uniform(0.3, 0.6, 5))
    return EnsembleSVGP(
        list(models),
        gpflow.kernels.SquaredExponential(lengthscales=lengthscale),
        Z.copy(),
        q_mu=rng.standard_normal((5, 1)),
        q_sqrt=q_sqrt,
    )


def _privacy_aware(lengthscale: float):
    from gpflow_fed.models import PrivacyAwareGPR

    Sigma = 0.02 * np.exp(-0.5 * (X - X.T) ** 2)
    return PrivacyAwareGPR(
        (X, Y),
        gpflow.kernels.SquaredExponential(lengthscales=lengthscale),
        Sigma,
        gpflow.mean_functions.Constant(0.1),
        noise_variance=0.01,
    )


def _dataset(test=True):
    from gpflow_fed.data import FederatedDataset

    return FederatedDataset([(X[i::2], Y[i::2]) for i in range(2)], test=(XS, YS) if test else None)


@functools.lru_cache(maxsize=None)
def _fsgp_result():
    from gpflow_fed.federated import run
    from gpflow_fed.federated.algorithms import FSGP

    algorithm = FSGP(
        gpflow.kernels.SquaredExponential(lengthscales=0.7), Z.copy(), 0.1, rounds=1, local_steps=2, learning_rate=0.01
    )
    return run(algorithm, _dataset()).model


def _fsgp(noise: float):
    """FSGP's ``result.model`` with σ² replaced: its statistics do not depend on σ²."""
    from gpflow_fed.models import AggregatedSGPR

    m = _fsgp_result()
    return AggregatedSGPR(
        gpflow.utilities.deepcopy(m.kernel),
        m.inducing_variable.Z.numpy(),
        noise,
        m.kuf_kfu.numpy(),
        m.kuf_y.numpy(),
        num_data=m.num_data.numpy(),
        y_squared_sum=m.y_squared_sum.numpy(),
        trace_kff=m.trace_kff.numpy(),
        whitened=m.whitened,
    )


@functools.lru_cache(maxsize=None)
def _fedbnr_result():
    from gpflow_fed.federated import run
    from gpflow_fed.federated.algorithms import FedBNR

    return run(FedBNR(_urk(), noise_variance=0.1, rounds=1, local_steps=2, compile=False), _dataset()).model


def _fedbnr(noise: float):
    """FedBNR's ``result.model`` with σ² replaced (the statistics Σ φᵀφ, Σ φᵀy do not depend on it)."""
    from gpflow_fed.models import BayesianLinearRegression

    m = _fedbnr_result()
    return BayesianLinearRegression.from_statistics(
        {k: v.numpy() for k, v in m.statistics().items()},
        gpflow.utilities.deepcopy(m.kernel),
        noise,
        float(m.prior_variance.numpy()),
    )


@functools.lru_cache(maxsize=None)
def _recycle_result():
    from gpflow_fed.federated import run
    from gpflow_fed.federated.algorithms import Recycle

    algorithm = Recycle(
        gpflow.kernels.SquaredExponential(lengthscales=0.7), Z.copy(), num_local_inducing=4, local_maxiter=2, maxiter=2
    )
    return run(algorithm, _dataset()).model


def _recycle(lengthscale: float):
    """Recycle's ``result.model`` rebuilt from its local models and q at another global lengthscale."""
    from gpflow_fed.models import EnsembleSVGP

    m = _recycle_result()
    kernel = gpflow.utilities.deepcopy(m.kernel)
    kernel.lengthscales.assign(lengthscale)
    return EnsembleSVGP(
        list(m.local_models),
        kernel,
        m.inducing_variable.Z.numpy(),
        likelihood=m.likelihood,
        q_mu=m.q_mu.numpy(),
        q_sqrt=m.q_sqrt.numpy(),
        whiten=m.whiten,
        kl=m.kl,
        jitter=m.jitter,
    )


@functools.lru_cache(maxsize=None)
def _pvi_result():
    from gpflow_fed.federated import run
    from gpflow_fed.federated.algorithms import PVI

    algorithm = PVI(
        gpflow.kernels.SquaredExponential(lengthscales=0.7),
        Z.copy(),
        gpflow.likelihoods.Gaussian(0.1),
        rounds=2,
        learn_inducing="fixed",
        learn_hyperparameters=False,
        pseudo_fraction=1.0,
    )
    return run(algorithm, _dataset(test=False)).model  # no test set: the model has not predicted yet


def _pvi(value: float):
    import copy

    m = copy.deepcopy(_pvi_result())
    gpflow.utilities.multiple_assign(m, {PVI_PATH: np.asarray(value)})
    return m


PVI_PATH = ".kernel.lengthscales"

CASES = [
    Case("AggregatedSGPR", _aggregated, ".likelihood.variance", 0.1, 0.2),
    Case("BayesianLinearRegression", _blr, ".kernel.feature_map.lengthscales", 0.7, 0.9),
    Case("DPOSVGP", _dposvgp, ".kernel.lengthscales", 0.7, 0.9),
    Case("EnsembleSVGP", _ensemble, ".kernel.lengthscales", 0.7, 0.9),
    Case("PrivacyAwareGPR", _privacy_aware, ".kernel.lengthscales", 0.7, 0.9),
    Case("FSGP.result", _fsgp, ".likelihood.variance", 0.1, 0.2),
    Case("FedBNR.result", _fedbnr, ".likelihood.variance", 0.1, 0.2),
    Case("Recycle.result", _recycle, ".kernel.lengthscales", 0.7, 0.9),
    Case("PVI.result", _pvi, PVI_PATH, 0.7, 0.9),
]
