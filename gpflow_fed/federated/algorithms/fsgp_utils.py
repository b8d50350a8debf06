"""Helpers of FSGP and its baselines: the paper's initial inducing inputs, a compiled Adam loop, and the
SGPR client worker whose compiled functions every client of one federation shares."""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, List, Mapping, Sequence, Tuple

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import check_shapes
from gpflow.keras import tf_keras

from ...validation import integer
from ..state import resolve_path
from .fsgp_statistics import ADJOINT_NAMES, SGPRStatistics, sgpr_statistics, statistics_vjp

__all__ = ["SGPRClientWorker", "adam_steps", "compiled_adam_loop", "initial_inducing_inputs"]


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
    integer(num_inducing, "initial_inducing_inputs: num_inducing", minimum=1)
    if num_inducing > X.shape[0]:
        raise ValueError(f"initial_inducing_inputs: M = {num_inducing} exceeds the number of inputs N = {X.shape[0]}")
    rows = np.random.default_rng(seed).choice(X.shape[0], size=int(num_inducing), replace=False)
    return X[np.sort(rows)].copy()


def adam_steps(loss: Callable[[], tf.Tensor], variables: Sequence[tf.Variable], optimizer: Any, steps: int) -> tf.Tensor:
    """``steps`` calls of ``optimizer.minimize(loss, variables)`` as one ``tf.while_loop`` (call it inside a
    ``tf.function``; build the optimizer on ``variables`` first). Returns the step count."""

    def body(i: tf.Tensor) -> Tuple[tf.Tensor]:
        optimizer.minimize(loss, variables)
        return (i + 1,)

    return tf.while_loop(lambda i: i < steps, body, (tf.constant(0),))[0]


def compiled_adam_loop(
    loss: Callable[[], tf.Tensor], variables: Sequence[tf.Variable], optimizer: Any, steps: int
) -> Callable[[], tf.Tensor]:
    """A ``tf.function`` running ``steps`` ``optimizer.minimize(loss, variables)`` in one ``tf.while_loop``.

    Traced without AutoGraph (the loop is an explicit ``tf.while_loop``), which makes tracing several times
    faster than converting GPflow's code; build the optimizer on ``variables`` first. Returns the step count.
    """

    @tf.function(autograph=False)
    def loop() -> tf.Tensor:
        return adam_steps(loss, variables, optimizer, steps)

    return loop


