"""Kernel knowledge distillation on a server-held dataset (FedBNR-KD, thesis eq. 3.4)."""

from __future__ import annotations

from typing import Sequence

import gpflow
import tensorflow as tf
from check_shapes import check_shapes

from ...models.bayesian_linear_regression import BayesianLinearRegression

__all__ = ["distillation_loss", "mean_client_gram"]


@check_shapes("X_kd: [N, D]", "return: [N, N]")
def mean_client_gram(kernels: Sequence[gpflow.kernels.Kernel], X_kd: tf.Tensor) -> tf.Tensor:
    """``Σ_c θ_c(X_kd)ᵀ θ_c(X_kd) / |S|``: the mean of the client kernels' Gram matrices on the distillation
    inputs (the target of eq. 3.4)."""
    if not kernels:
        raise ValueError("mean_client_gram needs at least one client kernel")
    return tf.add_n([k.K(X_kd) for k in kernels]) / float(len(kernels))


@check_shapes("target_gram: [N, N]", "return: []")
def distillation_loss(model: BayesianLinearRegression, target_gram: tf.Tensor, alpha: float) -> tf.Tensor:
    """The knowledge-distillation loss of eq. 3.4, per distillation point:

    ``L_KD = −log p_BLR(y_kd | θ(X_kd)) / N_kd + α · mean_{ij} (θ(X_kd)ᵀθ(X_kd) − K̄)_{ij}²``

    where ``model`` is the server's BLR on ``(X_kd, y_kd)`` (its kernel is the global θ) and K̄ the mean client
    Gram matrix (:func:`mean_client_gram`). The marginal-likelihood term is negated so the loss is minimised.
    """
    X_kd, _ = model.data
    num_data = tf.cast(tf.shape(X_kd)[0], gpflow.default_float())
    mse = tf.reduce_mean(tf.square(model.kernel.K(X_kd) - target_gram))
    return -model.log_marginal_likelihood() / num_data + tf.cast(alpha, gpflow.default_float()) * mse
