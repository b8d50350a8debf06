"""Compiled local training for simulated federations: one traced Adam loop shared by every client.

A simulation runs K clients in one process. Giving each client its own model copy and its own
``tf.function`` traces the training step K times (and twice more per client while Keras creates the Adam
slots), and a Python loop over steps pays the dispatch overhead of every step. :class:`CompiledAdam`
instead owns one *worker* set of variables and one ``tf_keras`` Adam optimizer, and compiles

    ``fit(num_steps, adam_state, *data) → (last loss, new adam_state)``:
    ``adam_state`` is loaded into the optimizer's slots, ``num_steps`` Adam steps on ``loss_fn(*data)``
    run inside one ``tf.while_loop``, and the slots are read back.

The data are arguments, never captured, and the signature leaves the row dimension free, so the loop is
traced once per column shape, not per client, per round or per step. Each client keeps its *own* Adam
state (iterations, first and second moments) as plain arrays in ``client.state`` (so checkpoints save it),
which makes a client's sequence of updates identical to a client with a private ``tf_keras`` Adam.
"""

from __future__ import annotations

import copy
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
from gpflow.keras import tf_keras

__all__ = ["CompiledAdam", "deepcopy_without"]


class CompiledAdam:
    """``num_steps`` Adam steps on ``variables`` minimising ``loss_fn(*data)``, with a per-caller Adam state.

    :param variables: the worker's trainable variables (assign the client's starting values before
        :meth:`fit`; read the result from them after).
    :param loss_fn: ``loss_fn(*data) -> scalar``; it must read the data from its arguments.
    :param learning_rate: Adam's step size (the ``tf_keras`` defaults for β₁, β₂, ε).
    :param compile: trace :meth:`fit` with ``tf.function`` (``False``: the same loop, eagerly).
    """

    def __init__(
        self,
        variables: Sequence[tf.Variable],
        loss_fn: Callable[..., tf.Tensor],
        learning_rate: float,
        compile: bool = True,
    ) -> None:
        self.variables: List[tf.Variable] = list(variables)
        if not self.variables:
            raise ValueError("CompiledAdam needs at least one trainable variable")
        self.loss_fn = loss_fn
        self.optimizer = tf_keras.optimizers.Adam(learning_rate=learning_rate)
        self.optimizer.build(self.variables)
        self.slots: List[tf.Variable] = list(self.optimizer.variables)  # iterations, then (m, v) per variable
        self.compile = bool(compile)
        self._compiled: Optional[Callable[..., Any]] = None
        #: held by callers around load → :meth:`fit` → read, since the worker variables are shared scratch space
        self.lock = threading.RLock()

    def initial_state(self) -> List[np.ndarray]:
        """A fresh Adam state (zero iterations and moments), as plain arrays."""
        return [np.zeros(s.shape, dtype=s.dtype.as_numpy_dtype) for s in self.slots]

    def _fit(self, num_steps: tf.Tensor, state: Sequence[tf.Tensor], data: Tuple[tf.Tensor, ...]) -> Tuple[tf.Tensor, List[tf.Tensor]]:
        for slot, value in zip(self.slots, state):
            slot.assign(value)

        def step() -> tf.Tensor:
            with tf.GradientTape() as tape:
                loss = self.loss_fn(*data)
            grads = tape.gradient(loss, self.variables)
            self.optimizer.apply_gradients([(g, v) for g, v in zip(grads, self.variables) if g is not None])
            return loss

        first = step()  # at least one step, so the returned loss is always defined
        dtype = first.dtype

        def body(i: tf.Tensor, loss: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
            with tf.control_dependencies([loss]):
                return i + 1, tf.cast(step(), dtype)

        _, loss = tf.while_loop(lambda i, _: i < num_steps, body, (tf.constant(1, tf.int32), first))
        with tf.control_dependencies([loss]):
            return tf.identity(loss), [tf.identity(s) for s in self.slots]

    def fit(self, num_steps: int, state: Sequence[np.ndarray], *data: Any) -> Tuple[float, List[np.ndarray]]:
        """Run ``num_steps ≥ 1`` Adam steps from ``state``; returns the loss of the last step (evaluated before
        its update) and the new Adam state."""
        if isinstance(num_steps, bool) or not isinstance(num_steps, (int, np.integer)) or num_steps < 1:
            raise ValueError(f"num_steps must be a positive integer, got {num_steps!r}")
        tensors = tuple(tf.convert_to_tensor(d) for d in data)
        state_t = [tf.convert_to_tensor(s, dtype=slot.dtype) for s, slot in zip(state, self.slots)]
        steps = tf.constant(int(num_steps), tf.int32)
        if not self.compile:
            loss, new_state = self._fit(steps, state_t, tensors)
        else:
            if self._compiled is None:
                signature = [
                    tf.TensorSpec([], tf.int32),
                    [tf.TensorSpec(s.shape, s.dtype) for s in self.slots],
                    tuple(tf.TensorSpec([None] + list(t.shape[1:]), t.dtype) if t.shape.rank else tf.TensorSpec([], t.dtype) for t in tensors),
                ]
                self._compiled = tf.function(self._fit, input_signature=signature, autograph=False)
            loss, new_state = self._compiled(steps, state_t, tensors)
        return float(loss), [s.numpy() for s in new_state]


def deepcopy_without(obj: Any, memo: Dict[int, Any], transient: Sequence[str]) -> Any:
    """``copy.deepcopy(obj)`` with the attributes named in ``transient`` (compiled workers and their Keras
    optimizers, which cannot be deep-copied) set to ``None`` in the copy, which rebuilds them on first use.
    For an algorithm's ``__deepcopy__`` (e.g. the Flower runtime gives each party a deep copy)."""
    cls = obj.__class__
    new = cls.__new__(cls)
    memo[id(obj)] = new
    for key, value in vars(obj).items():
        setattr(new, key, None if key in transient else copy.deepcopy(value, memo))
    return new
