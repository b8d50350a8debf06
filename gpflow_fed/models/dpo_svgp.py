"""DPOSVGP: a centralized sparse variational GP whose q(u) is parameterised by DPO pseudo-observations.

This is the "global VI" reference of the PVI paper (spec §6.3) as an ordinary GPflow model: the ELBO

    L = E_{q(Z)}[ Σ_n E_{q(f_n|Z)} log p(y_n | f_n) − KL[q(u|Z) ‖ p(u|Z)] ] − α KL[q(Z) ‖ N(0, I)]

(paper eqs. 6, 13, 14 with K = 1; q(u|Z) from paper eq. 12 assembled as in spec §1.4). With a
:class:`~gpflow_fed.inducing_variables.GaussianInducingPoints` q(Z) the expectation over Z is estimated by
reparameterised Monte Carlo; without it Z is the point estimate held by the pseudo-observations. Kernel and
likelihood hyperparameters are point estimates (learned by maximising the ELBO). Any GPflow likelihood works:
``variational_expectations`` is closed form for ``Gaussian`` and Gauss–Hermite quadrature otherwise.
"""

from __future__ import annotations

from typing import Optional, Tuple

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import check_shapes, inherit_check_shapes
from gpflow.base import MeanAndVariance
from gpflow.config import default_jitter
from gpflow.models.model import GPModel
from gpflow.models.training_mixins import InternalDataTrainingLossMixin

from ..data.dataset import validate_regression_data
from ..inducing_variables import GaussianInducingPoints, PseudoObservations
from ..posteriors import DPOPosterior, dpo_whitened_posterior
from ..posteriors.whitened import whitened_marginals, whitened_prior_kl


