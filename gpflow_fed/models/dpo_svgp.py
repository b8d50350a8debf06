"""DPOSVGP: sparse variational GPs whose q(u) is parameterised by pseudo-observations (DPO) or a CPO factor.

Paper: *Federated Learning of Sparse Gaussian Processes* (the PVI paper of the docs guide 'PVI'). The bound
(paper eqs. 6, 13, 14 with K = 1; q(u|Z, β) from paper eq. 12, assembled in the whitened
coordinates w = L⁻¹u of :mod:`gpflow_fed.posteriors.whitened`):

    L = E_{q(Z)q(β)}[ Σ_n E_{q(f_n|Z,β)} log p(y_n | f_n, β) − KL[q(u|Z,β) ‖ p(u|Z,β)] ]
        − KL[q(β) ‖ p(β)] − α KL[q(Z) ‖ N(0, I)]

With a :class:`~gpflow_fed.inducing_variables.GaussianInducingPoints` q(Z) and/or a
:class:`~gpflow_fed.posteriors.LogNormalHyperparameters` q(log β) the expectations are reparameterised Monte
Carlo and prediction is the mixture :class:`~gpflow_fed.posteriors.DPOMixturePosterior`; without them Z and the
kernel's hyperparameters are point estimates and the posterior is :class:`~gpflow_fed.posteriors.DPOPosterior`.
Any GPflow likelihood works (``variational_expectations``: closed form for ``Gaussian``, quadrature otherwise).

:class:`DPOSVGP` holds its data (the centralized "global VI" reference of the PVI paper, §6: the same
objective on the pooled data); :class:`FederatedDPOSVGP` takes the data in ``elbo(data)`` (PVI's result,
assembled from the clients' factors). Prediction goes through :meth:`BaseDPOSVGP.posterior`, as in GPflow:
``predict_f`` recomputes from the current parameters, ``posterior()`` gives a cached predictor.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Tuple, Union, cast

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import check_shapes, inherit_check_shapes
from gpflow.base import MeanAndVariance
from gpflow.models.model import GPModel
from gpflow.models.training_mixins import ExternalDataTrainingLossMixin, InternalDataTrainingLossMixin
from gpflow.posteriors import PrecomputeCacheType

from ..data.dataset import validate_regression_data
from ..inducing_variables import GaussianInducingPoints, NaturalFactor, PseudoObservations
from ..posteriors import DPOMixturePosterior, DPOPosterior, LogNormalHyperparameters
from ..posteriors.dpo_mixture import draw_samples, mixture_moments, sampled_kernel
from ..posteriors.dpo_posterior import jittered_cholesky
from ..posteriors.whitened import assemble_whitened, whitened_kl, whitened_marginals, whitened_prior_kl

UFactor = Union[PseudoObservations, NaturalFactor]


class NoiseColumn(gpflow.functions.Function):
    """σ_n² carried as the last input column (a sampled noise variance per row)."""

    def __call__(self, X: tf.Tensor) -> tf.Tensor:
        return X[..., -1:]


@check_shapes("X: [N, D]", "means: [S, N, 1]", "variances: [S, N, 1]", "Y: [N, 1] if Y is not None")
def per_sample_likelihood(
    likelihood: gpflow.likelihoods.Likelihood,
    noise: Optional[tf.Tensor],
    method: str,
    X: tf.Tensor,
    means: tf.Tensor,
    variances: tf.Tensor,
    Y: Optional[tf.Tensor] = None,
) -> Tuple[tf.Tensor, ...]:
    """``likelihood.<method>`` for every sample's marginals ``[S, N, 1]`` in one call (X and Y tiled); outputs
    ``[S, N]`` or ``[S, N, 1]``. With a sampled noise σ²_s ``[S]`` it is GPflow's ``Gaussian`` with that variance
    (heteroskedastic, through an extra input column)."""
    S, N = tf.shape(means)[0], tf.shape(means)[1]
    Xf = tf.tile(X, [S, 1])
    if noise is not None:
        likelihood = gpflow.likelihoods.Gaussian(variance=NoiseColumn())
        Xf = tf.concat([Xf, tf.repeat(noise, N)[:, None]], axis=1)
    args = [Xf, tf.reshape(means, [-1, 1]), tf.reshape(variances, [-1, 1])]
    args += [] if Y is None else [tf.tile(Y, [S, 1])]
    out = getattr(likelihood, method)(*args)
    outs = out if isinstance(out, tuple) else (out,)
    return tuple(tf.reshape(o, tf.concat([[S, N], tf.shape(o)[1:]], 0)) for o in outs)


@check_shapes("X: [N, D]", "Y: [N, 1]", "Z: [batch..., M, D]", "return[0]: [batch...]", "return[1]: [batch...]")
def dpo_free_energy_terms(
    kern: Callable,
    likelihood: gpflow.likelihoods.Likelihood,
    noise: Optional[tf.Tensor],
    X: tf.Tensor,
    Y: tf.Tensor,
    Z: tf.Tensor,
    own: Sequence[UFactor],
    cavity: Sequence[UFactor],
    jitter: object,
    mean_function: Optional[gpflow.mean_functions.MeanFunction] = None,
) -> Tuple[tf.Tensor, tf.Tensor]:
    """``(ELL(Z, β), KL[q(u|Z,β) ‖ q_cav(u|Z,β)])`` at one sample of (Z, β) or a batch of them: the two terms
    inside the expectation of the local free energy (paper eq. 7), with q = cavity × own factors. One sample uses
    the same Z, β, jitter and noise for the ELL, for q and for the cavity, so the KL has no spurious terms. With
    no ``cavity`` factors the cavity is the prior p(u|Z, β) (the global bound, paper eq. 13)."""
    L = jittered_cholesky(kern, Z, jitter)
    M, dtype = tf.shape(Z)[-2], Z.dtype
    cav_terms = [f.whitened_terms(kern, Z, L) for f in cavity]
    mu, LB = assemble_whitened(cav_terms + [f.whitened_terms(kern, Z, L) for f in own], M, dtype)
    A = tf.linalg.triangular_solve(L, kern(Z, X), lower=True)
    Kdiag = tf.broadcast_to(kern(X, full_cov=False), tf.concat([tf.shape(A)[:-2], tf.shape(X)[:1]], 0))
    means, variances = whitened_marginals(A, Kdiag, mu, LB)
    if mean_function is not None:
        means = means + mean_function(X)
    kl = whitened_kl(mu, LB, *assemble_whitened(cav_terms, M, dtype)) if cavity else whitened_prior_kl(mu, LB)
    if means.shape.rank == 2:  # one sample
        (ve,) = per_sample_likelihood(
            likelihood,
            None if noise is None else noise[None],
            "variational_expectations",
            X,
            means[None],
            variances[None],
            Y,
        )
        return tf.reduce_sum(ve), kl
    (ve,) = per_sample_likelihood(likelihood, noise, "variational_expectations", X, means, variances, Y)
    return tf.reduce_sum(ve, axis=-1), kl


class BaseDPOSVGP(GPModel):
    """The DPO sparse GP shared by :class:`DPOSVGP` and :class:`FederatedDPOSVGP`.

    :param kernel: any GPflow kernel (with ``q_beta``: the SE-ARD template, whose own parameters are then unused
        and made non-trainable).
    :param likelihood: any single-latent GPflow likelihood (with a ``q_beta`` that includes the noise: a Gaussian,
        whose variance is then unused and made non-trainable).
    :param pseudo: the u-factor: :class:`PseudoObservations` ``(V, m, S)`` or a CPO :class:`NaturalFactor`; its
        ``Z`` (required when ``q_Z`` is None) is the point estimate of the inducing inputs.
    :param q_Z: optional :class:`GaussianInducingPoints`: Z is integrated out by Monte Carlo.
    :param q_beta: optional :class:`LogNormalHyperparameters`: β is integrated out by Monte Carlo.
    :param alpha: weight α ∈ [0, 1] of KL[q(Z) ‖ N(0, I)] (paper eq. 14; 0.1 in the paper's experiments).
    :param num_samples: Monte-Carlo samples per ELBO evaluation.
    :param num_predict_samples: samples used for prediction (paper §6: 100).
    :param seed: integer seed of the stateless samples used for prediction.
    :param jitter: added to K_ZZ (default GPflow's ``default_jitter()``).
    """

    def __init__(
        self,
        kernel: gpflow.kernels.Kernel,
        likelihood: gpflow.likelihoods.Likelihood,
        pseudo: UFactor,
        q_Z: Optional[GaussianInducingPoints] = None,
        q_beta: Optional[LogNormalHyperparameters] = None,
        *,
        alpha: float = 1.0,
        num_samples: int = 1,
        num_predict_samples: int = 100,
        mean_function: Optional[gpflow.mean_functions.MeanFunction] = None,
        seed: int = 0,
        jitter: Optional[float] = None,
    ) -> None:
        if not isinstance(pseudo, (PseudoObservations, NaturalFactor)):
            raise TypeError(f"pseudo must be a PseudoObservations or NaturalFactor, got {type(pseudo).__name__}")
        if q_Z is not None and not isinstance(q_Z, GaussianInducingPoints):
            raise TypeError(f"q_Z must be a GaussianInducingPoints or None, got {type(q_Z).__name__}")
        if q_beta is not None and not isinstance(q_beta, LogNormalHyperparameters):
            raise TypeError(f"q_beta must be a LogNormalHyperparameters or None, got {type(q_beta).__name__}")
        if q_Z is None and pseudo.Z is None:
            raise ValueError("give the pseudo-observations inducing inputs Z, or a q_Z distribution over them")
        if q_beta is not None and q_beta.learns_noise and not isinstance(likelihood, gpflow.likelihoods.Gaussian):
            raise ValueError("a q_beta over the noise variance needs a gpflow.likelihoods.Gaussian likelihood")
        if not (0.0 <= float(alpha) <= 1.0):
            raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
        for name, value in (("num_samples", num_samples), ("num_predict_samples", num_predict_samples)):
            if int(value) < 1:
                raise ValueError(f"{name} must be ≥ 1, got {value}")
        super().__init__(kernel, likelihood, mean_function, num_latent_gps=1)
        self.pseudo, self.q_Z, self.q_beta = pseudo, q_Z, q_beta
        if q_Z is not None and pseudo.Z is not None:
            gpflow.set_trainable(pseudo.Z, False)  # Z is integrated out under q(Z); the point Z is unused
        if q_beta is not None:
            gpflow.set_trainable(kernel, False)  # β is integrated out under q(β); the kernel's values are unused
            if q_beta.learns_noise:
                gpflow.set_trainable(likelihood, False)
        self.alpha = float(alpha)
        self.num_samples = int(num_samples)
        self.num_predict_samples = int(num_predict_samples)
        self.seed = int(seed)
        self.jitter = gpflow.config.default_jitter() if jitter is None else float(jitter)

    @property
    def inducing_variable(self) -> UFactor:
        """The u-factor (the model's inducing variable)."""
        return self.pseudo

    @property
    def input_dim(self) -> int:
        # without q(Z) the u-factor holds Z
        Z = self.q_Z.Z_mean if self.q_Z is not None else cast(gpflow.Parameter, self.pseudo.Z)
        return int(Z.shape[1])

    def _check_dims(self, X: np.ndarray) -> None:
        if X.shape[1] != self.input_dim:
            raise ValueError(f"the inducing inputs have D = {self.input_dim} but X has D = {X.shape[1]}")
        if isinstance(self.pseudo, PseudoObservations) and self.pseudo.V.shape[1] != X.shape[1]:
            raise ValueError(f"pseudo-inputs have D = {self.pseudo.V.shape[1]} but X has D = {X.shape[1]}")

    @property
    def Z(self) -> tf.Tensor:
        """The inducing inputs: the mean of q(Z), or the point Z."""
        return tf.convert_to_tensor(self.q_Z.Z_mean if self.q_Z is not None else self.pseudo.Z)

    @property
    def is_mixture(self) -> bool:
        """True when Z or β is random (prediction is a Monte-Carlo mixture)."""
        return self.q_Z is not None or self.q_beta is not None

    def _point_Z(self) -> Optional[tf.Tensor]:
        return None if self.pseudo.Z is None else tf.convert_to_tensor(self.pseudo.Z)

    def _bound(self, data: Tuple[tf.Tensor, tf.Tensor], seed: tf.Tensor, num: int) -> tf.Tensor:
        """The bound of the module docstring, Monte Carlo over ``num`` draws with the stateless ``seed``."""
        X, Y = (tf.convert_to_tensor(a, gpflow.default_float()) for a in data)
        Zs, betas = draw_samples(self.q_Z, self._point_Z(), self.q_beta, num, seed)
        noise = None if self.q_beta is None else self.q_beta.noise(betas)
        ell, kl = dpo_free_energy_terms(
            sampled_kernel(self.kernel, self.q_beta, betas),
            self.likelihood,
            noise,
            X,
            Y,
            Zs,
            [self.pseudo],
            [],
            self.jitter,
            self.mean_function,
        )
        bound = tf.reduce_mean(ell - kl)
        if self.q_beta is not None:
            bound = bound - self.q_beta.kl_divergence()
        if self.q_Z is not None:
            bound = bound - self.alpha * self.q_Z.kl_divergence()
        return bound

    def _predict_seed(self) -> tf.Tensor:
        return tf.constant([self.seed, 1], tf.int64)

    def posterior(
        self, precompute_cache: PrecomputeCacheType = PrecomputeCacheType.TENSOR
    ) -> Union[DPOPosterior, DPOMixturePosterior]:
        """The predictive posterior at the current parameters: :class:`DPOPosterior` for a point Z and β, else the
        :class:`DPOMixturePosterior` over ``num_predict_samples`` draws (GPflow's cache conventions: ``TENSOR`` and
        ``VARIABLE`` caches are fixed until ``update_cache``; ``NOCACHE`` recomputes at every call)."""
        if not self.is_mixture:
            return DPOPosterior(
                self.kernel,
                self.pseudo,
                None,
                None,
                True,
                self.mean_function,
                precompute_cache=precompute_cache,
                jitter=self.jitter,
            )
        return DPOMixturePosterior(
            self.kernel,
            self.pseudo,
            self.q_Z,
            self._point_Z(),
            self.q_beta,
            self.num_predict_samples,
            self._predict_seed(),
            self.jitter,
            self.mean_function,
            precompute_cache=precompute_cache,
        )

    @inherit_check_shapes
    def predict_f(self, Xnew: tf.Tensor, full_cov: bool = False, full_output_cov: bool = False) -> MeanAndVariance:
        """The posterior's prediction (the DPO posterior, or the moment-matched mixture over the S samples:
        mean ``(1/S)Σ μ_s``, covariance ``(1/S)Σ (Σ_s + μ_s μ_sᵀ) − mean meanᵀ``)."""
        return self.posterior(PrecomputeCacheType.NOCACHE).fused_predict_f(
            Xnew, full_cov=full_cov, full_output_cov=full_output_cov
        )

    def _samples(self, Xnew: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor, Optional[tf.Tensor]]:
        means, variances, betas = self.posterior(PrecomputeCacheType.NOCACHE).predict_f_samples(Xnew)
        return means, variances, None if self.q_beta is None else self.q_beta.noise(betas)

    @inherit_check_shapes
    def predict_y(self, Xnew: tf.Tensor, full_cov: bool = False, full_output_cov: bool = False) -> MeanAndVariance:
        if not self.is_mixture:
            return super().predict_y(Xnew, full_cov=full_cov, full_output_cov=full_output_cov)
        if full_cov or full_output_cov:
            raise NotImplementedError("predict_y of the DPO mixture gives marginal variances only; use full_cov=False")
        Xnew = tf.convert_to_tensor(Xnew, gpflow.default_float())
        means, variances, noise = self._samples(Xnew)
        moments = per_sample_likelihood(self.likelihood, noise, "predict_mean_and_var", Xnew, means, variances)
        return mixture_moments(*moments)

    @inherit_check_shapes
    def predict_log_density(
        self, data: Tuple[tf.Tensor, tf.Tensor], full_cov: bool = False, full_output_cov: bool = False
    ) -> tf.Tensor:
        """``log q(y*) = logsumexp_s log ∫ p(y*|f, β_s) q(f|Z_s, β_s) df − log S``, the Monte-Carlo predictive
        of the PVI paper §6 in log space."""
        if not self.is_mixture:
            return super().predict_log_density(data, full_cov=full_cov, full_output_cov=full_output_cov)
        X, Y = (tf.convert_to_tensor(a, gpflow.default_float()) for a in data)
        means, variances, noise = self._samples(X)
        (per,) = per_sample_likelihood(self.likelihood, noise, "predict_log_density", X, means, variances, Y)
        return tf.reduce_logsumexp(per, axis=0) - tf.math.log(tf.cast(tf.shape(per)[0], per.dtype))


class DPOSVGP(BaseDPOSVGP, InternalDataTrainingLossMixin):
    """The DPO sparse GP on data it holds (the "global VI" reference of the PVI paper, §6).

    :param data: ``(X [N, D], Y [N, 1])``; the other arguments are those of :class:`BaseDPOSVGP`. Each ELBO
        evaluation draws fresh Monte-Carlo samples (a counter advances the stateless seed).
    """

    def __init__(
        self,
        data: Tuple[object, object],
        kernel: gpflow.kernels.Kernel,
        likelihood: gpflow.likelihoods.Likelihood,
        pseudo: UFactor,
        q_Z: Optional[GaussianInducingPoints] = None,
        q_beta: Optional[LogNormalHyperparameters] = None,
        **kwargs: Any,
    ) -> None:
        X, Y = validate_regression_data(data[0], data[1], "DPOSVGP data")
        if Y.shape[1] != 1:
            raise ValueError(f"DPOSVGP is single-output: Y must be [N, 1], got {Y.shape}")
        super().__init__(kernel, likelihood, pseudo, q_Z, q_beta, **kwargs)
        self._check_dims(X)
        self.data = (tf.constant(X), tf.constant(Y))
        self._elbo_calls = tf.Variable(0, dtype=tf.int64, trainable=False)

    def elbo(self) -> tf.Tensor:
        """The (Monte-Carlo) ELBO of the module docstring; exact without q(Z) and q(β)."""
        self._elbo_calls.assign_add(1)
        seed = tf.stack([tf.constant(self.seed + 1, tf.int64), self._elbo_calls])
        return self._bound(self.data, seed, self.num_samples)

    def maximum_log_likelihood_objective(self) -> tf.Tensor:
        return self.elbo()


class FederatedDPOSVGP(BaseDPOSVGP, ExternalDataTrainingLossMixin):
    """The DPO sparse GP assembled from a federation's factors (PVI's result), with the data passed to
    ``elbo(data)``. The ELBO's Monte Carlo uses the prediction draws (``num_predict_samples``, fixed seed), so it
    is a deterministic function of the parameters that ``gpflow.optimizers.Scipy`` can minimise."""

    def elbo(self, data: Tuple[tf.Tensor, tf.Tensor]) -> tf.Tensor:
        """The global free energy L̃_α of paper eqs. (6), (13), (14) on ``data`` (cavity = prior)."""
        return self._bound(data, self._predict_seed(), self.num_predict_samples)

    def maximum_log_likelihood_objective(self, data: Tuple[tf.Tensor, tf.Tensor]) -> tf.Tensor:
        return self.elbo(data)
