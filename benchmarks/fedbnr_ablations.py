"""The ablations of FedBNR compared by ``benchmarks/fedbnr.py`` (thesis §3.2.2): kernel learning ∈ {local, avg, kd}
× last layer ∈ {local, global}.

``avg+global`` is FedBNR and ``kd+global`` FedBNR-KD. An ablation that keeps a phase local yields one model
per client (the thesis scores such methods by the mean error of the clients' models on the test set):

* kernel ``"local"``: client c trains its own kernel for ``rounds·local_steps`` Adam steps on its own data
  (a one-client FedBNR run), no aggregation;
* kernel ``"avg"`` / ``"kd"``: FedBNR's phase 1 with that aggregation gives one global kernel;
* last layer ``"local"``: client c's BLR on its own data with its kernel;
* last layer ``"global"``: the exact BLR over every client's data with client c's kernel (FedBNR's phase 2
  with ``rounds=0``: summed statistics).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import gpflow

from gpflow_fed.data import FederatedDataset
from gpflow_fed.federated import LocalRuntime, Protection, run
from gpflow_fed.federated.algorithms import FedBNR
from gpflow_fed.federated.protocol.algorithm import FederationInfo
from gpflow_fed.models import BayesianLinearRegression

__all__ = ["ABLATIONS", "RepeatedFedBNR", "fedbnr_ablation", "last_layers", "learn_kernels", "plain_runtime"]

ABLATIONS = ("local+local", "local+global", "avg+local", "kd+local", "avg+global", "kd+global")


def plain_runtime() -> LocalRuntime:
    """The runtime of a paper reproduction: ``LocalRuntime`` with secure aggregation off, whatever the library's
    default (the thesis aggregates in the clear; masking would change the sums by its fixed-point rounding)."""
    return LocalRuntime(protection=Protection(secure_aggregation=False))


class RepeatedFedBNR(FedBNR):
    """FedBNR for many runs in a row: its runs share one bound copy (``Algorithm.bind``), so the compiled local
    loop and the statistics function are traced once, not once per run. The ablations make one run per client
    (``local+local``) or per kernel (``local+global``); at K = 100, binding and tracing each run took most of
    their time. Sound for runs made one after another: a run's state lives in its clients and its server state,
    and the bound copy's worker model is scratch, loaded before every use.
    """

    _bound: Optional[FedBNR] = None

    def bind(self, info: FederationInfo) -> FedBNR:
        if self._bound is None:
            self._bound = super().bind(info)
        return self._bound

    def start_from(self, model: BayesianLinearRegression) -> None:
        super().start_from(model)
        if self._bound is not None:
            self._bound.start_from(model)


def _variances(model: BayesianLinearRegression) -> Dict[str, float]:
    return {
        "noise_variance": float(model.likelihood.variance.numpy()),
        "prior_variance": float(model.prior_variance.numpy()),
    }


def learn_kernels(
    kernel_learning: str, dataset: FederatedDataset, *, seed: int = 0, **fedbnr_options: Any
) -> List[BayesianLinearRegression]:
    """Phase 1 of an ablation: ``"local"`` gives one trained model per client (no aggregation), ``"avg"`` /
    ``"kd"`` one FedBNR model whose kernel is global. The models carry the learnt kernel, σ² and λ²."""
    options = dict(fedbnr_options)
    if kernel_learning == "local":
        options.pop("aggregation", None)
        options.pop("distillation_data", None)
        algorithm = RepeatedFedBNR(**options)  # one algorithm (one compiled local loop) runs every client alone
        return [
            run(
                algorithm,
                FederatedDataset(clients=[client], name=f"{dataset.name}-client{k}"),
                runtime=plain_runtime(),
                seed=seed,
            ).model
            for k, client in enumerate(dataset.clients)
        ]
    if kernel_learning not in ("avg", "kd"):
        raise ValueError(f"kernel_learning must be 'local', 'avg' or 'kd', got {kernel_learning!r}")
    options["aggregation"] = "fedavg" if kernel_learning == "avg" else "kd"
    return [run(FedBNR(**options), dataset, runtime=plain_runtime(), seed=seed).model]


def last_layers(
    last_layer: str, trained: List[BayesianLinearRegression], dataset: FederatedDataset, *, seed: int = 0
) -> List[BayesianLinearRegression]:
    """Phase 2 of an ablation, for the kernels of :func:`learn_kernels`: ``"local"`` gives client c's BLR on its
    own data; ``"global"`` the exact BLR over every client's data (FedBNR with ``rounds=0``), per kernel."""
    if last_layer == "local":
        source = trained if len(trained) == len(dataset.clients) else trained * len(dataset.clients)
        return [
            BayesianLinearRegression(client, gpflow.utilities.deepcopy(model.kernel), **_variances(model))
            for client, model in zip(dataset.clients, source)
        ]
    if last_layer != "global":
        raise ValueError(f"last_layer must be 'local' or 'global', got {last_layer!r}")
    algorithm = RepeatedFedBNR(gpflow.utilities.deepcopy(trained[0].kernel), rounds=0, **_variances(trained[0]))
    models = []
    for model in trained:  # one algorithm (one compiled statistics function), restarted from each kernel
        algorithm.start_from(model)
        models.append(run(algorithm, dataset, runtime=plain_runtime(), seed=seed).model)
    return models


def fedbnr_ablation(
    name: str, dataset: FederatedDataset, *, seed: int = 0, **fedbnr_options: Any
) -> List[BayesianLinearRegression]:
    """The K client models (or one global model, for ``*+global`` with a global kernel) of an ablation.

    :param name: one of :data:`ABLATIONS`, ``"<kernel learning>+<last layer>"``.
    :param dataset: the federation (its test set is not used).
    :param fedbnr_options: :class:`FedBNR` arguments (``kernel``, ``rounds``, ``local_steps``, ...;
        ``aggregation`` is set from ``name``; ``distillation_data`` and ``alpha`` for ``kd``).
    :raises ValueError: an unknown name.
    """
    if name not in ABLATIONS:
        raise ValueError(f"unknown ablation {name!r}; use one of {ABLATIONS}")
    kernel_learning, last_layer = name.split("+")
    return last_layers(
        last_layer, learn_kernels(kernel_learning, dataset, seed=seed, **fedbnr_options), dataset, seed=seed
    )
