"""FSGP: federated sparse GP regression (FedAvg over per-client Titsias bounds) and exact federated SGPR.

Paper: ``fsgp-federated-sparse-gp.txt`` (Guo et al.), Algorithm 1 and eqs. 9, 14–17.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Dict, Final, List, Mapping, Optional, Sequence, Tuple, Union, cast

import gpflow
import numpy as np
import tensorflow as tf
from gpflow.keras import tf_keras
from gpflow.models.util import inducingpoint_wrapper

from ....models.aggregated_sgpr import AggregatedSGPR, collapsed_sgpr_bound
from ..postprocess import project_to_psd
from ....validation import integer, positive_float
from ...protocol.algorithm import (
    TRAIN_PHASE,
    Aggregate,
    Algorithm,
    BroadcastRefused,
    FederationInfo,
    ReplySpec,
    answer_once_per,
)
from ...protocol.client import Client
from ...protocol.domain import DataDomain
from ...protocol.fingerprint import values_digest
from ...protocol.messages import Message
from ....training.adam import AdamState
from ....training.state import SharedState, resolve_path
from ....training.stopping import Plateau
from ..bounds import fedavg_move, fedavg_value_bounds, log_density_bound, variance_extremes
from .checks import displacement_fault, displacement_faults, statistics_fault
from .statistics import ADJOINT_NAMES, STATISTIC_NAMES
from .worker import SGPRClientWorker, initial_inducing_inputs
from ..inducing_inputs import STANDARDISED_BOX, inducing_grid

__all__ = ["FSGP", "FSGPState", "SGPRClientWorker", "initial_inducing_inputs"]

MODES = ("fedavg", "exact")

#: Exact mode's two exchanges per round: the clients' statistics, then their vector-Jacobian products.
STATISTICS_PHASE: Final[str] = "statistics"
#: shared values FSGP's statistics (eq. 12) do not read: a broadcast moved only in them is the same question
NOT_READ_BY_STATISTICS: Final[Tuple[str, ...]] = ("likelihood.variance",)
GRADIENT_PHASE: Final[str] = "gradient"
#: The final exchange (both modes): the statistics at the final parameters, for the returned model.
PREDICT_PHASE: Final[str] = "predict"
#: ``client.state`` key (exact mode): per parameters (hex digest), the hex digest of the adjoints its ``"gradient"``
#: answer was computed with (:meth:`FSGP._check_gradient_once`)
GRADIENT_ANSWERED: Final[str] = "fsgp_gradient_answered"


@dataclass(frozen=True)
class FSGPState:
    """The FSGP server state (only sums and averages; never a client's data).

    :param params: the shared parameters (θ, σ, Z) as unconstrained values under stable wire keys.
    :param statistics: the summed statistics the returned model is built from: the final ``"predict"`` phase's, or
        in exact mode, before it, the last ``"statistics"`` phase's (``None`` before either).
    :param statistics_params: the parameters ``statistics`` were computed at, when not ``params`` (exact mode: the
        ``"statistics"`` phase of round r is at θ_r, and its ``"gradient"`` phase then steps ``params`` to θ_{r+1});
        ``None``: at ``params``.
    :param adjoints: exact mode, between the ``"statistics"`` and ``"gradient"`` phases: ``∂(−F)/∂S``.
    :param direct_gradient: exact mode: ``∂(−F)/∂params`` at fixed statistics S (through Kuu and σ).
    :param bound: the latest global bound ``F = ELBO/N`` known to the server (exact mode and after the
        final phase), NaN otherwise.
    :param steps: the updates of ``params`` so far (FedAvg averages or exact-mode Adam steps).
    :param output_dim: P, the number of outputs (fixes the shape of the statistics ``Σ C y``).
    :param server_adam: exact mode: the server's ``tf_keras`` Adam state, the step count then the moments
        m and v of each shared value (plain arrays, so checkpoints save them); ``None`` in FedAvg.
    """

    params: Mapping[str, np.ndarray]
    statistics: Optional[Mapping[str, np.ndarray]] = None
    statistics_params: Optional[Mapping[str, np.ndarray]] = None
    adjoints: Optional[Mapping[str, np.ndarray]] = None
    direct_gradient: Optional[Mapping[str, np.ndarray]] = None
    bound: float = float("nan")
    steps: int = 0
    output_dim: int = 1
    server_adam: Optional[Tuple[np.ndarray, ...]] = None


class ServerAdam:
    """The exact-mode server's ``tf_keras`` Adam as one compiled step whose optimizer state is an argument.

    :meth:`step` loads the given Adam state (step count, moments) into the optimizer, applies the gradients
    to ``variables`` and returns the new state, so the state lives in :class:`FSGPState` (and its
    checkpoints) while the update is exactly the one a persistent ``tf_keras.optimizers.Adam`` takes.

    :param variables: the server model's unconstrained shared variables (scratch space, assigned by the caller).
    :param learning_rate: λ.
    """

    def __init__(self, variables: Sequence[tf.Variable], learning_rate: float) -> None:
        self.variables = list(variables)
        self.optimizer = tf_keras.optimizers.Adam(learning_rate=learning_rate)
        self.optimizer.build(self.variables)
        self.slots: List[tf.Variable] = list(self.optimizer.variables)  # the step count, then m and v per variable
        signature = (
            [tf.TensorSpec(v.shape, v.dtype) for v in self.variables],
            [tf.TensorSpec(s.shape, s.dtype) for s in self.slots],
        )
        self._step = tf.function(self._apply, input_signature=signature, autograph=False)

    def initial_state(self) -> Tuple[np.ndarray, ...]:
        """Step 0 and zero moments, as plain arrays."""
        return tuple(np.zeros(s.shape, s.dtype.as_numpy_dtype) for s in self.slots)

    def _apply(self, grads: List[tf.Tensor], slots: List[tf.Tensor]) -> List[tf.Tensor]:
        for slot, value in zip(self.slots, slots):
            slot.assign(value)
        self.optimizer.apply_gradients(zip(grads, self.variables))
        return [s.read_value() for s in self.slots]  # automatic control dependencies order these after the update

    def step(self, grads: Sequence[tf.Tensor], state: Sequence[np.ndarray]) -> Tuple[np.ndarray, ...]:
        """One Adam step on ``variables`` from the Adam ``state``; returns the new state."""
        return tuple(s.numpy() for s in self._step(list(grads), [tf.constant(s) for s in state]))


@dataclass(frozen=True)
class _ClientData:
    """A client's private ``(X_k, Y_k)`` as tensors (rebuilt by ``setup_client``, never checkpointed)."""

    X: tf.Tensor
    Y: tf.Tensor


class FSGP(Algorithm[FSGPState]):
    r"""Federated sparse GP regression (Guo et al., Algorithm 1) and exact federated SGPR.

    Model: Titsias' collapsed SGPR with a shared kernel ``c(·,·; θ)``, Gaussian noise σ² and inducing
    inputs Z, ``w = (θ, σ, Z)``.

    ``mode="fedavg"`` (the paper). Each round, ``max(⌈Kρ⌉, 1)`` sampled clients receive ``w``, run
    ``local_steps`` (P) steps of their own ``tf_keras`` Adam (learning rate λ) on
    ``F_k(w) = ELBO_k(w) / N_k`` — Titsias' bound on their own data (eq. 9) — and send back ``w_k``; the
    server sets ``w ← Σ_k N_k w_k / Σ_k N_k`` over the round's clients. **Averaging is in the unconstrained
    space** (GPflow's ``Parameter.unconstrained_variable``, softplus for θ and σ²): the average of
    positive parameters stays positive and Adam steps live in that space too. Each client keeps its own
    Adam moments and step count between rounds (``client.state["adam"]``, checkpointed with the client).
    FedAvg's fixed points are those of the client-sum bound ``Σ_k ELBO_k(w)``, which drops the cross-client
    blocks of ``Q_ff`` that the pooled bound keeps, so fedavg does not converge to centralized SGPR: on the
    concrete data its test RMSE is 5–8 % above SGPR's (BENCHMARKS.md, FSGP). ``mode="exact"`` optimises the
    pooled bound.

    Client work of every mode runs on one :class:`SGPRClientWorker` per run: its compiled functions take the
    client's data, w and Adam state as arguments, so they are traced once per run, not once per client
    (a 1,000-client federation would otherwise spend most of its first round tracing).

    ``mode="exact"`` (beyond the paper). Each round is one Adam step on the *global* bound
    ``F(w) = ELBO(w; D) / N`` with every client: phase ``"statistics"`` sums the clients' statistics S
    (see :mod:`~gpflow_fed.federated.algorithms.fsgp.statistics`), from which the server computes ``F``,
    ``∂F/∂w`` at fixed S, and the adjoints ``∂F/∂S``; phase ``"gradient"`` broadcasts the adjoints and the
    clients return the vector-Jacobian products ``(∂S_k/∂w)ᵀ ∂F/∂S``, summed. The server's Adam then
    takes one step, so R rounds equal R Adam steps of ``gpflow.models.SGPR`` on the pooled data with
    ``training_loss() / N``. ``local_steps`` is not used; ``client_fraction`` must be 1. Exact mode sends
    the *whitened* statistics ``L⁻¹ C Cᵀ L⁻ᵀ`` and ``L⁻¹ C y`` (``L Lᵀ = Kuu``, computed by every client from
    the shared w; same sizes, same information), which is how SGPR itself computes: the unwhitened sums
    lose accuracy when Kuu is ill-conditioned and σ² small (e.g. CO₂ with a periodic kernel), and Adam then
    drifts away from pooled SGPR. ``whiten`` overrides the default (whitened in exact mode only).

    Whitened statistics also suit differential privacy: their size has a public bound,
    ``‖A_k A_kᵀ‖_F ≤ tr(A_k A_kᵀ) ≤ Σ_n c(x_n, x_n)`` (``Q_nn ≤ K_nn``), i.e. ``N_k σ_f²`` for a stationary
    kernel, so a clip norm can be fixed without looking at the data (measured utility: BENCHMARKS.md,
    "Differential privacy", and ``benchmarks/dp_utility.py``).

    Final phase ``"predict"`` (both modes, eqs. 14–15): every client sends its statistics at the final w;
    the sum builds :class:`gpflow_fed.models.AggregatedSGPR`, which predicts without data. The server first
    symmetrizes ``Σ C Cᵀ`` and projects it onto the PSD cone
    (:func:`~gpflow_fed.federated.algorithms.postprocess.project_to_psd`): a no-op up to round-off for exact sums, and
    post-processing (no privacy cost) when the sums were released with differential-privacy noise.

    Messages (P outputs, ``|θ|`` kernel parameters, 8 bytes a number; none depends on ``N_k``):

    =================  =========  =========================================  ===========================
    phase              direction  arrays                                     numbers
    =================  =========  =========================================  ===========================
    ``train``          down, up   w (θ, σ², Z)                               ``|θ| + 1 + MD``
    ``statistics``     down       w                                          ``|θ| + 1 + MD``
    ``statistics``     up         ``CCᵀ, Cy, ‖y‖², tr Kff, N_k``             ``M² + MP + 3``
    ``gradient``       down       w, ``∂F/∂(CCᵀ, Cy, tr Kff)``               ``|θ| + 1 + MD + M² + MP + 1``
    ``gradient``       up         ``∂/∂w`` of ``⟨∂F/∂S, S_k⟩``               ``|θ| + 1 + MD``
    ``predict``        down, up   w; then the statistics as above            as above
    =================  =========  =========================================  ===========================

    Every up message also carries its weight ``N_k`` (the server knows the client sizes) and, for
    ``train``, the client's final local bound ``F_k`` as a metric. What the server sees: the averaged (or
    summed) values of each round; with plain (non-secure) aggregation also each client's ``w_k`` after P
    local steps, which is a function of its data. The statistics cannot be inverted to the data (Theorem 1:
    ``(C Q, Qᵀ y)`` gives the same message for any orthogonal Q), but they are not differentially private.

    Defaults (``FSGP(kernel, 20)`` runs): P = 3 and λ = 0.1 are the paper's values; σ² = 0.1 and R = 60 are this
    library's choices for standardised data (the paper starts from σ = 0.1, i.e. σ² = 0.01, and trains
    T = 5,000 rounds; ``stopping`` ends a run at convergence instead). Standardise the data first
    (:meth:`~gpflow_fed.data.FederatedDataset.standardized`); for data in raw units pass an initial σ² and Z
    on that scale.

    :param kernel: a ``gpflow.kernels.Kernel`` with the initial θ (copied, never modified).
    :param inducing_variable: initial Z, ``InducingPoints`` or an ``[M, D]`` array (copied; see
        :func:`~gpflow_fed.federated.algorithms.inducing_grid` and
        :func:`~gpflow_fed.federated.algorithms.inducing_from_public`, which need no client data), or an
        integer M: Z is then ``inducing_grid([(-2, 2)] * D, M)``, spread over standardised inputs, placed when
        the run learns D (in :meth:`validate`).
    :param noise_variance: initial σ² > 0.
    :param rounds: communication rounds R ≥ 0 (T in the paper).
    :param local_steps: P ≥ 1, local Adam steps per round (fedavg).
    :param learning_rate: λ > 0 of every Adam optimizer.
    :param client_fraction: ρ ∈ (0, 1]; ``max(⌈Kρ⌉, 1)`` clients per round (fedavg).
    :param mode: ``"fedavg"`` or ``"exact"``.
    :param whiten: send whitened statistics ``(L⁻¹CCᵀL⁻ᵀ, L⁻¹Cy)``; None (default): only in exact mode.
    :param stopping: end training before R rounds once the round's bound (``local_bound``, the sampled
        clients' averaged F_k, in fedavg mode; the global ``bound`` in exact mode) reaches a
        :class:`~gpflow_fed.federated.Plateau`; None (default): always R rounds.
    :raises TypeError: a kernel or inducing variable of the wrong type, a ``whiten`` that is not a bool, or a
        ``stopping`` that is not a Plateau.
    :raises ValueError: a non-positive learning rate, noise variance or local steps, negative rounds, ρ
        outside (0, 1], an unknown mode, exact mode with ρ < 1; in :meth:`validate`: M larger than the data
        or an input dimension of Z (or of ARD lengthscales) different from the data's D.
    """

    name = "fsgp"

    def __init__(
        self,
        kernel: gpflow.kernels.Kernel,
        inducing_variable: Any,
        noise_variance: float = 0.1,
        rounds: int = 60,
        local_steps: int = 3,
        learning_rate: float = 0.1,
        client_fraction: float = 1.0,
        mode: str = "fedavg",
        whiten: Optional[bool] = None,
        stopping: Optional[Plateau] = None,
    ) -> None:
        super().__init__(rounds, client_fraction)
        if stopping is not None and not isinstance(stopping, Plateau):
            raise TypeError(f"FSGP: stopping must be a Plateau or None, got {type(stopping).__name__}")
        self.stopping = stopping
        if not isinstance(kernel, gpflow.kernels.Kernel):
            raise TypeError(f"FSGP: kernel must be a gpflow.kernels.Kernel, got {type(kernel).__name__}")
        if mode not in MODES:
            raise ValueError(f"FSGP: mode must be one of {MODES}, got {mode!r}")
        integer(local_steps, "FSGP: local_steps", minimum=1)
        positive_float(learning_rate, "FSGP: learning_rate")
        positive_float(noise_variance, "FSGP: noise_variance")
        floor = gpflow.config.default_likelihood_positive_minimum()
        if noise_variance <= floor:
            raise ValueError(
                f"FSGP: noise_variance must exceed GPflow's Gaussian-likelihood floor {floor:g} "
                f"(gpflow.config likelihood_positive_minimum), got {noise_variance!r}; start from a "
                "larger σ², e.g. 10× the floor"
            )
        if whiten is not None and not isinstance(whiten, (bool, np.bool_)):
            raise TypeError(f"FSGP: whiten must be True, False or None (the mode's default), got {whiten!r}")
        if mode == "exact" and self.client_fraction != 1.0:
            raise ValueError("FSGP: mode='exact' sums statistics over every client each round; use client_fraction=1.0")
        #: M when Z is to be placed once D is known (an integer ``inducing_variable``), else None
        self._pending_num_inducing: Optional[int] = None
        if isinstance(inducing_variable, (int, np.integer)) and not isinstance(inducing_variable, bool):
            if inducing_variable < 1:
                raise ValueError(f"FSGP: M (an integer inducing_variable) must be positive, got {inducing_variable}")
            self._pending_num_inducing = int(inducing_variable)
            inducing_variable = inducingpoint_wrapper(np.zeros((self._pending_num_inducing, 1), gpflow.default_float()))
        elif isinstance(inducing_variable, gpflow.inducing_variables.InducingVariables):
            if not isinstance(inducing_variable, gpflow.inducing_variables.InducingPoints):
                raise TypeError(
                    "FSGP: inducing_variable must be InducingPoints or an [M, D] array, got "
                    f"{type(inducing_variable).__name__}"
                )
        else:
            Z = np.asarray(inducing_variable)
            if Z.ndim != 2 or not np.issubdtype(Z.dtype, np.number):
                raise ValueError(f"FSGP: inducing_variable must be an [M, D] numeric array, got shape {Z.shape}")
            if not np.all(np.isfinite(Z)):
                raise ValueError("FSGP: inducing_variable contains NaN or inf values")
            inducing_variable = inducingpoint_wrapper(Z.astype(gpflow.default_float()))
        self.kernel = gpflow.utilities.deepcopy(kernel)
        self.inducing_variable = gpflow.utilities.deepcopy(inducing_variable)
        self.noise_variance = float(noise_variance)
        self.local_steps = int(local_steps)
        self.learning_rate = float(learning_rate)
        self.mode = mode
        #: send whitened statistics (L⁻¹ C Cᵀ L⁻ᵀ, L⁻¹ C y): SGPR's own numerics, see sgpr_statistics
        self.whiten = (mode == "exact") if whiten is None else bool(whiten)
        self._shared: Optional[SharedState] = None
        self._server_model: Optional[AggregatedSGPR] = None
        self._server_adam: Optional[ServerAdam] = None
        self._worker: Optional[SGPRClientWorker] = None
        self._clients: List[str] = []
        self._sizes: Optional[Dict[str, int]] = None
        self._variance_at: Optional[Tuple[str, float]] = None  # (the parameters' values digest, σ_f² at them)
        #: (a broadcast's key, what payload_bound reads of it): see _broadcast_extent
        self._extent_at: Optional[Tuple[Any, Tuple[Dict[str, float], Tuple[float, ...]]]] = None

    # --- configuration -------------------------------------------------------------------------------
    @property
    def num_inducing(self) -> int:
        """M, from Z's static shape (read for every reply: GPflow's ``num_inducing`` runs a TensorFlow op, ≈ 2 ms)."""
        rows = self.inducing_variable.Z.shape[0]
        return int(rows) if rows is not None else int(self.inducing_variable.num_inducing)

    def validate(self, dataset: Any) -> None:
        """M ≤ N, Z's input dimension (and ARD lengthscales') equal to the data's D, and N_k ≥ 2 for every client.

        A client with ``N_k = 1`` is refused: its statistics ``(c cᵀ, c y, y², k(x, x), 1)`` with
        ``c = k(Z, x)`` give ``|y| = √(y²)``, its sign from ``c y``, then ``c`` and (for a stationary kernel)
        ``x`` from ``k(Z, x)`` — the rotation ambiguity of Theorem 1 (Guo et al.,
        doi:10.1007/978-3-031-13832-4_23) needs ``N_k > 1``.
        """
        single = [k for k, n in enumerate(dataset.client_sizes) if int(n) < 2]
        if single:
            raise ValueError(
                f"FSGP: client(s) {single} (by position) hold a single data point; its (x, y) can be read back "
                "exactly from the statistics it would send (Theorem 1 needs N_k > 1). Merge such clients with "
                "others or drop them"
            )
        D = int(dataset.input_dim)
        Z_dim = int(self.inducing_variable.Z.shape[1])
        if Z_dim != D:
            raise ValueError(f"FSGP: inducing inputs have dimension {Z_dim} but the data have D = {D}")
        lengthscales = getattr(self.kernel, "lengthscales", None)
        if lengthscales is not None and lengthscales.shape.ndims == 1 and int(lengthscales.shape[0]) not in (1, D):
            raise ValueError(f"FSGP: the kernel has {lengthscales.shape[0]} ARD lengthscales but the data have D = {D}")
        if self.num_inducing > dataset.num_data:
            raise ValueError(
                f"FSGP: M = {self.num_inducing} inducing points exceed the N = {dataset.num_data} data points; use M "
                "≤ N"
            )

    def phases(self, round: int) -> Tuple[str, ...]:
        return (TRAIN_PHASE,) if self.mode == "fedavg" else (STATISTICS_PHASE, GRADIENT_PHASE)

    def final_phases(self) -> Tuple[str, ...]:
        return (PREDICT_PHASE,)

    def evaluation_phases(self) -> Tuple[str, ...]:
        """FedAvg: ``"predict"`` at the current parameters. Exact mode: none. A mid-training evaluation after round r
        would ask ``"predict"`` at θ_{r+1}, which round r+1's ``"statistics"`` asks again (the same computation,
        :meth:`computation`: refused under secure aggregation over another masking graph, always under distributed
        DP). The model is built instead from the statistics round r summed at θ_r (:meth:`result`), so a
        mid-training evaluation in exact mode reports the model at θ_r, one server step behind the state."""
        return () if self.mode == "exact" else (PREDICT_PHASE,)

    def computation(self, phase: str) -> str:
        """``"predict"`` computes the clients' ``"statistics"`` (one function of the parameters they read), so both are
        one question to a client that answers a broadcast once; every other phase is its own."""
        return STATISTICS_PHASE if phase == PREDICT_PHASE else phase

    def aggregation(self, phase: str) -> str:
        return "mean" if phase == TRAIN_PHASE else "sum"

    def ignores(self, phase: str) -> Tuple[str, ...]:
        """The statistics (``"statistics"``, ``"predict"``) read the kernel and Z, not the noise variance (FSGP
        eq. 12: C = k(Z, X)), and so does ``"gradient"``, their vector–Jacobian product ``(∂S_k/∂w)ᵀ ∂F/∂S`` (its
        entry for σ² is 0 whatever σ² is: a fresh attacker moved σ² by 1e-9 and had one client's gradient to 1e-10
        from the difference of two sums; issue 43); ``"train"`` reads every shared value."""
        return NOT_READ_BY_STATISTICS if phase in (STATISTICS_PHASE, PREDICT_PHASE, GRADIENT_PHASE) else ()

    def reply_spec(self, state: FSGPState, round: int, phase: str) -> ReplySpec:
        """Parameters (``"train"``, ``"gradient"``) shaped as the broadcast; statistics with M and P."""
        if phase in (TRAIN_PHASE, GRADIENT_PHASE):
            return {k: tuple(np.shape(v)) for k, v in state.params.items()}
        M, P = self.num_inducing, state.output_dim
        return {"kuf_kfu": (M, M), "kuf_y": (M, P), "y_squared_sum": (), "trace_kff": (), "num_data": ()}

    def expected_weight(self, phase: str, num_data: int) -> float:
        """Every FSGP message is weighted by the client's registered N_k."""
        return float(num_data)

    def _kernel_variance(self, params: Mapping[str, np.ndarray]) -> Optional[float]:
        """max_x k(x, x) at the hyperparameters ``params`` (a state's, or a broadcast's): σ_f² of a stationary kernel
        (else None: no bound).

        Every reply of a phase is checked against the same state, so the last answer is kept under the float64
        values of the parameters it was computed from (``values_digest``; a new value of any parameter computes it
        again). Raw bytes would not do: the same bytes as int64 are other numbers, and a
        server that sent them after a float64 broadcast had a party bound its statistics by the other's variance
        (issue 43, a fifteenth attacker: each party's statistics to 1e-10 under a DP clip that bound).
        """
        if not isinstance(self.kernel, gpflow.kernels.Stationary) or self._shared is None:
            return None
        key = values_digest({k: params[k] for k in self._shared.keys})
        if self._variance_at is None or self._variance_at[0] != key:
            self._shared.assign(self._server_model, params)
            variance = float(self._server_model.kernel.variance.numpy())  # type: ignore[union-attr]  # bound with _shared
            self._variance_at = (key, variance)
        return self._variance_at[1]

    def payload_bound(self, broadcast: Message, domain: DataDomain) -> Optional[Mapping[str, float]]:
        """Public bounds of a reply (``Algorithm.payload_bound``), with N = ``domain.rows``, P outputs, Ȳ_p =
        ``domain.targets`` and σ_f² the stationary kernel's variance at the broadcast (``|k(z, x)| ≤ σ_f²``,
        ``k(x, x) = σ_f²``):

        * statistics (``"statistics"``, ``"predict"``; module :mod:`.checks`): ``C Cᵀ`` ≤ N σ_f⁴ (whitened: ≤ N σ_f²,
          the Nyström bound ``‖L⁻¹ k(Z, x)‖² ≤ k(x, x)`` and Cauchy–Schwarz), ``C y`` ≤ N σ_f² max_p Ȳ_p (whitened:
          ``√(N σ_f²) · √N max_p Ȳ_p``), ``‖y‖²`` ≤ N Σ_p Ȳ_p², ``tr K_ff`` ≤ N σ_f², ``N_k`` ≤ N;
        * a FedAvg update (``"train"``): each value within ``max |broadcast value|`` plus the largest move of
          ``local_steps`` Adam steps in the broadcast's round (:func:`~.checks.adam_displacement_bound`), whatever the
          data; with σ² ∈ [σ²₋, σ²₊] and σ_f² ≤ v₊ over that box (the transforms at its corners), its local
          bound ``ELBO_k / N_k`` (a metric, FSGP eq. 9) within

              P/2 (log 2π + max(|log σ²₋|, |log(σ²₊ + N v₊)|)) + (Σ_p Ȳ_p² + P v₊) / (2σ²₋)

          (``log det(Q + σ² I) / N`` lies between ``log σ²`` and ``log(σ² + N v)`` as ``λ(Q) ≤ tr Q ≤ N v``;
          ``y_pᵀ (Q + σ² I)⁻¹ y_p ≤ N Ȳ_p² / σ²``; ``0 ≤ tr(K − Q) ≤ N v``; :mod:`..bounds`, shared with FGP).

        None for the exact mode's ``"gradient"`` (linear in the server's adjoints, no bound built), for a kernel that
        is not ``gpflow.kernels.Stationary``, and unwhitened for inducing features other than ``InducingPoints``.
        What depends on the broadcast alone is computed once per broadcast (:meth:`_broadcast_extent`).
        """
        extent = self._broadcast_extent(broadcast)
        if extent is None:
            return None
        N, targets = float(domain.rows), np.asarray(domain.targets, np.float64)
        squares = float(np.sum(targets**2))
        if broadcast.phase == TRAIN_PHASE:
            bounds, (noise_low, noise_high, variance_high) = extent
            local = log_density_bound(N, targets, noise_low, noise_high, variance_high, trace_term=True)
            return {**bounds, "bound": local}
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            (variance,) = extent[1]
            largest = float(np.max(targets, initial=0.0))
            cross = N * (variance if self.whiten else variance**2)
            projected = N * (np.sqrt(variance) if self.whiten else variance) * largest
            return {"kuf_kfu": cross, "kuf_y": projected, "y_squared_sum": N * squares, "trace_kff": N * variance,
                    "num_data": N}  # fmt: skip

    def _broadcast_extent(self, broadcast: Message) -> Optional[Tuple[Dict[str, float], Tuple[float, ...]]]:
        """What :meth:`payload_bound` reads of a broadcast, kept under its phase, round and arrays' bytes (every client
        of a cohort asks for the same one): for ``"train"`` each value's bound and ``(σ²₋, σ²₊, v₊)``, for the
        statistics ``({}, (σ_f²,))``; None where there is no bound."""
        stationary = isinstance(self.kernel, gpflow.kernels.Stationary)
        statistics = broadcast.phase in (STATISTICS_PHASE, PREDICT_PHASE)
        points = type(self.inducing_variable) is gpflow.inducing_variables.InducingPoints
        if self._shared is None or not stationary or not (broadcast.phase == TRAIN_PHASE or statistics):
            return None
        if statistics and not (self.whiten or points):
            return None
        key = (broadcast.phase, broadcast.round, values_digest(broadcast.arrays))
        if self._extent_at is not None and self._extent_at[0] == key:
            return self._extent_at[1]
        params = dict(zip(self._shared.keys, self._broadcast_values(broadcast)))
        model = self._server_model
        assert model is not None
        if statistics:
            extent: Tuple[Dict[str, float], Tuple[float, ...]] = ({}, (float(self._kernel_variance(params) or 0.0),))
        else:
            move = fedavg_move(self.learning_rate, self.local_steps, broadcast.round)
            box = variance_extremes(model, self._shared, params, move)  # the transforms at the box's corners
            assert box is not None  # a stationary kernel and a Gaussian likelihood (checked above)
            extent = (fedavg_value_bounds(params, move), box)
        self._extent_at = (key, extent)
        return extent

    def check_reply(self, state: FSGPState, phase: str, message: Message, num_data: int) -> Optional[str]:
        """Statistics consistent with N_k points (:func:`~.checks.statistics_fault`: count, PSD, trace and entry
        bounds); a FedAvg update within ``local_steps`` Adam steps of the broadcast
        (:func:`~.checks.displacement_fault`)."""
        if phase == TRAIN_PHASE:
            return displacement_fault(message.arrays, state.params, self.learning_rate, self.local_steps, message.round)
        if phase in (STATISTICS_PHASE, PREDICT_PHASE):
            variance = self._kernel_variance(state.params)
            return statistics_fault(message.arrays, num_data, kernel_variance=variance, whitened=self.whiten)
        return None

    def check_replies(
        self, state: FSGPState, phase: str, messages: Sequence[Message], sizes: Sequence[int]
    ) -> List[Optional[str]]:
        """:meth:`check_reply` of every reply; a cohort's FedAvg updates of one round checked together
        (:func:`~.checks.displacement_faults`: the same verdicts)."""
        rounds = {message.round for message in messages}
        if phase != TRAIN_PHASE or len(rounds) != 1:
            return super().check_replies(state, phase, messages, sizes)
        arrays = [message.arrays for message in messages]
        return displacement_faults(arrays, state.params, self.learning_rate, self.local_steps, rounds.pop())

    def check_sum(self, state: FSGPState, aggregate: Aggregate) -> Optional[str]:
        """The same checks on a masked sum (fixed-point round-off allowed: the cohort size times 1e-6): statistics
        against the senders' registered sizes; a FedAvg mean within ``local_steps`` Adam steps of the broadcast (a
        weighted mean of points inside that box lies inside it), with the senders' registered sizes as its total
        weight."""
        if self._sizes is None:
            return None
        expected = sum(self._sizes[c] for c in aggregate.senders)
        if aggregate.phase == TRAIN_PHASE:
            if abs(float(aggregate.total_weight) - expected) > 1e-6 * len(aggregate.senders) + 1e-9 * expected:
                return f"its total weight is not the senders' registered {expected} points"
            round_off = 1e-6 * len(aggregate.senders)
            return displacement_fault(
                aggregate.arrays, state.params, self.learning_rate, self.local_steps, aggregate.round, round_off
            )
        if aggregate.phase not in (STATISTICS_PHASE, PREDICT_PHASE):
            return None
        return statistics_fault(
            aggregate.arrays,
            expected,
            kernel_variance=self._kernel_variance(state.params),
            whitened=self.whiten,
            absolute_tolerance=1e-6 * len(aggregate.senders),
        )

    def checkpoint_objects(self) -> Dict[str, Any]:
        """The server model's parameters (and, in exact mode, the server Adam), not its summed statistics: the
        clients recompute those every round. (A ``tf.Module`` under the same name keeps the checkpoint's paths, so
        checkpoints written before the model held its statistics still resume.)"""
        objects = super().checkpoint_objects()
        model = objects.get("_server_model")
        if model is not None:
            parameters = tf.Module()
            parameters.kernel, parameters.likelihood = model.kernel, model.likelihood
            parameters.inducing_variable = model.inducing_variable
            objects["_server_model"] = parameters
        return objects

    def min_cohort_data(self, phase: str) -> Optional[int]:
        """``M + 1``: the statistics of Σ N_k ≤ M points determine those points exactly (every column of
        ``C = k(Z, X)`` is a kernel feature vector of its input), so a client's policy refuses smaller groups."""
        return self.num_inducing + 1 if phase in (STATISTICS_PHASE, PREDICT_PHASE) else None

    # --- models ---------------------------------------------------------------------------------------
    def _empty_model(self, output_dim: int) -> AggregatedSGPR:
        M = self.num_inducing
        dtype = gpflow.default_float()
        return AggregatedSGPR(
            gpflow.utilities.deepcopy(self.kernel),
            gpflow.utilities.deepcopy(self.inducing_variable),
            self.noise_variance,
            np.zeros((M, M), dtype),
            np.zeros((M, output_dim), dtype),
            freeze_statistics_parameters=False,  # the server's parameters: clients recompute the statistics
        )

    def _unconstrained(self, module: Any) -> List[tf.Variable]:
        assert self._shared is not None
        out = []
        for path in self._shared.paths.values():
            obj = resolve_path(module, path)
            if not isinstance(obj, gpflow.Parameter):
                raise TypeError(f"FSGP shares GPflow Parameters only; {path!r} is a {type(obj).__name__}")
            out.append(obj.unconstrained_variable)
        return out

    def bind(self, info: FederationInfo) -> "FSGP":
        """The run's FSGP: Z spread over standardised inputs if it was given as a count M (``FSGP(kernel, M)``),
        and the run's own server model, shared-parameter map and client worker (every party builds the same)."""
        bound = super().bind(info)
        assert isinstance(bound, FSGP)
        if bound._pending_num_inducing is not None:
            box = [STANDARDISED_BOX] * int(info.input_dim)
            bound.inducing_variable = inducingpoint_wrapper(inducing_grid(box, bound._pending_num_inducing))
            bound._pending_num_inducing = None
        bound._server_model = bound._empty_model(info.output_dim)
        bound._shared = SharedState.from_module(bound._server_model, space="unconstrained")
        bound._worker = SGPRClientWorker(
            bound.kernel,
            bound.inducing_variable,
            bound.noise_variance,
            info.output_dim,
            list(bound._shared.paths.values()),
            bound.learning_rate,
            bound.local_steps,
            bound.whiten,
        )
        bound._clients = []
        bound._sizes = dict(info.client_sizes)
        bound._variance_at = None
        bound._extent_at = None
        if bound.mode == "exact":
            bound._server_adam = ServerAdam(bound._unconstrained(bound._server_model), bound.learning_rate)
        return bound

    def initial_state(self, info: FederationInfo) -> FSGPState:
        if self._worker is None:
            raise ValueError("FSGP.initial_state needs the run's bound algorithm (FSGP.bind(info); use run())")
        # bind() set the shared state, and the server's Adam in "exact" mode
        server_adam = cast(ServerAdam, self._server_adam).initial_state() if self.mode == "exact" else None
        return FSGPState(
            params=cast(SharedState, self._shared).read(self._server_model),
            output_dim=int(info.output_dim),
            server_adam=server_adam,
        )

    def setup_client(self, client: Client, info: FederationInfo) -> None:
        """The client's data as tensors and, in FedAvg, its own fresh Adam state (step 0, zero moments).

        The client's Adam state lives in ``client.state["adam"]`` (an
        :class:`~gpflow_fed.training.adam.AdamState` of numpy arrays), so it is saved with the client's
        checkpoint; the update itself runs on the shared :class:`SGPRClientWorker` (traced once per run).
        """
        assert self._worker is not None
        client.state["fsgp"] = _ClientData(*(tf.constant(a) for a in client.data))
        if self.mode == "fedavg":
            client.state["adam"] = self._worker.initial_adam_state()
        self._clients.append(client.id)

    def tracing_counts(self) -> Dict[str, Dict[str, int]]:
        """For each set-up client, how many times the compiled functions of its rounds were traced.

        ``"train"`` (fedavg) or ``"statistics"`` and ``"gradient"`` (exact). These functions are shared by
        all clients (:class:`SGPRClientWorker`), so each count is the number of traces in the whole run:
        1 once used, never one per client or per round. The final ``"predict"`` phase of fedavg uses the
        shared ``"statistics"`` function too (``self.worker.tracing_counts()`` has every count).
        """
        if self._worker is None:
            return {}
        counts = self._worker.tracing_counts()
        names = self.phases(0)
        return {cid: {name: counts[name] for name in names} for cid in self._clients}

    @property
    def worker(self) -> Optional[SGPRClientWorker]:
        """The shared client worker of the current run (None before :meth:`initial_state`)."""
        return self._worker

    # --- the round -----------------------------------------------------------------------------------
    def broadcast(self, state: FSGPState, round: int, phase: str) -> Mapping[str, np.ndarray]:
        arrays = dict(state.params)
        if phase == GRADIENT_PHASE:
            if state.adjoints is None:
                raise RuntimeError("FSGP: the 'gradient' phase needs the adjoints of a 'statistics' phase")
            arrays.update({f"adjoint/{k}": v for k, v in state.adjoints.items()})
        return arrays

    def _broadcast_values(self, broadcast: Message) -> List[np.ndarray]:
        """The shared values a client's update starts from, in wire order (a value its phase does not read is the
        party's own copy's).

        :raises BroadcastRefused: arrays other than the phase's.
        """
        assert self._shared is not None
        expected = set(self._shared.keys) - set(self.ignores(broadcast.phase))
        if broadcast.phase == GRADIENT_PHASE:
            expected |= {f"adjoint/{k}" for k in ADJOINT_NAMES}
        if set(broadcast.arrays) != expected:  # an array it would ignore would make a "new" broadcast for free
            raise BroadcastRefused(f"FSGP: the {broadcast.phase!r} broadcast carries arrays other than the algorithm's")
        # a value the phase does not read is the party's own copy's (its statistics never touch it)
        own = {} if expected.issuperset(self._shared.keys) else self._shared.read(self._server_model)
        return [broadcast[k] if k in broadcast.arrays else own[k] for k in self._shared.keys]

    def client_update(self, client: Client, broadcast: Any) -> Any:
        assert self._shared is not None and self._worker is not None
        data: _ClientData = client.state["fsgp"]
        values = self._broadcast_values(broadcast)
        weight = float(client.num_data)
        if broadcast.phase == TRAIN_PHASE:
            new_values, adam, bound = self._worker.train(data.X, data.Y, values, client.state["adam"])
            return self._trained(client, broadcast, new_values, adam, bound)
        if broadcast.phase in (STATISTICS_PHASE, PREDICT_PHASE):
            return self.reply(client, broadcast, self._worker.statistics(data.X, data.Y, values), weight)
        if broadcast.phase == GRADIENT_PHASE:
            self._check_gradient_once(client, broadcast)
            adjoints = {k: broadcast[f"adjoint/{k}"] for k in ADJOINT_NAMES}
            grads = self._worker.vjp(data.X, data.Y, values, adjoints)
            return self.reply(client, broadcast, dict(zip(self._shared.keys, grads)), weight)
        raise ValueError(f"FSGP: unknown phase {broadcast.phase!r}")

    def _trained(
        self, client: Client, broadcast: Message, new_values: Sequence[np.ndarray], adam: AdamState, bound: float
    ) -> Message:
        """The reply of a FedAvg update; only a finite local bound changes the client's Adam state.

        :raises FloatingPointError: the local bound is not finite.
        """
        assert self._shared is not None
        if not np.isfinite(bound):
            raise FloatingPointError(f"the local bound became {bound} after {self.local_steps} steps")
        client.state["adam"] = adam  # only a successful update changes the client's Adam state
        arrays = dict(zip(self._shared.keys, new_values))
        return self.reply(client, broadcast, arrays, float(client.num_data), {"bound": bound})

    def _alone(self, client: Client, broadcast: Message) -> Union[Message, Exception]:
        """:meth:`client_update` of one client, its error returned (what the per-client path answers)."""
        try:
            return self.client_update(client, broadcast)
        except Exception as exc:  # noqa: BLE001 - this client's update fails, as on the per-client path
            return exc

    def batched(self, phase: str) -> bool:
        """Every phase of FSGP has a batched form (:class:`~.batched.BatchedSGPRWorker`): FedAvg's local Adam steps,
        the statistics and exact mode's products; not for a subclass that replaces :meth:`client_update` (its own
        update is asked per client), nor when the worker's trained variables are not exactly the shared
        Parameters."""
        worker = self._worker
        return (
            worker is not None
            and worker.batched is not None
            and type(self).client_update is FSGP.client_update
            and phase in (TRAIN_PHASE, STATISTICS_PHASE, PREDICT_PHASE, GRADIENT_PHASE)
        )

    def _check_gradient_once(self, client: Client, broadcast: Message) -> None:
        """One ``"gradient"`` answer per parameters (:func:`~gpflow_fed.federated.protocol.algorithm.answer_once_per`):
        ``(∂S_k/∂w)ᵀ a`` is exactly linear in the adjoints ``a`` the server sends (``a`` then ``2a`` at the same
        parameters without one client gave its gradient to 3.7e-10; issue 43, twelfth round). An honest exact-mode
        round asks the gradient once, at the parameters of its ``"statistics"``."""
        params = {k: v for k, v in broadcast.arrays.items() if not k.startswith("adjoint/")}
        adjoints = {k: v for k, v in broadcast.arrays.items() if k.startswith("adjoint/")}
        answer_once_per(client, GRADIENT_ANSWERED, params, adjoints, "'gradient' at these parameters")

    def client_updates(
        self, clients: Sequence[Client], broadcast: Message, memory_budget: int
    ) -> List[Union[Message, Exception]]:
        """:meth:`client_update` of every client at once: one compiled call per size bucket and memory chunk
        (:class:`~.batched.BatchedSGPRWorker`), each client with its own data and, in FedAvg, its own Adam state; per
        client, the reply (or the error) :meth:`client_update` gives, to round-off.

        A client whose batched update or gradient is not finite is recomputed on its own (:meth:`client_update`), so it
        gets the per-client answer, its failure included: ``tf.vectorized_map`` does not keep TensorFlow
        Probability's custom gradient of its softplus bijector, so a softplus-constrained parameter whose
        unconstrained value exceeds log(float64 max) ≈ 709.8 (a kernel variance above 709.8) gets a NaN gradient in
        the batch where the per-client step is finite (as in :meth:`FGP.client_updates
        <gpflow_fed.federated.algorithms.FGP.client_updates>`)."""
        assert self._shared is not None and self._worker is not None and self._worker.batched is not None
        batched = self._worker.batched
        try:
            values = self._worker.pack(self._broadcast_values(broadcast))
        except (BroadcastRefused, ValueError) as exc:
            return [exc] * len(clients)
        data = [client.data for client in clients]
        out: List[Any] = [None] * len(clients)
        phase = broadcast.phase
        if phase == TRAIN_PHASE:
            good: List[int] = []
            for k, client in enumerate(clients):
                try:
                    self._worker.trainer.check(client.state["adam"])  # as SGPRClientWorker.train checks it
                    good.append(k)
                except Exception as exc:  # noqa: BLE001 - this client's update fails, as client_update would
                    out[k] = exc
            states = [clients[k].state["adam"] for k in good]
            trained = batched.train([data[k] for k in good], values, states, memory_budget)
            for k, (new_values, adam, bound) in zip(good, trained):
                if not (np.isfinite(bound) and all(np.all(np.isfinite(v)) for v in new_values)):
                    out[k] = self._alone(clients[k], broadcast)  # the per-client answer (see above)
                    continue
                out[k] = self._trained(clients[k], broadcast, new_values, adam, bound)
            return out
        if phase in (STATISTICS_PHASE, PREDICT_PHASE):
            stats = batched.statistics(data, values, memory_budget)
            return [self.reply(c, broadcast, s, float(c.num_data)) for c, s in zip(clients, stats)]
        if phase == GRADIENT_PHASE:
            asked: List[int] = []
            for k, client in enumerate(clients):
                try:
                    self._check_gradient_once(client, broadcast)
                    asked.append(k)
                except BroadcastRefused as exc:  # as client_update refuses it
                    out[k] = exc
            adjoints = {k: broadcast[f"adjoint/{k}"] for k in ADJOINT_NAMES}
            grads = batched.vjp([data[k] for k in asked], values, adjoints, memory_budget) if asked else []
            keys = self._shared.keys
            for k, g in zip(asked, grads):
                c = clients[k]
                finite = all(np.all(np.isfinite(v)) for v in g)
                out[k] = (
                    self.reply(c, broadcast, dict(zip(keys, g)), float(c.num_data))
                    if finite
                    else self._alone(c, broadcast)
                )
            return out
        return [ValueError(f"FSGP: unknown phase {phase!r}")] * len(clients)

    def _objective(self, state: FSGPState, stats: Mapping[str, np.ndarray]) -> Tuple[float, Dict, Dict]:
        """``F = ELBO/N``, ``∂(−F)/∂w`` at fixed S, and ``∂(−F)/∂S`` on the server model."""
        assert self._server_model is not None and self._shared is not None
        model = self._server_model
        self._shared.assign(model, state.params)
        variables = self._unconstrained(model)
        tensors = {k: tf.constant(stats[k]) for k in STATISTIC_NAMES}
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(variables)
            tape.watch([tensors[k] for k in ADJOINT_NAMES])
            kuu = (
                None
                if self.whiten
                else gpflow.covariances.Kuu(
                    model.inducing_variable, model.kernel, jitter=gpflow.config.default_jitter()
                )
            )
            bound = (
                collapsed_sgpr_bound(
                    kuu,
                    tensors["kuf_kfu"],
                    tensors["kuf_y"],
                    tensors["y_squared_sum"],
                    tensors["trace_kff"],
                    tensors["num_data"],
                    model.likelihood.variance,
                )
                / tensors["num_data"]
            )
            loss = -bound
        grads = tape.gradient(
            loss, variables + [tensors[k] for k in ADJOINT_NAMES], unconnected_gradients=tf.UnconnectedGradients.ZERO
        )
        direct = {k: g.numpy() for k, g in zip(self._shared.keys, grads[: len(variables)])}
        adjoints = {k: g.numpy() for k, g in zip(ADJOINT_NAMES, grads[len(variables) :])}
        return float(bound.numpy()), direct, adjoints

    def server_update(self, state: FSGPState, aggregate: Aggregate) -> FSGPState:
        phase = aggregate.phase
        if phase == TRAIN_PHASE:
            return replace(state, params={k: np.array(aggregate[k]) for k in state.params}, steps=state.steps + 1)
        if phase == PREDICT_PHASE:
            stats = {k: np.array(aggregate[k]) for k in STATISTIC_NAMES}
            # symmetric PSD: post-processing under DP (free); for exact sums, which the server's checks have found PSD
            # (check_reply, check_sum), only symmetrization and round-off
            stats["kuf_kfu"] = project_to_psd(stats["kuf_kfu"])
            bound, _, _ = self._objective(state, stats)
            return replace(state, statistics=stats, statistics_params=None, bound=bound)
        if phase == STATISTICS_PHASE:
            stats = {k: np.array(aggregate[k]) for k in STATISTIC_NAMES}
            if aggregate.noised:  # post-processing, free under DP
                stats["kuf_kfu"] = project_to_psd(stats["kuf_kfu"])
            bound, direct, adjoints = self._objective(state, stats)
            if not (np.isfinite(bound) and all(np.all(np.isfinite(v)) for v in (*direct.values(), *adjoints.values()))):
                cause = (
                    "the differentially private noise made the summed statistics unusable (raise clip_norm, lower "
                    "noise_multiplier, or use mode='fedavg')"
                    if aggregate.noised
                    else "the summed statistics"
                )
                raise FloatingPointError(
                    f"FSGP exact mode, round {aggregate.round}: the global bound is not finite: {cause}"
                )
            # kept with the parameters they were computed at: a mid-training evaluation builds its model from them
            # (evaluation_phases), instead of asking the clients the same statistics again
            return replace(
                state,
                statistics=stats,
                statistics_params=dict(state.params),
                adjoints=adjoints,
                direct_gradient=direct,
                bound=bound,
            )
        if phase == GRADIENT_PHASE:
            assert self._server_model is not None and self._shared is not None and state.direct_gradient is not None
            assert self._server_adam is not None and state.server_adam is not None
            model = self._server_model
            self._shared.assign(model, state.params)  # the variables the server Adam steps
            grads = [tf.constant(state.direct_gradient[k] + aggregate[k]) for k in self._shared.keys]
            if not all(np.all(np.isfinite(g.numpy())) for g in grads):
                raise FloatingPointError("FSGP exact mode: the aggregated gradient is not finite")
            server_adam = self._server_adam.step(grads, state.server_adam)
            return replace(
                state,
                params=self._shared.read(model),
                adjoints=None,
                direct_gradient=None,
                steps=state.steps + 1,
                server_adam=server_adam,
            )
        raise ValueError(f"FSGP: unknown phase {phase!r}")

    def round_metrics(self, state: FSGPState, aggregates: Sequence[Aggregate]) -> Dict[str, float]:
        """The clients' averaged local bound (fedavg) or the global bound F before the step (exact)."""
        if self.mode == "exact":
            return {"bound": state.bound}
        return {"local_bound": float(aggregates[0].metrics.get("bound", float("nan")))}

    def stop_early(self, history: Sequence[Mapping[str, Any]]) -> bool:
        """Whether the round bounds of ``history`` reached ``stopping``'s plateau (never without one)."""
        if self.stopping is None:
            return False
        key = "bound" if self.mode == "exact" else "local_bound"
        return self.stopping.reached([entry[key] for entry in history])

    def copy_state(self, state: FSGPState) -> FSGPState:
        return replace(state)

    def result(self, state: FSGPState) -> AggregatedSGPR:
        """:class:`~gpflow_fed.models.AggregatedSGPR` with the summed statistics at the parameters they were computed
        at: the final w after the final ``"predict"`` phase; in exact mode before it (a mid-training evaluation,
        :meth:`evaluation_phases`), the last ``"statistics"`` phase's θ_r, one server step behind ``state.params``."""
        if state.statistics is None:
            raise ValueError("FSGP.result needs the statistics of the final 'predict' phase")
        assert self._shared is not None
        stats = dict(state.statistics)
        if state.statistics_params is not None:  # a training phase's sum: symmetric PSD as the final phase makes it
            stats["kuf_kfu"] = project_to_psd(stats["kuf_kfu"])
        model = AggregatedSGPR(
            gpflow.utilities.deepcopy(self.kernel),
            gpflow.utilities.deepcopy(self.inducing_variable),
            self.noise_variance,
            stats["kuf_kfu"],
            stats["kuf_y"],
            num_data=stats["num_data"],
            y_squared_sum=stats["y_squared_sum"],
            trace_kff=stats["trace_kff"],
            whitened=self.whiten,
        )
        self._shared.assign(model, state.params if state.statistics_params is None else state.statistics_params)
        return model
