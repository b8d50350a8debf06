"""A pFedGP-style baseline (Achituve et al. 2021, as compared in thesis §3.2.2): personalised GPs.

All clients share the (deep-)kernel hyperparameters, the noise variance and M inducing inputs Z, learnt by
FedAvg over local steps on each client's collapsed SGPR bound (Titsias 2009; pFedGP uses an inducing-point
approximation for scale); each client keeps its *own* GP posterior on its own data. The final exchange
asks every client for its SGPR statistics at Z (``kuf_kfu = K_uf K_fu [M, M]``, ``kuf_y = K_uf y [M, P]``,
sizes independent of N_c), so the server can evaluate each personal model:

    ``A_c = K_uu + σ⁻² K_uf K_fu``,  ``μ_c(x) = σ⁻² k_xu A_c⁻¹ K_uf y``,
    ``v_c(x) = k_xx − k_xu K_uu⁻¹ k_ux + k_xu A_c⁻¹ k_ux``.

:meth:`PersonalisedGPs.predict_client` is client c's model; ``predict_f`` is the moment-matched equal mixture
of the client models (a global read-out of personalised models, which is what they lack).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Final, Mapping, Optional, Tuple

import gpflow
import numpy as np
import tensorflow as tf
from gpflow.keras import tf_keras

from ..protocol.algorithm import TRAIN_PHASE, Aggregate, Algorithm, FederationInfo
from ..protocol.client import Client
from ...training.adam import CompiledAdam, SharedWorker, per_point_loss
from ..protocol.messages import Message
from ...training.state import SharedState
from ...validation import integer, positive_float

from ...models.personalised_gp import PersonalisedGPs

__all__ = ["PersonalisedGP", "PersonalisedGPState", "PersonalisedGPs"]

#: The final exchange: each client's own SGPR statistics at the global parameters, for its personal model.
PERSONAL_PHASE: Final[str] = "personal"


@dataclass(frozen=True)
class PersonalisedGPState:
    """Shared values (unconstrained) and, after the final exchange, every client's statistics."""

    values: Mapping[str, np.ndarray]
    client_statistics: Optional[Tuple[Tuple[np.ndarray, np.ndarray], ...]] = None


