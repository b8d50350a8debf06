"""DPOMixturePosterior: the predictive of a DPO sparse GP with a distribution over Z and/or β.

Paper: *Federated Learning of Sparse Gaussian Processes* (the PVI paper of the docs guide 'PVI'), §6:
``q(f_*) = (1/S) Σ_s q(f_* | Z_s, β_s)`` with ``(Z_s, β_s) ~ q(Z) q(β)`` drawn with a fixed stateless seed, and
``q(f_* | Z_s, β_s)`` the DPO posterior at that sample with every u-factor projected onto ``Z_s`` (paper eq. 22,
in the whitened form of :func:`~gpflow_fed.posteriors.dpo_posterior.dpo_whitened_posterior`).
All S samples are computed as one batch. Like GPflow's posteriors, the per-sample factors are a cache computed
from the current parameters: ``NOCACHE`` (what the models' ``predict_f`` uses) recomputes them at every call,
``TENSOR``/``VARIABLE`` freeze them until :meth:`update_cache`.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple, Union, cast

import gpflow
import tensorflow as tf
from check_shapes import check_shapes
from gpflow.base import MeanAndVariance
from gpflow.posteriors import AbstractPosterior, PrecomputeCacheType, PrecomputedValue

from ..inducing_variables import GaussianInducingPoints
from .dpo_posterior import UFactor, dpo_whitened_posterior
from .hyperparameters import LogNormalHyperparameters
from .whitened import whitened_marginals

PREDICT_CHUNK = 2048
"""Test inputs per batched prediction step (bounds the ``[S, M, chunk]`` intermediate)."""


def draw_samples(
    q_Z: Optional[GaussianInducingPoints],
    Z: Optional[tf.Tensor],
    q_beta: Optional[LogNormalHyperparameters],
    num_samples: int,
    seed: tf.Tensor,
) -> Tuple[tf.Tensor, Optional[tf.Tensor]]:
    """``(Z_s [S, M, D], β_s [S, H] or None)``: Z from q(Z) with the stateless ``seed`` (or the point ``Z``), β from
    q(β) with ``seed + [0, 1]``. Without any distribution S is 1."""
    if q_Z is not None:
        Zs = q_Z.sample(num_samples, seed)
    else:
        Zs = tf.repeat(tf.convert_to_tensor(Z)[None], num_samples if q_beta is not None else 1, axis=0)
    if q_beta is None:
        return Zs, None
    return Zs, q_beta.sample(Zs.shape[0], seed + tf.constant([0, 1], seed.dtype))


def sampled_kernel(
    kernel: gpflow.kernels.Kernel, q_beta: Optional[LogNormalHyperparameters], betas: Optional[tf.Tensor]
) -> Callable:
    """The kernel of each sample: ``kernel`` itself (fixed β) or q(β)'s SE-ARD at ``betas``."""
    # betas are sampled only from a q(β)
    return kernel if betas is None else cast(LogNormalHyperparameters, q_beta).kernel(betas)


