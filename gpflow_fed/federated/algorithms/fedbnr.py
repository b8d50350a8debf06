"""FedBNR: Federated Bayesian Neural Regression (thesis §3.1.3, Algorithm 1).

Phase 1, kernel learning (``rounds`` rounds, phase ``"kernel"``): every asked client copies the global
(θ, σ², λ²), takes ``local_steps`` Adam steps on its own negative BLR log marginal likelihood per point
(eq. 3.3), and sends back its parameters. The server aggregates them

* ``aggregation="fedavg"``: the N_c-weighted mean, in the unconstrained space (so σ², λ², ℓ stay positive);
* ``aggregation="kd"``: knowledge distillation (eq. 3.4): starting from the FedAvg mean, ``kd_steps`` Adam
  steps on ``−log p(y_kd)/N_kd + α·MSE(θ(X_kd)ᵀθ(X_kd), mean_c θ_c(X_kd)ᵀθ_c(X_kd))`` over the server-held
  ``distillation_data``.

Phase 2, exact global last layer (final phases, every client): with the global kernel fixed, each client
sends its statistics; the server sums them (eqs. 3.5–3.6), so the returned
:class:`~gpflow_fed.models.BayesianLinearRegression` equals the BLR on the pooled data:

* ``protocol="statistics"`` (one exchange, phase ``"scatter"``): ``phi_t_phi = Φ_cᵀΦ_c [L, L]``,
  ``phi_t_y = Φ_cᵀy_c [L, P]``, ``y_t_y [P]``, ``num_data []``;
* ``protocol="two_step"`` (the thesis' Algorithm 1): ``"scatter"`` sends ``phi_t_phi``, ``y_t_y``,
  ``num_data``; the server broadcasts ``A⁻¹``; ``"weights"`` sends ``w_c = A⁻¹Φ_cᵀy_c [L, P]`` and the
  server sums ``w̄ = Σ_c w_c``, whose ``σ⁻²w̄`` is the thesis' mean weights: σ² is the server's, applied by the server
  (the clients' own copies of σ² differ after phase 1's local training; dividing by them gave another model than the
  one-step protocol's). ``w_c`` is linear in the server's ``A⁻¹``, so a client answers ``"weights"`` once per state of
  its features (the kernel values of its last ``"scatter"`` answer): a second ``A⁻¹`` for the same
  features is refused, the same one again is a retry. Otherwise a server that asked ``I`` over a cohort and ``2I``
  over the cohort without one client had that client's ``Φ_cᵀy_c`` from the difference of the two sums (issue 43,
  eleventh round).

What leaves a client: its kernel/hyperparameter values (phase 1, the same sizes as the model), then arrays of
sizes L×L, L×P, P and 1 — none depends on N_c, and no row of Φ_c, X_c or y_c is sent.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, Final, List, Mapping, Optional, Sequence, Tuple, Union, cast

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import check_shapes
from gpflow.keras import tf_keras

from ...data.dataset import FederatedDataset, validate_regression_data
from ...kernels.urk import URK
from .postprocess import denoised_gram
from ...models.bayesian_linear_regression import (
    BayesianLinearRegression,
    blr_log_marginal_likelihood,
    blr_statistics,
)
from ...validation import integer, non_negative_float, positive_float
from ..protocol.algorithm import Aggregate, Algorithm, BroadcastRefused, FederationInfo, answer_once_per
from ..protocol.client import Client
from ...training.adam import AdamState, CompiledAdam, SharedWorker
from ..protocol.messages import Message
from ...training.state import SharedState
from .distillation import distillation_loss
from .fedbnr_batched import BatchedBLRWorker

__all__ = ["FedBNR", "FedBNRState", "fedbnr_shared_state", "negative_log_marginal_likelihood_per_point"]

AGGREGATIONS = ("fedavg", "kd")
PROTOCOLS = ("statistics", "two_step")

#: Phase 1's exchange (each round): the clients' kernel, σ² and λ² after local training.
KERNEL_PHASE: Final[str] = "kernel"
#: Phase 2's exchanges (final): the summed statistics, then (two-step protocol) the summed weights.
SCATTER_PHASE: Final[str] = "scatter"
WEIGHTS_PHASE: Final[str] = "weights"
#: ``client.state`` key (two-step protocol): the shared values (wire key → array) of the client's last ``"scatter"``
#: answer, which its ``"weights"`` answer computes with (plain arrays: saved by checkpoints and a Flower party's state)
SCATTER_VALUES: Final[str] = "fedbnr_scatter_values"
#: ``client.state`` key (two-step protocol): per kernel state (hex digest of its kernel values), the hex digest of the
#: ``A⁻¹`` its ``"weights"`` answer was computed with
WEIGHTS_ANSWERED: Final[str] = "fedbnr_weights_answered"


def _keras_paths(kernel: gpflow.kernels.Kernel) -> Dict[str, str]:
    paths = {}
    for name in ("feature_extractor", "distribution_shifter"):
        if isinstance(getattr(kernel, name, None), tf_keras.layers.Layer):
            paths[f"kernel.{name}"] = f"kernel.{name}"
    feature_map = getattr(kernel, "feature_map", None)
    if isinstance(getattr(feature_map, "function", None), tf_keras.layers.Layer):
        paths["kernel.feature_map.function"] = "kernel.feature_map.function"
    return paths


def fedbnr_shared_state(model: BayesianLinearRegression) -> SharedState:
    """The wire map of FedBNR's phase 1: every public trainable GPflow parameter of ``model`` (kernel
    hyperparameters, σ², λ²) plus each ``tf_keras`` network of the kernel under one stable key
    (``"kernel.feature_extractor"``, ``"kernel.distribution_shifter"``, ``"kernel.feature_map.function"``)."""
    keras = _keras_paths(model.kernel)
    try:
        params = SharedState.from_module(model, exclude=tuple(keras)).paths
    except ValueError:  # every GPflow parameter frozen: only the networks are shared
        params = {}
    return SharedState({**params, **keras}, space="unconstrained")


def _every_parameter(model: BayesianLinearRegression) -> SharedState:
    """Every public parameter of ``model`` and its kernel's networks, trainable or not (a result model's kernel
    is frozen, so :func:`fedbnr_shared_state` of it, or of an algorithm built on it, leaves the kernel out)."""
    keras = _keras_paths(model.kernel)
    params = SharedState.from_module(model, trainable_only=False, exclude=tuple(keras)).paths
    return SharedState({**params, **keras}, space="unconstrained")


@dataclass(frozen=True)
class FedBNRState:
    """The server's state: the global shared values and, after phase 2, the summed statistics.

    :param values: wire key → unconstrained value of the global kernel, σ² and λ².
    :param statistics: ``{phi_t_phi, phi_t_y, y_t_y, num_data}`` summed over clients (after ``"scatter"``).
    :param a_inverse: ``A⁻¹`` (two-step protocol, broadcast in ``"weights"``).
    :param kd_adam: ``aggregation="kd"``: the server's Adam state for distillation, kept across rounds;
        ``None`` with FedAvg.
    """

    values: Mapping[str, np.ndarray]
    statistics: Optional[Mapping[str, np.ndarray]] = None
    a_inverse: Optional[np.ndarray] = None
    kd_adam: Optional[AdamState] = None


@check_shapes("X: [N, D]", "Y: [N, P]", "return: []")
def negative_log_marginal_likelihood_per_point(
    model: BayesianLinearRegression, X: tf.Tensor, Y: tf.Tensor
) -> tf.Tensor:
    """A client's phase-1 objective ``−log p(y_c | X_c) / N_c`` (eq. 3.3) for ``model``'s kernel, σ² and λ², on
    the data given as arguments (so one compiled step serves every client).

    The evidence is ``Σ_p log N(y_p | 0, λ²ΦΦᵀ + σ²I)`` (eqs. 2.8–2.18). With ``N_c ≥ L`` it is computed in the
    primal from the statistics of ``φ(X_c)`` (eq. 2.8, an L×L Cholesky factor); with ``N_c < L`` (many small
    clients) in the dual, from the N_c×N_c Cholesky factor of ``λ²ΦΦᵀ + σ²I`` as in ``gpflow.models.GPR``. The
    two are equal by the matrix determinant lemma and Woodbury; the dual costs O(N_c²L + N_c³) instead of
    O(N_c L² + L³).
    """
    Phi = model.kernel.features(X)
    Y = tf.cast(Y, Phi.dtype)
    noise, prior = model.likelihood.variance, model.prior_variance
    num_data = tf.shape(Phi)[0]

    def primal() -> tf.Tensor:
        s = blr_statistics(Phi, Y)
        return blr_log_marginal_likelihood(s["phi_t_phi"], s["phi_t_y"], s["y_t_y"], s["num_data"], noise, prior)

    def dual() -> tf.Tensor:
        cov = prior * tf.linalg.matmul(Phi, Phi, transpose_b=True) + noise * tf.eye(num_data, dtype=Phi.dtype)
        return tf.reduce_sum(gpflow.logdensities.multivariate_normal(Y, tf.zeros_like(Y), tf.linalg.cholesky(cov)))

    lml = tf.cond(num_data < tf.shape(Phi)[1], dual, primal)
    return -lml / tf.cast(num_data, Phi.dtype)


@dataclass
class _Worker:
    """A BLR shared by every client (or the server's distillation model) and its compiled Adam loop; for the
    clients' worker also phase 2's statistics and the distillation target's Gram on its kernel, compiled on first
    use, and phase 1's training of a whole cohort (None where it cannot be batched, e.g. a kernel with a network)."""

    model: BayesianLinearRegression
    trainer: CompiledAdam
    statistics: Optional[Callable[..., Dict[str, tf.Tensor]]] = None
    gram: Optional[Callable[[tf.Tensor], tf.Tensor]] = None
    batched: Optional[BatchedBLRWorker] = None


class FedBNR(Algorithm[FedBNRState]):
    """Federated Bayesian Neural Regression: a global GP with a URK kernel, in two phases.

    :param kernel: the template :class:`~gpflow_fed.kernels.URK` (copied for the server and every client; its
        seed makes every party's random features identical).
    :param noise_variance: initial σ² > 0.
    :param prior_variance: initial λ² > 0.
    :param rounds: phase-1 rounds R (0: no kernel learning; phase 2 alone equals the pooled BLR).
    :param local_steps: Adam steps per client per round (≥ 1).
    :param aggregation: ``"fedavg"`` or ``"kd"`` (then ``distillation_data`` is required).
    :param distillation_data: the server's ``(X_kd, y_kd)`` for ``"kd"``.
    :param alpha: α ≥ 0 of eq. 3.4.
    :param kd_steps: server Adam steps per round for ``"kd"``.
    :param learning_rate: Adam step size of clients and server.
    :param protocol: ``"statistics"`` or ``"two_step"`` (see the module docstring).
    :param client_fraction: ρ of the phase-1 rounds (phase 2 always asks every client).
    :param compile: compile the local and distillation loops with ``tf.function`` (``False``: the same loops,
        eagerly).

    Simulation: the clients' steps run on one shared worker model whose compiled Adam loop takes the client's
    data as arguments (traced once, not per client or round); each client keeps its own Adam state in
    ``client.state["adam"]`` (see :mod:`~gpflow_fed.training.adam`). Client updates therefore run one
    at a time, serialised by the worker's lock (threaded runtimes stay correct). Phase 1 also has a batched form
    (:meth:`batched`, :meth:`client_updates`): ``LocalRuntime`` (``batched=True``, its default) trains a ``"kernel"``
    cohort of at least ``min_batch`` clients in one compiled call per form (primal or dual), size bucket and memory
    chunk (:class:`~gpflow_fed.federated.algorithms.fedbnr_batched.BatchedBLRWorker`: padded rows masked out of the
    evidence exactly, each client's Adam state stacked), with the same replies to round-off and every per-client
    protection applied to each client's reply by the runtime; ``LocalRuntime(batched=False)`` keeps one call a client,
    and so do a kernel with a ``tf_keras`` network and ``compile=False``.
    """

    name = "fedbnr"

    def __init__(
        self,
        kernel: URK,
        noise_variance: float = 1.0,
        prior_variance: float = 1.0,
        rounds: int = 10,
        local_steps: int = 10,
        aggregation: str = "fedavg",
        distillation_data: Optional[Tuple[Any, Any]] = None,
        alpha: float = 1.0,
        kd_steps: int = 10,
        learning_rate: float = 0.01,
        protocol: str = "statistics",
        client_fraction: float = 1.0,
        compile: bool = True,
    ) -> None:
        super().__init__(rounds, client_fraction)
        if not isinstance(kernel, URK):
            raise TypeError(f"kernel must be a gpflow_fed.kernels.URK, got {type(kernel).__name__}")
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
        self.noise_variance = positive_float(noise_variance, "noise_variance")
        self.prior_variance = positive_float(prior_variance, "prior_variance")
        self.learning_rate = positive_float(learning_rate, "learning_rate")
        self.alpha = non_negative_float(alpha, "alpha (the weight of the distillation MSE)")
        self.local_steps = integer(local_steps, "local_steps", minimum=1)
        self.kd_steps = integer(kd_steps, "kd_steps", minimum=1)
        if aggregation == "kd" and distillation_data is None:
            raise ValueError('aggregation="kd" needs distillation_data=(X_kd, y_kd) held by the server')
        if distillation_data is not None:
            distillation_data = validate_regression_data(
                distillation_data[0], distillation_data[1], "distillation_data"
            )
            if distillation_data[0].shape[1] != kernel.input_dim:
                raise ValueError(
                    f"distillation_data has {distillation_data[0].shape[1]} input columns, the kernel expects "
                    f"{kernel.input_dim}"
                )
        self.kernel = kernel
        self.aggregation_method = aggregation
        self.distillation_data = distillation_data
        self.protocol = protocol
        self.compile = bool(compile)
        # the template holds the kernel runs start from (the constructor's, or start_from's): every model copies it
        self._template = BayesianLinearRegression(
            (np.zeros((1, kernel.input_dim)), np.zeros((1, 1))),
            gpflow.utilities.deepcopy(kernel),
            self.noise_variance,
            self.prior_variance,
        )
        self.shared = fedbnr_shared_state(self._template)
        self._server = gpflow.utilities.deepcopy(self._template)  # the server's scratch model (the template stays put)
        self._worker = SharedWorker(self._client_worker)
        self._kd = SharedWorker(self._distillation_worker)  # built once, so one trace serves every run

    # --- configuration -------------------------------------------------------------------------------
    def validate(self, dataset: FederatedDataset) -> None:
        if dataset.input_dim != self.kernel.input_dim:
            raise ValueError(
                f"the dataset has D={dataset.input_dim} inputs, the kernel expects input_dim={self.kernel.input_dim}"
            )
        if self.distillation_data is not None and self.distillation_data[1].shape[1] != dataset.output_dim:
            raise ValueError(
                f"distillation_data has P={self.distillation_data[1].shape[1]} outputs, the clients have "
                f"{dataset.output_dim}"
            )

    def phases(self, round: int) -> Tuple[str, ...]:
        return (KERNEL_PHASE,)

    def final_phases(self) -> Tuple[str, ...]:
        return (SCATTER_PHASE,) if self.protocol == "statistics" else (SCATTER_PHASE, WEIGHTS_PHASE)

    def ignores(self, phase: str) -> Tuple[str, ...]:
        """``"scatter"``'s statistics ``ΦᵀΦ, Φᵀy, yᵀy, N`` read the kernel's features only, not σ² or λ²: a broadcast
        moved in those alone is the same question (a fresh attacker moved σ² by 1e-9, asked again without one client
        and had its statistics to 1e-10 from the difference; issue 43). The other phases read what they receive."""
        return tuple(k for k in self.shared.keys if not k.startswith("kernel.")) if phase == SCATTER_PHASE else ()

    def aggregation(self, phase: str) -> str:
        if phase == KERNEL_PHASE:
            return "collect" if self.aggregation_method == "kd" else "mean"
        return "sum"

    def initial_state(self, info: FederationInfo) -> FedBNRState:
        # the server's own Adam, kept across rounds (in the state, so checkpoints save it)
        kd_adam = self._kd.get().trainer.initial_state() if self.aggregation_method == "kd" else None
        return FedBNRState(values=self.shared.read(self._template), kd_adam=kd_adam)

    def _model(self, data: Tuple[Any, Any]) -> BayesianLinearRegression:
        return BayesianLinearRegression(
            data, gpflow.utilities.deepcopy(self._template.kernel), self.noise_variance, self.prior_variance
        )

    def _client_worker(self) -> _Worker:
        model = self._model((np.zeros((1, self.kernel.input_dim)), np.zeros((1, 1))))  # its data are the clients'
        loss = lambda X, Y: negative_log_marginal_likelihood_per_point(model, X, Y)  # noqa: E731
        trainer = CompiledAdam(model.trainable_variables, loss, self.learning_rate, compile=self.compile)
        batched: Optional[BatchedBLRWorker]
        try:
            batched = BatchedBLRWorker(model, trainer, self.local_steps, self.shared)
        except ValueError:  # e.g. a kernel with a tf_keras network: the per-client path only
            batched = None
        return _Worker(model, trainer, batched=batched)

    def _distillation_worker(self) -> _Worker:
        model = self._model(self.distillation_data)  # type: ignore[arg-type]  # given for aggregation="kd"
        loss = lambda X, Y, target: distillation_loss(model, target, self.alpha, data=(X, Y))  # noqa: E731
        return _Worker(model, CompiledAdam(model.trainable_variables, loss, self.learning_rate, compile=self.compile))

    def _statistics(self, X: tf.Tensor, Y: tf.Tensor) -> Dict[str, tf.Tensor]:
        """Phase 2's client statistics on the worker kernel, compiled once (rows left free)."""
        worker = self._worker.get()
        if worker.statistics is None:
            kernel = worker.model.kernel
            statistics = lambda X, Y: blr_statistics(kernel.features(X), Y)  # noqa: E731
            # Phase 2 must equal the pooled BLR to rounding: compile it only when the whole kernel computes in
            # default_float (graph and eager float32 networks differ by ~1e-7 relative).
            exact = all(v.dtype == gpflow.default_float() for v in kernel.variables)
            signature = [tf.TensorSpec([None, X.shape[1]], X.dtype), tf.TensorSpec([None, Y.shape[1]], Y.dtype)]
            worker.statistics = (
                tf.function(statistics, input_signature=signature, autograph=False)
                if self.compile and exact
                else statistics
            )
        return worker.statistics(X, Y)

    def setup_client(self, client: Client, info: FederationInfo) -> None:
        """The client's own Adam state (its steps run on the shared compiled worker, see
        :mod:`~gpflow_fed.training.adam`) and its data as tensors."""
        client.state["adam"] = self._worker.get().trainer.initial_state()
        client.state["tensors"] = tuple(tf.constant(a, dtype=gpflow.default_float()) for a in client.data)

    # --- the round -----------------------------------------------------------------------------------
    def broadcast(self, state: FedBNRState, round: int, phase: str) -> Mapping[str, np.ndarray]:
        if phase == WEIGHTS_PHASE:
            return {"a_inverse": state.a_inverse}  # type: ignore[dict-item]  # set in the two-step scatter phase
        return dict(state.values)

    def client_update(self, client: Client, broadcast: Message) -> Message:
        with self._worker.use() as worker:  # one shared worker: client updates run one at a time
            model = worker.model
            X, Y = client.state["tensors"]
            if broadcast.phase == KERNEL_PHASE:
                self.shared.assign(model, dict(broadcast.arrays))
                losses, client.state["adam"] = worker.trainer.fit(self.local_steps, client.state["adam"], X, Y)
                return self.reply(
                    client,
                    broadcast,
                    self.shared.read(model),
                    weight=client.num_data,
                    metrics={"neg_log_marginal_likelihood_per_point": float(losses[-1])},
                )
            if broadcast.phase == SCATTER_PHASE:
                own = self.shared.read(model)  # wire keys (a network's weights one array each)
                if set(broadcast.arrays) != set(own) - set(self.ignores(SCATTER_PHASE)):  # else a "new" broadcast
                    raise BroadcastRefused("FedBNR: the 'scatter' broadcast carries arrays other than the kernel's")
                # σ² and λ² are the party's own copy's (the statistics never touch them)
                self.shared.assign(model, {**own, **broadcast.arrays})
                stats = {k: v.numpy() for k, v in self._statistics(X, Y).items()}
                if self.protocol == "two_step":
                    del stats["phi_t_y"]
                    # the values its "weights" answer computes with (a Flower party rebuilds its worker per message)
                    client.state[SCATTER_VALUES] = {k: np.array(v) for k, v in self.shared.read(model).items()}
                return self.reply(client, broadcast, stats)
            if broadcast.phase == WEIGHTS_PHASE:
                if set(broadcast.arrays) != {"a_inverse"}:  # an ignored array would make a "new" broadcast for free
                    raise BroadcastRefused("FedBNR: the 'weights' broadcast carries arrays other than 'a_inverse'")
                values = self._weights_values(client, model)
                self._check_weights_once(client, broadcast, values)
                self.shared.assign(model, values)
                phi_t_y = tf.linalg.matmul(model.kernel.features(X), Y, transpose_a=True)
                w_c = tf.linalg.matmul(tf.constant(broadcast["a_inverse"]), phi_t_y)  # σ⁻² is the server's
                return self.reply(client, broadcast, {"w_mean": w_c.numpy()})
            raise ValueError(f"unknown FedBNR phase {broadcast.phase!r}")

    def _weights_values(self, client: Client, model: BayesianLinearRegression) -> Dict[str, np.ndarray]:
        """The shared values a ``"weights"`` answer computes with: those of the client's last ``"scatter"`` answer (its
        record, which a Flower party that rebuilt its worker still holds), else its worker's own."""
        kept = client.state.get(SCATTER_VALUES)
        return dict(kept) if kept is not None else self.shared.read(model)

    def _check_weights_once(self, client: Client, broadcast: Message, values: Mapping[str, np.ndarray]) -> None:
        """One ``"weights"`` answer per kernel state (:func:`~gpflow_fed.federated.protocol.algorithm.answer_once_per`):
        ``w_c = A⁻¹Φ_cᵀy_c`` is exactly linear in the ``A⁻¹`` it is asked with, and its features are those of the kernel
        values it computes with (``values``, :meth:`_weights_values`) on the client's own data."""
        kernel = {k: v for k, v in values.items() if k.startswith("kernel.")}
        answer_once_per(client, WEIGHTS_ANSWERED, kernel, {"a_inverse": broadcast["a_inverse"]}, "'weights' here")

    def batched(self, phase: str) -> bool:
        """``"kernel"`` has a batched form (:class:`~.fedbnr_batched.BatchedBLRWorker`: every client's local steps in
        one compiled call per form, size bucket and memory chunk) where the trained variables are GPflow Parameters only
        (a kernel without a ``tf_keras`` network) and the loops are compiled; phase 2's exchanges (one statistic a
        client) do not, nor does a subclass that replaces :meth:`client_update` (its own update is asked per client).
        The clients' worker is built here if needed (a runtime asks before the clients' first update sets them up)."""
        if phase != KERNEL_PHASE or not self.compile or type(self).client_update is not FedBNR.client_update:
            return False
        return self._worker.get().batched is not None

    def client_updates(
        self, clients: Sequence[Client], broadcast: Message, memory_budget: int
    ) -> List[Union[Message, Exception]]:
        """:meth:`client_update` of every client of a ``"kernel"`` cohort at once
        (:class:`~.fedbnr_batched.BatchedBLRWorker`), each with its own data and Adam state: per client, the reply (or
        the error) :meth:`client_update` gives, to round-off. The broadcast is checked as the per-client path checks it
        (by assigning it to the worker: keys, shapes, finite values), each client's Adam state as ``CompiledAdam.fit``
        does.

        A client whose batched result is not finite is recomputed on its own (:meth:`client_update`), so it gets the
        per-client answer: ``tf.vectorized_map`` drops TensorFlow Probability's custom softplus gradient, so an
        unconstrained value above log(float64 max) ≈ 709.8 gets a NaN gradient in the batch where the per-client step is
        finite (as for :meth:`FGP.client_updates <gpflow_fed.federated.algorithms.FGP.client_updates>`). Another phase:
        client by client."""
        if broadcast.phase != KERNEL_PHASE or not self.batched(KERNEL_PHASE):
            return super().client_updates(clients, broadcast, memory_budget)
        out: List[Any] = [None] * len(clients)
        with self._worker.use() as worker:  # the per-client path's lock: tracing reads the worker's parameters
            assert worker.batched is not None
            try:
                self.shared.assign(worker.model, dict(broadcast.arrays))  # what the per-client update refuses
            except Exception as exc:  # noqa: BLE001 - every client's update fails with it, as client_update's would
                return [exc] * len(clients)
            values = np.concatenate([np.ravel(v.numpy()) for v in worker.trainer.variables])
            good: List[int] = []
            data: List[Tuple[np.ndarray, np.ndarray]] = []
            for k, client in enumerate(clients):
                try:
                    X, Y = client.state["tensors"]
                    worker.trainer.check(client.state["adam"])  # as CompiledAdam.fit checks it
                    data.append((X.numpy(), Y.numpy()))
                    good.append(k)
                except Exception as exc:  # noqa: BLE001 - this client's update fails, as client_update's would
                    out[k] = exc
            trained = worker.batched.train(data, values, [clients[k].state["adam"] for k in good], memory_budget)
        for k, (new_values, adam, loss) in zip(good, trained):
            client = clients[k]
            try:
                if all(np.all(np.isfinite(v)) for v in new_values.values()) and np.isfinite(loss):
                    client.state["adam"] = adam
                    metrics = {"neg_log_marginal_likelihood_per_point": loss}
                    out[k] = self.reply(client, broadcast, new_values, weight=client.num_data, metrics=metrics)
                else:  # recomputed on its own: the per-client path's answer (see above)
                    out[k] = self.client_update(client, broadcast)
            except Exception as exc:  # noqa: BLE001 - this client's update fails, as client_update's would
                out[k] = exc
        return out

    def tracing_counts(self) -> Dict[str, int]:
        """How many times phase 1's local training was traced, per client (``"kernel"``) and batched (``"batched"``,
        at most one trace per form, primal and dual): 0 before the run's first update on that path."""
        worker = self._worker.built
        if worker is None:
            return {"kernel": 0, "batched": 0}
        return {
            "kernel": worker.trainer.tracing_count(),
            "batched": 0 if worker.batched is None else worker.batched.tracing_count(),
        }

    def server_update(self, state: FedBNRState, aggregate: Aggregate) -> FedBNRState:
        if aggregate.phase == KERNEL_PHASE:
            if self.aggregation_method == "fedavg":
                return replace(state, values={k: np.array(v) for k, v in aggregate.arrays.items()})
            values, kd_adam = self._distil(aggregate, state.kd_adam)
            return replace(state, values=values, kd_adam=kd_adam)
        if aggregate.phase == SCATTER_PHASE:
            stats = {k: np.array(v) for k, v in aggregate.arrays.items()}
            if aggregate.noised:
                stats["phi_t_phi"] = denoised_gram(stats["phi_t_phi"], aggregate.noise_std)
            a_inverse = None
            if self.protocol == "two_step":
                model = self._server_model(state.values, None)
                noise = model.likelihood.variance
                prior = model.prior_variance
                eye = tf.eye(stats["phi_t_phi"].shape[0], dtype=gpflow.default_float())
                chol_A = tf.linalg.cholesky(tf.constant(stats["phi_t_phi"]) / noise + eye / prior)
                a_inverse = tf.linalg.cholesky_solve(chol_A, eye).numpy()
            return replace(state, statistics=stats, a_inverse=a_inverse)
        if aggregate.phase == WEIGHTS_PHASE:
            # Φᵀy = A w̄ (the thesis' weights σ⁻²w̄, eq. 3.6), so the model is the same BLR as the one-step protocol's
            A = np.linalg.inv(cast(np.ndarray, state.a_inverse))  # set in the two-step scatter phase
            stats = dict(state.statistics or {})
            stats["phi_t_y"] = A @ np.asarray(aggregate["w_mean"])
            return replace(state, statistics=stats)
        raise ValueError(f"unknown FedBNR phase {aggregate.phase!r}")

    def _distil(self, aggregate: Aggregate, kd_adam: Optional[AdamState]) -> Tuple[Dict[str, np.ndarray], AdamState]:
        """Eq. 3.4: start from the FedAvg mean of the collected client values, then distil on (X_kd, y_kd) with
        the server's Adam from state ``kd_adam``; returns the distilled values and the new Adam state."""
        messages = aggregate.messages or ()
        weights = np.array([m.weight for m in messages], dtype=float)
        mean = {
            k: sum(w * np.asarray(m[k]) for w, m in zip(weights, messages)) / weights.sum() for k in messages[0].arrays
        }
        X_kd, Y_kd = (tf.constant(a) for a in self.distillation_data)  # type: ignore[union-attr]  # given for "kd"
        with self._worker.use() as worker:
            if worker.gram is None:
                worker.gram = (
                    tf.function(worker.model.kernel.K, autograph=False) if self.compile else worker.model.kernel.K
                )
            grams = []
            for message in messages:  # θ_c(X_kd)ᵀθ_c(X_kd) of every client kernel, on the worker (eq. 3.4's target)
                self.shared.assign(worker.model, dict(message.arrays))
                grams.append(worker.gram(X_kd))
        target = tf.add_n(grams) / float(len(grams))
        kd = self._kd.get()
        self.shared.assign(kd.model, mean)
        _, new_adam = kd.trainer.fit(self.kd_steps, kd_adam, X_kd, Y_kd, target)  # type: ignore[arg-type]  # "kd" state has one
        return self.shared.read(kd.model), new_adam

    def _server_model(
        self, values: Mapping[str, np.ndarray], statistics: Optional[Mapping[str, Any]]
    ) -> BayesianLinearRegression:
        self.shared.assign(self._server, dict(values))
        if statistics is None:
            return self._server
        return BayesianLinearRegression.from_statistics(
            statistics,
            gpflow.utilities.deepcopy(self._server.kernel),
            float(self._server.likelihood.variance.numpy()),
            float(self._server.prior_variance.numpy()),
        )

    def start_from(self, model: BayesianLinearRegression) -> None:
        """Start the next run from ``model``'s kernel, σ² and λ² instead of the constructor's (``model`` must have
        this algorithm's kernel architecture). One algorithm, compiled once, can so serve several kernels, e.g.
        the exact global last layer of every client's kernel in the ablation ``local+global``.

        Every parameter is copied, trainable or not: a result model's kernel is frozen (its statistics fix the
        features), and phase 1 only shares trainable values, so a frozen kernel reaches the clients and the server
        through this copy alone.

        :raises ValueError: ``model``'s shared parameters differ from this algorithm's (another architecture), a
            shape mismatch, or non-finite values.
        """
        if not isinstance(model, BayesianLinearRegression):
            raise TypeError(f"start_from needs a BayesianLinearRegression, got {type(model).__name__}")
        theirs, mine = _every_parameter(model), _every_parameter(self._template)
        if sorted(theirs.keys) != sorted(mine.keys):
            raise ValueError(
                f"start_from: the model has parameters {sorted(theirs.keys)}, this FedBNR {sorted(mine.keys)}; "
                "give a model with this algorithm's kernel architecture"
            )
        values = theirs.read(model)
        workers = [shared.built for shared in (self._worker, self._kd)]  # built by an earlier run of this object
        for target in (self._template, self._server, *(w.model for w in workers if w is not None)):
            mine.assign(target, values)

    def result(self, state: FedBNRState) -> BayesianLinearRegression:
        """The global BLR from the server state alone (the summed statistics and the global kernel)."""
        if state.statistics is None or "phi_t_y" not in state.statistics:
            raise ValueError("FedBNR.result needs the phase-2 statistics; run the final phases first")
        return self._server_model(state.values, state.statistics)

    def copy_state(self, state: FedBNRState) -> FedBNRState:
        return replace(state, values={k: np.array(v) for k, v in state.values.items()})
