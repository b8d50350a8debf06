r"""PVI's local optimisation for a whole cohort in one compiled computation: the masked local free energy.

:class:`BatchedLocalProblem` is the batched form of :meth:`LocalProblem.fit <.local.LocalProblem.fit>` (one client's
own DPO factor, q(Z) and q(log β) fitted by Adam with early stopping, one client at a time): the cohort's data, own
pseudo-sets and cavity pseudo-sets are stacked, padded and masked by size bucket
(:mod:`gpflow_fed.training.batched`), and every client takes its own Adam steps (:class:`StackedAdam`, reset at the
start of each update as the per-client worker resets its optimizer) on its own Monte-Carlo local free energy

.. math::
    \tilde{\mathcal L}_{k,α} = \mathbb E_{q(Z)q(β)}\big[\mathrm{ELL}_k(Z, β)
        − \mathrm{KL}[q(u|Z,β) ‖ q_{\setminus k}(u|Z,β)]\big]
        − \mathrm{KL}[q(β) ‖ q_{\setminus k}(β)] − α\,\mathrm{KL}[q(Z) ‖ q_{\setminus k}(Z)]

(PVI paper eq. 7 with the α-scaled Z-KL of §4.1; spec §2.1), with its own noise stream (the stateless draws at its
seed and counter, as the per-client step draws them), so each client gets back what the per-client fit returns, to
round-off.

**Why padded entries contribute exactly nothing.** Three sets are padded, each with a 0/1 mask ``w``: the client's data
rows (to the bucket's length L), its own pseudo-set (to the bucket's largest ``M_k``) and its cavity pseudo-set (to
the chunk's largest ``Σ_{j≠k} M_j``). A padded entry repeats a real one (or is zero), so every quantity computed from
it is finite.

* *The u-posterior and its cavity* (paper eqs. 12 and 22 in the whitened form of spec §1.4). With ``P = L⁻¹ K_{ZV}``
  over a pseudo-set's J points and ``s`` its diagonal noise, a set enters only through
  ``B = I + Σ_j (w_j P_{:j}/√s_j)(w_j P_{:j}/√s_j)ᵀ`` and ``b = Σ_j (w_j P_{:j}/√s_j)(w_j m_j/√s_j)``
  (:func:`masked_pseudo_terms`): a padded point's column ``w_j P_{:j}/√s_j`` is exactly 0, so its outer product and
  its shift are exact zeros and ``B``, ``b`` (hence ``μ_w``, ``L_B``) are the real points' sums, which the padded
  zeros can only reorder. The same holds for the cavity's ``(B_c, b_c)``, so ``KL_u = KL[N(μ_w, B⁻¹) ‖ N(μ_c, B_c⁻¹)]``
  (spec §2.3) is the real sets' KL.
* *The expected log-likelihood* (eq. 7's ELL_k, spec §2.2): each row's marginal ``(μ_n, v_n)`` depends on its own
  column ``a_n = L⁻¹ k_{Z x_n}`` only, so the real rows' marginals are unchanged by the padded ones, and
  ``ELL_k = Σ_n w_n E_q log p(y_n | f_n)`` adds ``0 · (finite)`` = 0 for each padded row.
* *The Z- and β-KLs* involve no padded quantity.

So the bound is the per-client one up to the order of its sums. So is its gradient: every path from a padded entry (a
row, a pseudo-point's V, m or log s) to the bound passes through a factor ``w = 0``, so its gradient is exactly 0, and
Adam from zero moments leaves it where it is (``m = v = 0``, a step of ``0 · α / (0 + ε) = 0``): padded own
pseudo-points never move and never reach the reply.

**What stays per client.** Early stopping (the running-mean rule of :meth:`LocalProblem.fit`) is checked in Python after
every compiled chunk of :data:`~.local.CHUNK` steps, exactly as there: a client that stops leaves the batch and the
rest go on. A client whose chunk fails (a Cholesky error, which fails the whole compiled call, or a non-finite free
energy) is *not* retried here: :meth:`fit` returns None for it and the caller recomputes it on its own, so its jitter
escalation and learning-rate halvings are the per-client path's, unchanged.

**Buckets and memory.** Clients are bucketed by ``N_k`` with :func:`~gpflow_fed.training.batched.size_buckets` (ratio
1.25, so a client's rows are padded to at most ``1.25 N_k`` and its own pseudo-set, ``M_k = min(⌊0.8 N_k⌋, 500)``
increasing in ``N_k``, to at most the bucket's largest); the cavity of a client differs from the others' by its own
set only, so padding it costs at most the bucket's spread of ``M_k``. A bucket goes in chunks of
``max(1, budget // bytes_per_client)`` clients (:meth:`BatchedLocalProblem.bytes_per_client`), never refused.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Dict, Final, List, Mapping, Optional, Sequence, Tuple, cast

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import check_shapes
from gpflow.keras import tf_keras

from ....inducing_variables import S_FLOOR
from ....models.dpo_svgp import per_sample_likelihood
from ....posteriors.dpo_posterior import jittered_cholesky
from ....posteriors.whitened import assemble_whitened, whitened_kl, whitened_marginals
from ....training.batched import (
    PADDING_RATIO,
    Bucket,
    StackedAdam,
    chunked,
    clients_per_chunk,
    parameters_at,
    size_buckets,
    stack_padded,
)
from .factors import NaturalGaussian
from .local import CHUNK, LocalProblem

__all__ = [
    "BYTES_PER_CLIENT_FACTOR",
    "BatchedLocalProblem",
    "LocalFit",
    "LocalJob",
    "LocalPlan",
    "masked_local_terms",
    "masked_pseudo_terms",
]

#: bytes per client of one batched call ≈ this × 8 × the words of :meth:`BatchedLocalProblem.bytes_per_client`; FSGP's
#: and FGP's measured factors for their bodies (6.7–8.6, ``fsgp/batched.py``, ``fgp_batched.py``) rounded up, as
#: PVI's body holds the same kind of tensors (not measured for PVI)
BYTES_PER_CLIENT_FACTOR: Final[int] = 10


@dataclass(frozen=True)
class LocalPlan:
    """What client k's local optimisation starts from (:meth:`PVI._local_plan
    <gpflow_fed.federated.algorithms.pvi.algorithm.PVI._local_plan>`): the broadcast's ``versions``, q(Z) and
    q(log β) (None where not learned), their cavities, the start ``(mean, var)`` of q(Z) (var None: a point Z) and of
    q(log β), the other clients' u-factors (DPO ``V, m, s``; CPO ``eta, Lam``) and the clipped cavity coordinates."""

    versions: np.ndarray
    qZ: Optional[NaturalGaussian]
    qrho: Optional[NaturalGaussian]
    cavZ: Optional[NaturalGaussian]
    cavR: Optional[NaturalGaussian]
    start_Z: Tuple[np.ndarray, Optional[np.ndarray]]
    start_rho: Optional[Tuple[np.ndarray, np.ndarray]]
    others: Mapping[str, np.ndarray]
    clipped: int


@dataclass(frozen=True)
class LocalFit:
    """The result of one client's local optimisation: the factor it sends (DPO ``V, m, s``; CPO ``eta, Lam``), its
    trainable factor to keep (unconstrained), its random-stream counter and jitter after it, the ``(mean, var)`` of
    its q(Z) and q(log β) (empty arrays when β is fixed), its final smoothed free energy (NaN if not computed) and
    the Adam steps taken."""

    factor: Dict[str, np.ndarray]
    snapshot: Dict[str, np.ndarray]
    counter: int
    jitter: float
    q_Z: Tuple[np.ndarray, np.ndarray]
    q_rho: Tuple[np.ndarray, np.ndarray]
    free_energy: float
    steps: int


@dataclass(frozen=True)
class LocalJob:
    """One client's DPO local problem for :meth:`BatchedLocalProblem.fit`: its data, its own factor (``V [M_k, D]``,
    ``m [M_k, 1]``, ``log_s [M_k]``, unconstrained), its random-stream seed and counter, its jitter and its plan."""

    data: Tuple[np.ndarray, np.ndarray]
    factor: Mapping[str, np.ndarray]
    seed: int
    counter: int
    jitter: float
    plan: LocalPlan


@check_shapes("Z: [M, D]", "L: [M, M]", "V: [J, D]", "m: [J, 1]", "s: [J]", "mask: [J]")
def masked_pseudo_terms(
    kernel: Any, Z: tf.Tensor, L: tf.Tensor, V: tf.Tensor, m: tf.Tensor, s: tf.Tensor, mask: tf.Tensor
) -> Tuple[tf.Tensor, tf.Tensor]:
    """A DPO pseudo-set's whitened precision and shift ``(Ps Psᵀ, Ps r)`` (paper eq. 12 in the whitened form of
    :meth:`PseudoObservations.whitened_terms <gpflow_fed.inducing_variables.PseudoObservations.whitened_terms>`) over
    the points whose ``mask`` is 1: ``Ps = w ⊙ (L⁻¹ K_{ZV}) / √s`` and ``r = w ⊙ m / √s``, so a point of mask 0 adds
    exact zeros (module docstring).

    :param s: the diagonal pseudo-noise (> 0); :param mask: 1 for a real point, 0 for a padded one.
    """
    P = tf.linalg.triangular_solve(L, kernel(Z, V), lower=True)
    sd = tf.sqrt(s)
    Ps = P / sd * mask
    r = m / sd[:, None] * mask[:, None]
    return tf.matmul(Ps, Ps, transpose_b=True), tf.matmul(Ps, r)


@check_shapes("X: [N, D]", "Y: [N, 1]", "rows: [N]", "Z: [M, D]", "return[0]: []", "return[1]: []")
def masked_local_terms(
    kernel: Any,
    likelihood: gpflow.likelihoods.Likelihood,
    noise: Optional[tf.Tensor],
    X: tf.Tensor,
    Y: tf.Tensor,
    rows: tf.Tensor,
    Z: tf.Tensor,
    own: Tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor],
    cavity: Tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor],
    jitter: tf.Tensor,
) -> Tuple[tf.Tensor, tf.Tensor]:
    """``(ELL_k(Z, β), KL[q(u|Z,β) ‖ q_\\k(u|Z,β)])`` at one sample of (Z, β) over the rows of ``(X, Y)`` whose mask
    ``rows`` is 1 and the masked own and cavity pseudo-sets ``(V, m, s, mask)``: what
    :func:`~gpflow_fed.models.dpo_svgp.dpo_free_energy_terms` computes for one sample on the real entries only
    (module docstring), in its order of operations.
    """
    L = jittered_cholesky(kernel, Z, jitter)
    M, dtype = tf.shape(Z)[-2], Z.dtype
    cav_terms = [masked_pseudo_terms(kernel, Z, L, *cavity)]
    mu, LB = assemble_whitened(cav_terms + [masked_pseudo_terms(kernel, Z, L, *own)], M, dtype)
    A = tf.linalg.triangular_solve(L, kernel(Z, X), lower=True)
    Kdiag = tf.broadcast_to(kernel(X, full_cov=False), tf.concat([tf.shape(A)[:-2], tf.shape(X)[:1]], 0))
    means, variances = whitened_marginals(A, Kdiag, mu, LB)
    kl = whitened_kl(mu, LB, *assemble_whitened(cav_terms, M, dtype))
    (ve,) = per_sample_likelihood(
        likelihood,
        None if noise is None else noise[None],
        "variational_expectations",
        X,
        means[None],
        variances[None],
        Y,
    )
    return tf.reduce_sum(ve[0] * rows), kl


class _Stopping:
    """:meth:`LocalProblem.fit`'s early-stopping rule for one client, fed one chunk of losses at a time."""

    def __init__(self, patience: int, smoothing: int = 20) -> None:
        self.patience, self.smoothing = patience, smoothing
        self.window: "deque[float]" = deque(maxlen=smoothing)
        self.smoothed: List[float] = []
        self.steps = 0

    def feed(self, losses: np.ndarray) -> bool:
        """Record a chunk's losses; True when the rule stops the fit after this chunk."""
        stop = False
        for loss in losses:
            self.steps += 1
            self.window.append(-float(loss))
            self.smoothed.append(float(np.mean(self.window)))
            patience = self.patience
            if (
                self.steps >= self.smoothing + patience
                and max(self.smoothed[-patience:]) <= self.smoothed[-patience - 1]
            ):
                stop = True
        return stop


class BatchedLocalProblem:
    r""":meth:`LocalProblem.fit <.local.LocalProblem.fit>` for every DPO client of a cohort at once (module docstring).

    The state of a client is seven stacked arrays, in :meth:`LocalProblem.trainables` order: its own ``V``, ``m``,
    ``log s`` (padded to the chunk's largest M_k), q(log β)'s mean and log-variance (when β is learned) and q(Z)'s mean
    and log-variance; ``which`` trains the first five (``"factor"``, point Z) or all (``"all"``). One compiled call per
    chunk of :data:`~.local.CHUNK` steps (traced once whatever the cohort and sizes).

    :param template: a per-client worker of the run (DPO): its kernel, likelihood, q(Z), q(log β), α, sample count,
        Adam hyperparameters and pseudo-noise transform give the maths; none of its variables is read or assigned
        except q(Z)'s variance, the start of a point Z's unused variance.
    :param which: ``"all"`` (q(Z) learned) or ``"factor"`` (a point Z).
    :param max_steps: the Adam step cap of an update; :param patience: the early-stopping patience.
    :raises ValueError: a CPO template or another ``which``.
    """

    def __init__(self, template: LocalProblem, which: str, max_steps: int, patience: int) -> None:
        if template.param != "dpo" or which not in ("all", "factor"):
            raise ValueError(f"the batched PVI step fits DPO factors with which 'all' or 'factor', got {which!r}")
        self.which, self.max_steps, self.patience = which, int(max_steps), int(patience)
        self.point_Z = which != "all" or template.mode == "point"
        self.kernel, self.likelihood = template.kernel, template.likelihood
        self.alpha, self.S, self.H = template.alpha, template.S, template.num_hyper
        self.M, self.D = (int(d) for d in template.q_Z.Z_mean.shape)
        self.q_Z = gpflow.utilities.deepcopy(template.q_Z)
        self.q_beta = None if template.q_beta is None else gpflow.utilities.deepcopy(template.q_beta)
        self.s_transform = template.own.S_diag.transform
        self.unit_Z_var = template.q_Z.Z_var.unconstrained_variable.numpy()
        optimizer = template.optimizer
        fresh = tf_keras.optimizers.Adam(
            learning_rate=template.learning_rate,
            beta_1=optimizer.beta_1,
            beta_2=optimizer.beta_2,
            epsilon=optimizer.epsilon,
        )
        self.adam = StackedAdam(fresh)
        #: positions in the state of the trained arrays (own V, m, log s; q(log β); q(Z))
        self.trained = [0, 1, 2] + ([3, 4] if self.H else []) + ([] if self.point_Z else [5, 6])
        dtype = gpflow.default_float()
        D, M, Hp = self.D, self.M, max(self.H, 1)
        state = [[None, None, D], [None, None, 1], [None, None], [None, Hp], [None, Hp], [None, M, D], [None, M, D]]
        moments = [state[i] for i in self.trained]
        signature = [
            [tf.TensorSpec(s, dtype) for s in state],
            [tf.TensorSpec(s, dtype) for s in moments],
            [tf.TensorSpec(s, dtype) for s in moments],
            tf.TensorSpec([None], tf.int64),
            {
                "X": tf.TensorSpec([None, None, D], dtype),
                "Y": tf.TensorSpec([None, None, 1], dtype),
                "rows": tf.TensorSpec([None, None], dtype),
                "own_mask": tf.TensorSpec([None, None], dtype),
                "cav_V": tf.TensorSpec([None, None, D], dtype),
                "cav_m": tf.TensorSpec([None, None, 1], dtype),
                "cav_log_s": tf.TensorSpec([None, None], dtype),
                "cav_mask": tf.TensorSpec([None, None], dtype),
                "cavZ_nu": tf.TensorSpec([None, M, D], dtype),
                "cavZ_lam": tf.TensorSpec([None, M, D], dtype),
                "cavR_nu": tf.TensorSpec([None, Hp], dtype),
                "cavR_lam": tf.TensorSpec([None, Hp], dtype),
                "jitter": tf.TensorSpec([None], dtype),
                "seed": tf.TensorSpec([None], tf.int64),
                "counter": tf.TensorSpec([None], tf.int64),
            },
            tf.TensorSpec([], tf.int32),
        ]
        self.function: Any = tf.function(self._steps, input_signature=signature, autograph=False)

    # --- memory -------------------------------------------------------------------------------------------
    def bytes_per_client(self, length: int, own: int, cavity: int) -> int:
        """The working set of one client in a batched call with L data rows, ``own`` own and ``cavity`` cavity
        pseudo-points: ``BYTES_PER_CLIENT_FACTOR · 8 · (S (4 M L + 3 M (own + cavity) + 10 M²) + (L + own + cavity)
        (D + 3) + 3 |state|)`` bytes (per Monte-Carlo sample: ``K_ZX``, ``A``, ``L_B⁻¹A`` and a gradient per data row,
        ``K_ZV``, ``P``, ``Ps`` per pseudo-point, about ten ``M × M`` matrices)."""
        M, S, L, J = self.M, self.S, int(length), int(own) + int(cavity)
        size = S * (4 * M * L + 3 * M * J + 10 * M * M) + (L + J) * (self.D + 3) + 3 * (2 * M * self.D + 2 * self.H)
        return BYTES_PER_CLIENT_FACTOR * 8 * size

    # --- the compiled body --------------------------------------------------------------------------------
    def _free_energy(self, values: Sequence[tf.Tensor], data: Mapping[str, tf.Tensor]) -> tf.Tensor:
        """One client's :meth:`LocalProblem.free_energy` at its state ``values`` and noise (module docstring)."""
        V, m, log_s, beta_mean, beta_var, Z_mean, Z_var = values
        dtype = gpflow.default_float()
        own = (V, m, self.s_transform.forward(log_s), data["own_mask"])
        cavity = (data["cav_V"], data["cav_m"], self.s_transform.forward(data["cav_log_s"]), data["cav_mask"])
        params = [self.q_Z.Z_mean, self.q_Z.Z_var]
        at = [Z_mean, Z_var]
        if self.q_beta is not None:
            params += [self.q_beta.mean, self.q_beta.var]
            at += [beta_mean, beta_var]
        with parameters_at(params, at):
            total = tf.constant(0.0, dtype)
            for s in range(self.S):
                Z = (
                    tf.convert_to_tensor(Z_mean)
                    if self.point_Z
                    else self.q_Z.sample_from_noise(data["eps_Z"][s][None])[0]
                )
                kern: Any = self.kernel
                noise: Optional[tf.Tensor] = None
                if self.q_beta is not None:
                    beta = self.q_beta.sample_from_noise(data["eps_R"][s, : self.H])
                    kern, noise = self.q_beta.kernel(beta), self.q_beta.noise(beta)
                ell, kl_u = masked_local_terms(
                    kern, self.likelihood, noise, data["X"], data["Y"], data["rows"], Z, own, cavity, data["jitter"]
                )
                total += ell - kl_u
            bound = total / self.S
            if self.q_beta is not None:
                cav_nu, cav_lam = data["cavR_nu"], data["cavR_lam"]
                bound -= self.q_beta.kl_divergence(cav_nu / cav_lam, 1.0 / cav_lam)
            if not self.point_Z:
                bound -= self.alpha * self.q_Z.kl_divergence(data["cavZ_nu"] / data["cavZ_lam"], 1.0 / data["cavZ_lam"])
        return bound

    def _noise(self, seed: tf.Tensor, counter: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
        """Each client's ``(ε_Z [S, M, D], ε_β [S, H])`` at its stream position, as :meth:`LocalProblem.free_energy`
        draws them (stateless normals at ``(seed, counter)`` and ``(seed, counter) + 1``)."""
        dtype = gpflow.default_float()
        seeds = tf.stack([seed, counter], axis=1)
        shape_Z, shape_R = [self.S, self.M, self.D], [self.S, max(self.H, 1)]
        eps_Z = tf.map_fn(
            lambda s: tf.random.stateless_normal(shape_Z, seed=s, dtype=dtype),
            seeds,
            fn_output_signature=tf.TensorSpec(shape_Z, dtype),
        )
        eps_R = tf.map_fn(
            lambda s: tf.random.stateless_normal(shape_R, seed=s + 1, dtype=dtype),
            seeds,
            fn_output_signature=tf.TensorSpec(shape_R, dtype),
        )
        return eps_Z, eps_R

    def _steps(
        self,
        state: List[tf.Tensor],
        first: List[tf.Tensor],
        second: List[tf.Tensor],
        iterations: tf.Tensor,
        data: Dict[str, tf.Tensor],
        num_steps: tf.Tensor,
    ) -> Tuple[List[tf.Tensor], List[tf.Tensor], List[tf.Tensor], tf.Tensor, tf.Tensor]:
        dtype = gpflow.default_float()
        fixed = {i: state[i] for i in range(len(state)) if i not in self.trained}
        names = sorted(data)

        def losses_at(trained: Sequence[tf.Tensor], noise: Tuple[tf.Tensor, tf.Tensor]) -> tf.Tensor:
            values = [fixed[i] if i in fixed else trained[self.trained.index(i)] for i in range(len(state))]

            def one(elems: Tuple[tf.Tensor, ...]) -> tf.Tensor:
                own_values, rest = elems[: len(values)], elems[len(values) :]
                client = dict(zip(names, rest[: len(names)]))
                client["eps_Z"], client["eps_R"] = rest[len(names) :]
                return -self._free_energy(own_values, client)

            return tf.vectorized_map(one, (*values, *(data[n] for n in names), *noise))

        def body(
            i: tf.Tensor, it: tf.Tensor, ws: List[tf.Tensor], ms: List[tf.Tensor], vs: List[tf.Tensor], out: Any
        ) -> Any:
            noise = self._noise(data["seed"], data["counter"] + tf.cast(i, tf.int64))
            with tf.GradientTape(watch_accessed_variables=False) as tape:
                tape.watch(ws)
                losses = losses_at(ws, noise)
                total = tf.reduce_sum(losses)  # client k's loss depends on its own slice only
            grads = tape.gradient(total, ws)
            it, ws, ms, vs = self.adam.step(it, ws, grads, ms, vs)
            return i + 1, it, ws, ms, vs, out.write(i, losses)

        trained = [state[i] for i in self.trained]
        start = (tf.constant(0), iterations, trained, first, second, tf.TensorArray(dtype, size=num_steps))
        _, iterations, trained, first, second, out = tf.while_loop(lambda i, *_: i < num_steps, body, start)
        new_state = [fixed[i] if i in fixed else trained[self.trained.index(i)] for i in range(len(state))]
        return new_state, first, second, iterations, tf.transpose(out.stack())

    # --- the public call ----------------------------------------------------------------------------------
    def chunks(self, jobs: Sequence[LocalJob], memory_budget: int) -> List[Bucket]:
        """The size buckets of the jobs' ``N_k`` (ratio ``PADDING_RATIO``), each in chunks within ``memory_budget``
        bytes (:meth:`bytes_per_client` at the bucket's length, largest own set and largest cavity; ≥ 1 client)."""
        out: List[Bucket] = []
        for bucket in size_buckets([len(job.data[1]) for job in jobs], PADDING_RATIO):
            own = max(len(jobs[k].factor["m"]) for k in bucket.members)
            cavity = max(max(len(jobs[k].plan.others["m"]) for k in bucket.members), 1)
            per = self.bytes_per_client(bucket.length, own, cavity)
            out.extend(chunked(bucket, clients_per_chunk(memory_budget, per)))
        return out

    def fit(self, jobs: Sequence[LocalJob], memory_budget: int) -> List[Optional[LocalFit]]:
        """Every job's :meth:`LocalProblem.fit` (then its reading of the result), in order; None for a job whose
        batched fit failed (the caller recomputes it on its own, module docstring).

        :param jobs: the clients' problems (their own factors of the shapes their ``M_k`` gives).
        :param memory_budget: bytes one compiled call may use (a larger bucket goes in chunks).
        """
        out: List[Optional[LocalFit]] = [None] * len(jobs)
        for chunk in self.chunks(jobs, memory_budget):
            for k, fitted in zip(chunk.members, self._fit_chunk([jobs[k] for k in chunk.members], chunk.length)):
                out[k] = fitted
        return out

    def _stack(self, jobs: Sequence[LocalJob], length: int) -> Tuple[List[np.ndarray], Dict[str, np.ndarray]]:
        """The chunk's start state and data, stacked and padded (module docstring)."""
        dtype = gpflow.default_float()
        B, M, D, Hp = len(jobs), self.M, self.D, max(self.H, 1)
        X, rows = stack_padded([job.data[0] for job in jobs], length)
        Y, _ = stack_padded([job.data[1] for job in jobs], length)
        own = max(len(job.factor["m"]) for job in jobs)
        V, own_mask = stack_padded([job.factor["V"] for job in jobs], own)
        m, _ = stack_padded([np.zeros_like(job.factor["m"]) for job in jobs], own)
        log_s, _ = stack_padded([np.zeros_like(job.factor["log_s"]) for job in jobs], own)
        for b, job in enumerate(jobs):  # padded m and log s are zeros (V repeats a real point: finite kernels)
            n = len(job.factor["m"])
            m[b, :n], log_s[b, :n] = job.factor["m"], job.factor["log_s"]
        cavity = max(max(len(job.plan.others["m"]) for job in jobs), 1)
        zeros: Callable[..., np.ndarray] = lambda *shape: np.zeros(shape, dtype)  # noqa: E731
        ones: Callable[..., np.ndarray] = lambda *shape: np.ones(shape, dtype)  # noqa: E731
        cav_V, cav_m, cav_log_s, cav_mask = zeros(B, cavity, D), zeros(B, cavity, 1), zeros(B, cavity), zeros(B, cavity)
        beta_mean, beta_var, Z_mean, Z_var = zeros(B, Hp), zeros(B, Hp), zeros(B, M, D), zeros(B, M, D)
        cavZ, cavR = [ones(B, M, D), ones(B, M, D)], [ones(B, Hp), ones(B, Hp)]  # unit precisions where not learned
        for b, job in enumerate(jobs):
            plan, c = job.plan, len(job.plan.others["m"])
            cav_V[b, :c], cav_m[b, :c], cav_mask[b, :c] = plan.others["V"], plan.others["m"], 1.0
            # as LocalProblem.set_cavity stores s (and reads it back through the transform)
            cav_log_s[b, :c] = np.log(np.maximum(np.asarray(plan.others["s"]) - S_FLOOR, 1e-300))
            Z_mean[b] = plan.start_Z[0]
            Z_var[b] = self.unit_Z_var if plan.start_Z[1] is None else np.log(plan.start_Z[1])
            if plan.start_rho is not None:
                beta_mean[b], beta_var[b] = plan.start_rho[0], np.log(plan.start_rho[1])
            for target, q in ((cavZ, plan.cavZ), (cavR, plan.cavR)):
                if q is not None:
                    target[0][b], target[1][b] = q.nu, q.lam
        data = {
            "X": X,
            "Y": Y,
            "rows": rows,
            "own_mask": own_mask,
            "cav_V": cav_V,
            "cav_m": cav_m,
            "cav_log_s": cav_log_s,
            "cav_mask": cav_mask,
            "cavZ_nu": cavZ[0],
            "cavZ_lam": cavZ[1],
            "cavR_nu": cavR[0],
            "cavR_lam": cavR[1],
            "jitter": np.array([job.jitter for job in jobs], dtype),
            "seed": np.array([job.seed for job in jobs], np.int64),
            "counter": np.array([job.counter for job in jobs], np.int64),
        }
        return [V, m, log_s, beta_mean, beta_var, Z_mean, Z_var], data

    def _fit_chunk(self, jobs: Sequence[LocalJob], length: int) -> List[Optional[LocalFit]]:
        state, data = self._stack(jobs, length)
        first = [np.zeros_like(state[i]) for i in self.trained]
        second = [np.zeros_like(state[i]) for i in self.trained]
        iterations = np.zeros(len(jobs), np.int64)
        stopping = [_Stopping(self.patience) for _ in jobs]
        failed = np.zeros(len(jobs), bool)
        active = np.arange(len(jobs))
        steps = 0
        while active.size and steps < self.max_steps:
            n = min(CHUNK, self.max_steps - steps)
            take = {name: value[active] for name, value in data.items()}
            try:
                new_state, new_first, new_second, new_iterations, losses = self.function(
                    [s[active] for s in state],
                    [f[active] for f in first],
                    [s[active] for s in second],
                    iterations[active],
                    take,
                    tf.constant(n, tf.int32),
                )
            except Exception:  # noqa: BLE001 - e.g. a Cholesky error: every client of the call is recomputed alone
                failed[active] = True
                break
            for target, new in zip(state, new_state):
                target[active] = new.numpy()
            for target, new in zip(first, new_first):
                target[active] = new.numpy()
            for target, new in zip(second, new_second):
                target[active] = new.numpy()
            iterations[active] = new_iterations.numpy()
            data["counter"][active] += n
            steps += n
            losses = losses.numpy()
            keep = []
            for j, b in enumerate(active):
                if not np.all(np.isfinite(losses[j])):
                    failed[b] = True
                elif not stopping[b].feed(losses[j]):
                    keep.append(b)
            active = np.array(keep, dtype=np.int64)
        return self._read(jobs, state, data, stopping, failed)

    def _read(
        self,
        jobs: Sequence[LocalJob],
        state: Sequence[np.ndarray],
        data: Mapping[str, np.ndarray],
        stopping: Sequence[_Stopping],
        failed: np.ndarray,
    ) -> List[Optional[LocalFit]]:
        """Each client's :class:`LocalFit` from the chunk's final state, as :class:`LocalProblem` reads its variables
        (constrained values through the same transforms)."""
        V, m, log_s, beta_mean, beta_var, Z_mean, Z_var = state
        s = self.s_transform.forward(tf.constant(log_s)).numpy()
        Z_variance = cast(Any, self.q_Z.Z_var.transform).forward(tf.constant(Z_var)).numpy()
        beta_variance = None
        if self.q_beta is not None:
            beta_variance = cast(Any, self.q_beta.var.transform).forward(tf.constant(beta_var)).numpy()
        out: List[Optional[LocalFit]] = []
        for b, job in enumerate(jobs):
            if failed[b]:
                out.append(None)
                continue
            n = len(job.factor["m"])
            q_rho = (np.zeros(0), np.zeros(0))
            if beta_variance is not None:
                q_rho = (beta_mean[b].copy(), beta_variance[b].copy())
            smoothed = stopping[b].smoothed
            out.append(
                LocalFit(
                    factor={"V": V[b, :n].copy(), "m": m[b, :n].copy(), "s": s[b, :n].copy()},
                    snapshot={"V": V[b, :n].copy(), "m": m[b, :n].copy(), "log_s": log_s[b, :n].copy()},
                    counter=int(data["counter"][b]),
                    jitter=float(job.jitter),
                    q_Z=(Z_mean[b].copy(), Z_variance[b].copy()),
                    q_rho=q_rho,
                    free_energy=smoothed[-1] if smoothed else float("nan"),
                    steps=stopping[b].steps,
                )
            )
        return out

    def tracing_count(self) -> int:
        """How many times the batched steps were traced (1 once used, whatever the cohorts and sizes)."""
        return int(self.function.experimental_get_tracing_count())
