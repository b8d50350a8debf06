r"""FGP's local training for a whole cohort in one compiled call: the exact-GP likelihood with padded rows masked out.

:class:`BatchedGPRWorker` is the batched form of FGP's per-client update (one ``gpflow.models.GPR`` trained by a
:class:`~gpflow_fed.training.adam.CompiledAdam`, one client at a time): the cohort's data are stacked, padded and masked
by size bucket (:mod:`gpflow_fed.training.batched`), every client takes its own P ``tf_keras`` Adam steps
(:class:`~gpflow_fed.training.batched.StackedAdam`, its own step count and moments) from the broadcast on its own
``−(1/N_k) log N(y_k | 0, C_{N_kN_k} + σ² I)`` (FSGP paper eq. 3, negated, plus any priors), and gets back what the
per-client update computes, up to round-off (:func:`masked_gpr_log_marginal_likelihood`: the padded rows change no
number of the real ones' likelihood, only, at most, the order of a sum).

**Memory and buckets.** An exact GP costs a client ``O(N_k²)`` memory and ``O(N_k³)`` time, so padding costs more here
than in FSGP (``O(M² + M N_k)``): clients are bucketed by :func:`~gpflow_fed.training.batched.size_buckets` with the
default ratio 1.25 (each client padded to ``L ≤ 1.25 N_k`` rows), which bounds a client's padded working set by
``1.25² ≈ 1.56×`` its own and its Cholesky's flops by ``1.25³ ≈ 1.95×`` (worst case; clients of equal size are never
padded). A bucket goes in consecutive chunks of ``max(1, batch_memory // bytes_per_client(L))`` clients
(:meth:`BatchedGPRWorker.bytes_per_client`, ``BYTES_PER_CLIENT_FACTOR · 8 · (L² + L (D + P) + |w| + 2 |w|)`` bytes), so
one compiled call holds at most ``batch_memory`` bytes of client working sets (or one client) whatever K: a cohort
that does not fit is processed in chunks, never refused. For example, at D = 1 and L = 20 a client is budgeted
35.9 KB, so ``LocalRuntime``'s default 64 MiB takes 1,868 clients a call; at L = 200, 3.2 MB and 20 clients.
"""

from __future__ import annotations

from typing import Any, Final, List, Sequence, Tuple

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import check_shapes
from gpflow.utilities.model_utils import add_likelihood_noise_cov

from ...training.adam import AdamState, CompiledAdam
from ...training.batched import PADDING_RATIO, Bucket, StackedTraining, memory_chunks, trained_parameters

__all__ = ["BYTES_PER_CLIENT_FACTOR", "BatchedGPRWorker", "masked_gpr_log_marginal_likelihood"]

#: bytes per client of one batched training call ≈ this × 8 × (L² + L (D + P) + 3 |w|), L the bucket's padded length
#: (:meth:`BatchedGPRWorker.bytes_per_client`): the peak resident memory one call of P = 3 steps added here was
#: 30.5–30.7 KB a client for B = 2,000–4,000 clients at L = 20, D = 1 (a factor 8.5–8.6) and 217–252 KB for
#: B = 500–1,000 at L = 60 (7.3–8.5); 10 leaves a margin over the largest
BYTES_PER_CLIENT_FACTOR: Final[int] = 10


