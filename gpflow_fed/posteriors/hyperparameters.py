"""q(log β): a mean-field Gaussian over the log hyperparameters of an SE-ARD kernel and a Gaussian noise.

PVI for sparse GPs (*Federated Learning of Sparse Gaussian Processes*, the PVI paper of the docs guide 'PVI')
treats β = (ℓ_1..ℓ_D, σ_f², [σ_n²]) as random with LogNormal(0, 1) priors and a log-normal q (paper eqs. 8–10,
§6). A Monte-Carlo sample β_s enters the kernel as a *value*, so that gradients flow to q(log β) (assigning it
into a GPflow kernel's parameters would cut them); :class:`SampledSquaredExponential` evaluates the kernel for
one sample or for a batch of samples aligned with a batch of inputs.
"""

from __future__ import annotations

from typing import Optional

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import check_shapes
from gpflow.utilities import positive

from ..inducing_variables.gaussian_inducing_points import meanfield_gaussian_kl

LOG_BETA_CLIP = 10.0
"""log β samples are clipped to [−10, 10] before exponentiating (so that exp never overflows)."""


class SampledSquaredExponential:
    """SE-ARD ``σ_f² exp(−½ Σ_d (x_d − x'_d)²/ℓ_d²)`` at given (sampled) hyperparameters, as GPflow's
    ``SquaredExponential`` computes it (squared distances of ``X/ℓ`` by inner products, clipped at 0).

    Called like a GPflow kernel: ``k(X)``, ``k(X, X2)``, ``k(X, full_cov=False)``. With ``lengthscales [S, D]`` and
    ``variance [S]`` it is a batch of S kernels: ``X [S, N, D]`` is paired with sample s, ``X2 [N2, D]`` is shared.
    (``tfp.math.psd_kernels`` would do the same, but its gradients fail inside ``tf.function`` when the number of
    inputs is dynamic, as in PVI's compiled local step, under TensorFlow 2.21.)
    """

    def __init__(self, lengthscales: tf.Tensor, variance: tf.Tensor) -> None:
        self.lengthscales, self.variance = lengthscales, variance

    def __call__(self, X: tf.Tensor, X2: Optional[tf.Tensor] = None, *, full_cov: bool = True) -> tf.Tensor:
        if not full_cov:
            return self.variance[..., None] * tf.ones(tf.shape(X)[-2:-1], dtype=X.dtype)
        ls = self.lengthscales[..., None, :]
        A, B = X / ls, (X if X2 is None else X2) / ls
        r2 = (
            tf.reduce_sum(A**2, -1)[..., :, None]
            + tf.reduce_sum(B**2, -1)[..., None, :]
            - 2.0 * tf.matmul(A, B, transpose_b=True)
        )
        return self.variance[..., None, None] * tf.exp(-0.5 * tf.maximum(r2, 0.0))


class LogNormalHyperparameters(gpflow.Module):
    """q(log β) = Π_h N(log β_h; μ_h, σ²_h) for β = (ℓ_1..ℓ_D, σ_f², [σ_n²]) (paper eq. 10), optimised as
    (mean, log-variance) in unconstrained space.

    :param mean: μ ``[H]`` with ``H = D + 1`` (kernel only) or ``D + 2`` (also the Gaussian noise variance).
    :param var: σ² ``[H]`` (or a positive scalar); stored as a log-variance.
    :param input_dim: D.
    :raises ValueError: a length H other than D + 1 or D + 2, non-finite values or non-positive variances.
    """

    def __init__(self, mean: object, var: object, input_dim: int, *, name: Optional[str] = None) -> None:
        super().__init__(name=name)
        mean_arr: np.ndarray = np.asarray(mean, dtype=gpflow.default_float()).reshape(-1)
        var_arr: np.ndarray = np.broadcast_to(np.asarray(var, dtype=gpflow.default_float()), mean_arr.shape).copy()
        D = int(input_dim)
        if mean_arr.shape[0] not in (D + 1, D + 2):
            raise ValueError(
                f"q(log β) needs D + 1 = {D + 1} (kernel) or D + 2 (and noise) entries, got {mean_arr.shape[0]}"
            )
        if not (np.all(np.isfinite(mean_arr)) and np.all(np.isfinite(var_arr))):
            raise ValueError("q(log β) mean and variance must be finite")
        if np.any(var_arr <= 0):
            raise ValueError("q(log β) variances must be positive")
        self.input_dim = D
        self.mean = gpflow.Parameter(mean_arr, name="mean")
        self.var = gpflow.Parameter(var_arr, transform=positive(lower=0.0, base="exp"), name="var")

    @property
    def num_hyper(self) -> int:
        """H."""
        return int(self.mean.shape[0])

    @property
    def learns_noise(self) -> bool:
        """True when β includes the Gaussian noise variance σ_n²."""
        return self.num_hyper == self.input_dim + 2

    @check_shapes("eps: [batch..., H]", "return: [batch..., H]")
    def sample_from_noise(self, eps: tf.Tensor) -> tf.Tensor:
        """``β = exp(clip(μ + σ ⊙ ε))``, reparameterised (differentiable in μ and σ²)."""
        log_beta = self.mean + tf.sqrt(tf.convert_to_tensor(self.var)) * eps
        return tf.exp(tf.clip_by_value(log_beta, -LOG_BETA_CLIP, LOG_BETA_CLIP))

    @check_shapes("return: [S, H]")
    def sample(self, num_samples: int, seed: tf.Tensor) -> tf.Tensor:
        """``num_samples`` draws of β with the stateless ``seed`` ``[2]``."""
        eps = tf.random.stateless_normal([int(num_samples), self.num_hyper], seed=seed, dtype=gpflow.default_float())
        return self.sample_from_noise(eps)

    def kernel(self, beta: tf.Tensor) -> SampledSquaredExponential:
        """The SE-ARD kernel at ``β [H]`` (or a batch ``[S, H]``)."""
        return SampledSquaredExponential(beta[..., : self.input_dim], beta[..., self.input_dim])

    def noise(self, beta: tf.Tensor) -> Optional[tf.Tensor]:
        """σ_n² of ``β`` (``[]`` or ``[S]``), or None when the noise is not part of β."""
        return beta[..., self.input_dim + 1] if self.learns_noise else None

    def kl_divergence(self, prior_mean: object = 0.0, prior_var: object = 1.0) -> tf.Tensor:
        """KL[q(log β) ‖ Π N(prior_mean, prior_var)] (LogNormal(0, 1) priors by default)."""
        return meanfield_gaussian_kl(self.mean, self.var, prior_mean, prior_var)
