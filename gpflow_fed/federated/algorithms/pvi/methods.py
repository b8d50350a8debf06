"""PVI set up as one of the five methods compared in the PVI paper (Bui et al., arXiv:1811.11206, §6.2), from
the same initial q(log β) and inducing inputs: what ``gpflow-fed pvi`` and ``gpflow_fed.fit(method="pvi")`` run."""

from __future__ import annotations

from typing import Any

import gpflow
import numpy as np

from .algorithm import PVI

__all__ = ["INIT_NOISE", "METHODS", "make_pvi"]

METHODS = ("dpo", "cpo", "fixed", "fixed_dpo", "fedavg", "global")
"""DPO and CPO factors with q(Z); fixed Z (CPO factors, or DPO factors for ``"fixed_dpo"``); FedAvg-Z (the
paper's Alg. 1, DPO factors); global VI
(DPO PVI on the pooled data: the caller gives it a one-client dataset)."""

INIT_NOISE = 0.1
"""Initial mean of q(σ_n²) on standardised targets. Starting at σ_n² = 1 (log β mean 0), the whole variance of
y, starts every method at the "all noise" solution, which sequential PVI with few points per client in many
dimensions never leaves (docs guide "PVI", "The initial noise variance matters")."""


def make_pvi(
    method: str, input_dim: int, rounds: int, M: int, seed: int, init_noise: float = INIT_NOISE, **options: Any
) -> PVI:
    """The sequential :class:`PVI` of one of :data:`METHODS`, with ``M`` inducing inputs drawn from N(0, I)
    (seed ``seed``) and q(log β) starting at lengthscales 1, σ_f² = 1 and σ_n² = ``init_noise``.

    :param options: further :class:`PVI` keywords (``local_steps``, ``patience``, ``alpha``, ...).
    :raises ValueError: an unknown method or a non-positive ``init_noise``.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if not init_noise > 0:
        raise ValueError(f"init_noise (the initial noise variance) must be positive, got {init_noise}")
    Z0 = np.random.default_rng(seed).standard_normal((M, input_dim))
    kernel = gpflow.kernels.SquaredExponential(lengthscales=np.ones(input_dim))
    lik = gpflow.likelihoods.Gaussian(float(init_noise))
    param = {"cpo": "cpo", "fixed": "cpo"}.get(method, "dpo")
    learn = {"fixed": "fixed", "fixed_dpo": "fixed", "fedavg": "fedavg"}.get(method, "distribution")
    return PVI(kernel, Z0, lik, param, "sequential", rounds, learn_inducing=learn, **options)
