r"""FedBNR's phase 1 for a whole cohort in one compiled call: the BLR evidence with padded rows masked out exactly.

:class:`BatchedBLRWorker` is the batched form of FedBNR's per-client ``"kernel"`` update (the shared worker
:class:`~gpflow_fed.models.BayesianLinearRegression` trained by a :class:`~gpflow_fed.training.adam.CompiledAdam`, one
client at a time): the cohort's data are stacked, padded and masked by size bucket (:mod:`gpflow_fed.training.batched`),
every client takes its own ``local_steps`` ``tf_keras`` Adam steps (:class:`~gpflow_fed.training.batched.StackedAdam`,
its own step count and moments) from the broadcast (θ, σ², λ²) on its own ``−log p(y_c | X_c) / N_c`` (thesis eq. 3.3,
:func:`~gpflow_fed.federated.algorithms.fedbnr.negative_log_marginal_likelihood_per_point`), and gets back what the
per-client update computes, up to round-off (:func:`masked_negative_log_marginal_likelihood_per_point`: the padded rows
add exact zeros to the real rows' numbers, which can change only the order of a sum).

**Primal and dual.** The per-client objective is computed in the primal (eq. 2.8, from ``ΦᵀΦ``, an L×L Cholesky
factor) when ``N_c ≥ L`` and in the dual (the ``N_c × N_c`` Cholesky factor of ``λ²ΦΦᵀ + σ²I``) when ``N_c < L``, L the
kernel's number of features. A batched call computes one of the two for all its clients, so a cohort is first split by
that rule on each client's own ``N_c`` (never on its padded length), and each client gets the form it gets on its own.

**What it batches.** The trained variables must be exactly the unconstrained variables of the model's trainable GPflow
``Parameter``\ s (σ_f², the feature map's lengthscales or offset, σ², λ²), evaluated at each client's values by
:func:`~gpflow_fed.training.batched.parameters_at`. A kernel with a ``tf_keras`` network (a feature extractor, a
distribution shifter or a network feature map) trains weights that are plain ``tf.Variable``\ s read inside Keras
layers, which that substitution cannot reach: :class:`BatchedBLRWorker` refuses it (``ValueError``) and FedBNR keeps the
per-client path for such kernels.

**Memory and buckets.** Clients are bucketed by :func:`~gpflow_fed.training.batched.size_buckets` (ratio
:data:`~gpflow_fed.training.batched.PADDING_RATIO` = 1.25: each client padded to at most ``1.25 N_c`` rows) within each
of the two forms; a bucket goes in consecutive chunks of ``max(1, batch_memory // bytes_per_client)`` clients
(:meth:`BatchedBLRWorker.bytes_per_client`: ``BYTES_PER_CLIENT_FACTOR · 8 · (L_p (D + P + L) + S + |ω| + 3 |w|)`` bytes
with ``L_p`` the padded length, ``S = L_p²`` in the dual and ``L²`` in the primal), so one compiled call holds at most
``batch_memory`` bytes of client working sets (or one client): a cohort that does not fit is processed in chunks, never
refused.
"""

from __future__ import annotations

import functools
from typing import Any, Dict, Final, List, Sequence, Tuple

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import check_shapes

from ...models.bayesian_linear_regression import BayesianLinearRegression, blr_log_marginal_likelihood
from ...training.adam import AdamState, CompiledAdam
from ...training.batched import PADDING_RATIO, Bucket, StackedTraining, memory_chunks, trained_parameters
from ...training.state import SharedState, resolve_path

__all__ = ["BYTES_PER_CLIENT_FACTOR", "BatchedBLRWorker", "masked_negative_log_marginal_likelihood_per_point"]

#: bytes per client of one batched call ≈ this × 8 × (its numbers, :meth:`BatchedBLRWorker.bytes_per_client`): FGP's
#: factor (:data:`~gpflow_fed.federated.algorithms.fgp_batched.BYTES_PER_CLIENT_FACTOR`, measured there for the same
#: kind of computation: features or a covariance, a Cholesky factor, their gradients), not measured for FedBNR apart
BYTES_PER_CLIENT_FACTOR: Final[int] = 10


