"""PVIPosteriorModel: the GPflow model PVI returns, built from the server state alone (spec §4)."""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
from check_shapes import inherit_check_shapes
from gpflow.base import MeanAndVariance
from gpflow.models.model import GPModel
from gpflow.models.training_mixins import ExternalDataTrainingLossMixin

from .pvi_objective import RHO_CLIP, HyperModel, PseudoSets, meanfield_kl_natural, predictive_marginals, sample_terms


class PVIPosteriorModel(GPModel, ExternalDataTrainingLossMixin):
    """q(f, β, Z) = q(Z) q(β) p(f | u, β) q(u | Z, β) with q(u | Z, β) ∝ p(u | Z, β) Π_k t_k(u | Z, β).

    Prediction is Monte Carlo over (Z_s, β_s) ~ q(Z) q(β), S samples with a fixed seed (paper §6):
    ``predict_log_density`` is ``logsumexp_s log ∫ p(y*|f, β_s) q(f|Z_s, β_s) df − log S``; ``predict_f``
    returns the moment-matched mixture mean and variance. ``maximum_log_likelihood_objective(data)`` is the
    global free energy L̃_α of paper eqs. (6), (13), (14) on ``data`` (cavity = prior), Monte Carlo with S samples.

    :param hyper: how β enters the kernel and likelihood.
    :param sets: every client's u-factor (DPO pseudo-sets or summed CPO natural parameters).
    :param Z: fixed Z ``[M, D]``, or the mean of q(Z) when ``Z_var`` is given.
    :param Z_var: variances of q(Z) (None: Z is a point).
    :param rho: ``(mean, var)`` of q(log β) (None: β fixed in ``hyper``).
    """

    def __init__(
        self,
        hyper: HyperModel,
        sets: Sequence[PseudoSets],
        Z: np.ndarray,
        Z_var: Optional[np.ndarray] = None,
        rho: Optional[Tuple[np.ndarray, np.ndarray]] = None,
        *,
        alpha: float = 0.1,
        num_samples: int = 100,
        seed: int = 0,
        jitter: float = 1e-6,
    ) -> None:
        super().__init__(hyper.kernel, hyper.likelihood, None, num_latent_gps=1)
        self.hyper = hyper
        self.sets = list(sets)
        self.Z = tf.constant(Z)
        self.Z_var = None if Z_var is None else tf.constant(Z_var)
        self.rho = None if rho is None else (tf.constant(rho[0]), tf.constant(rho[1]))
        self.alpha, self.num_samples, self.seed, self.jitter = float(alpha), int(num_samples), int(seed), float(jitter)
        if self.num_samples < 1:
            raise ValueError(f"num_samples must be ≥ 1, got {num_samples}")

    def draws(self, num: Optional[int] = None) -> Tuple[tf.Tensor, Optional[tf.Tensor]]:
        """``num`` samples ``(Z_s [S, M, D], β_s [S, H] or None)`` with this model's fixed seed."""
        S = num or self.num_samples
        dtype = self.Z.dtype
        if self.Z_var is None:
            Zs = tf.repeat(self.Z[None], S if self.rho is not None else 1, axis=0)
        else:
            eps = tf.random.stateless_normal([S, *self.Z.shape], seed=[self.seed, 1], dtype=dtype)
            Zs = self.Z[None] + tf.sqrt(self.Z_var)[None] * eps
        if self.rho is None:
            return Zs, None
        eps = tf.random.stateless_normal([Zs.shape[0], self.rho[0].shape[0]], seed=[self.seed, 2], dtype=dtype)
        rho = self.rho[0][None] + tf.sqrt(self.rho[1])[None] * eps
        return Zs, tf.exp(tf.clip_by_value(rho, -RHO_CLIP, RHO_CLIP))

    def _per_sample(self, Xnew: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor, Optional[tf.Tensor]]:
        Zs, betas = self.draws()
        out = [predictive_marginals(self.hyper, Xnew, Zs[s], None if betas is None else betas[s], self.sets, self.jitter) for s in range(Zs.shape[0])]
        return tf.stack([o[0] for o in out]), tf.stack([o[1] for o in out]), betas

    @inherit_check_shapes
    def predict_f(self, Xnew: tf.Tensor, full_cov: bool = False, full_output_cov: bool = False) -> MeanAndVariance:
        if full_cov or full_output_cov:
            raise ValueError("PVIPosteriorModel gives marginal variances only (a mixture over Z, β); use full_cov=False")
        means, variances, _ = self._per_sample(tf.convert_to_tensor(Xnew, self.Z.dtype))
        mean = tf.reduce_mean(means, axis=0)
        return mean, tf.reduce_mean(variances + means**2, axis=0) - mean**2

    @inherit_check_shapes
    def predict_y(self, Xnew: tf.Tensor, full_cov: bool = False, full_output_cov: bool = False) -> MeanAndVariance:
        if full_cov or full_output_cov:
            raise ValueError("PVIPosteriorModel gives marginal variances only; use full_cov=False")
        Xnew = tf.convert_to_tensor(Xnew, self.Z.dtype)
        means, variances, betas = self._per_sample(Xnew)
        noise = [self.hyper.noise(None if betas is None else betas[s]) for s in range(means.shape[0])]
        if noise[0] is not None:
            ys = [(means[s], variances[s] + noise[s]) for s in range(means.shape[0])]
        else:
            ys = [self.likelihood.predict_mean_and_var(Xnew, means[s], variances[s]) for s in range(means.shape[0])]
        m = tf.stack([y[0] for y in ys])
        v = tf.stack([y[1] for y in ys])
        mean = tf.reduce_mean(m, axis=0)
        return mean, tf.reduce_mean(v + m**2, axis=0) - mean**2

    @inherit_check_shapes
    def predict_log_density(self, data: Tuple[tf.Tensor, tf.Tensor], full_cov: bool = False, full_output_cov: bool = False) -> tf.Tensor:
        X, Y = (tf.convert_to_tensor(a, self.Z.dtype) for a in data)
        means, variances, betas = self._per_sample(X)
        per = tf.stack([self.hyper.log_predictive(X, Y, means[s], variances[s], None if betas is None else betas[s]) for s in range(means.shape[0])])
        return tf.reduce_logsumexp(per, axis=0) - np.log(means.shape[0])

    def maximum_log_likelihood_objective(self, data: Tuple[tf.Tensor, tf.Tensor]) -> tf.Tensor:
        X, Y = (tf.convert_to_tensor(a, self.Z.dtype) for a in data)
        Zs, betas = self.draws()
        terms = [sample_terms(self.hyper, X, Y, Zs[s], None if betas is None else betas[s], self.sets, [], tf.constant(self.jitter, X.dtype)) for s in range(Zs.shape[0])]
        bound = tf.add_n([t[0] - t[1] for t in terms]) / len(terms)
        one, zero = tf.ones_like, tf.zeros_like
        if self.rho is not None:
            bound -= meanfield_kl_natural(self.rho[0], self.rho[1], zero(self.rho[0]), one(self.rho[0]))
        if self.Z_var is not None:
            bound -= self.alpha * meanfield_kl_natural(self.Z, self.Z_var, zero(self.Z), one(self.Z))
        return bound

    def elbo(self, data: Tuple[tf.Tensor, tf.Tensor]) -> tf.Tensor:
        """The global free energy L̃_α on ``data`` (see the class docstring)."""
        return self.maximum_log_likelihood_objective(data)
