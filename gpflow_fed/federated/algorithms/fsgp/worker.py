"""Helpers of FSGP: the paper's initial inducing inputs and the SGPR client worker whose compiled functions every
client of one federation shares."""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import check_shapes

from ....validation import integer
from ....training.adam import AdamState, CompiledAdam
from ....training.state import resolve_path
from .batched import BatchedSGPRWorker
from .statistics import ADJOINT_NAMES, SGPRStatistics, sgpr_statistics, statistics_vjp

__all__ = ["SGPRClientWorker", "initial_inducing_inputs"]


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


class SGPRClientWorker:
    r"""One SGPR and one :class:`~gpflow_fed.training.adam.CompiledAdam` whose compiled functions serve
    every client of a federation.

    A client's work in FSGP (Guo et al., Algorithm 1, lines 5–9; eqs. 9, 14–15) depends on the client only
    through its data ``(X_k, Y_k)``, the broadcast ``w = (θ, σ², Z)`` and, in FedAvg, its own Adam state.
    All of these are *arguments* of the functions below (data with a free leading dimension ``N_k``), so
    each function is traced once per federation instead of once per client: with K = 1,000 clients that
    turns ~K seconds of tracing into ~1 second. The worker's model and optimizer are scratch space: every
    call first loads the client's values into them and returns everything the client keeps.

    * :meth:`train`: load w and the client's :class:`~gpflow_fed.training.adam.AdamState`, take P
      Adam steps on ``F_k(w) = ELBO_k(w) / N_k`` (eq. 9; the same ``tf_keras`` Adam update a per-client
      optimizer would take), return the new w, the new Adam state and ``F_k`` at the new w;
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
        self._Y = tf.Variable(
            np.zeros((0, self.output_dim), dtype), shape=tf.TensorShape([None, self.output_dim]), trainable=False
        )
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
        # the data are the worker's variables: X and Y only give N_k here
        per_point = lambda X, Y: self.model.training_loss() / tf.cast(tf.shape(Y)[0], dtype)  # noqa: E731
        self.trainer = CompiledAdam(self.model.trainable_variables, per_point, learning_rate)
        self.local_steps = int(local_steps)
        self.whiten = bool(whiten)
        # Values and moments travel as one flat vector each: a compiled call's overhead grows with its arguments.
        self._value_shapes = [tuple(v.shape) for v in self.shared]
        self._value_sizes = [int(np.prod(shape)) for shape in self._value_shapes]
        self._moment_shapes = [tuple(m.shape) for m in self.trainer.slots[1:]]
        self._moment_size = int(sum(int(np.prod(shape)) for shape in self._moment_shapes))
        data = [tf.TensorSpec([None, D], dtype), tf.TensorSpec([None, self.output_dim], dtype)]
        values = tf.TensorSpec([sum(self._value_sizes)], dtype)
        adam = [tf.TensorSpec([], tf.int64), tf.TensorSpec([self._moment_size], dtype)]
        M = int(inducing_variable.num_inducing)  # type: ignore[arg-type]  # None only for an unknown Z shape
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
        self._concrete: Dict[str, Any] = {}
        #: the same three functions for a whole cohort (:class:`BatchedSGPRWorker`), on this worker's model and Adam;
        #: None when its trained variables are not exactly the shared GPflow Parameters
        self.batched: Optional[BatchedSGPRWorker]
        try:
            self.batched = BatchedSGPRWorker(
                self.model, self.shared, self.trainer, self.local_steps, whiten, self._lock
            )
        except ValueError:
            self.batched = None

    def _call(self, name: str, *args: Any) -> Any:
        """The compiled function ``name`` on ``args``, through its one concrete function (traced on first use).

        Calling the ``tf.function`` binds its input signature on every call (≈ 1.5 ms of a 4 ms FedAvg update at
        M = 20, measured by ``benchmarks/scale_overhead.py``); the concrete function is the same graph, so the
        results are the same to the bit.
        """
        concrete = self._concrete.get(name)
        if concrete is None:
            concrete = self._concrete[name] = self.functions[name].get_concrete_function()
        return concrete(*args)

    # --- the compiled bodies ----------------------------------------------------------------------------
    @staticmethod
    def _split(vector: tf.Tensor, shapes: Sequence[Tuple[int, ...]]) -> List[tf.Tensor]:
        parts = tf.split(vector, [int(np.prod(shape)) for shape in shapes])
        return [tf.reshape(part, shape) for part, shape in zip(parts, shapes)]

    def _assign_flat(self, variables: Sequence[tf.Variable], vector: tf.Tensor) -> None:
        for variable, value in zip(variables, self._split(vector, [tuple(v.shape) for v in variables])):
            variable.assign(value)

    @staticmethod
    def _flat(tensors: Sequence[tf.Tensor]) -> tf.Tensor:
        return tf.concat([tf.reshape(t, [-1]) for t in tensors], axis=0)

    def _train(
        self, X: tf.Tensor, Y: tf.Tensor, values: tf.Tensor, step: tf.Tensor, moments: tf.Tensor
    ) -> Tuple[tf.Tensor, tf.Tensor]:
        self._X.assign(X)
        self._Y.assign(Y)
        self._assign_flat(self.shared, values)
        _, (new_step, *new_moments) = self.trainer.steps(
            self.local_steps, [step, *self._split(moments, self._moment_shapes)], (X, Y)
        )
        # automatic control dependencies order these reads after the steps
        bound = self.model.elbo() / tf.cast(tf.shape(Y)[0], gpflow.default_float())
        return self._flat([v.read_value() for v in self.shared] + new_moments + [bound]), new_step

    def _statistics(self, X: tf.Tensor, Y: tf.Tensor, values: tf.Tensor) -> SGPRStatistics:
        self._assign_flat(self.shared, values)
        return sgpr_statistics(self.model.kernel, self.model.inducing_variable, X, Y, whiten=self.whiten)

    def _vjp(self, X: tf.Tensor, Y: tf.Tensor, values: tf.Tensor, adjoints: Dict[str, tf.Tensor]) -> List[tf.Tensor]:
        self._assign_flat(self.shared, values)
        return statistics_vjp(
            self.model.kernel, self.model.inducing_variable, X, Y, adjoints, self.shared, whiten=self.whiten
        )

    # --- the public calls ---------------------------------------------------------------------------------
    @check_shapes("return: [V]")
    def pack(self, values: Sequence[np.ndarray]) -> np.ndarray:
        """The shared values (wire order) as one flat vector, the compiled functions' argument.

        :raises ValueError: a wrong number of values or a value of the wrong shape.
        """
        if len(values) != len(self._value_shapes):
            raise ValueError(f"expected {len(self._value_shapes)} shared values, got {len(values)}")
        for value, shape in zip(values, self._value_shapes):
            if np.shape(value) != shape:
                raise ValueError(f"a shared value has shape {np.shape(value)}, expected {shape}")
        return np.concatenate([np.ravel(v) for v in values]).astype(gpflow.default_float(), copy=False)

    @staticmethod
    def _unpack(vector: np.ndarray, shapes: Sequence[Tuple[int, ...]]) -> List[np.ndarray]:
        parts = np.split(vector, np.cumsum([int(np.prod(shape)) for shape in shapes])[:-1])
        return [part.reshape(shape) for part, shape in zip(parts, shapes)]

    def initial_adam_state(self) -> AdamState:
        """A fresh client's Adam state: step 0 and zero moments (m and v of every trainable variable)."""
        return self.trainer.initial_state()

    @check_shapes("X: [N, D]", "Y: [N, P]")
    def train(
        self, X: tf.Tensor, Y: tf.Tensor, values: Sequence[np.ndarray], adam: AdamState
    ) -> Tuple[List[np.ndarray], AdamState, float]:
        """P Adam steps from w = ``values`` with the client's Adam state ``adam`` (see
        :meth:`initial_adam_state`).

        :return: the new w, the new Adam state and the local bound ``F_k = ELBO_k / N_k`` at the new w.
        :raises ValueError: values or Adam moments of the wrong shapes.
        """
        self.trainer.check(adam)
        moments = np.concatenate([np.ravel(m) for m in adam.moments])
        with self._lock:
            floats, step = self._call("train", X, Y, self.pack(values), np.asarray(adam.iterations), moments)
        floats = floats.numpy()
        V = sum(self._value_sizes)
        new_adam = AdamState(iterations=step.numpy(), moments=tuple(self._unpack(floats[V:-1], self._moment_shapes)))
        return self._unpack(floats[:V], self._value_shapes), new_adam, float(floats[-1])

    @check_shapes("X: [N, D]", "Y: [N, P]")
    def statistics(self, X: tf.Tensor, Y: tf.Tensor, values: Sequence[np.ndarray]) -> Dict[str, np.ndarray]:
        """The client's statistics (module :mod:`.fsgp_statistics`) at w = ``values``."""
        with self._lock:
            stats = self._call("statistics", X, Y, self.pack(values))
        return {k: v.numpy() for k, v in stats._asdict().items()}

    @check_shapes("X: [N, D]", "Y: [N, P]")
    def vjp(
        self, X: tf.Tensor, Y: tf.Tensor, values: Sequence[np.ndarray], adjoints: Mapping[str, np.ndarray]
    ) -> List[np.ndarray]:
        """``(∂S_k/∂w)ᵀ ∂F/∂S`` at w = ``values``, one array per shared value (see :func:`statistics_vjp`)."""
        with self._lock:
            grads = self._call("gradient", X, Y, self.pack(values), {k: adjoints[k] for k in ADJOINT_NAMES})
        return [g.numpy() for g in grads]

    def tracing_counts(self) -> Dict[str, int]:
        """How many times the compiled function of each phase was traced, per client and batched together: 1 once
        used by one path, 2 once used by both (never one per client, round or cohort)."""
        batched = {} if self.batched is None else self.batched.tracing_counts()
        return {
            name: int(fn.experimental_get_tracing_count()) + batched.get(name, 0) for name, fn in self.functions.items()
        }