class DPOSVGP(GPModel, InternalDataTrainingLossMixin):
    """Sparse variational GP with a DPO q(u) and an optional distribution q(Z) over the inducing inputs.

    :param data: ``(X [N, D], Y [N, 1])``.
    :param kernel: any GPflow kernel.
    :param likelihood: any single-latent GPflow likelihood.
    :param pseudo: the pseudo-observations ``(V, m, S)``; its ``Z`` (required when ``q_Z`` is None) is the
        point estimate of the inducing inputs.
    :param q_Z: optional :class:`GaussianInducingPoints`: then Z is integrated out by Monte Carlo.
    :param alpha: weight α ∈ [0, 1] of KL[q(Z) ‖ N(0, I)] (paper eq. 14; 0.1 in the paper's experiments).
    :param num_samples: Monte-Carlo samples of Z per ELBO evaluation.
    :param num_predict_samples: samples of Z used for prediction (paper §6: 100).
    :param seed: integer seed of the stateless Z samples used for prediction.
    """

    def __init__(
        self,
        data: Tuple[object, object],
        kernel: gpflow.kernels.Kernel,
        likelihood: gpflow.likelihoods.Likelihood,
        pseudo: PseudoObservations,
        q_Z: Optional[GaussianInducingPoints] = None,
        *,
        alpha: float = 1.0,
        num_samples: int = 1,
        num_predict_samples: int = 100,
        mean_function: Optional[gpflow.mean_functions.MeanFunction] = None,
        seed: int = 0,
    ) -> None:
        X, Y = validate_regression_data(data[0], data[1], "DPOSVGP data")
        if Y.shape[1] != 1:
            raise ValueError(f"DPOSVGP is single-output: Y must be [N, 1], got {Y.shape}")
        if not isinstance(pseudo, PseudoObservations):
            raise TypeError(f"pseudo must be a PseudoObservations, got {type(pseudo).__name__}")
        if q_Z is not None and not isinstance(q_Z, GaussianInducingPoints):
            raise TypeError(f"q_Z must be a GaussianInducingPoints or None, got {type(q_Z).__name__}")
        if q_Z is None and pseudo.Z is None:
            raise ValueError("give the pseudo-observations inducing inputs Z, or a q_Z distribution over them")
        if pseudo.V.shape[1] != X.shape[1]:
            raise ValueError(f"pseudo-inputs have D = {pseudo.V.shape[1]} but X has D = {X.shape[1]}")
        if q_Z is not None and q_Z.Z_mean.shape[1] != X.shape[1]:
            raise ValueError(f"q_Z has D = {q_Z.Z_mean.shape[1]} but X has D = {X.shape[1]}")
        if not (0.0 <= float(alpha) <= 1.0):
            raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
        for name, value in (("num_samples", num_samples), ("num_predict_samples", num_predict_samples)):
            if int(value) < 1:
                raise ValueError(f"{name} must be ≥ 1, got {value}")
        super().__init__(kernel, likelihood, mean_function, num_latent_gps=1)
        self.data = (tf.constant(X), tf.constant(Y))
        self.pseudo = pseudo
        self.q_Z = q_Z
        if q_Z is not None and pseudo.Z is not None:
            gpflow.set_trainable(pseudo.Z, False)  # Z is integrated out under q(Z); the point Z is unused
        self.alpha = float(alpha)
        self.num_samples = int(num_samples)
        self.num_predict_samples = int(num_predict_samples)
        self.seed = int(seed)
        self._elbo_calls = tf.Variable(0, dtype=tf.int64, trainable=False)

    @property
    def inducing_variable(self) -> PseudoObservations:
        """The pseudo-observations (the model's inducing variable)."""
        return self.pseudo

    def _Z_samples(self, num: int, seed: tf.Tensor) -> tf.Tensor:
        if self.q_Z is None:
            return tf.convert_to_tensor(self.pseudo.Z)[None]
        return self.q_Z.sample(num, seed)

    @check_shapes("Z: [M, D]", "X: [N, D]", "return[0]: [N, 1]", "return[1]: [N, 1]", "return[2]: []")
    def _marginals_and_kl(self, Z: tf.Tensor, X: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        L, mu_w, LB = dpo_whitened_posterior(self.kernel, Z, self.pseudo, default_jitter())
        A = tf.linalg.triangular_solve(L, self.kernel(Z, X), lower=True)
        mean, var = whitened_marginals(A, self.kernel(X, full_cov=False), mu_w, LB)
        if self.mean_function is not None:
            mean = mean + self.mean_function(X)
        return mean, var, whitened_prior_kl(mu_w, LB)

    def elbo(self) -> tf.Tensor:
        """The (Monte-Carlo) ELBO above; exact when q_Z is None."""
        X, Y = self.data
        self._elbo_calls.assign_add(1)
        seed = tf.stack([tf.constant(self.seed + 1, tf.int64), self._elbo_calls])
        samples = self._Z_samples(self.num_samples, seed)
        terms = []
        for s in range(samples.shape[0]):
            mean, var, kl = self._marginals_and_kl(samples[s], X)
            terms.append(tf.reduce_sum(self.likelihood.variational_expectations(X, mean, var, Y)) - kl)
        bound = tf.add_n(terms) / len(terms)
        if self.q_Z is not None:
            bound = bound - self.alpha * self.q_Z.kl_divergence()
        return bound

    def maximum_log_likelihood_objective(self) -> tf.Tensor:
        return self.elbo()

    def posterior(self, precompute_cache: gpflow.posteriors.PrecomputeCacheType = gpflow.posteriors.PrecomputeCacheType.TENSOR) -> DPOPosterior:
        """The :class:`DPOPosterior` at the point-estimate Z (requires ``q_Z`` to be None)."""
        if self.q_Z is not None:
            raise ValueError("with a q(Z) distribution the posterior is a mixture; use predict_f / predict_log_density")
        return DPOPosterior(self.kernel, self.pseudo, None, None, True, self.mean_function, precompute_cache=precompute_cache)

    def _sample_marginals(self, Xnew: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
        samples = self._Z_samples(self.num_predict_samples, tf.constant([self.seed, 0], tf.int64))
        means, variances = [], []
        for s in range(samples.shape[0]):
            mean, var, _ = self._marginals_and_kl(samples[s], Xnew)
            means.append(mean)
            variances.append(var)
        return tf.stack(means), tf.stack(variances)

    @inherit_check_shapes
    def predict_f(self, Xnew: tf.Tensor, full_cov: bool = False, full_output_cov: bool = False) -> MeanAndVariance:
        """Without q(Z): the DPO posterior. With q(Z): the moment-matched mixture over S Z-samples
        (mean ``(1/S)Σ μ_s``, variance ``(1/S)Σ (v_s + μ_s²) − mean²``; diagonal only)."""
        if self.q_Z is None:
            return self.posterior(gpflow.posteriors.PrecomputeCacheType.NOCACHE).fused_predict_f(
                Xnew, full_cov=full_cov, full_output_cov=full_output_cov
            )
        if full_cov or full_output_cov:
            raise ValueError("full covariances are not available for the q(Z) mixture; use full_cov=False")
        means, variances = self._sample_marginals(tf.convert_to_tensor(Xnew))
        mean = tf.reduce_mean(means, axis=0)
        return mean, tf.reduce_mean(variances + means**2, axis=0) - mean**2

    @inherit_check_shapes
    def predict_log_density(self, data: Tuple[tf.Tensor, tf.Tensor], full_cov: bool = False, full_output_cov: bool = False) -> tf.Tensor:
        """log q(y*) = logsumexp_s log ∫ p(y*|f) q(f|Z_s) df − log S (spec §4)."""
        if self.q_Z is None:
            return super().predict_log_density(data, full_cov=full_cov, full_output_cov=full_output_cov)
        X, Y = data
        means, variances = self._sample_marginals(tf.convert_to_tensor(X))
        per_sample = tf.stack([self.likelihood.predict_log_density(X, means[s], variances[s], Y) for s in range(means.shape[0])])
        return tf.reduce_logsumexp(per_sample, axis=0) - np.log(means.shape[0])