class PersonalisedGP(Algorithm[PersonalisedGPState]):
    """pFedGP-style personalised GPs: FedAvg of shared kernel hyperparameters, local GP posteriors.

    :param kernel: the shared kernel (e.g. a :class:`~gpflow_fed.kernels.DeepKernel`).
    :param inducing_points: initial shared Z ``[M, D]`` (trained with the kernel).
    :param noise_variance: initial σ² > 0.
    :param rounds, local_steps, learning_rate: FedAvg schedule and Adam step size.
    """

    name = "personalised_gp"

    def __init__(
        self,
        kernel: gpflow.kernels.Kernel,
        inducing_points: Any,
        noise_variance: float = 1.0,
        rounds: int = 10,
        local_steps: int = 10,
        learning_rate: float = 0.01,
        client_fraction: float = 1.0,
    ) -> None:
        super().__init__(rounds, client_fraction)
        if not isinstance(kernel, gpflow.kernels.Kernel):
            raise TypeError(f"kernel must be a gpflow kernel, got {type(kernel).__name__}")
        Z: np.ndarray = np.asarray(inducing_points, dtype=gpflow.default_float())
        if Z.ndim != 2 or Z.shape[0] == 0:
            raise ValueError(f"inducing_points must be [M, D] with M ≥ 1, got shape {Z.shape}")
        positive_float(noise_variance, "noise_variance")
        integer(local_steps, "local_steps", minimum=1)
        self.kernel, self.Z = kernel, Z
        self.noise_variance, self.local_steps, self.learning_rate = (
            float(noise_variance),
            local_steps,
            float(learning_rate),
        )
        template = self._model((Z[:1], np.zeros((1, 1))))
        keras = {
            f"kernel.{n}": f"kernel.{n}"
            for n in ("feature_extractor",)
            if isinstance(getattr(kernel, n, None), tf_keras.layers.Layer)
        }
        self.shared = SharedState({**SharedState.from_module(template, exclude=tuple(keras)).paths, **keras})
        self._template = template
        self._worker = SharedWorker(self._client_worker)

    def _model(self, data: Tuple[np.ndarray, np.ndarray]) -> gpflow.models.SGPR:
        return gpflow.models.SGPR(
            data, gpflow.utilities.deepcopy(self.kernel), self.Z.copy(), noise_variance=self.noise_variance
        )

    def validate(self, dataset: Any) -> None:
        if dataset.input_dim != self.Z.shape[1]:
            raise ValueError(f"inducing_points have D={self.Z.shape[1]} columns, the dataset has D={dataset.input_dim}")

    def final_phases(self) -> Tuple[str, ...]:
        return (PERSONAL_PHASE,)

    def aggregation(self, phase: str) -> str:
        return "mean" if phase == TRAIN_PHASE else "collect"

    def initial_state(self, info: FederationInfo) -> PersonalisedGPState:
        return PersonalisedGPState(values=self.shared.read(self._template))

    def _client_worker(self) -> Tuple[gpflow.models.SGPR, CompiledAdam]:
        """The clients' shared worker SGPR and its compiled Adam loop (built once, traced once), on the client's
        data given as arguments."""
        worker = self._model((self.Z[:1], np.zeros((1, 1))))
        return worker, CompiledAdam(
            worker.trainable_variables, lambda X, Y: per_point_loss(worker, X, Y), self.learning_rate
        )

    def setup_client(self, client: Client, info: FederationInfo) -> None:
        """The client's own Adam state (its steps run on the shared compiled worker, see
        :mod:`~gpflow_fed.training.adam`) and its data as tensors."""
        _, trainer = self._worker.get()
        client.state["adam"] = trainer.initial_state()
        client.state["tensors"] = tuple(tf.constant(a) for a in client.data)

    def broadcast(self, state: PersonalisedGPState, round: int, phase: str) -> Mapping[str, np.ndarray]:
        return dict(state.values)

    def client_update(self, client: Client, broadcast: Message) -> Message:
        with self._worker.use() as (model, trainer):  # one shared worker: client updates run one at a time
            self.shared.assign(model, dict(broadcast.arrays))
            X, Y = client.state["tensors"]
            if broadcast.phase == PERSONAL_PHASE:
                kuf = gpflow.covariances.Kuf(model.inducing_variable, model.kernel, X)
                return self.reply(
                    client,
                    broadcast,
                    {
                        "kuf_kfu": tf.linalg.matmul(kuf, kuf, transpose_b=True).numpy(),
                        "kuf_y": tf.linalg.matmul(kuf, Y).numpy(),
                    },
                )
            losses, client.state["adam"] = trainer.fit(self.local_steps, client.state["adam"], X, Y)
            return self.reply(
                client,
                broadcast,
                self.shared.read(model),
                weight=client.num_data,
                metrics={"neg_elbo_per_point": float(losses[-1])},
            )

    def server_update(self, state: PersonalisedGPState, aggregate: Aggregate) -> PersonalisedGPState:
        if aggregate.phase == PERSONAL_PHASE:
            stats = tuple((np.array(m["kuf_kfu"]), np.array(m["kuf_y"])) for m in aggregate.messages or ())
            return replace(state, client_statistics=stats)
        return replace(state, values={k: np.array(v) for k, v in aggregate.arrays.items()})

    def result(self, state: PersonalisedGPState) -> PersonalisedGPs:
        if state.client_statistics is None:
            raise ValueError("PersonalisedGP.result needs the final 'personal' exchange")
        self.shared.assign(self._template, dict(state.values))
        t = self._template
        return PersonalisedGPs(
            gpflow.utilities.deepcopy(t.kernel),
            t.inducing_variable.Z.numpy(),
            float(t.likelihood.variance.numpy()),
            list(state.client_statistics),
        )
