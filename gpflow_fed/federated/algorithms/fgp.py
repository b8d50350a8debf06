"""FGP: the FSGP paper's federated exact-GP baseline, as an :class:`~gpflow_fed.federated.Algorithm`.

Paper: ``fsgp-federated-sparse-gp.txt`` (Guo et al., §4, after Yue & Kontar, arXiv:2111.14008).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Dict, Final, List, Mapping, Optional, Sequence, Tuple, Union

import gpflow
import numpy as np
import tensorflow as tf

from ...models.experts import COMBINATION_RULES, ExpertCommittee
from ..protocol.algorithm import TRAIN_PHASE, Aggregate, Algorithm, BroadcastRefused, FederationInfo, ReplySpec
from ..protocol.client import Client
from ..protocol.domain import DataDomain
from ..protocol.fingerprint import values_digest
from ..protocol.messages import Message
from ...training.adam import AdamState, CompiledAdam, SharedWorker, per_point_loss
from ...training.state import SharedState, resolve_path
from ...training.stopping import Plateau
from ...validation import integer, positive_float
from .bounds import fedavg_move, fedavg_value_bounds, log_density_bound, variance_extremes
from .fgp_batched import BatchedGPRWorker

__all__ = ["EXPERTS_PHASE", "FGP", "FGPState"]

EXPERTS_PHASE: Final[str] = "experts"
"""The final phase: every client sets its expert to the final hyperparameters (an empty reply)."""


@dataclass
class _Worker:
    """The scratch GPR every client trains in turn, its compiled Adam loop, its wire keys ↔ parameters, the
    wire keys in the order of ``trainer.variables``, and the same training for a whole cohort (None when the
    trained variables are not exactly the GPR's trainable Parameters)."""

    model: gpflow.models.GPR
    trainer: CompiledAdam
    shared: SharedState
    keys: Tuple[str, ...]
    batched: Optional[BatchedGPRWorker]


@dataclass(frozen=True)
class FGPState:
    """The FGP server state: the shared hyperparameters, never a client's data.

    :param params: the shared (θ, σ²) as unconstrained values under stable wire keys.
    :param experts: the clients that hold ``params`` in their expert after the final ``"experts"`` phase, in
        client order (empty before it).
    """

    params: Mapping[str, np.ndarray]
    experts: Tuple[str, ...] = ()


class FGP(Algorithm[FGPState]):
    r"""Federated exact GP (FGP): FedAvg over the clients' exact-GP marginal likelihoods, committee prediction.

    Training (Guo et al. §4, after Yue & Kontar): each round ``max(⌈Kρ⌉, 1)`` sampled clients receive the
    shared ``w = (θ, σ²)``, take ``local_steps`` (P) steps of their own ``tf_keras`` Adam (learning rate λ) on
    ``−(1/N_k) log N(y_k | 0, C_{N_kN_k} + σ² I)`` (``gpflow.models.GPR``'s ``training_loss() / N_k``) and send
    back ``w_k``; the server sets ``w ← Σ_k N_k w_k / Σ_k N_k`` in GPflow's unconstrained space, as
    :class:`~gpflow_fed.federated.algorithms.FSGP` does. Each client keeps its own Adam moments and step count
    between rounds (``client.state["adam"]``, checkpointed with the client); the steps run on one compiled
    loop shared by all clients (:class:`~gpflow_fed.training.adam.CompiledAdam` on one
    :class:`~gpflow_fed.training.adam.SharedWorker`). ``train`` also has a batched form (:meth:`batched`,
    :meth:`client_updates`): ``LocalRuntime`` (``batched=True``, its default) trains a cohort of at least ``min_batch``
    clients in one compiled call per size bucket and memory chunk
    (:class:`~gpflow_fed.federated.algorithms.fgp_batched.BatchedGPRWorker`: padded rows masked out of the
    likelihood exactly, each client's Adam state stacked), with the same replies to round-off and every per-client
    protection applied to each client's reply by the runtime; ``LocalRuntime(batched=False)`` keeps one call a client.

    Final phase ``"experts"``: the server sends the final ``w`` to every client, which sets its expert, an
    exact ``gpflow.models.GPR`` on its own data (``client.model``), to it and answers with an empty payload.

    Prediction: :meth:`result` combines the clients' experts by ``rule`` (default the robust Bayesian committee
    machine, Deisenroth & Ng 2015, eqs. 13–14: :class:`~gpflow_fed.baselines.ExpertCommittee`). **Privacy**:
    unlike FSGP's :class:`~gpflow_fed.models.AggregatedSGPR`, this prediction cannot be made from a server-side
    summary: every client must answer every test-point query with its own posterior mean and variance, which
    are functions of its private data, and pays ``O(N_k³)`` once plus ``O(N_k)`` per query. That query traffic
    (``N*·D`` inputs down, ``2·N*·P`` numbers up per client for ``N*`` test points) happens when the returned
    model predicts, after the run, so the run's ledger does not hold it. The returned model holds the
    clients' experts, so it can only be built in the process where every client ran (``LocalRuntime``, or
    ``DistributeRuntime`` in one process); a Flower server, or one worker of a multi-worker strategy, lacks
    the other clients' experts and :meth:`result` raises there.

    Messages (``|w|`` numbers: the kernel's trainable parameters and σ²; 8 bytes a number; none depends on
    ``N_k``): ``train`` sends ``w`` down and ``w_k`` up; ``experts`` sends ``w`` down and an empty payload up.
    Every up message carries its weight ``N_k`` (the server knows the client sizes) and nothing else. With
    plain (non-secure) aggregation the server sees each client's ``w_k`` after P local steps, a function of
    its data; with secure aggregation only the weighted sum. With differential privacy, pass
    ``DifferentialPrivacy(phases=("train",))``: the ``experts`` replies release nothing, and would otherwise be
    accounted (and warned about) as a release.

    Defaults (``FGP(kernel)`` runs) are FSGP's, so the two are compared on equal terms: σ² = 0.1, R = 60, P = 3,
    λ = 0.1 on standardised data.

    :param kernel: a ``gpflow.kernels.Kernel`` with the initial θ (copied, never modified).
    :param noise_variance: initial σ² > 0.
    :param rounds: communication rounds R ≥ 0.
    :param local_steps: P ≥ 1, local Adam steps per round.
    :param learning_rate: λ > 0 of every Adam optimizer.
    :param client_fraction: ρ ∈ (0, 1]; ``max(⌈Kρ⌉, 1)`` clients per round.
    :param rule: the committee's combination rule, one of
        :data:`~gpflow_fed.models.experts.COMBINATION_RULES` (default ``"rbcm"``).
    :param stopping: end training before R rounds once the round's ``local_log_likelihood`` (the sampled
        clients' ``(1/N_k) log p(y_k)`` before their last local step, averaged with weights N_k) reaches a
        :class:`~gpflow_fed.federated.Plateau`; None (default): always R rounds. With a rule, every ``train``
        reply also carries that client's value as a metric (one number, a function of its data).
    :raises TypeError: a kernel that is not a GPflow kernel, a learning rate or noise variance that is not
        a number, or a ``stopping`` that is not a Plateau.
    :raises ValueError: negative rounds, non-positive local steps, learning rate or noise variance, ρ outside
        (0, 1], an unknown rule; in :meth:`validate`: ARD lengthscales of another input dimension than the data's.
    """

    name = "fgp"

    def __init__(
        self,
        kernel: gpflow.kernels.Kernel,
        noise_variance: float = 0.1,
        rounds: int = 60,
        local_steps: int = 3,
        learning_rate: float = 0.1,
        client_fraction: float = 1.0,
        *,
        rule: str = "rbcm",
        stopping: Optional[Plateau] = None,
    ) -> None:
        super().__init__(rounds, client_fraction)
        if stopping is not None and not isinstance(stopping, Plateau):
            raise TypeError(f"FGP: stopping must be a Plateau or None, got {type(stopping).__name__}")
        self.stopping = stopping
        if not isinstance(kernel, gpflow.kernels.Kernel):
            raise TypeError(f"FGP: kernel must be a gpflow.kernels.Kernel, got {type(kernel).__name__}")
        if rule not in COMBINATION_RULES:
            raise ValueError(f"FGP: rule must be one of {COMBINATION_RULES}, got {rule!r}")
        self.kernel = gpflow.utilities.deepcopy(kernel)
        self.noise_variance = positive_float(noise_variance, "FGP: noise_variance")
        self.local_steps = integer(local_steps, "FGP: local_steps", minimum=1)
        self.learning_rate = positive_float(learning_rate, "FGP: learning_rate")
        self.rule = rule
        #: one GPR and compiled Adam loop shared by every client, rebuilt by each run's :meth:`initial_state`
        self._worker: Optional[SharedWorker[_Worker]] = None
        #: each set-up client's expert (its ``client.model``): the committee of :meth:`result` queries them
        self._experts: Dict[str, gpflow.models.GPR] = {}
        #: (a ``"train"`` broadcast's round and values digest, what :meth:`payload_bound` reads of it)
        self._extent_at: Optional[Tuple[Any, Tuple[Dict[str, float], Optional[Tuple[float, float, float]]]]] = None

    # --- configuration -------------------------------------------------------------------------------
    def validate(self, dataset: Any) -> None:
        """ARD lengthscales, if any, must number 1 or the data's input dimension D."""
        D = int(dataset.input_dim)
        lengthscales = getattr(self.kernel, "lengthscales", None)
        if lengthscales is not None and lengthscales.shape.ndims == 1 and int(lengthscales.shape[0]) not in (1, D):
            raise ValueError(f"FGP: the kernel has {lengthscales.shape[0]} ARD lengthscales but the data have D = {D}")

    def final_phases(self) -> Tuple[str, ...]:
        return (EXPERTS_PHASE,)

    def aggregation(self, phase: str) -> str:
        """``"mean"`` (FedAvg) for ``train``; ``"sum"`` of the empty acknowledgements for ``experts``."""
        return "mean" if phase == TRAIN_PHASE else "sum"

    def reply_spec(self, state: FGPState, round: int, phase: str) -> ReplySpec:
        """``train``: the parameters, shaped as the broadcast; ``experts``: nothing."""
        if phase == TRAIN_PHASE:
            return {k: tuple(np.shape(v)) for k, v in state.params.items()}
        return {}

    def expected_weight(self, phase: str, num_data: int) -> float:
        """Every FGP message is weighted by the client's registered N_k."""
        return float(num_data)

    def payload_bound(self, broadcast: Message, domain: DataDomain) -> Optional[Mapping[str, float]]:
        """Public bounds of a reply (``Algorithm.payload_bound``; issue 43, the clip leak), from the broadcast and
        N = ``domain.rows``, Ȳ_p = ``domain.targets``:

        * ``"train"``: each shared value within ``max |broadcast value|`` plus the largest move of ``local_steps`` Adam
          steps in the broadcast's round (:func:`~.bounds.fedavg_value_bounds`,
          :func:`~.fsgp.checks.adam_displacement_bound`), whatever the data. With ``stopping``, the metric
          ``log_likelihood`` (``log p(y_k) / N_k`` at values within that box: the loss before the last step) is
          bounded, for a ``gpflow.kernels.Stationary`` kernel with no prior on any parameter, from σ² ∈ [σ²₋, σ²₊] and
          σ_f² ≤ v₊ over the box (:func:`~.bounds.variance_extremes`) by :func:`~.bounds.log_density_bound` (exact GP:
          ``log det(K + σ² I) / N`` between ``log σ²`` and ``log(σ² + N v)``, ``yᵀ (K + σ² I)⁻¹ y ≤ N Σ_p Ȳ_p² / σ²``).
          Another kernel (or a prior, whose log density the loss holds) states no bound for it, so under secure
          aggregation it is not sent, and a ``stopping`` rule then meets a ``nan`` objective
          (:class:`~gpflow_fed.training.stopping.Plateau` raises).
        * ``"experts"``: ``{}`` (the reply is empty: its weight N_k alone).

        None for another phase, or before the run's worker is built. What depends on the broadcast alone is computed
        once per broadcast (every client of a cohort asks for the same one).
        """
        if broadcast.phase == EXPERTS_PHASE:
            return {}
        worker = None if self._worker is None else self._worker.built
        if broadcast.phase != TRAIN_PHASE or worker is None:
            return None
        key = (broadcast.round, values_digest(broadcast.arrays))
        if self._extent_at is None or self._extent_at[0] != key:
            move = fedavg_move(self.learning_rate, self.local_steps, broadcast.round)
            params = {k: np.asarray(v, np.float64) for k, v in broadcast.arrays.items() if k in worker.keys}
            priors = any(p.prior is not None for p in worker.model.parameters)
            box = None if priors else variance_extremes(worker.model, worker.shared, params, move)
            self._extent_at = (key, (fedavg_value_bounds(params, move), box))
        bounds, box = self._extent_at[1]
        if self.stopping is None or box is None:
            return dict(bounds)
        noise_low, noise_high, variance_high = box
        local = log_density_bound(domain.rows, domain.targets, noise_low, noise_high, variance_high, trace_term=False)
        return {**bounds, "log_likelihood": local}

    # --- clients -------------------------------------------------------------------------------------
    def _gpr(self, data: Tuple[Any, Any]) -> gpflow.models.GPR:
        kernel = gpflow.utilities.deepcopy(self.kernel)
        return gpflow.models.GPR(data, kernel=kernel, noise_variance=self.noise_variance)

    def _build_worker(self, input_dim: int, output_dim: int) -> _Worker:
        dtype = gpflow.default_float()
        model = self._gpr((tf.zeros([1, input_dim], dtype), tf.zeros([1, output_dim], dtype)))  # data: arguments
        trainer = CompiledAdam(model.trainable_variables, lambda X, Y: per_point_loss(model, X, Y), self.learning_rate)
        shared = SharedState.from_module(model, space="unconstrained")
        position = {variable.ref(): i for i, variable in enumerate(trainer.variables)}
        backing = {k: resolve_path(model, p).unconstrained_variable.ref() for k, p in shared.paths.items()}
        if sorted(position[b] for b in backing.values()) != list(range(len(trainer.variables))):
            raise TypeError("FGP shares the GPR's trainable GPflow Parameters only (θ and σ²)")
        keys = tuple(sorted(shared.keys, key=lambda k: position[backing[k]]))
        batched: Optional[BatchedGPRWorker]
        try:
            batched = BatchedGPRWorker(model, trainer, self.local_steps)
        except ValueError:  # e.g. another optimizer state layout: the per-client path only
            batched = None
        return _Worker(model, trainer, shared, keys, batched)

    def initial_state(self, info: FederationInfo) -> FGPState:
        self._worker, self._experts = SharedWorker(self._build_worker), {}
        worker = self._worker.get(info.input_dim, info.output_dim)
        return FGPState(params=worker.shared.read(worker.model))

    def setup_client(self, client: Client, info: FederationInfo) -> None:
        """The client's expert (an exact GPR on its own data, ``client.model``) and a fresh Adam state.

        The Adam state (an :class:`~gpflow_fed.training.adam.AdamState`) lives in
        ``client.state["adam"]``, so it is saved with the client's checkpoint; the steps run on the shared worker.
        """
        assert self._worker is not None
        client.model = self._gpr(tuple(tf.constant(a) for a in client.data))
        client.state["adam"] = self._worker.get().trainer.initial_state()
        self._experts[client.id] = client.model

    # --- the round -----------------------------------------------------------------------------------
    def broadcast(self, state: FGPState, round: int, phase: str) -> Mapping[str, np.ndarray]:
        return dict(state.params)

    def client_update(self, client: Client, broadcast: Message) -> Message:
        assert self._worker is not None
        weight = float(client.num_data)
        if broadcast.phase == TRAIN_PHASE:
            dtype = gpflow.default_float()
            X, Y = (tf.constant(a, dtype) for a in client.data)
            with self._worker.use() as worker:  # one scratch model for every client: updates run one at a time
                if set(broadcast.arrays) != set(worker.keys):  # an ignored array would make a "new" broadcast
                    raise BroadcastRefused("FGP: the 'train' broadcast carries arrays other than the shared ones")
                for variable, key in zip(worker.trainer.variables, worker.keys):
                    variable.assign(broadcast[key])
                losses, adam = worker.trainer.fit(self.local_steps, client.state["adam"], X, Y)
                updated = {key: variable.numpy() for key, variable in zip(worker.keys, worker.trainer.variables)}
            return self._trained(client, broadcast, updated, adam, float(losses[-1]))
        if broadcast.phase == EXPERTS_PHASE:
            self._worker.get().shared.assign(client.model, dict(broadcast.arrays))
            return self.reply(client, broadcast, {}, weight)
        raise ValueError(f"FGP: unknown phase {broadcast.phase!r}")

    def _trained(
        self, client: Client, broadcast: Message, updated: Mapping[str, np.ndarray], adam: AdamState, loss: float
    ) -> Message:
        """The reply of a ``train`` update (wire order) from the new values by key; only finite values change the
        client's Adam state.

        :raises FloatingPointError: a non-finite new value.
        """
        assert self._worker is not None
        if not all(np.all(np.isfinite(v)) for v in updated.values()):
            raise FloatingPointError(f"the local hyperparameters became non-finite after {self.local_steps} steps")
        client.state["adam"] = adam  # only a successful update changes the client's Adam state
        metrics = {"log_likelihood": -float(loss)} if self.stopping is not None else None
        arrays = {k: updated[k] for k in self._worker.get().shared.keys}
        return self.reply(client, broadcast, arrays, float(client.num_data), metrics)

    def batched(self, phase: str) -> bool:
        """``train`` has a batched form (:class:`~.fgp_batched.BatchedGPRWorker`: every client's P Adam steps in one
        compiled call per size bucket and memory chunk); ``experts`` (one assignment a client) does not, nor does a
        subclass that replaces :meth:`client_update` (its own update is asked per client)."""
        worker = None if self._worker is None else self._worker.built
        return (
            phase == TRAIN_PHASE
            and worker is not None
            and worker.batched is not None
            and type(self).client_update is FGP.client_update
        )

    def client_updates(
        self, clients: Sequence[Client], broadcast: Message, memory_budget: int
    ) -> List[Union[Message, Exception]]:
        """:meth:`client_update` of every client of a ``train`` cohort at once
        (:class:`~.fgp_batched.BatchedGPRWorker`), each with its own data and Adam state: per client, the reply (or the
        error) :meth:`client_update` gives, to round-off.

        A client whose batched result is not finite is recomputed on its own (:meth:`client_update`), so it gets the
        per-client answer, its failure included. Besides a genuine failure this catches one of the batched computation:
        ``tf.vectorized_map`` does not keep TensorFlow Probability's custom gradient of its softplus bijector, so a
        softplus-constrained parameter whose unconstrained value exceeds log(float64 max) ≈ 709.8 (e.g. a kernel
        variance above 709.8) gets a NaN gradient in the batch (``tf.where``'s unused ``log1p(exp(x))`` branch) where
        the per-client step is finite. Another phase: client by client."""
        assert self._worker is not None
        if broadcast.phase != TRAIN_PHASE or not self.batched(TRAIN_PHASE):
            return super().client_updates(clients, broadcast, memory_budget)
        out: List[Any] = [None] * len(clients)
        with self._worker.use() as worker:  # the per-client path's lock: tracing reads the scratch GPR's parameters
            assert worker.batched is not None
            if set(broadcast.arrays) != set(worker.keys):  # an ignored array would make a "new" broadcast
                return [BroadcastRefused("FGP: the 'train' broadcast carries arrays other than the shared ones")] * len(
                    clients
                )
            shapes = {key: tuple(v.shape) for key, v in zip(worker.keys, worker.trainer.variables)}
            wrong = [key for key in worker.keys if np.shape(broadcast[key]) != shapes[key]]
            if wrong:
                return [ValueError(f"FGP: the broadcast {wrong[0]!r} has shape {np.shape(broadcast[wrong[0]])}, "
                                   f"expected {shapes[wrong[0]]}")] * len(clients)  # fmt: skip
            values = np.concatenate([np.ravel(broadcast[key]) for key in worker.keys])
            good: List[int] = []
            for k, client in enumerate(clients):
                try:
                    worker.trainer.check(client.state["adam"])  # as CompiledAdam.fit checks it
                    good.append(k)
                except Exception as exc:  # noqa: BLE001 - this client's update fails, as client_update's would
                    out[k] = exc
            states = [clients[k].state["adam"] for k in good]
            trained = worker.batched.train([clients[k].data for k in good], values, states, memory_budget)
            keys = worker.keys
        for k, (new_values, adam, loss) in zip(good, trained):
            try:
                if all(np.all(np.isfinite(v)) for v in new_values) and np.isfinite(loss):
                    out[k] = self._trained(clients[k], broadcast, dict(zip(keys, new_values)), adam, loss)
                else:  # recomputed on its own: the per-client path's answer, a failure included (see above)
                    out[k] = self.client_update(clients[k], broadcast)
            except Exception as exc:  # noqa: BLE001 - this client's update fails, as client_update's would
                out[k] = exc
        return out

    def tracing_counts(self) -> Dict[str, int]:
        """How many times local training was traced, per client (``"train"``) and batched (``"batched"``): at most 1
        each in a run, whatever the clients, rounds and cohorts (0 before the run's first update on that path)."""
        worker = None if self._worker is None else self._worker.built
        if worker is None:
            return {"train": 0, "batched": 0}
        return {
            "train": worker.trainer.tracing_count(),
            "batched": 0 if worker.batched is None else worker.batched.tracing_count(),
        }

    def server_update(self, state: FGPState, aggregate: Aggregate) -> FGPState:
        if aggregate.phase == TRAIN_PHASE:
            return replace(state, params={k: np.array(aggregate[k]) for k in state.params})
        if aggregate.phase == EXPERTS_PHASE:
            return replace(state, experts=tuple(aggregate.senders))
        raise ValueError(f"FGP: unknown phase {aggregate.phase!r}")

    def round_metrics(self, state: FGPState, aggregates: Sequence[Aggregate]) -> Dict[str, float]:
        """The sampled clients' per-point log marginal likelihood, averaged (``nan`` in other phases)."""
        return {"local_log_likelihood": float(aggregates[0].metrics.get("log_likelihood", float("nan")))}

    def stop_early(self, history: Sequence[Mapping[str, Any]]) -> bool:
        """Whether the ``local_log_likelihood`` of ``history`` reached ``stopping``'s plateau (never without one)."""
        return self.stopping is not None and self.stopping.reached([e["local_log_likelihood"] for e in history])

    def copy_state(self, state: FGPState) -> FGPState:
        return replace(state)

    def result(self, state: FGPState) -> ExpertCommittee:
        """The committee (by ``rule``) of the experts of ``state.experts``, which hold ``state.params``.

        :raises ValueError: before the final ``"experts"`` phase, or where the experts are not in this process
            (a Flower server).
        """
        if not state.experts:
            raise ValueError("FGP.result needs the final 'experts' phase, which sets every client's expert")
        missing: List[str] = [c for c in state.experts if c not in self._experts]
        if missing:
            raise ValueError(
                f"FGP.result: the experts of {missing} are held by clients outside this process (e.g. Flower "
                "parties); FGP's prediction asks every client's own exact GP, so build it where the clients ran"
            )
        return ExpertCommittee([self._experts[c] for c in state.experts], rule=self.rule)