@check_shapes("X: [N, D]", "Y: [N, P]", "mask: [N]", "return: []")
def masked_negative_log_marginal_likelihood_per_point(
    model: BayesianLinearRegression, X: tf.Tensor, Y: tf.Tensor, mask: tf.Tensor, dual: bool
) -> tf.Tensor:
    r"""``−log p(y_R | X_R) / N_c`` (thesis eq. 3.3) of ``model``'s kernel, σ² and λ² on the rows R of ``(X, Y)`` whose
    ``mask`` is 1, ``N_c = |R|``; the rows whose mask is 0 (padded, P) contribute exactly nothing, when they all come
    after the real ones, as :func:`~gpflow_fed.training.batched.stack_padded` places them.

    Derivation. Let ``m`` be the mask, ``Φ = φ(X)`` the ``[N, L]`` features of every row (a padded row repeats a real
    one, so its features are finite) and ``Φ̃ = diag(m) Φ``, ``ỹ = diag(m) y``: the real rows' features and targets with
    the padded rows set to exact zeros (a product by 0).

    * Primal (``dual=False``, eq. 2.8): the objective reads the data only through the statistics
      ``Φ̃ᵀΦ̃ = Σ_n m_n φ_n φ_nᵀ``, ``Φ̃ᵀỹ``, ``ỹᵀỹ`` and ``N_c = Σ_n m_n``. Each is the real rows' sum plus terms that
      are products with an exact zero, i.e. exact zeros; adding an exact zero changes no floating-point number, so the
      statistics are those of ``(X_R, y_R)`` up to the order of the sums, and so is
      :func:`~gpflow_fed.models.blr_log_marginal_likelihood` of them (eq. 2.8, normalised).
    * Dual (``dual=True``, eqs. 2.9–2.18): with ``Σ̃ = λ² Φ̃Φ̃ᵀ + diag(σ² m + (1 − m))``

      .. math::
          \tilde Σ = \begin{pmatrix} λ^2 Φ_R Φ_R^\top + σ^2 I_R & 0 \\ 0 & I_P \end{pmatrix},

      since ``Φ̃Φ̃ᵀ`` has exact zeros in every padded row and column, ``σ² · 1 + (1 − 1) = σ²`` on a real diagonal
      and ``σ² · 0 + 1 = 1`` on a padded one. Its Cholesky factor is ``diag(L_R, I_P)`` *exactly* (each entry of a
      padded row in a real column is ``(0 − Σ_{k<j} 0) / L_jj = 0`` by induction over j, each padded diagonal
      ``√(1 − 0) = 1``, and the real block is the same recursion on the same numbers as ``cholesky(Σ_R)``); then
      ``α = L⁻¹ ỹ = (L_R⁻¹ y_R, 0)`` and ``Σ_n log L_nn = Σ_{n∈R} log (L_R)_nn + |P| log 1``, so per output column

      .. math::
          -\tfrac12 \|α\|^2 - \sum_n \log L_{nn} - \tfrac{N_c}{2} \log 2π
          = \log N(y_R \mid 0, λ^2 Φ_R Φ_R^\top + σ^2 I),

      with the constant counting the real rows only (``N_c = Σ_n m_n``, not the padded length).

    The gradient is the real rows' too: every path from a padded row's features or target to the result passes through
    a factor ``m_n = 0`` (times finite numbers), or through the constant 1 on ``Σ̃``'s padded diagonal. For a mask of
    ones both forms are the per-client objective on ``(X, Y)`` to round-off.

    :param model: supplies the kernel, σ² (its likelihood's variance) and λ² (``prior_variance``); its data are not
        read.
    :param mask: 1 for a real row, 0 for a padded one; the real rows first.
    :param dual: the dual form (the per-client path's for ``N_c < L``) instead of the primal.
    """
    Phi = model.kernel.features(X)
    weights = tf.cast(mask, Phi.dtype)
    Phi = Phi * weights[:, None]
    Y = tf.cast(Y, Phi.dtype) * weights[:, None]
    noise, prior = model.likelihood.variance, model.prior_variance
    num_data = tf.reduce_sum(weights)
    if dual:
        diagonal = noise * weights + (1 - weights)
        cov = prior * tf.linalg.matmul(Phi, Phi, transpose_b=True) + tf.linalg.diag(diagonal)
        chol = tf.linalg.cholesky(cov)
        alpha = tf.linalg.triangular_solve(chol, Y, lower=True)
        log_prob = -0.5 * tf.reduce_sum(tf.square(alpha), 0)  # [P], as gpflow.logdensities.multivariate_normal
        log_prob -= 0.5 * num_data * np.log(2 * np.pi)
        log_prob -= tf.reduce_sum(tf.math.log(tf.linalg.diag_part(chol)))
        lml = tf.reduce_sum(log_prob)
    else:
        phi_t_phi = tf.linalg.matmul(Phi, Phi, transpose_a=True)
        phi_t_y = tf.linalg.matmul(Phi, Y, transpose_a=True)
        y_t_y = tf.reduce_sum(tf.square(Y), axis=0)
        lml = blr_log_marginal_likelihood(phi_t_phi, phi_t_y, y_t_y, num_data, noise, prior)
    return -lml / num_data


