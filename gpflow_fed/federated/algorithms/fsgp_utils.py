"""Helpers of FSGP and its baselines: the paper's initial inducing inputs and a compiled Adam loop."""

from __future__ import annotations

from typing import Any, Callable, Sequence, Tuple

import gpflow
import numpy as np
import tensorflow as tf

__all__ = ["compiled_adam_loop", "initial_inducing_inputs"]


def initial_inducing_inputs(X: np.ndarray, num_inducing: int, seed: int = 0) -> np.ndarray:
    """Z as a random subset of M rows of X, without replacement (the paper's initialisation, §4).

    Privacy note: this needs training inputs at the server (the paper draws Z from the pooled X); in a
    real federation either a client volunteers these M points or Z is drawn from public knowledge of the
    input domain (e.g. uniformly in a known box).

    :param X: ``[N, D]`` inputs.
    :param num_inducing: M, with ``1 ≤ M ≤ N``.
    :param seed: seed of the draw.
    :return: ``[M, D]`` array of ``gpflow.default_float()``.
    """
    X = np.asarray(X, dtype=gpflow.default_float())
    if X.ndim != 2:
        raise ValueError(f"initial_inducing_inputs: X must have shape [N, D], got {X.shape}")
    if isinstance(num_inducing, bool) or not isinstance(num_inducing, (int, np.integer)) or num_inducing < 1:
        raise ValueError(f"initial_inducing_inputs: num_inducing must be a positive integer, got {num_inducing!r}")
    if num_inducing > X.shape[0]:
        raise ValueError(f"initial_inducing_inputs: M = {num_inducing} exceeds the number of inputs N = {X.shape[0]}")
    rows = np.random.default_rng(seed).choice(X.shape[0], size=int(num_inducing), replace=False)
    return X[np.sort(rows)].copy()


def compiled_adam_loop(
    loss: Callable[[], tf.Tensor], variables: Sequence[tf.Variable], optimizer: Any, steps: int
) -> Callable[[], tf.Tensor]:
    """A ``tf.function`` running ``steps`` ``optimizer.minimize(loss, variables)`` in one ``tf.while_loop``.

    Traced without AutoGraph (the loop is an explicit ``tf.while_loop``), which makes tracing several times
    faster than converting GPflow's code; build the optimizer on ``variables`` first. Returns the step count.
    """

    def body(i: tf.Tensor) -> Tuple[tf.Tensor]:
        optimizer.minimize(loss, variables)
        return (i + 1,)

    @tf.function(autograph=False)
    def loop() -> tf.Tensor:
        return tf.while_loop(lambda i: i < steps, body, (tf.constant(0),))[0]

    return loop
