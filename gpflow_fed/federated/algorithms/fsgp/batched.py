"""FSGP's client work for a whole cohort in one compiled call: the masked bound, the statistics and their products.

:class:`BatchedSGPRWorker` is the batched form of :class:`~gpflow_fed.federated.algorithms.fsgp.worker.SGPRClientWorker`
(its model, shared parameters and Adam): the cohort's data are stacked, padded and masked by size bucket
(:mod:`gpflow_fed.training.batched`), every client takes its own P Adam steps from the broadcast on its own
``F_k(w) = ELBO_k(w) / N_k`` (FSGP eq. 9) with its own Adam state, and each client gets back exactly what the per-client
worker returns it, up to round-off (a padded row adds exact zeros, which can change a sum's order).
"""

from __future__ import annotations

import threading
from typing import Any, Dict, Final, List, Mapping, Sequence, Tuple

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import check_shapes
from gpflow.covariances import Kuf, Kuu
from gpflow.utilities import add_noise_cov

from ....training.adam import AdamState, CompiledAdam
from ....training.batched import (
    PADDING_RATIO,
    Bucket,
    StackedTraining,
    memory_chunks,
    per_client,
    stack_padded,
)
from .statistics import ADJOINT_NAMES, SGPRStatistics

__all__ = [
    "BYTES_PER_CLIENT_FACTOR",
    "BatchedSGPRWorker",
    "masked_sgpr_elbo",
    "masked_sgpr_statistics",
]

#: bytes per client of one batched training call ≈ this × 8 × (M² + M L + L (D + P) + |w|), L the bucket's padded
#: length: the peak resident memory one call of B = 2,000 to 8,000 clients added here was 38–42 KB a client at M = 20,
#: L = 10, D = P = 1 (a factor 7.4–8.1) and 156–158 KB at M = 40, L = 30 (6.7–6.8)
BYTES_PER_CLIENT_FACTOR: Final[int] = 8


def _split_rows(block: np.ndarray, offsets: Sequence[Tuple[int, int, Tuple[int, ...]]]) -> List[List[np.ndarray]]:
    """Per row of ``block`` (``[B, S]``, the clients along the leading axis), the arrays of its flat row at ``offsets``
    (:func:`~gpflow_fed.training.batched.flat_offsets`), as :func:`~gpflow_fed.training.batched.split_flat` gives
    them for one row; one slice and reshape per array for the whole block, not per client (views of ``block``).
    """
    B = int(block.shape[0])
    columns = [block[:, start:stop].reshape((B,) + tuple(shape)) for start, stop, shape in offsets]
    return [[column[i, ...] for column in columns] for i in range(B)]


def _stack_states(
    states: Sequence[AdamState], offsets: Sequence[Tuple[int, int, Tuple[int, ...]]]
) -> Tuple[np.ndarray, np.ndarray]:
    """``(iterations [B], moments [B, S])`` of B clients' Adam states (moments of the shapes ``offsets`` lays out,
    :func:`~gpflow_fed.training.batched.flat_offsets`), as :func:`~gpflow_fed.training.batched.stack_adam_states`
    stacks them, one ``np.array`` per moment written into one preallocated block."""
    B, size = len(states), (offsets[-1][1] if offsets else 0)
    moments: np.ndarray = np.empty((B, size), gpflow.default_float())
    for j, (start, stop, _) in enumerate(offsets):
        moments[:, start:stop] = np.array([state.moments[j] for state in states]).reshape(B, stop - start)
    return np.array([state.iterations for state in states], np.int64), moments


