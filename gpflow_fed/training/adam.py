"""Local training in a simulated federation: one compiled Adam loop on one worker shared by every client.

A model and a ``tf.function`` per client would trace K times; instead an algorithm keeps one *worker* (scratch
variables) in a :class:`SharedWorker` and trains it with one :class:`CompiledAdam`, whose ``tf.while_loop``
(:func:`adam_steps`) takes the client's data as arguments with the rows left free: one trace serves every client,
round and step. Each client keeps its own Adam state (:class:`AdamState`: the step count t and moments m, v of
Kingma & Ba 2015, Algorithm 1), loaded before its steps and read back after, so its updates are those of a private
``tf_keras`` Adam, and checkpoints save it.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, Generic, Iterator, List, Optional, Sequence, Tuple, TypeVar

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import check_shapes
from gpflow.keras import tf_keras

__all__ = ["AdamState", "CompiledAdam", "SharedWorker", "adam_steps", "per_point_loss"]

W = TypeVar("W")


@dataclass(frozen=True)
class AdamState:
    """One party's ``tf_keras`` Adam state between its updates (plain arrays, so checkpoints save it).

    :param iterations: the step count t, an ``int64`` scalar array.
    :param moments: the first and second moments (m, v) of every trained variable, in the optimizer's order
        (``optimizer.variables`` after the step count).
    """

    iterations: np.ndarray
    moments: Tuple[np.ndarray, ...]


def adam_steps(
    loss: Callable[[], tf.Tensor],
    variables: Sequence[tf.Variable],
    optimizer: tf_keras.optimizers.Optimizer,
    num_steps: Any,
    after_step: Optional[Callable[[], Any]] = None,
) -> tf.Tensor:
    """``num_steps`` optimizer steps on ``loss()`` over ``variables``, as one ``tf.while_loop``.

    Call it inside a ``tf.function`` (it needs no AutoGraph), with the optimizer built on ``variables`` first so
    that no slot is created while tracing. A variable without a gradient is left alone.

    :param num_steps: a Python integer or an ``int32`` scalar tensor (any value then reuses one trace).
    :param after_step: called after each update, e.g. to advance a random-stream counter.
    :return: ``[num_steps]`` losses, each evaluated before its step's update, in ``gpflow.default_float()``.
    """
    dtype = gpflow.default_float()

    def body(i: tf.Tensor, losses: tf.TensorArray) -> Tuple[tf.Tensor, tf.TensorArray]:
        with tf.GradientTape() as tape:
            value = loss()
        grads = tape.gradient(value, variables)
        optimizer.apply_gradients([(g, v) for g, v in zip(grads, variables) if g is not None])
        if after_step is not None:
            after_step()
        return i + 1, losses.write(i, tf.cast(value, dtype))

    start = (tf.constant(0), tf.TensorArray(dtype, size=num_steps))
    return tf.while_loop(lambda i, _: i < num_steps, body, start)[1].stack()


@check_shapes("X: [N, D]", "Y: [N, P]", "return: []")
def per_point_loss(model: gpflow.models.GPModel, X: tf.Tensor, Y: tf.Tensor) -> tf.Tensor:
    """``model.training_loss() / N`` on ``(X, Y)`` instead of the model's own data: the loss of a shared worker
    model (e.g. ``gpflow.models.SGPR``, ``GPR``) on a client's data given as arguments of a compiled loop."""
    own = model.data
    model.data = (X, Y)
    try:
        return model.training_loss() / tf.cast(tf.shape(X)[0], gpflow.default_float())
    finally:
        model.data = own