class BatchedBLRWorker:
    r"""FedBNR's phase-1 local training of a cohort: :meth:`train` is the per-client loop (``CompiledAdam.fit`` of the
    shared BLR) for every client at once.

    It splits the clients by form (dual for ``N_c < L``, else primal), buckets each part by size, splits a bucket into
    chunks within the memory budget (module docstring), and runs one compiled call per chunk; each form is traced once
    per run (free batch size, padded length and output count). Each client's steps minimise its
    ``−log p(y_c | X_c) / N_c`` (:func:`masked_negative_log_marginal_likelihood_per_point`) with its own Adam state.

    :param model: the per-client worker's BLR: its kernel, likelihood and prior variance give the maths, evaluated at
        each client's values (:func:`~gpflow_fed.training.batched.parameters_at`); nothing is assigned to its variables.
        Call :meth:`train` under the lock that guards the per-client worker (tracing reads the model's parameters at
        other values while it lasts).
    :param trainer: the per-client worker's Adam (its variables, optimizer and state layout).
    :param local_steps: the Adam steps a client takes, ≥ 1.
    :param shared: FedBNR's wire map (:func:`~gpflow_fed.federated.algorithms.fedbnr.fedbnr_shared_state`).
    :raises ValueError: a trained variable that is not a trainable GPflow Parameter's (e.g. a ``tf_keras`` network's
        weight) or not in ``default_float``, wire keys that are not exactly the trained Parameters, or an Adam state
        layout other than ``tf_keras``' (the step count, then m and v of each variable in turn).
    """

    def __init__(
        self, model: BayesianLinearRegression, trainer: CompiledAdam, local_steps: int, shared: SharedState
    ) -> None:
        self.model, self.local_steps = model, int(local_steps)
        variables = trainer.variables
        parameters = trained_parameters(model, variables)
        if parameters is None:
            raise ValueError(
                "the batched FedBNR worker trains GPflow Parameters only, not a tf_keras network's weights"
            )
        dtype = gpflow.default_float()
        if any(v.dtype != dtype for v in variables):
            raise ValueError(f"the batched FedBNR worker trains {np.dtype(dtype).name} variables only")
        #: the trained Parameters, in the trainer's (and its Adam state's) order
        self.parameters: List[gpflow.Parameter] = parameters
        position = {id(v): i for i, v in enumerate(variables)}
        keys: Dict[str, int] = {}
        for key, path in shared.paths.items():
            target = resolve_path(model, path)
            backing = getattr(target, "unconstrained_variable", None)
            if not isinstance(target, gpflow.Parameter) or id(backing) not in position:
                raise ValueError(f"the wire key {key!r} is not a trained GPflow Parameter")
            keys[key] = position[id(backing)]
        if sorted(keys.values()) != list(range(len(variables))):
            raise ValueError("the wire keys are not exactly the trained Parameters")
        #: wire key → the position of its variable in the trainer's order (wire order)
        self.keys = keys
        self.training = StackedTraining(trainer, parameters, self.local_steps)
        self.input_dim = int(model.kernel.input_dim)
        #: L, the kernel's number of features: a client with N_c < L is trained in the dual form
        self.num_features = int(model.kernel.num_features)
        self._omega_size = int(np.prod(model.kernel.omega().shape))
        self.functions: Dict[bool, Any] = {
            dual: self.training.compiled(functools.partial(self._loss, dual=dual), self.input_dim, None)
            for dual in (False, True)
        }

    # --- memory -------------------------------------------------------------------------------------------
    def bytes_per_client(self, length: int, output_dim: int, dual: bool) -> int:
        """The working set of one client in a batched call with padded length ``L_p``:
        ``BYTES_PER_CLIENT_FACTOR · 8 · (L_p (D + P + L) + S + |ω| + |w| + |m| + |v|)`` bytes, ``S = L_p²`` in the
        dual (the covariance, its Cholesky factor and their gradients) and ``L²`` in the primal (``ΦᵀΦ``, A, its
        factor)."""
        Lp, L = int(length), self.num_features
        square = Lp * Lp if dual else L * L
        size = Lp * (self.input_dim + int(output_dim) + L) + square + self._omega_size
        return BYTES_PER_CLIENT_FACTOR * 8 * (size + self.training.value_size + self.training.moment_size)

    def chunks(self, sizes: Sequence[int], output_dim: int, memory_budget: int) -> List[Tuple[Bucket, bool]]:
        """``(chunk, dual)`` of the clients of ``sizes``: split by form (dual for ``N_c < L``), each part in size
        buckets (ratio ``PADDING_RATIO``), each bucket in chunks of at most ``memory_budget`` bytes
        (:meth:`bytes_per_client`; at least one client a chunk). Members are positions in ``sizes``."""
        out: List[Tuple[Bucket, bool]] = []
        for dual in (True, False):
            part = [k for k, n in enumerate(sizes) if (int(n) < self.num_features) == dual]
            if not part:
                continue
            bytes_each = functools.partial(self.bytes_per_client, output_dim=output_dim, dual=dual)
            chunks = memory_chunks([sizes[k] for k in part], memory_budget, bytes_each, PADDING_RATIO)
            out.extend((Bucket(tuple(part[i] for i in chunk.members), chunk.length), dual) for chunk in chunks)
        return out

    # --- the loss (the compiled loop: StackedTraining.compiled) --------------------------------------------
    def _loss(self, X: tf.Tensor, Y: tf.Tensor, mask: tf.Tensor, dual: bool) -> tf.Tensor:
        """One client's ``−log p(y_c | X_c) / N_c`` at the substituted parameters, in the primal or the dual form."""
        return masked_negative_log_marginal_likelihood_per_point(self.model, X, Y, mask, dual)

    # --- the public call ----------------------------------------------------------------------------------
    @check_shapes("values: [V]")
    def train(
        self,
        data: Sequence[Tuple[np.ndarray, np.ndarray]],
        values: np.ndarray,
        states: Sequence[AdamState],
        memory_budget: int,
    ) -> List[Tuple[Dict[str, np.ndarray], AdamState, float]]:
        """``local_steps`` Adam steps of every client from the broadcast ``values`` with its own Adam state.

        :param data: each client's ``(X_c, Y_c)`` (the same output count P for all).
        :param values: the broadcast (θ, σ², λ²), unconstrained, flat, in the order of ``trainer.variables``.
        :param states: each client's :class:`~gpflow_fed.training.adam.AdamState` (checked by the caller).
        :param memory_budget: bytes one compiled call may use (a larger bucket goes in chunks).
        :return: per client, in order: its new values by wire key (wire order), its new Adam state and its loss before
            the last step (what ``CompiledAdam.fit``'s last loss is on the per-client path). As for FGP
            (:meth:`~gpflow_fed.federated.algorithms.fgp_batched.BatchedGPRWorker.train`), a softplus-constrained value
            above log(float64 max) ≈ 709.8 gets a NaN gradient here where the per-client step is finite; the caller
            recomputes every non-finite client on its own.
        :raises ValueError: ``values`` of another length than the trained variables', or clients with different output
            counts.
        """
        size = self.training.value_size
        if int(np.shape(values)[0]) != size:
            raise ValueError(f"expected {size} shared values, got {np.shape(values)[0]}")
        outputs_of = {int(np.shape(Y)[1]) for _, Y in data}
        if len(outputs_of) > 1:
            raise ValueError(f"the cohort's clients have different output counts {sorted(outputs_of)}")
        values = np.asarray(values, gpflow.default_float())
        out: List[Any] = [None] * len(data)
        if not data:
            return out
        sizes = [int(np.shape(d[1])[0]) for d in data]
        chunks = self.chunks(sizes, outputs_of.pop(), memory_budget)
        for dual in (True, False):  # the order of self.chunks: the dual form's chunks first
            form = [chunk for chunk, in_dual in chunks if in_dual == dual]
            for k, trained in enumerate(self.training.train(self.functions[dual], form, data, values, states)):
                if trained is not None:
                    own, state, loss = trained
                    out[k] = ({key: own[p] for key, p in self.keys.items()}, state, loss)
        return out

    def tracing_count(self) -> int:
        """How many times the batched training was traced (at most 2 in a run, one per form, whatever the cohorts)."""
        return sum(int(f.experimental_get_tracing_count()) for f in self.functions.values())
