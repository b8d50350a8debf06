"""GaussianInducingPoints: a mean-field Gaussian distribution q(Z) over the inducing inputs (paper eq. 10)."""

from __future__ import annotations

from typing import Optional

import gpflow
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp
from check_shapes import Shape, check_shapes
from gpflow.utilities import positive

from .pseudo_observations import as_float_array


class GaussianInducingPoints(gpflow.inducing_variables.InducingVariables):
    """q(Z) = Π_{m,d} N(z_md; μ_md, σ²_md) over M inducing inputs in D dimensions.

    ``Kuu``/``Kuf`` (registered in :mod:`gpflow_fed.covariances`) evaluate at the mean ``Z_mean``, so the
    object also works as a point estimate inside stock GPflow models; Monte-Carlo estimates over q(Z) use
    :meth:`sample` (reparameterised; the q(Z) of the PVI paper, *Federated Learning of Sparse Gaussian
    Processes*, §4 and docs guide 'PVI').

    :param Z_mean: μ ``[M, D]``.
    :param Z_var: σ² ``[M, D]`` (or a positive scalar broadcast to ``[M, D]``).
    :raises ValueError: non-finite values, shape mismatch or non-positive variances.
    """

    def __init__(self, Z_mean: object, Z_var: object = 0.01, *, name: Optional[str] = None):
        super().__init__(name=name)
        mean = as_float_array(Z_mean, "Z_mean", (2,))
        var = np.broadcast_to(as_float_array(Z_var, "Z_var", (0, 1, 2)), mean.shape).copy()
        if mean.shape[0] < 1:
            raise ValueError("GaussianInducingPoints needs at least one inducing input (M ≥ 1)")
        if np.any(var <= 0):
            raise ValueError("Z_var must be positive everywhere")
        self.Z_mean = gpflow.Parameter(mean, name="Z_mean")
        # log-variance parameterisation: the unconstrained variable is log σ², so σ² stays positive
        self.Z_var = gpflow.Parameter(var, transform=positive(lower=0.0, base="exp"), name="Z_var")

    @property
    def num_inducing(self) -> tf.Tensor:
        return tf.shape(self.Z_mean)[0]

    @property
    def shape(self) -> Shape:
        return (self.Z_mean.shape[0], self.Z_mean.shape[1], 1)

    @check_shapes("eps: [S, M, D]", "return: [S, M, D]")
    def sample_from_noise(self, eps: tf.Tensor) -> tf.Tensor:
        """Reparameterised samples ``Z_s = μ + σ ⊙ ε_s``, ε_s ~ N(0, I), differentiable in (μ, σ²)."""
        return self.Z_mean[None] + tf.sqrt(tf.convert_to_tensor(self.Z_var))[None] * eps

    @check_shapes("return: [S, M, D]")
    def sample(self, num_samples: int, seed: tf.Tensor) -> tf.Tensor:
        """``num_samples`` reparameterised draws; ``seed`` is a stateless seed of shape ``[2]``."""
        if int(num_samples) < 1:
            raise ValueError(f"num_samples must be ≥ 1, got {num_samples}")
        shape = tf.concat([[int(num_samples)], tf.shape(self.Z_mean)], axis=0)
        eps = tf.random.stateless_normal(shape, seed=seed, dtype=gpflow.default_float())
        return self.sample_from_noise(eps)

    def kl_divergence(self, prior_mean: object = 0.0, prior_var: object = 1.0) -> tf.Tensor:
        """KL[q(Z) ‖ Π N(prior_mean, prior_var)] summed over coordinates (the Z-KL of the PVI paper's eq. 7;
        its p̃(Z) = N(0, I) is the default)."""
        return meanfield_gaussian_kl(self.Z_mean, self.Z_var, prior_mean, prior_var)


def meanfield_gaussian_kl(mean_q: object, var_q: object, mean_p: object, var_p: object) -> tf.Tensor:
    """Σ_i KL[N(μ_q,i, σ²_q,i) ‖ N(μ_p,i, σ²_p,i)] (arguments broadcast), by TensorFlow Probability."""
    dtype = gpflow.default_float()
    mq, vq, mp, vp = (tf.cast(tf.convert_to_tensor(a), dtype) for a in (mean_q, var_q, mean_p, var_p))
    q = tfp.distributions.Normal(mq, tf.sqrt(vq))
    return tf.reduce_sum(q.kl_divergence(tfp.distributions.Normal(mp, tf.sqrt(vp))))