@check_shapes("X: [N, D]", "Y: [N, P]", "mask: [N]", "return: []")
def masked_sgpr_elbo(model: gpflow.models.SGPR, X: tf.Tensor, Y: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
    r"""Titsias' collapsed bound (``gpflow.models.SGPR.elbo``) of ``model``'s kernel, Z, likelihood and mean function on
    the rows of ``(X, Y)`` whose ``mask`` is 1; a row whose mask is 0 contributes nothing.

    The same operations as GPflow's SGPR (``_common_calculation``, ``logdet_term``, ``quad_term``), with every per-row
    quantity multiplied by the mask: the kernel column ``k(Z, x_n)``, ``k(x_n, x_n)``, ``log σ²(x_n)`` and the residual
    ``y_n − μ(x_n)``, and ``N = Σ_n mask_n``; so for a mask of ones it is ``SGPR.elbo`` on ``(X, Y)`` to round-off.
    """
    dtype = X.dtype
    weights = tf.cast(mask, dtype)
    iv, kernel = model.inducing_variable, model.kernel
    sigma_sq = tf.squeeze(model.likelihood.variance_at(X), axis=-1)
    sigma = tf.sqrt(sigma_sq)
    kuf = Kuf(iv, kernel, X) * weights
    kuu = Kuu(iv, kernel, jitter=gpflow.config.default_jitter())
    L = tf.linalg.cholesky(kuu)
    A = tf.linalg.triangular_solve(L, kuf / sigma, lower=True)
    AAT = tf.linalg.matmul(A, A, transpose_b=True)
    B = add_noise_cov(AAT, tf.cast(1.0, AAT.dtype))
    LB = tf.linalg.cholesky(B)
    # logdet_term
    outdim = tf.cast(tf.shape(Y)[1], dtype)
    kdiag = kernel(X, full_cov=False) * weights
    trace_k = tf.reduce_sum(kdiag / sigma_sq)
    trace_q = tf.reduce_sum(tf.linalg.diag_part(AAT))
    trace = trace_k - trace_q
    half_logdet_b = tf.reduce_sum(tf.math.log(tf.linalg.diag_part(LB)))
    log_sigma_sq = tf.reduce_sum(tf.math.log(sigma_sq) * weights)
    logdet = -outdim * (half_logdet_b + 0.5 * log_sigma_sq + 0.5 * trace)
    # quad_term
    err = (Y - model.mean_function(X)) * weights[:, None] / sigma[..., None]
    Aerr = tf.linalg.matmul(A, err)
    c = tf.linalg.triangular_solve(LB, Aerr, lower=True)
    quad = -0.5 * (tf.reduce_sum(tf.square(err)) - tf.reduce_sum(tf.square(c)))
    # elbo
    num_data = tf.reduce_sum(weights)
    const = -0.5 * num_data * outdim * np.log(2 * np.pi)
    return const + logdet + quad


@check_shapes(
    "X: [N, D]",
    "Y: [N, P]",
    "mask: [N]",
    "return.kuf_kfu: [M, M]",
    "return.kuf_y: [M, P]",
    "return.y_squared_sum: []",
    "return.trace_kff: []",
    "return.num_data: []",
)
def masked_sgpr_statistics(
    kernel: gpflow.kernels.Kernel,
    inducing_variable: gpflow.inducing_variables.InducingVariables,
    X: tf.Tensor,
    Y: tf.Tensor,
    mask: tf.Tensor,
    whiten: bool = False,
) -> SGPRStatistics:
    """One client's statistics (:func:`~gpflow_fed.federated.algorithms.fsgp.statistics.sgpr_statistics`) of the rows
    whose ``mask`` is 1: the kernel column, ``y_n``, ``k(x_n, x_n)`` and the count of a row whose mask is 0 are zero."""
    weights = tf.cast(mask, X.dtype)
    kuf = Kuf(inducing_variable, kernel, X) * weights
    if whiten:
        kuu = Kuu(inducing_variable, kernel, jitter=gpflow.config.default_jitter())
        kuf = tf.linalg.triangular_solve(tf.linalg.cholesky(kuu), kuf, lower=True)
    Y = Y * weights[:, None]
    return SGPRStatistics(
        kuf_kfu=tf.linalg.matmul(kuf, kuf, transpose_b=True),
        kuf_y=tf.linalg.matmul(kuf, Y),
        y_squared_sum=tf.reduce_sum(tf.square(Y)),
        trace_kff=tf.reduce_sum(kernel(X, full_cov=False) * weights),
        num_data=tf.reduce_sum(weights),
    )


class BatchedSGPRWorker:
    r"""The per-client worker's three functions for a cohort: :meth:`train`, :meth:`statistics` and :meth:`vjp`.

    Each takes the clients' data as a list, buckets them by size (at most ``PADDING_RATIO · N_k`` rows each,
    :func:`~gpflow_fed.training.batched.size_buckets`), splits a bucket into chunks that fit ``memory_budget`` bytes
    (:meth:`bytes_per_client`), and runs one compiled call per chunk, traced once per run (free batch size and padded
    length). Per client it returns what :class:`~gpflow_fed.federated.algorithms.fsgp.worker.SGPRClientWorker` returns.

    :param model: the per-client worker's SGPR: its kernel, Z and likelihood give the GP maths, evaluated at each
        client's values (:func:`~gpflow_fed.training.batched.parameters_at`); nothing is assigned to its variables.
    :param shared: the unconstrained variables of the shared values, in wire order.
    :param trainer: the per-client worker's Adam (its variables, optimizer and state layout).
    :param local_steps: P.
    :param whiten: the statistics are whitened.
    :param lock: the per-client worker's lock, held by every call (tracing reads the shared model's parameters at
        other values while it lasts).
    :raises ValueError: a trained variable that is not a shared GPflow Parameter's, or an Adam state layout other than
        ``tf_keras``' (the step count, then m and v of each variable in turn).
    """

    def __init__(
        self,
        model: gpflow.models.SGPR,
        shared: Sequence[tf.Variable],
        trainer: CompiledAdam,
        local_steps: int,
        whiten: bool,
        lock: threading.Lock,
    ) -> None:
        self.model, self.local_steps, self.whiten, self.lock = model, int(local_steps), bool(whiten), lock
        variables = trainer.variables
        by_variable = {id(p.unconstrained_variable): p for p in model.trainable_parameters}
        if {id(v) for v in variables} != {id(v) for v in shared} or not all(id(v) in by_variable for v in variables):
            raise ValueError("the batched FSGP worker trains exactly the shared GPflow Parameters")
        #: the trained Parameters, in the trainer's (and its Adam state's) order
        self.parameters: List[gpflow.Parameter] = [by_variable[id(v)] for v in variables]
        self._prior_parameters = list(model.trainable_parameters)  # the order of SGPR.log_prior_density
        position = {id(v): i for i, v in enumerate(variables)}
        #: the Adam loop, with values in wire order (the trainer position of each shared variable)
        self.training = StackedTraining(trainer, self.parameters, self.local_steps, [position[id(v)] for v in shared])
        dtype = gpflow.default_float()
        D = int(model.inducing_variable.Z.shape[1])
        P = int(model.data[1].shape[1])
        M = int(model.inducing_variable.Z.shape[0])
        self.input_dim, self.output_dim, self.num_inducing = D, P, M
        train = self.training.signature(D, P)  # data, values, then Adam's step counts and moments
        data, values = train[:3], train[3]
        adjoints = {
            "kuf_kfu": tf.TensorSpec([M, M], dtype),
            "kuf_y": tf.TensorSpec([M, P], dtype),
            "trace_kff": tf.TensorSpec([], dtype),
        }
        self.functions: Dict[str, Any] = {
            "train": tf.function(self._train, input_signature=train, autograph=False),
            "statistics": tf.function(self._statistics, input_signature=data + [values], autograph=False),
            "gradient": tf.function(self._vjp, input_signature=data + [values, adjoints], autograph=False),
        }

    # --- memory -------------------------------------------------------------------------------------------
    def bytes_per_client(self, length: int) -> int:
        """The working set of one client in a batched call with padded length L:
        ``BYTES_PER_CLIENT_FACTOR · 8 · (M² + M L + L (D + P) + |w|)`` bytes."""
        M, L = self.num_inducing, int(length)
        size = M * M + M * L + L * (self.input_dim + self.output_dim) + self.training.value_size
        return BYTES_PER_CLIENT_FACTOR * 8 * size

    # --- the compiled bodies ----------------------------------------------------------------------------
    def _loss(self, X: tf.Tensor, Y: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
        """One client's ``training_loss() / N_k`` (``-(ELBO_k + log prior) / N_k``) at the substituted parameters."""
        prior = tf.add_n([p.log_prior_density() for p in self._prior_parameters])
        return -(masked_sgpr_elbo(self.model, X, Y, mask) + prior) / tf.reduce_sum(mask)

    def _bound(self, X: tf.Tensor, Y: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
        return masked_sgpr_elbo(self.model, X, Y, mask) / tf.reduce_sum(mask)

    def _train(
        self, X: tf.Tensor, Y: tf.Tensor, mask: tf.Tensor, values: tf.Tensor, iterations: tf.Tensor, moments: tf.Tensor
    ) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
        variables, new_moments, iterations, _ = self.training.fit(self._loss, (X, Y, mask), values, iterations, moments)
        bound = per_client(self._bound, self.parameters, variables, (X, Y, mask))
        return self.training.flat_values(variables), new_moments, iterations, bound

    def _statistics(self, X: tf.Tensor, Y: tf.Tensor, mask: tf.Tensor, values: tf.Tensor) -> SGPRStatistics:
        variables = self.training.stacked_values(values, tf.shape(X)[0])
        model = self.model
        return per_client(
            lambda x, y, m: masked_sgpr_statistics(model.kernel, model.inducing_variable, x, y, m, self.whiten),
            self.parameters,
            variables,
            (X, Y, mask),
        )

    def _vjp(
        self, X: tf.Tensor, Y: tf.Tensor, mask: tf.Tensor, values: tf.Tensor, adjoints: Mapping[str, tf.Tensor]
    ) -> tf.Tensor:
        variables = self.training.stacked_values(values, tf.shape(X)[0])
        model = self.model
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(variables)
            stats = per_client(
                lambda x, y, m: masked_sgpr_statistics(model.kernel, model.inducing_variable, x, y, m, self.whiten),
                self.parameters,
                variables,
                (X, Y, mask),
            )
            # Σ_s ⟨∂F/∂s, s_k⟩: its gradient is the per-client vector-Jacobian product (statistics_vjp)
            target = tf.add_n([tf.reduce_sum(getattr(stats, name) * adjoints[name]) for name in ADJOINT_NAMES])
        grads = tape.gradient(target, variables, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return self.training.flat_values(grads)

    # --- the public calls ---------------------------------------------------------------------------------
    def _chunks(self, sizes: Sequence[int], memory_budget: int) -> List[Bucket]:
        """The size buckets of ``sizes``, each in chunks of at most ``memory_budget`` bytes (at least one client)."""
        return memory_chunks(sizes, memory_budget, self.bytes_per_client, PADDING_RATIO)

    def _data(self, data: Sequence[Tuple[np.ndarray, np.ndarray]], chunk: Bucket) -> List[Any]:
        """The chunk's stacked, padded ``X``, ``Y`` and row mask."""
        X, mask = stack_padded([data[k][0] for k in chunk.members], chunk.length)
        Y, _ = stack_padded([data[k][1] for k in chunk.members], chunk.length)
        return [X, Y, mask]

    @check_shapes("values: [V]")
    def train(
        self,
        data: Sequence[Tuple[np.ndarray, np.ndarray]],
        values: np.ndarray,
        states: Sequence[AdamState],
        memory_budget: int,
    ) -> List[Tuple[List[np.ndarray], AdamState, float]]:
        """P Adam steps of every client from the broadcast ``values`` (flat, wire order) with its own Adam state.

        :param data: each client's ``(X_k, Y_k)``.
        :param states: each client's :class:`AdamState` (checked by the caller).
        :param memory_budget: bytes one compiled call may use (a larger bucket goes in chunks).
        :return: per client, what ``SGPRClientWorker.train`` returns: the new w, the new Adam state and ``F_k``
            (each client's arrays are views of its row of the chunk's one copy of the outputs, as rows never overlap).
        """
        training = self.training
        out: List[Any] = [None] * len(data)
        for chunk in self._chunks([len(d[1]) for d in data], memory_budget):
            iterations, moments = _stack_states([states[k] for k in chunk.members], training.moment_offsets)
            with self.lock:
                outputs = self.functions["train"](*self._data(data, chunk), values, iterations, moments)
            new_values, new_moments, new_iterations, bounds = (t.numpy() for t in outputs)
            # one copy of the chunk's outputs (so no client's arrays alias TensorFlow's buffers), then each client's
            # arrays as views of its own row: what StackedTraining.train gives, without its per-client copies
            new_values, new_moments, new_iterations = (
                np.array(a, copy=True) for a in (new_values, new_moments, new_iterations)
            )
            value_rows = _split_rows(new_values, training.value_offsets)
            moment_rows = _split_rows(new_moments, training.moment_offsets)
            for i, k in enumerate(chunk.members):
                state = AdamState(new_iterations[i, ...], tuple(moment_rows[i]))
                out[k] = (value_rows[i], state, float(bounds[i]))
        return out

    @check_shapes("values: [V]")
    def statistics(
        self, data: Sequence[Tuple[np.ndarray, np.ndarray]], values: np.ndarray, memory_budget: int
    ) -> List[Dict[str, np.ndarray]]:
        """Every client's statistics at the broadcast ``values`` (what ``SGPRClientWorker.statistics`` returns)."""
        out: List[Any] = [None] * len(data)
        for chunk in self._chunks([len(d[1]) for d in data], memory_budget):
            with self.lock:
                stats = self.functions["statistics"](*self._data(data, chunk), values)
            arrays = {name: value.numpy() for name, value in stats._asdict().items()}
            names, columns = list(arrays), [list(a) for a in arrays.values()]  # a[i] per client, in one pass
            for k, row in zip(chunk.members, zip(*columns)):
                out[k] = dict(zip(names, row))
        return out

    @check_shapes("values: [V]")
    def vjp(
        self,
        data: Sequence[Tuple[np.ndarray, np.ndarray]],
        values: np.ndarray,
        adjoints: Mapping[str, np.ndarray],
        memory_budget: int,
    ) -> List[List[np.ndarray]]:
        """Every client's ``(∂S_k/∂w)ᵀ ∂F/∂S`` at the broadcast ``values`` (what ``SGPRClientWorker.vjp`` returns)."""
        out: List[Any] = [None] * len(data)
        for chunk in self._chunks([len(d[1]) for d in data], memory_budget):
            with self.lock:
                grads = self.functions["gradient"](
                    *self._data(data, chunk), values, {k: adjoints[k] for k in ADJOINT_NAMES}
                )
            for k, row in zip(chunk.members, _split_rows(grads.numpy(), self.training.value_offsets)):
                out[k] = row
        return out

    def tracing_counts(self) -> Dict[str, int]:
        """How many times each batched function was traced (1 once used, whatever the cohorts and sizes)."""
        return {name: int(fn.experimental_get_tracing_count()) for name, fn in self.functions.items()}
