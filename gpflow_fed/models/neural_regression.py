"""A neural-network regression model as a GPflow model (the FedAvg/FedProx baseline's returned model).

:class:`NeuralRegression` predicts with a ``tf_keras`` network as its mean (:class:`NetworkMean`) and a homoscedastic
Gaussian noise; trained by :class:`~gpflow_fed.federated.algorithms.FedAvgNN`.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import inherit_check_shapes
from gpflow.keras import tf_keras
from gpflow.models.training_mixins import InternalDataTrainingLossMixin

__all__ = ["NetworkMean", "NeuralRegression"]


class NetworkMean(gpflow.functions.MeanFunction):
    """A ``tf_keras`` network as a GPflow mean function; its output is cast to ``gpflow.default_float()``."""

    def __init__(self, network: tf_keras.Model) -> None:
        super().__init__()
        if not callable(network):
            raise TypeError(f"network must be a tf_keras model, got {type(network).__name__}")
        self.network = network

    def __call__(self, X: tf.Tensor) -> tf.Tensor:
        return tf.cast(self.network(X), gpflow.default_float())


class NeuralRegression(gpflow.models.GPModel, InternalDataTrainingLossMixin):
    """A deterministic network ``f(x) = net(x)`` with Gaussian noise, as a GPflow model.

    ``predict_f`` returns the network output with zero variance; ``predict_y`` adds the likelihood variance.
    The training objective is ``−MSE`` (the thesis trains the baselines by MSE); :meth:`fit_noise_variance`
    sets σ² to the training MSE afterwards.

    :param data: ``(X, Y)`` or ``None`` for a server-side model that only predicts.
    :param network: ``[N, D] → [N, P]``.
    :param noise_variance: σ² > 0.
    :param num_outputs: P.
    """

    def __init__(
        self,
        data: Optional[Tuple[Any, Any]],
        network: tf_keras.Model,
        noise_variance: float = 1.0,
        num_outputs: int = 1,
    ) -> None:
        if not (np.isfinite(noise_variance) and noise_variance > 0):
            raise ValueError(f"noise_variance must be positive, got {noise_variance!r}")
        super().__init__(
            None,  # type: ignore[arg-type]  # no kernel (a network mean): GPModel stores None as given
            gpflow.likelihoods.Gaussian(noise_variance),
            NetworkMean(network),
            num_latent_gps=num_outputs,
        )
        self.data = None if data is None else gpflow.models.util.data_input_to_tensor(data)
        if self.data is not None:
            self.mean_function(self.data[0][:1])  # build the network's weights

    def maximum_log_likelihood_objective(self) -> tf.Tensor:
        if self.data is None:
            raise ValueError("this NeuralRegression has no data; build it with data=(X, Y) to train it")
        X, Y = self.data
        return -tf.reduce_mean(tf.square(Y - self.mean_function(X)))

    def fit_noise_variance(self) -> None:
        """σ² ← the training mean squared error (its maximum-likelihood value)."""
        self.likelihood.variance.assign(-self.maximum_log_likelihood_objective())

    @inherit_check_shapes
    def predict_f(
        self, Xnew: tf.Tensor, full_cov: bool = False, full_output_cov: bool = False
    ) -> Tuple[tf.Tensor, tf.Tensor]:
        mean = self.mean_function(Xnew)
        if full_cov:
            n = tf.shape(mean)[0]
            return mean, tf.zeros([self.num_latent_gps, n, n], dtype=mean.dtype)
        return mean, tf.zeros_like(mean)
