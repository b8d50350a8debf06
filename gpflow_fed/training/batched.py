"""Batched local training: the clients of a cohort in one compiled computation over stacked, padded, masked data.

A simulation that trains its K clients one after the other pays one compiled call (and its Python) per client and
round. Here every client of a cohort is a slice of one computation instead:

* **Data** are stacked into ``[B, L, ·]`` tensors, each client's ``N_k`` rows followed by ``L − N_k`` *padded* rows,
  and a ``[B, L]`` mask (1 for a real row, 0 for a padded one). A padded row repeats the client's first row (so it is
  as finite as the data) and the algorithm's bound multiplies every per-row term by the mask, its kernel column and
  its weight included, so it contributes exactly nothing (not only through its y).
* **Buckets** (:func:`size_buckets`) keep the padding bounded: clients sorted by size, a bucket opens at its smallest
  ``N_min`` and takes every following client with ``N_k ≤ ratio · N_min``; its length L is its largest ``N_k``. So
  each client is padded to at most ``ratio · N_k`` rows, and at most ``(ratio − 1) / ratio`` of a bucket's rows are
  padding (worst case: ``N_min`` and ``⌊ratio · N_min⌋`` together); with the default ratio 1.25 that is ≤ 20 % of the
  rows (≤ 25 % more rows than the data), and a cohort of sizes from ``N_min`` to ``N_max`` makes at most
  ``⌈log(N_max / N_min) / log(ratio)⌉ + 1`` buckets. Clients of equal size are never padded.
* **Chunks** (:func:`chunked`): a bucket larger than a memory budget is processed in consecutive chunks of
  ``budget // bytes_per_client`` clients (at least one), never refused.
* **Per-client parameters**: every client starts from the broadcast but takes its own steps, so the shared values are
  stacked ``[B, ·]`` tensors; :func:`per_client` maps a function of one client over the batch
  (``tf.vectorized_map``) with the model's GPflow ``Parameter``\\ s evaluated at that client's unconstrained values
  (:func:`parameters_at`), so the GP maths stays GPflow's own (kernels, ``Kuf``/``Kuu``, likelihood, priors).
* **Per-client optimiser state**: :class:`StackedAdam` is B copies of one ``tf_keras`` Adam as a pure function of
  stacked step counts and moments (Kingma & Ba 2015, Algorithm 1, in ``tf_keras``' own operation order), so each
  client's update is the one its private optimizer takes, and its :class:`~gpflow_fed.training.adam.AdamState` is
  stacked before and split after (checkpoints keep saving it per client).
* **The training loop** every batched worker runs (:class:`StackedTraining`): the broadcast tiled to ``[B, ·]``, P
  stacked Adam steps on the sum of the clients' own losses, and per chunk of :func:`memory_chunks` the stacking of the
  clients' data and Adam states and the split of the results per client; a worker supplies only its loss.

The batch only replaces the local computation: in a federated run, each client's policy, encoding and ledger entries
are applied to its own slice of the output as before (``gpflow_fed.federated.runtimes.local.LocalRuntime``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Final, Iterator, List, Optional, Sequence, Tuple

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import check_shapes
from gpflow.keras import tf_keras

from ..validation import integer
from .adam import AdamState, CompiledAdam

__all__ = [
    "stack_adam_states",
    "unstack_adam_state",
    "flat_offsets",
    "split_flat",
    "PADDING_RATIO",
    "Bucket",
    "StackedAdam",
    "StackedTraining",
    "chunked",
    "clients_per_chunk",
    "memory_chunks",
    "padding_overhead",
    "parameters_at",
    "per_client",
    "size_buckets",
    "stack_padded",
    "trained_parameters",
]

#: the default bucketing ratio: a client is padded to at most 1.25 N_k rows (≤ 20 % of a bucket's rows are padding)
PADDING_RATIO: Final[float] = 1.25


@dataclass(frozen=True)
class Bucket:
    """Clients trained in one compiled call: their positions in the cohort and the padded length L of their data."""

    members: Tuple[int, ...]
    length: int


def size_buckets(sizes: Sequence[int], ratio: float = PADDING_RATIO) -> List[Bucket]:
    """The cohort's clients grouped by size so that each is padded to at most ``ratio · N_k`` rows (module docstring).

    Greedy over the sorted sizes (the fewest buckets under that bound): a bucket opens at the smallest remaining
    ``N_min`` and takes every client with ``N_k ≤ ratio · N_min``; its length is its largest ``N_k``. Padded rows are
    then at most ``(ratio − 1) / ratio`` of a bucket's rows.

    :param sizes: ``N_k ≥ 1`` of each client, in cohort order.
    :param ratio: the bound on ``L / N_k``, ≥ 1 (1: only clients of equal size share a bucket).
    :return: the buckets, smallest sizes first; members keep cohort order within a bucket.
    :raises ValueError: a size below 1 or a ratio below 1.
    """
    if not ratio >= 1.0:
        raise ValueError(f"ratio must be at least 1, got {ratio!r}")
    order = sorted(range(len(sizes)), key=lambda k: (int(sizes[k]), k))
    buckets: List[Bucket] = []
    members: List[int] = []
    smallest = 0
    for k in order:
        n = integer(sizes[k], "a client's size", minimum=1)
        if members and n > ratio * smallest:
            buckets.append(Bucket(tuple(sorted(members)), int(sizes[members[-1]])))
            members = []
        if not members:
            smallest = n
        members.append(k)
    if members:
        buckets.append(Bucket(tuple(sorted(members)), int(sizes[members[-1]])))
    return buckets


def chunked(bucket: Bucket, max_clients: int) -> List[Bucket]:
    """``bucket`` in consecutive chunks of at most ``max_clients ≥ 1`` clients (same length L)."""
    integer(max_clients, "max_clients", minimum=1)
    members = bucket.members
    return [Bucket(members[i : i + max_clients], bucket.length) for i in range(0, len(members), max_clients)]


def stack_padded(arrays: Sequence[np.ndarray], length: int) -> Tuple[np.ndarray, np.ndarray]:
    """``[B, length, ...]`` of ``arrays`` (each ``[N_k, ...]``, ``1 ≤ N_k ≤ length``), padded by repeating each one's
    first row, and the ``[B, length]`` row mask (1 real, 0 padded) in ``gpflow.default_float()``.

    :raises ValueError: no arrays, an empty array, one longer than ``length``, or trailing shapes that differ.
    """
    if not arrays:
        raise ValueError("stack_padded needs at least one array")
    dtype = gpflow.default_float()
    sizes = [int(np.shape(a)[0]) for a in arrays]
    if min(sizes) < 1 or max(sizes) > length:
        raise ValueError(f"every array needs 1 … {length} rows, got sizes from {min(sizes)} to {max(sizes)}")
    if all(n == length for n in sizes):
        return np.stack(arrays).astype(dtype, copy=False), np.ones((len(arrays), length), dtype)
    tail = tuple(np.shape(arrays[0])[1:])
    out: np.ndarray = np.empty((len(arrays), length) + tail, dtype)
    mask: np.ndarray = np.zeros((len(arrays), length), dtype)
    for k, (a, n) in enumerate(zip(arrays, sizes)):
        out[k, :n] = a
        out[k, n:] = a[0]
        mask[k, :n] = 1.0
    return out, mask


@contextlib.contextmanager
def parameters_at(parameters: Sequence[gpflow.Parameter], unconstrained: Sequence[tf.Tensor]) -> Iterator[None]:
    """Inside the block, each GPflow ``Parameter`` reads as its transform of the given unconstrained tensor.

    For tracing a function of a model at values that are tensors rather than the parameters' variables (one client's
    slice of stacked values in :func:`per_client`): the parameter keeps its transform, prior and shape; only its
    pre-transformed input (``Parameter.unconstrained_variable``) is the tensor until the block ends. Nothing is
    assigned, so no variable changes.

    :raises ValueError: a tensor whose shape differs from its parameter's unconstrained shape.
    """
    if len(parameters) != len(unconstrained):
        raise ValueError(f"{len(parameters)} parameters but {len(unconstrained)} values")
    saved = [p.unconstrained_variable for p in parameters]
    for p, value in zip(parameters, unconstrained):
        if not p.unconstrained_variable.shape.is_compatible_with(value.shape):
            raise ValueError(
                f"a value of shape {value.shape} for a parameter of shape {p.unconstrained_variable.shape}"
            )
    try:
        for p, value in zip(parameters, unconstrained):
            # TransformedVariable reads its pre-transformed input on every use (tfp.util.DeferredTensor)
            p._pretransformed_input = value
        yield
    finally:
        for p, variable in zip(parameters, saved):
            p._pretransformed_input = variable


def per_client(
    fn: Callable[..., Any],
    parameters: Sequence[gpflow.Parameter],
    values: Sequence[tf.Tensor],
    data: Sequence[tf.Tensor],
) -> Any:
    """``fn(*data_k)`` for every client k of a batch, with ``parameters`` at client k's ``values`` (``[B, ·]`` each,
    unconstrained), as one vectorised computation (``tf.vectorized_map``); outputs are stacked along a leading B.

    Gradients of the outputs with respect to ``values`` are per client: client k's outputs depend on its slice only.
    """

    def one(elems: Tuple[tf.Tensor, ...]) -> Any:
        own, rows = elems[: len(values)], elems[len(values) :]
        with parameters_at(parameters, own):
            return fn(*rows)

    return tf.vectorized_map(one, (*values, *data))


class StackedAdam:
    """B copies of one ``tf_keras`` Adam as a pure function of stacked values, gradients, step counts and moments.

    :meth:`step` is ``optimizer.apply_gradients`` for each client, in ``tf_keras``' order of operations
    (``tf_keras.optimizers.Adam.update_step``, dense case, no AMSGrad): with ``t = iterations + 1``,
    ``α = λ √(1 − β₂ᵗ) / (1 − β₁ᵗ)``, ``m ← m + (g − m)(1 − β₁)``, ``v ← v + (g² − v)(1 − β₂)``,
    ``w ← w − m α / (√v + ε)``; λ is read through the optimizer's float32 variable as it does. Each client has its
    own t, so clients at different steps share one call.

    :param optimizer: the ``tf_keras`` Adam whose update this is (its λ, β₁, β₂, ε).
    :raises TypeError: not a ``tf_keras`` Adam; :raises ValueError: AMSGrad or an adaptive ε (not implemented).
    """

    def __init__(self, optimizer: tf_keras.optimizers.Optimizer) -> None:
        if not isinstance(optimizer, tf_keras.optimizers.Adam):
            raise TypeError(f"StackedAdam needs a tf_keras Adam, got {type(optimizer).__name__}")
        if optimizer.amsgrad or getattr(optimizer, "adaptive_epsilon", False):
            raise ValueError("StackedAdam implements Adam without AMSGrad or an adaptive epsilon")
        self.learning_rate = float(optimizer.learning_rate.numpy())  # the float32 variable's value, as apply reads it
        self.beta_1, self.beta_2, self.epsilon = float(optimizer.beta_1), float(optimizer.beta_2), optimizer.epsilon

    @check_shapes("iterations: [B]")
    def step(
        self,
        iterations: tf.Tensor,
        variables: Sequence[tf.Tensor],
        grads: Sequence[tf.Tensor],
        first: Sequence[tf.Tensor],
        second: Sequence[tf.Tensor],
    ) -> Tuple[tf.Tensor, List[tf.Tensor], List[tf.Tensor], List[tf.Tensor]]:
        """One Adam step of every client: ``(iterations + 1, variables, first moments, second moments)``.

        :param iterations: ``[B]`` int64 step counts.
        :param variables: each ``[B, ·]``; ``grads``, ``first`` and ``second`` alike.
        """
        dtype = variables[0].dtype
        local_step = tf.cast(iterations + 1, dtype)
        beta_1_power = tf.pow(tf.cast(self.beta_1, dtype), local_step)
        beta_2_power = tf.pow(tf.cast(self.beta_2, dtype), local_step)
        alpha = tf.cast(self.learning_rate, dtype) * tf.sqrt(1 - beta_2_power) / (1 - beta_1_power)
        new_variables, new_first, new_second = [], [], []
        for w, g, m, v in zip(variables, grads, first, second):
            a = tf.reshape(alpha, [-1] + [1] * (len(w.shape) - 1))
            m = m + (g - m) * (1 - self.beta_1)
            v = v + (tf.square(g) - v) * (1 - self.beta_2)
            new_variables.append(w - (m * a) / (tf.sqrt(v) + self.epsilon))
            new_first.append(m)
            new_second.append(v)
        return iterations + 1, new_variables, new_first, new_second


def clients_per_chunk(memory_budget: int, bytes_per_client: int) -> int:
    """``max(1, memory_budget // bytes_per_client)``: how many clients one chunk holds within the budget."""
    return max(1, int(memory_budget) // max(1, int(bytes_per_client)))


def padding_overhead(sizes: Sequence[int], ratio: float = PADDING_RATIO) -> float:
    """The padded rows :func:`size_buckets` adds, as a fraction of the real rows (0: none; at most ``ratio − 1``)."""
    real = sum(int(n) for n in sizes)
    padded = sum(b.length * len(b.members) for b in size_buckets(sizes, ratio))
    return padded / real - 1.0 if real else 0.0


def flat_offsets(shapes: Sequence[Tuple[int, ...]]) -> List[Tuple[int, int, Tuple[int, ...]]]:
    """``(start, stop, shape)`` of each array of ``shapes`` laid end to end in one flat row (a client's values or
    Adam moments in a stacked batch)."""
    out, start = [], 0
    for shape in shapes:
        stop = start + int(np.prod(shape))
        out.append((start, stop, tuple(shape)))
        start = stop
    return out


def split_flat(row: np.ndarray, offsets: Sequence[Tuple[int, int, Tuple[int, ...]]]) -> List[np.ndarray]:
    """Views of the arrays of one flat ``row`` (:func:`flat_offsets`)."""
    return [row[start:stop].reshape(shape) for start, stop, shape in offsets]


def stack_adam_states(states: Sequence[AdamState], moment_count: int) -> Tuple[np.ndarray, np.ndarray]:
    """``(iterations [B], moments [B, S])`` of B clients' Adam states for :class:`StackedAdam`: each row the client's
    moments flattened one after another in :class:`~gpflow_fed.training.adam.AdamState` order."""
    B = len(states)
    own = [state.moments for state in states]
    moments = np.concatenate([np.stack([m[j] for m in own]).reshape(B, -1) for j in range(moment_count)], axis=1)
    return np.array([state.iterations for state in states], np.int64), moments


def unstack_adam_state(
    iterations: np.ndarray, moments: np.ndarray, offsets: Sequence[Tuple[int, int, Tuple[int, ...]]]
) -> AdamState:
    """One client's :class:`~gpflow_fed.training.adam.AdamState` from its row of a stacked batch (copies, so the
    batch's arrays can go)."""
    return AdamState(np.array(iterations, copy=True), tuple(split_flat(np.array(moments, copy=True), offsets)))


def memory_chunks(
    sizes: Sequence[int], memory_budget: int, bytes_per_client: Callable[[int], int], ratio: float = PADDING_RATIO
) -> List[Bucket]:
    """The size buckets of ``sizes`` (:func:`size_buckets`), each in consecutive chunks of at most ``memory_budget``
    bytes (``bytes_per_client(L)`` a client at the bucket's padded length L; at least one client a chunk)."""
    out: List[Bucket] = []
    for bucket in size_buckets(sizes, ratio):
        out.extend(chunked(bucket, clients_per_chunk(memory_budget, bytes_per_client(bucket.length))))
    return out


def trained_parameters(module: tf.Module, variables: Sequence[tf.Variable]) -> Optional[List[gpflow.Parameter]]:
    """The trainable GPflow ``Parameter``\\ s of ``module`` whose unconstrained variables are ``variables``, in their
    order; None if one of ``variables`` is not such a variable (e.g. a ``tf_keras`` layer's weight) or comes twice."""
    by_variable = {id(p.unconstrained_variable): p for p in module.trainable_parameters}
    if not all(id(v) in by_variable for v in variables) or len({id(v) for v in variables}) != len(variables):
        return None
    return [by_variable[id(v)] for v in variables]


class StackedTraining:
    """The batched form of ``CompiledAdam.fit`` for one per-client worker: P ``tf_keras`` Adam steps of every client of
    a chunk from the broadcast, on its own loss, with its own Adam state (:class:`StackedAdam`).

    The workers (FSGP's, FGP's, FedBNR's) differ only in their loss and in how they bucket; this is the rest. Values
    travel flat: the broadcast is one ``[|w|]`` row, each client's result one row of ``[B, |w|]``, in ``value_order``;
    Adam moments are ``[B, S]`` rows in the trainer's order (m and v of each variable in turn).

    :param trainer: the per-client worker's Adam (its variables, optimizer and state layout).
    :param parameters: the GPflow ``Parameter``\\ s whose unconstrained variables are ``trainer.variables``, in that
        order (:func:`trained_parameters`): each client's loss reads them at its own values (:func:`per_client`).
    :param local_steps: P ≥ 1, the steps every client takes.
    :param value_order: for each flat value, the position of its variable in ``trainer.variables`` (default: the
        trainer's order; FSGP's wire order otherwise).
    :raises ValueError: an Adam state layout other than ``tf_keras``' (the step count, then m and v of each variable in
        turn), or a ``value_order`` that is not a permutation of the trainer's variables.
    """

    def __init__(
        self,
        trainer: CompiledAdam,
        parameters: Sequence[gpflow.Parameter],
        local_steps: int,
        value_order: Optional[Sequence[int]] = None,
    ) -> None:
        variables = trainer.variables
        slots = trainer.slots[1:]
        expected = [(prefix, tuple(v.shape)) for v in variables for prefix in ("m/", "v/")]
        if [(s.name[:2], tuple(s.shape)) for s in slots] != expected:
            raise ValueError("the Adam state is not tf_keras' layout (m and v of each variable in turn)")
        order = list(range(len(variables))) if value_order is None else [int(i) for i in value_order]
        if sorted(order) != list(range(len(variables))):
            raise ValueError(f"value_order {order} is not a permutation of the {len(variables)} trained variables")
        self.parameters, self.local_steps = list(parameters), int(local_steps)
        self.adam = StackedAdam(trainer.optimizer)
        #: flat position j holds trainer variable ``value_order[j]``; ``_from_flat[i]``: the flat position of variable i
        self.value_order = order
        self._from_flat = [order.index(i) for i in range(len(variables))]
        self.value_shapes = [tuple(variables[i].shape) for i in order]
        self.moment_shapes = [tuple(s.shape) for s in slots]
        self.value_offsets, self.moment_offsets = flat_offsets(self.value_shapes), flat_offsets(self.moment_shapes)
        self.value_size = int(sum(int(np.prod(s)) for s in self.value_shapes))
        self.moment_size = int(sum(int(np.prod(s)) for s in self.moment_shapes))

    def signature(self, input_dim: int, output_dim: Optional[int]) -> List[tf.TensorSpec]:
        """The input signature of a compiled ``fit`` call: ``X [B, L, D]``, ``Y [B, L, P]`` (``None``: a free P),
        the row mask ``[B, L]``, the flat broadcast ``[|w|]``, step counts ``[B]`` and moments ``[B, S]``."""
        dtype = gpflow.default_float()
        return [
            tf.TensorSpec([None, None, input_dim], dtype),
            tf.TensorSpec([None, None, output_dim], dtype),
            tf.TensorSpec([None, None], dtype),
            tf.TensorSpec([self.value_size], dtype),
            tf.TensorSpec([None], tf.int64),
            tf.TensorSpec([None, self.moment_size], dtype),
        ]

    def stacked_values(self, values: tf.Tensor, batch: tf.Tensor) -> List[tf.Tensor]:
        """The flat broadcast ``values``, one copy per client (``[B, ·]`` each), in the trainer's order."""
        parts = tf.split(values, [int(np.prod(s)) for s in self.value_shapes])
        flat = [tf.tile(tf.reshape(p, [1, *s]), [batch] + [1] * len(s)) for p, s in zip(parts, self.value_shapes)]
        return [flat[j] for j in self._from_flat]

    def flat_values(self, stacked: Sequence[tf.Tensor]) -> tf.Tensor:
        """``[B, |w|]`` in ``value_order`` from trainer-ordered ``[B, ·]`` values (or their gradients)."""
        batch = tf.shape(stacked[0])[0]
        return tf.concat([tf.reshape(stacked[i], [batch, -1]) for i in self.value_order], axis=1)

    def fit(
        self,
        loss: Callable[..., tf.Tensor],
        data: Sequence[tf.Tensor],
        values: tf.Tensor,
        iterations: tf.Tensor,
        moments: tf.Tensor,
    ) -> Tuple[List[tf.Tensor], tf.Tensor, tf.Tensor, tf.Tensor]:
        """``local_steps`` Adam steps of every client (traced inside a worker's compiled call).

        Each step minimises ``Σ_k loss(data_k)`` at client k's values; client k's loss depends on its own slice only
        (:func:`per_client`), so the gradient of the sum is each client's own gradient.

        :param loss: one client's loss of its rows of ``data`` (``X``, ``Y``, mask), with :attr:`parameters` at its
            values.
        :param data: ``[B, L, ·]`` tensors, the clients along the leading axis.
        :param values: the flat broadcast ``[|w|]``; every client starts from it.
        :param iterations: ``[B]`` Adam step counts; ``moments``: ``[B, S]``.
        :return: the new values (trainer order, ``[B, ·]`` each), the new moments ``[B, S]``, step counts ``[B]`` and
            each client's loss before its last step ``[B]``.
        """
        batch = tf.shape(data[0])[0]
        variables = self.stacked_values(values, batch)
        sizes = [int(np.prod(s)) for s in self.moment_shapes]
        slots = [
            tf.reshape(part, [batch, *shape])
            for part, shape in zip(tf.split(moments, sizes, axis=1), self.moment_shapes)
        ]
        first, second = slots[0::2], slots[1::2]

        def body(
            i: tf.Tensor, it: tf.Tensor, ws: List[tf.Tensor], ms: List[tf.Tensor], vs: List[tf.Tensor], _: tf.Tensor
        ) -> Any:
            with tf.GradientTape(watch_accessed_variables=False) as tape:
                tape.watch(ws)
                losses = per_client(loss, self.parameters, ws, data)
                total = tf.reduce_sum(losses)  # client k's loss depends on its own slice only
            grads = tape.gradient(total, ws)
            it, ws, ms, vs = self.adam.step(it, ws, grads, ms, vs)
            return i + 1, it, ws, ms, vs, losses

        start = (tf.constant(0), iterations, variables, first, second, tf.zeros([batch], values.dtype))
        _, iterations, variables, first, second, last = tf.while_loop(lambda i, *_: i < self.local_steps, body, start)
        new_moments = tf.concat([tf.reshape(s, [batch, -1]) for pair in zip(first, second) for s in pair], axis=1)
        return variables, new_moments, iterations, last

    def compiled(self, loss: Callable[..., tf.Tensor], input_dim: int, output_dim: Optional[int]) -> Any:
        """The compiled batched training of ``loss`` (:meth:`fit`, traced once: free batch size and padded length):
        ``(X, Y, mask, values, iterations, moments) ↦ (values [B, |w|] in value_order, moments [B, S], step counts
        [B], each client's loss before its last step [B])``, the call :meth:`train` takes.

        :param loss: one client's loss of its rows (``X``, ``Y``, mask), with :attr:`parameters` at its values.
        :param input_dim: D; ``output_dim``: P (``None``: free).
        """

        def call(
            X: tf.Tensor, Y: tf.Tensor, mask: tf.Tensor, values: tf.Tensor, iterations: tf.Tensor, moments: tf.Tensor
        ) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
            variables, new_moments, iterations, last = self.fit(loss, (X, Y, mask), values, iterations, moments)
            return self.flat_values(variables), new_moments, iterations, last

        return tf.function(call, input_signature=self.signature(input_dim, output_dim), autograph=False)

    def train(
        self,
        function: Callable[..., Sequence[tf.Tensor]],
        chunks: Sequence[Bucket],
        data: Sequence[Tuple[np.ndarray, np.ndarray]],
        values: np.ndarray,
        states: Sequence[AdamState],
    ) -> List[Any]:
        """``function(X, Y, mask, values, iterations, moments)`` (a worker's compiled call, returning ``[B, |w|]``
        values, ``[B, S]`` moments, ``[B]`` step counts and a ``[B]`` scalar per client) on each chunk's stacked,
        padded data and Adam states, split per client.

        :param chunks: the cohort's chunks; their members are positions in ``data`` and ``states``.
        :return: per client, in order: ``(its new values in value_order and shapes, its new AdamState, its scalar)``
            (None for a client in no chunk).
        """
        out: List[Any] = [None] * len(data)
        for chunk in chunks:
            iterations, moments = stack_adam_states([states[k] for k in chunk.members], len(self.moment_shapes))
            X, mask = stack_padded([data[k][0] for k in chunk.members], chunk.length)
            Y, _ = stack_padded([data[k][1] for k in chunk.members], chunk.length)
            outputs = function(X, Y, mask, values, iterations, moments)
            new_values, new_moments, new_iterations, scalars = (t.numpy() for t in outputs)
            for i, k in enumerate(chunk.members):
                state = unstack_adam_state(new_iterations[i], new_moments[i], self.moment_offsets)
                out[k] = (split_flat(new_values[i].copy(), self.value_offsets), state, float(scalars[i]))
        return out
