"""PVIPosteriorModel: the GPflow model PVI returns, built from the server state alone (spec §4)."""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
from check_shapes import inherit_check_shapes
from gpflow.base import MeanAndVariance
from gpflow.models.model import GPModel
from gpflow.models.training_mixins import ExternalDataTrainingLossMixin

from ...posteriors.whitened import whitened_marginals
from .pvi_objective import RHO_CLIP, HyperModel, PseudoSets, assemble, meanfield_kl_natural, sample_terms

PREDICT_CHUNK = 2048
"""Test inputs per compiled prediction call (bounds the ``[S, M, chunk]`` intermediate)."""


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
        self._factors: Optional[Tuple[tf.Tensor, ...]] = None
        self._marginals: Optional[tf.types.experimental.GenericFunction] = None

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

    def _per_sample_factors(self) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor, Optional[tf.Tensor]]:
        """``(Z_s, L_s, μ_w,s, L_B,s, β_s)`` for every sample, batched over S (``[S, M, M]`` Choleskys), computed
        once per model by one compiled, vectorised call and cached: the model is a snapshot of the server state
        (with fixed hyperparameters, changing the kernel's values afterwards is not seen by this model)."""
        if self._factors is None:
            Zs, betas = self.draws()
            hyper, sets, jitter = self.hyper, self.sets, self.jitter

            def one(args: Tuple[tf.Tensor, ...]) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
                Z, beta = args[0], (args[1] if len(args) > 1 else None)
                M = tf.shape(Z)[0]
                L = tf.linalg.cholesky(hyper.K(Z, Z, beta) + jitter * tf.eye(M, dtype=Z.dtype))
                mu, LB = assemble([s.precision(hyper, Z, L, beta) for s in sets], M, Z.dtype)
                return L, mu, LB

            args = (Zs,) if betas is None else (Zs, betas)
            L, mu, LB = tf.function(lambda a: tf.vectorized_map(one, a))(args)
            self._factors = (Zs, L, mu, LB, betas)
        return self._factors

    def _per_sample(self, Xnew: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor, Optional[tf.Tensor]]:
        """Marginals ``(μ_s [S, N, 1], v_s [S, N, 1])`` of q(f_* | Z_s, β_s) for every sample (spec §4), vectorised
        over S by a compiled function traced once per model; test inputs are processed in chunks of
        :data:`PREDICT_CHUNK` rows so memory stays ``O(S·M·chunk)``."""
        Zs, L, mu, LB, betas = self._per_sample_factors()
        if self._marginals is None:
            hyper = self.hyper

            def marginals(X: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
                def one(args: Tuple[tf.Tensor, ...]) -> Tuple[tf.Tensor, tf.Tensor]:
                    Z, L_s, mu_s, LB_s = args[:4]
                    beta = args[4] if len(args) > 4 else None
                    A = tf.linalg.triangular_solve(L_s, hyper.K(Z, X, beta), lower=True)
                    return whitened_marginals(A, hyper.Kdiag(X, beta), mu_s, LB_s)

                args = (Zs, L, mu, LB) if betas is None else (Zs, L, mu, LB, betas)
                return tf.vectorized_map(one, args)

            D = self.Z.shape[1]
            self._marginals = tf.function(marginals, input_signature=[tf.TensorSpec([None, D], self.Z.dtype)])
        N = Xnew.shape[0]
        starts = range(0, max(int(N), 1), PREDICT_CHUNK) if N is not None else [None]
        chunks = [self._marginals(Xnew if i is None else Xnew[i : i + PREDICT_CHUNK]) for i in starts]
        means = tf.concat([c[0] for c in chunks], axis=1)
        variances = tf.concat([c[1] for c in chunks], axis=1)
        return means, variances, betas

    def _noise(self, betas: Optional[tf.Tensor]) -> Optional[tf.Tensor]:
        """σ_n² per sample as ``[S, 1, 1]`` (learned), a scalar (fixed Gaussian), or None (non-Gaussian)."""
        if self.hyper.learn_noise:
            return betas[:, self.hyper.input_dim + 1][:, None, None]
        return self.hyper.noise(None)

    def _flat(self, X: tf.Tensor, means: tf.Tensor, variances: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """``[S, N, ·]`` → ``[S·N, ·]`` (X tiled), to hand all samples to a GPflow likelihood in one call."""
        S = tf.shape(means)[0]
        return tf.tile(X, [S, 1]), tf.reshape(means, [-1, 1]), tf.reshape(variances, [-1, 1])

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
        m, v, betas = self._per_sample(Xnew)
        noise = self._noise(betas)
        if noise is not None:
            v = v + noise
        else:
            Xf, mf, vf = self._flat(Xnew, m, v)
            mf, vf = self.likelihood.predict_mean_and_var(Xf, mf, vf)
            m, v = tf.reshape(mf, tf.shape(m)), tf.reshape(vf, tf.shape(v))
        mean = tf.reduce_mean(m, axis=0)
        return mean, tf.reduce_mean(v + m**2, axis=0) - mean**2

    @inherit_check_shapes
    def predict_log_density(self, data: Tuple[tf.Tensor, tf.Tensor], full_cov: bool = False, full_output_cov: bool = False) -> tf.Tensor:
        X, Y = (tf.convert_to_tensor(a, self.Z.dtype) for a in data)
        means, variances, betas = self._per_sample(X)
        noise = self._noise(betas)
        if noise is not None:
            total = variances + noise
            per = tf.reduce_sum(-0.5 * np.log(2 * np.pi) - 0.5 * tf.math.log(total) - 0.5 * (Y[None] - means) ** 2 / total, axis=-1)
        else:
            Xf, mf, vf = self._flat(X, means, variances)
            per = tf.reshape(self.likelihood.predict_log_density(Xf, mf, vf, tf.tile(Y, [tf.shape(means)[0], 1])), tf.shape(means)[:2])
        return tf.reduce_logsumexp(per, axis=0) - np.log(int(means.shape[0]))

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
