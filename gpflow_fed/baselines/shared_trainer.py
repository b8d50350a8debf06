"""The FGP baseline's per-client training: a worker model and one
:class:`~gpflow_fed.federated.local_training.CompiledAdam` shared by every client (no retracing per client)."""

from __future__ import annotations

from typing import Callable, List, Sequence, Tuple

import gpflow
import numpy as np
import tensorflow as tf

from ..federated.local_training import AdamState, CompiledAdam, per_point_loss

__all__ = ["SharedAdamTrainer"]


class SharedAdamTrainer:
    """``steps`` Adam steps on ``model.training_loss() / N`` for any ``(X, Y)``, compiled once.

    :param make_model: builds the worker model from placeholder ``(X, Y)``; its initial values are every client's
        start (:meth:`initial_values`).
    :param input_dim: D; :param output_dim: P; :param learning_rate: λ of Adam; :param steps: steps per call.
    """

    def __init__(
        self, make_model: Callable[[Tuple[tf.Tensor, tf.Tensor]], gpflow.models.GPModel], input_dim: int,
        output_dim: int, learning_rate: float, steps: int,
    ) -> None:  # fmt: skip
        dtype = gpflow.default_float()
        model = make_model((tf.zeros([1, input_dim], dtype), tf.zeros([1, output_dim], dtype)))
        self.trainer = CompiledAdam(model.trainable_variables, lambda X, Y: per_point_loss(model, X, Y), learning_rate)
        self.steps = int(steps)
        self._initial_values = [v.numpy() for v in self.trainer.variables]

    def initial_values(self) -> List[np.ndarray]:
        """The template's trainable variable values (unconstrained), in ``model.trainable_variables`` order."""
        return [v.copy() for v in self._initial_values]

    def initial_adam(self) -> AdamState:
        """A fresh Adam state."""
        return self.trainer.initial_state()

    def train(
        self, X: np.ndarray, Y: np.ndarray, values: Sequence[np.ndarray], adam: AdamState
    ) -> Tuple[List[np.ndarray], AdamState]:
        """Take the steps on ``(X, Y)`` from ``values`` with Adam state ``adam``; return the new values and state."""
        for variable, value in zip(self.trainer.variables, values):
            variable.assign(value)
        dtype = gpflow.default_float()
        _, adam = self.trainer.fit(self.steps, adam, tf.constant(X, dtype), tf.constant(Y, dtype))
        return [v.numpy() for v in self.trainer.variables], adam

    def tracing_count(self) -> int:
        """How many times the loop was traced (1 once used)."""
        return self.trainer.tracing_count()
