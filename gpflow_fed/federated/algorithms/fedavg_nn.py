"""FedAvg and FedProx neural-network regression baselines (thesis §3.2.2; McMahan et al. 2017, Li et al. 2020).

The network (the same feature extractor as FedBNR's, plus a linear output layer) is trained by mean squared
error. Each round, every asked client copies the global weights, takes ``local_steps`` Adam steps on

    ``MSE_c(w) + μ/2 ‖w − w_global‖²``  (μ = 0: FedAvg; μ > 0: FedProx's proximal term),

and the server takes the N_c-weighted mean. A final exchange sums the clients' squared residuals so the
returned model has the maximum-likelihood noise variance ``σ² = Σ_c SSE_c / N``, which ``predict_y`` uses
(a homoscedastic Gaussian predictive, needed for NLPD and calibration metrics).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Final, Mapping, Optional, Tuple

import gpflow
import numpy as np
import tensorflow as tf
from gpflow.keras import tf_keras

from ..protocol.algorithm import TRAIN_PHASE, Aggregate, Algorithm, FederationInfo
from ..protocol.client import Client
from ..protocol.domain import DataDomain
from ...training.adam import CompiledAdam, SharedWorker
from ..protocol.messages import Message
from ...training.state import SharedState
from ...validation import integer, non_negative_float, positive_float
from .bounds import fedavg_move, fedavg_value_bounds

from ...models.neural_regression import NetworkMean, NeuralRegression

__all__ = ["FedAvgNN", "FedAvgNNState", "NetworkMean", "NeuralRegression"]

#: The final exchange: the clients' residual sums of squares, for the noise variance of the returned model.
NOISE_PHASE: Final[str] = "noise"


@dataclass(frozen=True)
class FedAvgNNState:
    """The global network weights and, after the final exchange, the noise variance."""

    values: Mapping[str, np.ndarray]
    noise_variance: Optional[float] = None


class FedAvgNN(Algorithm[FedAvgNNState]):
    """FedAvg (``proximal_mu=0``) or FedProx (``proximal_mu > 0``) on a regression network trained by MSE.

    :param network_factory: builds a fresh ``tf_keras`` network ``[N, D] → [N, P]`` (one per party; the
        server's initial weights are broadcast, so every party starts from the same network).
    :param rounds: R.
    :param local_steps: Adam steps per client per round.
    :param learning_rate: Adam step size.
    :param proximal_mu: μ ≥ 0 of FedProx.
    """

    name = "fedavg_nn"

    def __init__(
        self,
        network_factory: Callable[[], tf_keras.Model],
        rounds: int = 10,
        local_steps: int = 10,
        learning_rate: float = 0.01,
        proximal_mu: float = 0.0,
        client_fraction: float = 1.0,
    ) -> None:
        super().__init__(rounds, client_fraction)
        if not callable(network_factory):
            raise TypeError("network_factory must be a callable that returns a new tf_keras model")
        non_negative_float(proximal_mu, "proximal_mu")
        positive_float(learning_rate, "learning_rate")
        integer(local_steps, "local_steps", minimum=1)
        self.network_factory = network_factory
        self.local_steps = local_steps
        self.learning_rate = float(learning_rate)
        self.proximal_mu = float(proximal_mu)
        self.shared = SharedState({"network": "mean_function.network"}, space="constrained")
        self._server: Optional[NeuralRegression] = None
        self._worker = SharedWorker(self._client_worker)

    def _network(self, input_dim: int) -> tf_keras.Model:
        net = self.network_factory()
        net(tf.zeros([1, input_dim], dtype=gpflow.default_float()))  # build the weights
        return net

    def final_phases(self) -> Tuple[str, ...]:
        return (NOISE_PHASE,)

    def aggregation(self, phase: str) -> str:
        return "mean" if phase == TRAIN_PHASE else "sum"

    def payload_bound(self, broadcast: Message, domain: DataDomain) -> Optional[Mapping[str, float]]:
        """Public bounds of a ``"train"`` reply (``Algorithm.payload_bound``; issue 43, the clip leak): each weight
        within ``max |broadcast value|`` plus the largest move of ``local_steps`` steps of the party's own ``tf_keras``
        Adam in the broadcast's round (:func:`~.bounds.fedavg_value_bounds`,
        :func:`~.fsgp.checks.adam_displacement_bound`), whatever the data and μ (the bound holds for any gradient; a
        weight the optimiser does not train stays at its broadcast value), widened by ``4 P ε`` of the network's float
        (``float32``'s before the worker is built: the steps' round-off in a narrower float than float64).

        The metric ``loss`` (the MSE, a function of the network's outputs) has no public bound, so under secure
        aggregation it is not sent (nothing reads it). The ``"noise"`` phase's residual sum has none either (the
        network's outputs are not bounded by public numbers): None, as before (its clip is the threat model's open
        gap).
        """
        if broadcast.phase != TRAIN_PHASE:
            return None
        built = self._worker.built
        dtypes = [np.float32] if built is None else [w.dtype.as_numpy_dtype for w in built[0].trainable_variables]
        epsilon = max((float(np.finfo(d).eps) for d in dtypes), default=float(np.finfo(np.float32).eps))
        move = fedavg_move(self.learning_rate, self.local_steps, broadcast.round)
        return fedavg_value_bounds(broadcast.arrays, move, relative_slack=4.0 * self.local_steps * epsilon)

    def initial_state(self, info: FederationInfo) -> FedAvgNNState:
        self._server = NeuralRegression(None, self._network(info.input_dim), num_outputs=info.output_dim)
        out = self._server.mean_function(tf.zeros([1, info.input_dim], dtype=gpflow.default_float()))
        if out.shape.rank != 2 or out.shape[1] != info.output_dim:
            raise ValueError(f"the network must map [N, D] to [N, P={info.output_dim}], got output shape {out.shape}")
        return FedAvgNNState(values=self.shared.read(self._server))

    def _client_worker(self, input_dim: int, output_dim: int) -> Tuple[NeuralRegression, CompiledAdam]:
        """The clients' shared worker network and its compiled Adam loop (built once, traced once)."""
        worker = NeuralRegression(None, self._network(input_dim), num_outputs=output_dim)
        network = worker.mean_function.network
        mu = self.proximal_mu

        def loss(X: tf.Tensor, Y: tf.Tensor, *anchors: tf.Tensor) -> tf.Tensor:
            mse = tf.reduce_mean(tf.square(Y - worker.mean_function(X)))
            if mu > 0:
                proximal = tf.add_n(
                    [
                        tf.reduce_sum(tf.square(tf.cast(w - a, gpflow.default_float())))
                        for w, a in zip(network.trainable_weights, anchors)
                    ]
                )
                return mse + 0.5 * mu * proximal
            return mse

        return worker, CompiledAdam(network.trainable_weights, loss, self.learning_rate)

    def setup_client(self, client: Client, info: FederationInfo) -> None:
        """The client's own Adam state (its steps run on the shared compiled worker, see
        :mod:`~gpflow_fed.training.adam`) and its data as tensors."""
        X, Y = client.data
        _, trainer = self._worker.get(X.shape[1], Y.shape[1])
        client.state["adam"] = trainer.initial_state()
        client.state["tensors"] = (tf.constant(X), tf.constant(Y))

    def broadcast(self, state: FedAvgNNState, round: int, phase: str) -> Mapping[str, np.ndarray]:
        return dict(state.values)

    def client_update(self, client: Client, broadcast: Message) -> Message:
        with self._worker.use(*(a.shape[1] for a in client.data)) as (worker, trainer):  # one client at a time
            self.shared.assign(worker, dict(broadcast.arrays))
            X, Y = client.state["tensors"]
            if broadcast.phase == NOISE_PHASE:
                sse = float(tf.reduce_sum(tf.square(Y - worker.mean_function(X))))
                return self.reply(
                    client, broadcast, {"sse": np.array(sse), "num_data": np.array(float(client.num_data))}
                )
            anchors = [tf.constant(w) for w in worker.mean_function.network.trainable_weights]  # the global weights
            losses, client.state["adam"] = trainer.fit(self.local_steps, client.state["adam"], X, Y, *anchors)
            return self.reply(
                client, broadcast, self.shared.read(worker), weight=client.num_data, metrics={"loss": float(losses[-1])}
            )

    def server_update(self, state: FedAvgNNState, aggregate: Aggregate) -> FedAvgNNState:
        if aggregate.phase == NOISE_PHASE:
            return replace(state, noise_variance=float(aggregate["sse"] / aggregate["num_data"]))
        return replace(state, values={k: np.array(v) for k, v in aggregate.arrays.items()})

    def result(self, state: FedAvgNNState) -> NeuralRegression:
        if self._server is None:
            raise ValueError("FedAvgNN.result needs initial_state to have run (use gpflow_fed.federated.run)")
        self.shared.assign(self._server, dict(state.values))
        if state.noise_variance is not None:
            self._server.likelihood.variance.assign(max(state.noise_variance, 1e-6))
        return gpflow.utilities.deepcopy(self._server)