class SGPRClientWorker:
    r"""One SGPR and one ``tf_keras`` Adam whose compiled functions serve every client of a federation.

    A client's work in FSGP (Guo et al., Algorithm 1, lines 5–9; eqs. 9, 14–15) depends on the client only
    through its data ``(X_k, Y_k)``, the broadcast ``w = (θ, σ², Z)`` and, in FedAvg, its own Adam state.
    All of these are *arguments* of the functions below (data with a free leading dimension ``N_k``), so
    each function is traced once per federation instead of once per client: with K = 1,000 clients that
    turns ~K seconds of tracing into ~1 second. The worker's model and optimizer are scratch space: every
    call first loads the client's values into them and returns everything the client keeps.

    * :meth:`train`: load w and the client's Adam moments and step count, take P Adam steps on
      ``F_k(w) = ELBO_k(w) / N_k`` (eq. 9; the same ``tf_keras`` Adam update a per-client optimizer would
      take), return the new w, the new Adam state and ``F_k`` at the new w;
    * :meth:`statistics`: the client's statistics at w (eqs. 14–17; whitened if ``whiten``);
    * :meth:`vjp`: the client's vector-Jacobian product of the statistics (exact mode).

    Shared values are unconstrained (``Parameter.unconstrained_variable``), in the order of ``shared_paths``.
    The worker's variables are scratch space shared by all clients, so calls are serialised by a lock
    (runtimes that run clients in threads stay correct).

    :param kernel: the template kernel (copied).
    :param inducing_variable: the template ``InducingPoints`` (copied; fixes M and D).
    :param noise_variance: the initial σ² (its value is replaced at every call).
    :param output_dim: P.
    :param shared_paths: the attribute paths of the shared GPflow parameters, in wire order.
    :param learning_rate: λ of the Adam update.
    :param local_steps: P, the Adam steps of :meth:`train`.
    :param whiten: compute the whitened statistics ``(L⁻¹CCᵀL⁻ᵀ, L⁻¹Cy)`` (see :func:`sgpr_statistics`).
    """

    def __init__(
        self,
        kernel: gpflow.kernels.Kernel,
        inducing_variable: gpflow.inducing_variables.InducingPoints,
        noise_variance: float,
        output_dim: int,
        shared_paths: Sequence[str],
        learning_rate: float,
        local_steps: int,
        whiten: bool,
    ) -> None:
        dtype = gpflow.default_float()
        D = int(inducing_variable.Z.shape[1])
        self.input_dim, self.output_dim = D, int(output_dim)
        self._X = tf.Variable(np.zeros((0, D), dtype), shape=tf.TensorShape([None, D]), trainable=False)
        self._Y = tf.Variable(np.zeros((0, self.output_dim), dtype), shape=tf.TensorShape([None, self.output_dim]), trainable=False)
        self.model = gpflow.models.SGPR(
            (self._X, self._Y),
            kernel=gpflow.utilities.deepcopy(kernel),
            inducing_variable=gpflow.utilities.deepcopy(inducing_variable),
            noise_variance=noise_variance,
        )
        self.shared: List[tf.Variable] = []
        for path in shared_paths:
            parameter = resolve_path(self.model, path)
            if not isinstance(parameter, gpflow.Parameter):
                raise TypeError(f"FSGP shares GPflow Parameters only; {path!r} is a {type(parameter).__name__}")
            self.shared.append(parameter.unconstrained_variable)
        self.trainable = list(self.model.trainable_variables)
        self.optimizer = tf_keras.optimizers.Adam(learning_rate=learning_rate)
        self.optimizer.build(self.trainable)
        self.step, *self.moments = self.optimizer.variables  # the step count, then Adam's m and v of each variable
        if self.step.dtype != tf.int64 or any(m.dtype != dtype for m in self.moments):
            raise TypeError("SGPRClientWorker expects a tf_keras Adam with an int64 step count and float moments")
        self.local_steps = int(local_steps)
        self.whiten = bool(whiten)
        # Values and moments travel as one flat vector each: a compiled call's overhead grows with its arguments.
        self._value_shapes = [tuple(v.shape) for v in self.shared]
        self._value_sizes = [int(np.prod(shape)) for shape in self._value_shapes]
        self._moment_size = int(sum(int(np.prod(m.shape)) for m in self.moments))
        data = [tf.TensorSpec([None, D], dtype), tf.TensorSpec([None, self.output_dim], dtype)]
        values = tf.TensorSpec([sum(self._value_sizes)], dtype)
        adam = [tf.TensorSpec([], tf.int64), tf.TensorSpec([self._moment_size], dtype)]
        M = int(inducing_variable.num_inducing)
        adjoints = {
            "kuf_kfu": tf.TensorSpec([M, M], dtype),
            "kuf_y": tf.TensorSpec([M, self.output_dim], dtype),
            "trace_kff": tf.TensorSpec([], dtype),
        }
        self._lock = threading.Lock()
        self.functions: Dict[str, Any] = {
            "train": tf.function(self._train, input_signature=data + [values] + adam, autograph=False),
            "statistics": tf.function(self._statistics, input_signature=data + [values], autograph=False),
            "gradient": tf.function(self._vjp, input_signature=data + [values, adjoints], autograph=False),
        }

    # --- the compiled bodies ----------------------------------------------------------------------------
    @staticmethod
    def _assign_flat(variables: Sequence[tf.Variable], vector: tf.Tensor) -> None:
        sizes = [int(np.prod(v.shape)) for v in variables]
        for variable, part in zip(variables, tf.split(vector, sizes)):
            variable.assign(tf.reshape(part, variable.shape))

    @staticmethod
    def _flat(tensors: Sequence[tf.Tensor]) -> tf.Tensor:
        return tf.concat([tf.reshape(t, [-1]) for t in tensors], axis=0)

    def _train(
        self, X: tf.Tensor, Y: tf.Tensor, values: tf.Tensor, step: tf.Tensor, moments: tf.Tensor
    ) -> Tuple[tf.Tensor, tf.Tensor]:
        self._X.assign(X)
        self._Y.assign(Y)
        self._assign_flat(self.shared, values)
        self.step.assign(step)
        self._assign_flat(self.moments, moments)
        num_data = tf.cast(tf.shape(Y)[0], gpflow.default_float())
        adam_steps(lambda: self.model.training_loss() / num_data, self.trainable, self.optimizer, self.local_steps)
        # automatic control dependencies order these reads after the steps
        bound = self.model.elbo() / num_data
        floats = self._flat([v.read_value() for v in self.shared] + [m.read_value() for m in self.moments] + [bound])
        return floats, self.step.read_value()

    def _statistics(self, X: tf.Tensor, Y: tf.Tensor, values: tf.Tensor) -> SGPRStatistics:
        self._assign_flat(self.shared, values)
        return sgpr_statistics(self.model.kernel, self.model.inducing_variable, X, Y, whiten=self.whiten)

    def _vjp(self, X: tf.Tensor, Y: tf.Tensor, values: tf.Tensor, adjoints: Dict[str, tf.Tensor]) -> List[tf.Tensor]:
        self._assign_flat(self.shared, values)
        return statistics_vjp(
            self.model.kernel, self.model.inducing_variable, X, Y, adjoints, self.shared, whiten=self.whiten
        )

    # --- the public calls ---------------------------------------------------------------------------------
    def _pack(self, values: Sequence[np.ndarray]) -> np.ndarray:
        if len(values) != len(self._value_shapes):
            raise ValueError(f"expected {len(self._value_shapes)} shared values, got {len(values)}")
        for value, shape in zip(values, self._value_shapes):
            if np.shape(value) != shape:
                raise ValueError(f"a shared value has shape {np.shape(value)}, expected {shape}")
        return np.concatenate([np.ravel(v) for v in values]).astype(gpflow.default_float(), copy=False)

    def _unpack(self, vector: np.ndarray) -> List[np.ndarray]:
        parts = np.split(vector, np.cumsum(self._value_sizes)[:-1])
        return [part.reshape(shape) for part, shape in zip(parts, self._value_shapes)]

    def initial_adam_state(self) -> Dict[str, np.ndarray]:
        """A fresh client's Adam state: ``{"step": 0, "moments": zeros}`` (m and v of every trainable
        variable, flattened in the optimizer's order); plain arrays, so checkpoints save them."""
        return {"step": np.zeros((), np.int64), "moments": np.zeros(self._moment_size, gpflow.default_float())}

    @check_shapes("X: [N, D]", "Y: [N, P]")
    def train(
        self, X: tf.Tensor, Y: tf.Tensor, values: Sequence[np.ndarray], adam: Mapping[str, np.ndarray]
    ) -> Tuple[List[np.ndarray], Dict[str, np.ndarray], float]:
        """P Adam steps from w = ``values`` with the client's Adam state ``adam`` (see
        :meth:`initial_adam_state`).

        :return: the new w, the new Adam state and the local bound ``F_k = ELBO_k / N_k`` at the new w.
        """
        moments = np.asarray(adam["moments"])
        if moments.shape != (self._moment_size,):
            raise ValueError(f"Adam moments have shape {moments.shape}, expected ({self._moment_size},)")
        with self._lock:
            floats, step = self.functions["train"](X, Y, self._pack(values), np.asarray(adam["step"]), moments)
        floats = floats.numpy()
        V = sum(self._value_sizes)
        new_adam = {"step": step.numpy(), "moments": floats[V:-1]}
        return self._unpack(floats[:V]), new_adam, float(floats[-1])

    @check_shapes("X: [N, D]", "Y: [N, P]")
    def statistics(self, X: tf.Tensor, Y: tf.Tensor, values: Sequence[np.ndarray]) -> Dict[str, np.ndarray]:
        """The client's statistics (module :mod:`.fsgp_statistics`) at w = ``values``."""
        with self._lock:
            stats = self.functions["statistics"](X, Y, self._pack(values))
        return {k: v.numpy() for k, v in stats._asdict().items()}

    @check_shapes("X: [N, D]", "Y: [N, P]")
    def vjp(
        self, X: tf.Tensor, Y: tf.Tensor, values: Sequence[np.ndarray], adjoints: Mapping[str, np.ndarray]
    ) -> List[np.ndarray]:
        """``(∂S_k/∂w)ᵀ ∂F/∂S`` at w = ``values``, one array per shared value (see :func:`statistics_vjp`)."""
        with self._lock:
            grads = self.functions["gradient"](X, Y, self._pack(values), {k: adjoints[k] for k in ADJOINT_NAMES})
        return [g.numpy() for g in grads]

    def tracing_counts(self) -> Dict[str, int]:
        """How many times each compiled function was traced (1 once used: no retracing per client)."""
        return {name: int(fn.experimental_get_tracing_count()) for name, fn in self.functions.items()}