@check_shapes("X: [N, D]", "Y: [N, P]", "mask: [N]", "return: []")
def masked_gpr_log_marginal_likelihood(
    model: gpflow.models.GPR, X: tf.Tensor, Y: tf.Tensor, mask: tf.Tensor
) -> tf.Tensor:
    r"""``log N(y_R | μ(X_R), C_RR + σ² I)`` of ``model``'s kernel, likelihood and mean function on the rows R of
    ``(X, Y)`` whose ``mask`` is 1 (FSGP paper eq. 3 times N_k), when the rows whose mask is 0 (padded, P) all come
    after them, as :func:`~gpflow_fed.training.batched.stack_padded` places them.

    Derivation. With ``m`` the mask and ``Σ = C + σ² I`` over all ``L = |R| + |P|`` rows, the padded covariance and
    residual are

    .. math::
        \tilde Σ = (m m^\top) ⊙ Σ + \operatorname{diag}(1 − m) = \begin{pmatrix} Σ_{RR} & 0 \\ 0 & I_P \end{pmatrix},
        \qquad \tilde r = m ⊙ (y − μ(X)) = \begin{pmatrix} r_R \\ 0 \end{pmatrix}.

    Its Cholesky factor is ``L̃ = diag(L_RR, I_P)`` *exactly*: each entry of L̃ in a padded row and a real column is
    ``(0 − Σ_{k<j} L̃_ik L̃_jk) / L̃_jj = 0`` (the sum's terms are 0 by induction over j), each padded diagonal is
    ``√(1 − 0) = 1``, and the real block is the same recursion on the same numbers as ``cholesky(Σ_RR)``. Then
    ``α̃ = L̃⁻¹ r̃ = (L_RR⁻¹ r_R, 0)`` (forward substitution meets the real rows first) and
    ``Σ_n log L̃_nn = Σ_{n∈R} log (L_RR)_nn + |P| · log 1``, so for each output column

    .. math::
        \log N(\tilde r \mid 0, \tilde Σ) = -\tfrac12 \|α̃\|^2 - \sum_n \log \tilde L_{nn} - \tfrac{L}{2} \log 2π
        = \log N(r_R \mid 0, Σ_{RR}) - \tfrac{|P|}{2} \log 2π,

    so the constant counts the real rows only: ``−½ N_k log 2π`` with ``N_k = Σ_n m_n`` instead of GPflow's
    ``−½ L log 2π``, and the result is ``GPR(X_R, Y_R).log_marginal_likelihood()``'s (GPflow's
    ``multivariate_normal`` in its own order of operations) up to the order of the sums, to which the padded rows add
    exact zeros. The gradient is the real rows' too: every path from a padded row's kernel entry, noise or target to
    the result passes through a factor ``m_n = 0`` (a padded row repeats a real one, so those entries are finite).

    :param model: supplies the kernel, the (Gaussian) likelihood and the mean function; its data are not read.
    :param mask: 1 for a real row, 0 for a padded one; the real rows first.
    """
    dtype = X.dtype
    weights = tf.cast(mask, dtype)
    covariance = add_likelihood_noise_cov(model.kernel(X), model.likelihood, X)
    covariance = covariance * (weights[:, None] * weights[None, :]) + tf.linalg.diag(1 - weights)
    chol = tf.linalg.cholesky(covariance)
    residual = (Y - model.mean_function(X)) * weights[:, None]
    alpha = tf.linalg.triangular_solve(chol, residual, lower=True)
    num_data = tf.reduce_sum(weights)
    log_prob = -0.5 * tf.reduce_sum(tf.square(alpha), 0)  # [P]: one term per output column, as multivariate_normal
    log_prob -= 0.5 * num_data * np.log(2 * np.pi)
    log_prob -= tf.reduce_sum(tf.math.log(tf.linalg.diag_part(chol)))
    return tf.reduce_sum(log_prob)


