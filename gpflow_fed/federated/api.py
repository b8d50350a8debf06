"""The public entry point: ``gpflow_fed.federated.run``."""

from __future__ import annotations

from typing import Any, Optional

from ..data.dataset import FederatedDataset
from .algorithm import Algorithm
from .result import FederatedResult
from .runtimes.base import Runtime
from .runtimes.local import LocalRuntime


def run(
    algorithm: Algorithm,
    dataset: FederatedDataset,
    *,
    runtime: Optional[Runtime] = None,
    monitor: Optional[Any] = None,
    seed: int = 0,
) -> FederatedResult:
    """Run ``algorithm`` over the clients of ``dataset``.

    :param algorithm: e.g. :class:`gpflow_fed.federated.algorithms.FSGP`.
    :param dataset: the clients' private data and an optional test set.
    :param runtime: where clients run; defaults to :class:`LocalRuntime` (one process).
    :param monitor: a ``gpflow.monitor.Monitor`` (or any callable ``monitor(round, **kwargs)``), called
        after every round with ``history``, ``state`` and ``algorithm``; see :mod:`gpflow_fed.monitor`.
    :param seed: seeds client sampling and every client's randomness.
    :return: the trained model, per-round history and the communication ledger.
    """
    if not isinstance(algorithm, Algorithm):
        raise TypeError(f"algorithm must be a gpflow_fed.federated.Algorithm, got {type(algorithm).__name__}")
    if not isinstance(dataset, FederatedDataset):
        raise TypeError(f"dataset must be a gpflow_fed.data.FederatedDataset, got {type(dataset).__name__}")
    return (runtime or LocalRuntime()).execute(algorithm, dataset, monitor=monitor, seed=seed)
