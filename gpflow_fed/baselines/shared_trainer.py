"""One compiled Adam loop serving many datasets: the baselines' per-client training without retracing.

Building a ``tf.function`` per client traces it K times (and makes TensorFlow warn about excessive retracing
once K ≥ 5). :class:`SharedAdamTrainer` holds one scratch model whose data live in variables with a free
leading dimension, and one ``tf_keras`` Adam; its loop is traced once, and each call loads a client's data,
parameter values and Adam state, takes the steps, and returns the new values and state (the same update a
per-client model and optimizer would take).
"""

from __future__ import annotations

from typing import Callable, List, Sequence, Tuple

import gpflow
import numpy as np
import tensorflow as tf
from gpflow.keras import tf_keras

from ..federated.algorithms.fsgp_utils import adam_steps

__all__ = ["SharedAdamTrainer"]


class SharedAdamTrainer:
    """``steps`` Adam steps on ``model.training_loss() / N`` for any ``(X, Y)``, compiled once.

    :param make_model: builds the scratch model from ``(X, Y)`` variables (its kernel and initial values are
        the template every client starts from: see :meth:`initial_values`).
    :param input_dim: D; :param output_dim: P.
    :param learning_rate: λ of Adam; :param steps: Adam steps per call.
    """

    def __init__(
        self,
        make_model: Callable[[Tuple[tf.Variable, tf.Variable]], gpflow.models.GPModel],
        input_dim: int,
        output_dim: int,
        learning_rate: float,
        steps: int,
    ) -> None:
        dtype = gpflow.default_float()
        self._X = tf.Variable(np.zeros((0, input_dim), dtype), shape=tf.TensorShape([None, input_dim]), trainable=False)
        self._Y = tf.Variable(np.zeros((0, output_dim), dtype), shape=tf.TensorShape([None, output_dim]), trainable=False)
        self.model = make_model((self._X, self._Y))
        self.variables = list(self.model.trainable_variables)
        self.optimizer = tf_keras.optimizers.Adam(learning_rate=learning_rate)
        self.optimizer.build(self.variables)
        self.steps = int(steps)
        self._initial_values = [v.numpy() for v in self.variables]
        self._initial_adam = [v.numpy() for v in self.optimizer.variables]
        spec = [tf.TensorSpec([None, input_dim], dtype), tf.TensorSpec([None, output_dim], dtype)]
        self._loop = tf.function(self._run, input_signature=spec, autograph=False)

    def _run(self, X: tf.Tensor, Y: tf.Tensor) -> tf.Tensor:
        self._X.assign(X)
        self._Y.assign(Y)
        num_data = tf.cast(tf.shape(Y)[0], gpflow.default_float())
        return adam_steps(lambda: self.model.training_loss() / num_data, self.variables, self.optimizer, self.steps)

    def initial_values(self) -> List[np.ndarray]:
        """The template's trainable variable values (unconstrained), in ``model.trainable_variables`` order."""
        return [v.copy() for v in self._initial_values]

    def initial_adam(self) -> List[np.ndarray]:
        """A fresh Adam state (step count and moments)."""
        return [v.copy() for v in self._initial_adam]

    def train(
        self, X: np.ndarray, Y: np.ndarray, values: Sequence[np.ndarray], adam: Sequence[np.ndarray]
    ) -> Tuple[List[np.ndarray], List[np.ndarray]]:
        """Take the steps on ``(X, Y)`` from ``values`` with Adam state ``adam``; return the new values and state."""
        for variable, value in zip(self.variables, values):
            variable.assign(value)
        for variable, value in zip(self.optimizer.variables, adam):
            variable.assign(value)
        dtype = gpflow.default_float()
        self._loop(tf.constant(X, dtype), tf.constant(Y, dtype))
        return [v.numpy() for v in self.variables], [v.numpy() for v in self.optimizer.variables]

    def tracing_count(self) -> int:
        """How many times the loop was traced (1 once used)."""
        return int(self._loop.experimental_get_tracing_count())
