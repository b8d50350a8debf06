"""Recycle: federated Recyclable GPs — every client fits and sends its recyclable model once; the server
fits the ensemble without any data (Moreno-Muñoz et al., *Recyclable Gaussian Processes*, eqs. 1 and 6).

What leaves client k (one message, round 0, phase ``"fit"``): ``q_mu [M_k, 1]``, ``q_sqrt [M_k, M_k]``,
``Z [M_k, D]`` and a JSON spec of the local kernel and likelihood hyperparameters — ``O(M_k² + M_kD)`` numbers,
independent of N_k. The inducing inputs are a random subset of the client's own inputs moved by training,
so an honest-but-curious server learns M_k locations near the client's data and its local posterior there.
"""

from __future__ import annotations

from typing import Any, Dict, Final, Mapping, Optional

import gpflow
import numpy as np

from ...models.ensemble_svgp import EnsembleSVGP
from ...models.recyclable import RecyclableModel, export_svgp
from ...models.recyclable_training import LocalSVGPTrainer
from ...validation import integer
from ..protocol.algorithm import Aggregate, Algorithm, FederationInfo
from ..protocol.client import Client
from ..protocol.messages import Message

__all__ = ["Recycle"]

#: The single exchange: every client fits its local SVGP and sends it as a recyclable model.
FIT_PHASE: Final[str] = "fit"


class Recycle(Algorithm[Dict[str, Any]]):
    """One round: clients train a local unwhitened SVGP (paper eq. 1) and send it; the server fits
    :class:`~gpflow_fed.models.EnsembleSVGP` over the collected models (eq. 6) and returns it.

    :param kernel: the ensemble's initial kernel ψ. :param Z: ``[M, D]`` initial global inducing inputs Z_*.
    :param num_local_inducing: M_k (capped at N_k).
    :param local_kernel: template copied for every client (default: ``kernel``).
    :param local_likelihood: template copied for every client (default ``Gaussian()``).
    :param likelihood: the ensemble's likelihood (default: from the local models).
    :param local_maxiter: L-BFGS iterations per client. :param maxiter: for the ensemble fit.
    :param method: ensemble training, see :meth:`EnsembleSVGP.fit`.
    """

    name = "recycle"

    def __init__(
        self,
        kernel: gpflow.kernels.Kernel,
        Z: np.ndarray,
        *,
        num_local_inducing: int = 10,
        local_kernel: Optional[gpflow.kernels.Kernel] = None,
        local_likelihood: Optional[gpflow.likelihoods.Likelihood] = None,
        likelihood: Optional[gpflow.likelihoods.Likelihood] = None,
        local_maxiter: int = 200,
        maxiter: int = 200,
        method: str = "collapsed",
    ) -> None:
        super().__init__(rounds=1)
        if not isinstance(kernel, gpflow.kernels.Kernel):
            raise TypeError(f"kernel must be a gpflow Kernel, got {type(kernel).__name__}")
        Z = np.asarray(Z, dtype=gpflow.default_float())
        if Z.ndim != 2 or Z.shape[0] == 0:
            raise ValueError(f"Z must be [M, D] with M > 0, got shape {Z.shape}")
        num_local_inducing = integer(num_local_inducing, "num_local_inducing", minimum=1)
        if method not in ("collapsed", "alternate", "joint"):
            raise ValueError(f"method must be 'collapsed', 'alternate' or 'joint', got {method!r}")
        self.kernel, self.Z, self.num_local_inducing = kernel, Z, num_local_inducing
        self.local_kernel = local_kernel if local_kernel is not None else kernel
        self.local_likelihood = local_likelihood if local_likelihood is not None else gpflow.likelihoods.Gaussian()
        self.likelihood, self.local_maxiter, self.maxiter, self.method = likelihood, local_maxiter, maxiter, method
        integer(local_maxiter, "local_maxiter", minimum=0)
        # created at the first client update (after any runtime's deep copy of the algorithm), then one compiled
        # L-BFGS loop serves every client simulated in this process; each fit starts from copies of the templates
        self._trainer: Optional[LocalSVGPTrainer] = None

    def validate(self, dataset: Any) -> None:
        if dataset.input_dim != self.Z.shape[1]:
            raise ValueError(f"Z has D = {self.Z.shape[1]} but the clients' inputs have D = {dataset.input_dim}")
        if dataset.output_dim != 1:
            raise ValueError(f"Recycle fits single-output models; the clients have P = {dataset.output_dim}")

    def phases(self, round: int) -> tuple:
        return (FIT_PHASE,)

    def aggregation(self, phase: str) -> str:
        return "collect"

    def initial_state(self, info: FederationInfo) -> Dict[str, Any]:
        """``models``: the collected :class:`RecyclableModel` s; ``ensemble``: the fitted ensemble's unconstrained
        parameter values by path (numbers only, so the state can be checkpointed), ``None`` before the round."""
        return {"models": {}, "ensemble": None}

    def broadcast(self, state: Any, round: int, phase: str) -> Mapping[str, np.ndarray]:
        return {}

    def client_update(self, client: Client, broadcast: Message) -> Message:
        X, Y = client.data
        M = min(self.num_local_inducing, client.num_data)
        Z = X[np.sort(client.rng.choice(client.num_data, size=M, replace=False))]
        if self._trainer is None:
            self._trainer = LocalSVGPTrainer(self.local_kernel, self.local_likelihood, maxiter=self.local_maxiter)
        model = self._trainer.fit(X, Y, Z)
        elbo = float(model.elbo((X, Y)).numpy())
        rec = export_svgp(model, name=client.id)
        return self.reply(client, broadcast, rec.to_arrays(), weight=client.num_data, metrics={"local_elbo": elbo})

    def server_update(self, state: Any, aggregate: Aggregate) -> Dict[str, Any]:
        models = {m.sender: RecyclableModel.from_arrays(m.arrays) for m in aggregate.messages or ()}
        ensemble = self._ensemble(models)
        ensemble.fit(maxiter=self.maxiter, method=self.method)
        values = {path: _unconstrained(p).numpy() for path, p in gpflow.utilities.parameter_dict(ensemble).items()}
        return {"models": models, "ensemble": values}

    def result(self, state: Any) -> EnsembleSVGP:
        if state["ensemble"] is None:
            raise ValueError("no ensemble yet: Recycle needs its single round to run")
        ensemble = self._ensemble(state["models"])
        for path, p in gpflow.utilities.parameter_dict(ensemble).items():
            _unconstrained(p).assign(state["ensemble"][path])
        return ensemble

    def _ensemble(self, models: Mapping[str, RecyclableModel]) -> EnsembleSVGP:
        """A fresh, unfitted ensemble over ``models`` from the algorithm's templates."""
        likelihood = None if self.likelihood is None else gpflow.utilities.deepcopy(self.likelihood)
        return EnsembleSVGP(dict(models), gpflow.utilities.deepcopy(self.kernel), self.Z.copy(), likelihood=likelihood)


def _unconstrained(p: Any) -> Any:
    """The variable that holds a parameter's value exactly (a Parameter's unconstrained variable)."""
    return getattr(p, "unconstrained_variable", p)
