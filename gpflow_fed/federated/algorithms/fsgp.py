"""FSGP: federated sparse GP regression (FedAvg over per-client Titsias bounds) and exact federated SGPR.

Paper: ``fsgp-federated-sparse-gp.txt`` (Guo et al.), Algorithm 1 and eqs. 9, 14–17.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import gpflow
import numpy as np
import tensorflow as tf
from gpflow.keras import tf_keras
from gpflow.models.util import inducingpoint_wrapper

from ...models.aggregated_sgpr import AggregatedSGPR, collapsed_sgpr_bound, project_to_psd
from ..algorithm import Aggregate, Algorithm, FederationInfo
from ..client import Client
from ..state import SharedState, resolve_path
from .fsgp_statistics import ADJOINT_NAMES, STATISTIC_NAMES, sgpr_statistics, statistics_vjp
from .fsgp_utils import compiled_adam_loop, initial_inducing_inputs

__all__ = ["FSGP", "FSGPState", "compiled_adam_loop", "initial_inducing_inputs"]

MODES = ("fedavg", "exact")


@dataclass(frozen=True)
class FSGPState:
    """The FSGP server state (only sums and averages; never a client's data).

    :param params: the shared parameters (θ, σ, Z) as unconstrained values under stable wire keys.
    :param statistics: the summed statistics of the final ``"predict"`` phase (``None`` before it).
    :param adjoints: exact mode, between the ``"statistics"`` and ``"gradient"`` phases: ``∂(−F)/∂S``.
    :param direct_gradient: exact mode: ``∂(−F)/∂params`` at fixed statistics S (through Kuu and σ).
    :param bound: the latest global bound ``F = ELBO/N`` known to the server (exact mode and after the
        final phase), NaN otherwise.
    """

    params: Mapping[str, np.ndarray]
    statistics: Optional[Mapping[str, np.ndarray]] = None
    adjoints: Optional[Mapping[str, np.ndarray]] = None
    direct_gradient: Optional[Mapping[str, np.ndarray]] = None
    bound: float = float("nan")
    steps: int = 0


@dataclass
class _ClientFunctions:
    """A client's compiled functions, traced once per client (not per round)."""

    variables: List[tf.Variable]
    functions: Dict[str, Any] = field(default_factory=dict)


class FSGP(Algorithm):
    r"""Federated sparse GP regression (Guo et al., Algorithm 1) and exact federated SGPR.

    Model: Titsias' collapsed SGPR with a shared kernel ``c(·,·; θ)``, Gaussian noise σ² and inducing
    inputs Z, ``w = (θ, σ, Z)``.

    ``mode="fedavg"`` (the paper). Each round, ``max(⌈Kρ⌉, 1)`` sampled clients receive ``w``, run
    ``local_steps`` (P) steps of their own ``tf_keras`` Adam (learning rate λ) on
    ``F_k(w) = ELBO_k(w) / N_k`` — Titsias' bound on their own data (eq. 9) — and send back ``w_k``; the
    server sets ``w ← Σ_k N_k w_k / Σ_k N_k`` over the round's clients. **Averaging is in the unconstrained
    space** (GPflow's ``Parameter.unconstrained_variable``, softplus for θ and σ²): the average of
    positive parameters stays positive and Adam steps live in that space too. Each client keeps its own
    Adam moments between rounds; its local loop is one ``tf.function`` compiled once per client.

    ``mode="exact"`` (beyond the paper). Each round is one Adam step on the *global* bound
    ``F(w) = ELBO(w; D) / N`` with every client: phase ``"statistics"`` sums the clients' statistics S
    (see :mod:`~gpflow_fed.federated.algorithms.fsgp_statistics`), from which the server computes ``F``,
    ``∂F/∂w`` at fixed S, and the adjoints ``∂F/∂S``; phase ``"gradient"`` broadcasts the adjoints and the
    clients return the vector-Jacobian products ``(∂S_k/∂w)ᵀ ∂F/∂S``, summed. The server's Adam then
    takes one step, so R rounds equal R Adam steps of ``gpflow.models.SGPR`` on the pooled data with
    ``training_loss() / N``. ``local_steps`` is not used; ``client_fraction`` must be 1. Exact mode sends
    the *whitened* statistics ``L⁻¹ C Cᵀ L⁻ᵀ`` and ``L⁻¹ C y`` (``L Lᵀ = Kuu``, computed by every client from
    the shared w; same sizes, same information), which is how SGPR itself computes: the unwhitened sums
    lose accuracy when Kuu is ill-conditioned and σ² small (e.g. CO₂ with a periodic kernel), and Adam then
    drifts away from pooled SGPR.

    Final phase ``"predict"`` (both modes, eqs. 14–15): every client sends its statistics at the final w;
    the sum builds :class:`gpflow_fed.models.AggregatedSGPR`, which predicts without data. The server first
    symmetrizes ``Σ C Cᵀ`` and projects it onto the PSD cone
    (:func:`~gpflow_fed.models.aggregated_sgpr.project_to_psd`): a no-op up to round-off for exact sums, and
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

    :param kernel: a ``gpflow.kernels.Kernel`` with the initial θ (copied, never modified).
    :param inducing_variable: initial Z, ``InducingPoints`` or an ``[M, D]`` array (copied).
    :param noise_variance: initial σ² > 0.
    :param rounds: communication rounds R ≥ 0 (T in the paper).
    :param local_steps: P ≥ 1, local Adam steps per round (fedavg).
    :param learning_rate: λ > 0 of every Adam optimizer.
    :param client_fraction: ρ ∈ (0, 1]; ``max(⌈Kρ⌉, 1)`` clients per round (fedavg).
    :param mode: ``"fedavg"`` or ``"exact"``.
    :raises TypeError: a kernel or inducing variable of the wrong type.
    :raises ValueError: a non-positive learning rate, noise variance or local steps, negative rounds, ρ
        outside (0, 1], an unknown mode, exact mode with ρ < 1; in :meth:`validate`: M larger than the data
        or an input dimension of Z (or of ARD lengthscales) different from the data's D.
    """

    name = "fsgp"

    def __init__(
        self,
        kernel: gpflow.kernels.Kernel,
        inducing_variable: Any,
        noise_variance: float,
        rounds: int,
        local_steps: int,
        learning_rate: float,
        client_fraction: float = 1.0,
        mode: str = "fedavg",
    ) -> None:
        super().__init__(rounds, client_fraction)
        if not isinstance(kernel, gpflow.kernels.Kernel):
            raise TypeError(f"FSGP: kernel must be a gpflow.kernels.Kernel, got {type(kernel).__name__}")
        if mode not in MODES:
            raise ValueError(f"FSGP: mode must be one of {MODES}, got {mode!r}")
        if isinstance(local_steps, bool) or not isinstance(local_steps, (int, np.integer)) or local_steps < 1:
            raise ValueError(f"FSGP: local_steps must be a positive integer, got {local_steps!r}")
        if isinstance(learning_rate, bool) or not isinstance(learning_rate, (int, float, np.floating)):
            raise TypeError(f"FSGP: learning_rate must be a number, got {type(learning_rate).__name__}")
        if not (np.isfinite(learning_rate) and learning_rate > 0):
            raise ValueError(f"FSGP: learning_rate must be positive and finite, got {learning_rate!r}")
        if isinstance(noise_variance, bool) or not isinstance(noise_variance, (int, float, np.floating)):
            raise TypeError(f"FSGP: noise_variance must be a number, got {type(noise_variance).__name__}")
        if not (np.isfinite(noise_variance) and noise_variance > 0):
            raise ValueError(f"FSGP: noise_variance must be positive and finite, got {noise_variance!r}")
        if mode == "exact" and self.client_fraction != 1.0:
            raise ValueError(
                "FSGP: mode='exact' sums statistics over every client each round; use client_fraction=1.0"
            )
        if isinstance(inducing_variable, gpflow.inducing_variables.InducingVariables):
            if not isinstance(inducing_variable, gpflow.inducing_variables.InducingPoints):
                raise TypeError(
                    f"FSGP: inducing_variable must be InducingPoints or an [M, D] array, got {type(inducing_variable).__name__}"
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
        #: exact mode sends whitened statistics (L⁻¹ C Cᵀ L⁻ᵀ, L⁻¹ C y): SGPR's own numerics, see sgpr_statistics
        self.whiten = mode == "exact"
        self._shared: Optional[SharedState] = None
        self._server_model: Optional[AggregatedSGPR] = None
        self._server_optimizer: Any = None
        self._client_functions: Dict[str, _ClientFunctions] = {}

    # --- configuration -------------------------------------------------------------------------------
    @property
    def num_inducing(self) -> int:
        """M."""
        return int(self.inducing_variable.num_inducing)

    def validate(self, dataset: Any) -> None:
        """M ≤ N, Z's input dimension (and ARD lengthscales') equal to the data's D."""
        D = int(dataset.input_dim)
        Z_dim = int(self.inducing_variable.Z.shape[1])
        if Z_dim != D:
            raise ValueError(f"FSGP: inducing inputs have dimension {Z_dim} but the data have D = {D}")
        lengthscales = getattr(self.kernel, "lengthscales", None)
        if lengthscales is not None and lengthscales.shape.ndims == 1 and int(lengthscales.shape[0]) not in (1, D):
            raise ValueError(f"FSGP: the kernel has {lengthscales.shape[0]} ARD lengthscales but the data have D = {D}")
        if self.num_inducing > dataset.num_data:
            raise ValueError(
                f"FSGP: M = {self.num_inducing} inducing points exceed the N = {dataset.num_data} data points; use M ≤ N"
            )

    def phases(self, round: int) -> Tuple[str, ...]:
        return ("train",) if self.mode == "fedavg" else ("statistics", "gradient")

    def final_phases(self) -> Tuple[str, ...]:
        return ("predict",)

    def aggregation(self, phase: str) -> str:
        return "mean" if phase == "train" else "sum"

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

    def initial_state(self, info: FederationInfo) -> FSGPState:
        self._server_model = self._empty_model(info.output_dim)
        self._shared = SharedState.from_module(self._server_model, space="unconstrained")
        self._client_functions = {}
        if self.mode == "exact":
            self._server_optimizer = tf_keras.optimizers.Adam(learning_rate=self.learning_rate)
            self._server_optimizer.build(self._unconstrained(self._server_model))
        return FSGPState(params=self._shared.read(self._server_model))

    def setup_client(self, client: Client, state: FSGPState) -> None:
        """The client's SGPR on its own data, its own Adam, and its compiled functions (traced once)."""
        X, Y = (tf.constant(a) for a in client.data)
        model = gpflow.models.SGPR(
            (X, Y),
            kernel=gpflow.utilities.deepcopy(self.kernel),
            inducing_variable=gpflow.utilities.deepcopy(self.inducing_variable),
            noise_variance=self.noise_variance,
        )
        client.model = model
        variables = self._unconstrained(model)
        fns = _ClientFunctions(variables=variables)
        num_data = tf.constant(float(client.num_data), gpflow.default_float())
        def statistics() -> Any:
            return sgpr_statistics(model.kernel, model.inducing_variable, X, Y, whiten=self.whiten)

        # fedavg computes statistics once (final phase): eager is cheaper than tracing
        fns.functions["statistics"] = tf.function(statistics, autograph=False) if self.mode == "exact" else statistics
        if self.mode == "fedavg":
            optimizer = tf_keras.optimizers.Adam(learning_rate=self.learning_rate)
            trainable = model.trainable_variables
            optimizer.build(trainable)
            client.optimizer = optimizer

            def local_loss() -> tf.Tensor:
                return model.training_loss() / num_data

            loop = compiled_adam_loop(local_loss, trainable, optimizer, self.local_steps)

            @tf.function(autograph=False)
            def train() -> tf.Tensor:
                loop()  # automatic control dependencies order the bound after the steps
                return model.elbo() / num_data

            fns.functions["train"] = train
        else:

            @tf.function(autograph=False)
            def vjp(adjoints: Dict[str, tf.Tensor]) -> List[tf.Tensor]:
                return statistics_vjp(
                    model.kernel, model.inducing_variable, X, Y, adjoints, variables, whiten=self.whiten
                )

            fns.functions["gradient"] = vjp
        client.state["fsgp"] = fns
        self._client_functions[client.id] = fns

    def tracing_counts(self) -> Dict[str, Dict[str, int]]:
        """How many times each client's compiled functions were traced (1 each: no retracing per round)."""
        return {
            cid: {
                name: int(fn.experimental_get_tracing_count())
                for name, fn in fns.functions.items()
                if hasattr(fn, "experimental_get_tracing_count")
            }
            for cid, fns in self._client_functions.items()
        }

    # --- the round -----------------------------------------------------------------------------------
    def broadcast(self, state: FSGPState, round: int, phase: str) -> Mapping[str, np.ndarray]:
        arrays = dict(state.params)
        if phase == "gradient":
            if state.adjoints is None:
                raise RuntimeError("FSGP: the 'gradient' phase needs the adjoints of a 'statistics' phase")
            arrays.update({f"adjoint/{k}": v for k, v in state.adjoints.items()})
        return arrays

    def client_update(self, client: Client, broadcast: Any) -> Any:
        assert self._shared is not None
        fns: _ClientFunctions = client.state["fsgp"]
        params = {k: broadcast[k] for k in self._shared.keys}
        self._shared.assign(client.model, params)
        weight = float(client.num_data)
        if broadcast.phase == "train":
            bound = float(fns.functions["train"]().numpy())
            if not np.isfinite(bound):
                raise FloatingPointError(f"the local bound became {bound} after {self.local_steps} steps")
            return self.reply(client, broadcast, self._shared.read(client.model), weight, {"bound": bound})
        if broadcast.phase in ("statistics", "predict"):
            stats = fns.functions["statistics"]()
            return self.reply(client, broadcast, {k: v.numpy() for k, v in stats._asdict().items()}, weight)
        if broadcast.phase == "gradient":
            adjoints = {k: tf.constant(broadcast[f"adjoint/{k}"]) for k in ADJOINT_NAMES}
            grads = fns.functions["gradient"](adjoints)
            return self.reply(client, broadcast, {k: g.numpy() for k, g in zip(self._shared.keys, grads)}, weight)
        raise ValueError(f"FSGP: unknown phase {broadcast.phase!r}")

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
                else gpflow.covariances.Kuu(model.inducing_variable, model.kernel, jitter=gpflow.config.default_jitter())
            )
            bound = collapsed_sgpr_bound(
                kuu,
                tensors["kuf_kfu"],
                tensors["kuf_y"],
                tensors["y_squared_sum"],
                tensors["trace_kff"],
                tensors["num_data"],
                model.likelihood.variance,
            ) / tensors["num_data"]
            loss = -bound
        grads = tape.gradient(
            loss, variables + [tensors[k] for k in ADJOINT_NAMES], unconnected_gradients=tf.UnconnectedGradients.ZERO
        )
        direct = {k: g.numpy() for k, g in zip(self._shared.keys, grads[: len(variables)])}
        adjoints = {k: g.numpy() for k, g in zip(ADJOINT_NAMES, grads[len(variables) :])}
        return float(bound.numpy()), direct, adjoints

    def server_update(self, state: FSGPState, aggregate: Aggregate) -> FSGPState:
        phase = aggregate.phase
        if phase == "train":
            return replace(state, params={k: np.array(aggregate[k]) for k in state.params}, steps=state.steps + 1)
        if phase == "predict":
            stats = {k: np.array(aggregate[k]) for k in STATISTIC_NAMES}
            # post-processing (free under DP): a noised Σ C Cᵀ is made symmetric PSD again
            stats["kuf_kfu"] = project_to_psd(stats["kuf_kfu"])
            bound, _, _ = self._objective(state, stats)
            return replace(state, statistics=stats, bound=bound)
        if phase == "statistics":
            stats = {k: np.array(aggregate[k]) for k in STATISTIC_NAMES}
            bound, direct, adjoints = self._objective(state, stats)
            return replace(state, adjoints=adjoints, direct_gradient=direct, bound=bound)
        if phase == "gradient":
            assert self._server_model is not None and self._shared is not None and state.direct_gradient is not None
            model = self._server_model
            self._shared.assign(model, state.params)
            variables = self._unconstrained(model)
            grads = [tf.constant(state.direct_gradient[k] + aggregate[k]) for k in self._shared.keys]
            if not all(np.all(np.isfinite(g.numpy())) for g in grads):
                raise FloatingPointError("FSGP exact mode: the aggregated gradient is not finite")
            self._server_optimizer.apply_gradients(zip(grads, variables))
            return replace(
                state, params=self._shared.read(model), adjoints=None, direct_gradient=None, steps=state.steps + 1
            )
        raise ValueError(f"FSGP: unknown phase {phase!r}")

    def round_metrics(self, state: FSGPState, aggregates: Sequence[Aggregate]) -> Dict[str, float]:
        """The clients' averaged local bound (fedavg) or the global bound F before the step (exact)."""
        if self.mode == "exact":
            return {"bound": state.bound}
        return {"local_bound": float(aggregates[0].metrics.get("bound", float("nan")))}

    def copy_state(self, state: FSGPState) -> FSGPState:
        return replace(state)

    def result(self, state: FSGPState) -> AggregatedSGPR:
        """:class:`~gpflow_fed.models.AggregatedSGPR` at the final w with the summed statistics."""
        if state.statistics is None:
            raise ValueError("FSGP.result needs the statistics of the final 'predict' phase")
        assert self._shared is not None
        stats = state.statistics
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
        self._shared.assign(model, state.params)
        return model
