"""The predict-the-mean baseline as a GPflow model: every input gets the outputs' mean and variance.

It is what a model must beat to have learned anything, and what the federated moments phase
(:class:`~gpflow_fed.federated.algorithms.Moments`) returns besides the standardisation.
"""

from __future__ import annotations

from typing import Any

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import inherit_check_shapes

__all__ = ["MeanPredictor"]


class MeanPredictor(gpflow.models.GPModel):
    """``f(x) ~ N(μ, σ²)`` for every x: the outputs' mean ``μ`` ``[P]`` and variance ``σ²`` ``[P]``.

    ``predict_f`` gives ``(μ, σ²)``; the Gaussian likelihood's variance is GPflow's smallest (1e-6), so ``predict_y``
    is ``(μ, σ² + 1e-6)``.

    :param mean: ``[P]``.
    :param variance: ``[P]``, non-negative.
    :raises ValueError: shapes that differ, or a negative or non-finite value.
    """

    def __init__(self, mean: Any, variance: Any) -> None:
        mean_arr: np.ndarray = np.atleast_1d(np.asarray(mean, dtype=gpflow.default_float()))
        var_arr: np.ndarray = np.atleast_1d(np.asarray(variance, dtype=gpflow.default_float()))
        if mean_arr.ndim != 1 or mean_arr.shape != var_arr.shape:
            raise ValueError(
                f"MeanPredictor: mean and variance must be [P] alike, got {mean_arr.shape}, {var_arr.shape}"
            )
        if not (np.all(np.isfinite(mean_arr)) and np.all(np.isfinite(var_arr)) and np.all(var_arr >= 0)):
            raise ValueError("MeanPredictor: mean must be finite and variance finite and non-negative")
        likelihood = gpflow.likelihoods.Gaussian(variance=1.000001e-6)
        super().__init__(gpflow.kernels.Constant(), likelihood, num_latent_gps=mean_arr.size)
        self.mean = tf.constant(mean_arr)
        self.variance = tf.constant(var_arr)

    @inherit_check_shapes
    def predict_f(
        self, Xnew: gpflow.base.InputData, full_cov: bool = False, full_output_cov: bool = False
    ) -> gpflow.models.model.MeanAndVariance:
        if full_cov or full_output_cov:
            raise NotImplementedError("MeanPredictor predicts marginal variances only")
        n = tf.shape(Xnew)[0]
        return tf.tile(self.mean[None, :], [n, 1]), tf.tile(self.variance[None, :], [n, 1])

    def maximum_log_likelihood_objective(self, *args: Any, **kwargs: Any) -> tf.Tensor:
        return tf.constant(0.0, gpflow.default_float())