class CompiledAdam:
    """``tf_keras`` Adam steps minimising ``loss_fn(*data)`` over ``variables``, from and to a caller's
    :class:`AdamState`.

    :param variables: the worker's trained variables (assign a client's values before :meth:`fit`, read them after).
    :param loss_fn: ``loss_fn(*data) -> scalar``; it must read the data from its arguments.
    :param learning_rate: Adam's step size (the ``tf_keras`` defaults for β₁, β₂, ε).
    :param compile: trace :meth:`fit` with ``tf.function`` (``False``: the same loop, eagerly).
    :raises ValueError: no variables.
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
        self.slots: List[tf.Variable] = list(self.optimizer.variables)  # the step count, then (m, v) per variable
        self._moment_shapes = [tuple(s.shape) for s in self.slots[1:]]  # checked for every client's state
        self.compile = bool(compile)
        self._compiled: Optional[Any] = None  # a tf.function

    def initial_state(self) -> AdamState:
        """A fresh Adam state: step count 0 and zero moments."""
        zeros = [np.zeros(s.shape, dtype=s.dtype.as_numpy_dtype) for s in self.slots]
        return AdamState(iterations=zeros[0], moments=tuple(zeros[1:]))

    def check(self, state: AdamState) -> None:
        """:raises TypeError: not an :class:`AdamState`; :raises ValueError: moments of other shapes."""
        if not isinstance(state, AdamState):
            raise TypeError(f"expected an AdamState, got {type(state).__name__}")
        shapes = [m.shape if isinstance(m, np.ndarray) else tuple(np.shape(m)) for m in state.moments]
        expected = self._moment_shapes
        if shapes != expected:
            raise ValueError(f"Adam moments have shapes {shapes}, expected {expected}")

    def steps(
        self, num_steps: Any, state: Sequence[tf.Tensor], data: Sequence[tf.Tensor]
    ) -> Tuple[tf.Tensor, List[tf.Tensor]]:
        """The traced body of :meth:`fit`, to compose in another ``tf.function``: load ``state`` (step count, then
        moments) into the optimizer, take the steps, and return the ``[num_steps]`` losses and the new state."""
        for slot, value in zip(self.slots, state):
            slot.assign(value)
        losses = adam_steps(lambda: self.loss_fn(*data), self.variables, self.optimizer, num_steps)
        with tf.control_dependencies([losses]):
            return tf.identity(losses), [s.read_value() for s in self.slots]

    def fit(self, num_steps: int, state: AdamState, *data: Any) -> Tuple[np.ndarray, AdamState]:
        """Run ``num_steps ≥ 1`` Adam steps from ``state``.

        :return: the losses of the steps (each evaluated before its update) and the new Adam state.
        :raises ValueError: ``num_steps`` is not a positive integer, or ``state`` does not fit this optimizer.
        """
        if isinstance(num_steps, bool) or not isinstance(num_steps, (int, np.integer)) or num_steps < 1:
            raise ValueError(f"num_steps must be a positive integer, got {num_steps!r}")
        self.check(state)
        tensors = tuple(tf.convert_to_tensor(d) for d in data)
        values = [state.iterations, *state.moments]
        state_t = [tf.convert_to_tensor(v, dtype=s.dtype) for v, s in zip(values, self.slots)]
        if self._compiled is None and self.compile:
            signature = [
                tf.TensorSpec([], tf.int32),
                [tf.TensorSpec(s.shape, s.dtype) for s in self.slots],
                tuple(tf.TensorSpec([None, *t.shape[1:]] if t.shape.rank else [], t.dtype) for t in tensors),
            ]
            # A partial, not the bound method: TensorFlow's retracing warning adds up the traces of every function
            # with the same code, and each worker rightly traces its own loop once.
            self._compiled = tf.function(
                functools.partial(CompiledAdam.steps, self), input_signature=signature, autograph=False
            )
        losses, new_state = (self._compiled or self.steps)(tf.constant(int(num_steps), tf.int32), state_t, tensors)
        arrays = [s.numpy() for s in new_state]
        return losses.numpy(), AdamState(iterations=arrays[0], moments=tuple(arrays[1:]))

    def tracing_count(self) -> int:
        """How many times :meth:`fit` was traced (1 once used compiled, whatever the clients' sizes)."""
        return 0 if self._compiled is None else int(self._compiled.experimental_get_tracing_count())


class SharedWorker(Generic[W]):
    """A worker built on first use and shared by every client of its owner, used under one lock.

    :param build: builds the worker; a *bound method* of the owner, so that a deep copy of the owner builds its
        own worker (:meth:`__deepcopy__`).
    """

    def __init__(self, build: Callable[..., W]) -> None:
        self._build = build
        self._worker: Optional[W] = None
        #: held while a caller loads a client into the worker, trains and reads the result
        self.lock = threading.RLock()

    def get(self, *args: Any) -> W:
        """The worker, built by ``build(*args)`` on the first call (later calls ignore ``args``)."""
        with self.lock:
            if self._worker is None:
                self._worker = self._build(*args)
            return self._worker

    @property
    def built(self) -> Optional[W]:
        """The worker if it has been built, else ``None`` (builds nothing)."""
        return self._worker

    @contextlib.contextmanager
    def use(self, *args: Any) -> Iterator[W]:
        """``with shared.use() as worker:`` the worker (see :meth:`get`), held under the lock, so updates of
        clients that run in threads happen one at a time."""
        with self.lock:
            yield self.get(*args)

    def __deepcopy__(self, memo: Dict[int, Any]) -> "SharedWorker[W]":
        """An unbuilt worker whose ``build`` is bound to the copy of the owner."""
        return SharedWorker(copy.deepcopy(self._build, memo))