class BatchedGPRWorker:
    r"""FGP's local training of a cohort: :meth:`train` is the per-client loop (``CompiledAdam.fit`` of the shared
    GPR) for every client at once.

    It buckets the clients by size, splits a bucket into chunks within the memory budget (module docstring), and runs
    one compiled call per chunk, traced once per run (free batch size and padded length). Each client's P steps
    minimise its ``training_loss() / N_k = −(log N(y_k | 0, C + σ² I) + log prior) / N_k``
    (:func:`masked_gpr_log_marginal_likelihood`) with its own Adam state.

    :param model: the per-client worker's GPR: its kernel, likelihood and mean function give the GP maths, evaluated at
        each client's values (:func:`~gpflow_fed.training.batched.parameters_at`); nothing is assigned to its
        variables. Call :meth:`train` under the lock that guards the per-client worker (tracing reads the model's
        parameters at other values while it lasts).
    :param trainer: the per-client worker's Adam (its variables, optimizer and state layout).
    :param local_steps: P ≥ 1.
    :raises ValueError: a trained variable that is not a trainable GPflow Parameter's, or an Adam state layout other
        than ``tf_keras``' (the step count, then m and v of each variable in turn).
    """

    def __init__(self, model: gpflow.models.GPR, trainer: CompiledAdam, local_steps: int) -> None:
        self.model, self.local_steps = model, int(local_steps)
        parameters = trained_parameters(model, trainer.variables)
        if parameters is None:
            raise ValueError("the batched FGP worker trains the GPR's trainable GPflow Parameters only")
        #: the trained Parameters, in the trainer's (and its Adam state's) order
        self.parameters: List[gpflow.Parameter] = parameters
        self._prior_parameters = list(model.trainable_parameters)  # the order of GPR.log_prior_density
        self.training = StackedTraining(trainer, parameters, self.local_steps)
        X, Y = model.data
        self.input_dim, self.output_dim = int(X.shape[1]), int(Y.shape[1])
        self.function: Any = self.training.compiled(self._loss, self.input_dim, self.output_dim)

    # --- memory -------------------------------------------------------------------------------------------
    def bytes_per_client(self, length: int) -> int:
        """The working set of one client in a batched call with padded length L:
        ``BYTES_PER_CLIENT_FACTOR · 8 · (L² + L (D + P) + |w| + |m| + |v|)`` bytes (the ``L²`` term: the covariance,
        its Cholesky factor and their gradients)."""
        L = int(length)
        size = L * L + L * (self.input_dim + self.output_dim) + self.training.value_size + self.training.moment_size
        return BYTES_PER_CLIENT_FACTOR * 8 * size

    def chunks(self, sizes: Sequence[int], memory_budget: int) -> List[Bucket]:
        """The size buckets of ``sizes`` (ratio ``PADDING_RATIO``), each in chunks of at most ``memory_budget`` bytes
        (:meth:`bytes_per_client`; at least one client a chunk)."""
        return memory_chunks(sizes, memory_budget, self.bytes_per_client, PADDING_RATIO)

    # --- the loss (the compiled loop: StackedTraining.compiled) --------------------------------------------
    def _loss(self, X: tf.Tensor, Y: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
        """One client's ``training_loss() / N_k`` at the substituted parameters (what ``per_point_loss`` gives)."""
        prior = tf.add_n([p.log_prior_density() for p in self._prior_parameters])
        num_data = tf.reduce_sum(mask)
        return -(masked_gpr_log_marginal_likelihood(self.model, X, Y, mask) + prior) / num_data

    # --- the public call ----------------------------------------------------------------------------------

    @check_shapes("values: [V]")
    def train(
        self,
        data: Sequence[Tuple[np.ndarray, np.ndarray]],
        values: np.ndarray,
        states: Sequence[AdamState],
        memory_budget: int,
    ) -> List[Tuple[List[np.ndarray], AdamState, float]]:
        """P Adam steps of every client from the broadcast ``values`` with its own Adam state.

        :param data: each client's ``(X_k, Y_k)``.
        :param values: the broadcast (θ, σ²), unconstrained, flat, in the order of ``trainer.variables``.
        :param states: each client's :class:`~gpflow_fed.training.adam.AdamState` (checked by the caller).
        :param memory_budget: bytes one compiled call may use (a larger bucket goes in chunks).
        :return: per client, in order: its new values (the trainer's order and shapes), its new Adam state and its
            loss before the last step (what ``CompiledAdam.fit``'s last loss is on the per-client path). Known gap: a
            softplus-constrained value above log(float64 max) ≈ 709.8 gets a NaN gradient here (``tf.vectorized_map``
            drops TensorFlow Probability's custom softplus gradient) where the per-client step is finite;
            ``FGP.client_updates`` recomputes every non-finite client on its own.
        :raises ValueError: ``values`` of another length than the trained variables'.
        """
        size = self.training.value_size
        if int(np.shape(values)[0]) != size:
            raise ValueError(f"expected {size} shared values, got {np.shape(values)[0]}")
        values = np.asarray(values, gpflow.default_float())
        chunks = self.chunks([len(d[1]) for d in data], memory_budget)
        return self.training.train(self.function, chunks, data, values, states)

    def tracing_count(self) -> int:
        """How many times the batched training was traced (1 once used, whatever the cohorts and sizes)."""
        return int(self.function.experimental_get_tracing_count())