@check_shapes(
    "Zs: [S, M, D]",
    "L: [S, M, M]",
    "mu: [S, M, 1]",
    "LB: [S, M, M]",
    "Xnew: [N, D]",
    "return[0]: [S, N, 1]",
    "return[1]: [S, N, 1] if not full_cov",
    "return[1]: [S, N, N] if full_cov",
)
def per_sample_conditional(
    kern: Callable, Zs: tf.Tensor, L: tf.Tensor, mu: tf.Tensor, LB: tf.Tensor, Xnew: tf.Tensor, full_cov: bool = False
) -> Tuple[tf.Tensor, tf.Tensor]:
    """``q(f_* | Z_s, β_s)`` for every sample s (marginals, or full covariances with ``full_cov``), in chunks of
    :data:`PREDICT_CHUNK` test inputs when marginal."""
    S = tf.shape(Zs)[0]

    def one(X: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
        A = tf.linalg.triangular_solve(L, kern(Zs, X), lower=True)
        if full_cov:
            LBinvA = tf.linalg.triangular_solve(LB, A, lower=True)
            cov = kern(X) - tf.matmul(A, A, transpose_a=True) + tf.matmul(LBinvA, LBinvA, transpose_a=True)
            return tf.matmul(A, mu, transpose_a=True), cov
        Kdiag = kern(X, full_cov=False)
        Kdiag = tf.broadcast_to(Kdiag, tf.concat([[S], tf.shape(X)[:1]], 0))
        return whitened_marginals(A, Kdiag, mu, LB)

    N = Xnew.shape[0]
    if full_cov or N is None or N <= PREDICT_CHUNK:
        return one(Xnew)
    chunks = [one(Xnew[i : i + PREDICT_CHUNK]) for i in range(0, N, PREDICT_CHUNK)]
    return tf.concat([c[0] for c in chunks], axis=1), tf.concat([c[1] for c in chunks], axis=1)


@check_shapes("means: [S, N, 1]", "variances: [S, N, 1]", "return[0]: [N, 1]", "return[1]: [N, 1]")
def mixture_moments(means: tf.Tensor, variances: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
    """Moment-matched mixture ``mean = (1/S) Σ μ_s``, ``var = (1/S) Σ (v_s + μ_s²) − mean²``."""
    mean = tf.reduce_mean(means, axis=0)
    return mean, tf.reduce_mean(variances + means**2, axis=0) - mean**2


class DPOMixturePosterior(AbstractPosterior):
    """Monte-Carlo mixture over ``(Z_s, β_s)`` of DPO posteriors (the PVI paper's predictive, §6).

    :param kernel: the GPflow kernel (used when β is fixed; with ``q_beta`` the SE-ARD kernel of each sample).
    :param factors: the u-factor(s): :class:`~gpflow_fed.inducing_variables.PseudoObservations` and/or
        :class:`~gpflow_fed.inducing_variables.NaturalFactor`.
    :param q_Z: q(Z), or None for the point ``Z``.
    :param Z: point inducing inputs ``[M, D]`` (when ``q_Z`` is None).
    :param q_beta: q(log β), or None for the kernel's own (fixed) hyperparameters.
    :param num_samples: S.
    :param seed: the stateless seed ``[2]`` of the draws.
    :param jitter: added to K_ZZ before its Cholesky.
    """

    def __init__(
        self,
        kernel: gpflow.kernels.Kernel,
        factors: Union[UFactor, Sequence[UFactor]],
        q_Z: Optional[GaussianInducingPoints],
        Z: Optional[tf.Tensor],
        q_beta: Optional[LogNormalHyperparameters],
        num_samples: int,
        seed: tf.Tensor,
        jitter: float,
        mean_function: Optional[gpflow.mean_functions.MeanFunction] = None,
        *,
        precompute_cache: Optional[PrecomputeCacheType] = None,
    ) -> None:
        super().__init__(kernel, factors, mean_function=mean_function)
        self.factors, self.q_Z, self.Z, self.q_beta = factors, q_Z, Z, q_beta
        self.num_samples, self.seed, self.jitter = int(num_samples), seed, jitter
        if precompute_cache is not None:
            self.update_cache(precompute_cache)

    def _precompute(self) -> Tuple[PrecomputedValue, ...]:
        Zs, betas = draw_samples(self.q_Z, self.Z, self.q_beta, self.num_samples, self.seed)
        kern = sampled_kernel(self.kernel, self.q_beta, betas)
        L, mu, LB = dpo_whitened_posterior(kern, Zs, self.factors, self.jitter)
        if betas is None:
            betas = tf.zeros([Zs.shape[0], 0], dtype=Zs.dtype)
        return tuple(PrecomputedValue(v, (False,) * len(v.shape)) for v in (Zs, L, mu, LB, betas))

    def predict_f_samples(
        self, Xnew: tf.Tensor, full_cov: bool = False
    ) -> Tuple[tf.Tensor, tf.Tensor, Optional[tf.Tensor]]:
        """``(μ_s [S, N, 1], v_s [S, N, 1] (or [S, N, N]), β_s [S, H] or None)``: every sample's q(f_* | Z_s, β_s),
        the mean function included (from the cache when there is one)."""
        Zs, L, mu, LB, betas = self.cache if self.cache is not None else tuple(c.value for c in self._precompute())
        betas = betas if self.q_beta is not None else None
        Xnew = tf.convert_to_tensor(Xnew, Zs.dtype)
        kern = sampled_kernel(self.kernel, self.q_beta, betas)
        means, variances = per_sample_conditional(kern, Zs, L, mu, LB, Xnew, full_cov)
        if self.mean_function is not None:
            means = means + self.mean_function(Xnew)
        return means, variances, betas

    def _conditional_with_precompute(
        self, cache: Tuple[tf.Tensor, ...], Xnew: tf.Tensor, full_cov: bool = False, full_output_cov: bool = False
    ) -> MeanAndVariance:
        if full_output_cov:
            raise NotImplementedError("the DPO mixture is single-output; full_output_cov=True is not supported")
        Zs, L, mu, LB, betas = cache
        kern = sampled_kernel(self.kernel, self.q_beta, betas if self.q_beta is not None else None)
        means, variances = per_sample_conditional(kern, Zs, L, mu, LB, tf.convert_to_tensor(Xnew, Zs.dtype), full_cov)
        if not full_cov:
            return mixture_moments(means, variances)
        mean = tf.reduce_mean(means, axis=0)
        second = tf.reduce_mean(variances + tf.matmul(means, means, transpose_b=True), axis=0)
        return mean, (second - tf.matmul(mean, mean, transpose_b=True))[None]

    def _conditional_fused(
        self, Xnew: tf.Tensor, full_cov: bool = False, full_output_cov: bool = False
    ) -> MeanAndVariance:
        cache = tuple(c.value for c in self._precompute())
        return self._conditional_with_precompute(cache, Xnew, full_cov, full_output_cov)
