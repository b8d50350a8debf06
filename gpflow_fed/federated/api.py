"""The public entry point: ``gpflow_fed.federated.run``."""

from __future__ import annotations

from typing import Any, Optional

from ..data.dataset import FederatedDataset
from .protocol.algorithm import Algorithm
from .engine.options import RunOptions
from .protection.request import Protection
from .engine.result import FederatedResult
from .runtimes.base import Runtime
from .runtimes.local import LocalRuntime


def run(
    algorithm: Algorithm,
    dataset: FederatedDataset,
    *,
    runtime: Optional[Runtime] = None,
    options: Optional[RunOptions] = None,
    protection: Optional[Protection] = None,
    monitor: Optional[Any] = None,
    seed: int = 0,
) -> FederatedResult:
    """Run ``algorithm`` over the clients of ``dataset``.

    :param algorithm: e.g. :class:`gpflow_fed.federated.algorithms.FSGP`; it is configuration only (the run binds
        its own copy, so the object is unchanged and can start other runs).
    :param dataset: the clients' private data and an optional test set.
    :param runtime: where clients run; defaults to :class:`LocalRuntime` (one process).
    :param options: how the run is run (:class:`RunOptions`: progress, evaluation, faults, checkpoints); default:
        the runtime's.
    :param protection: the server's protection request (:class:`Protection`: secure aggregation, differential
        privacy, robust aggregation); default: the runtime's.
    :param monitor: a ``gpflow.monitor.Monitor`` (or any callable ``monitor(round, **kwargs)``), called
        after every round with ``history``, ``state`` and ``algorithm``; see :mod:`gpflow_fed.monitor`.
    :param seed: seeds client sampling and every client's randomness (only what may be public: protective
        randomness comes from the operating system).
    :return: the trained model, per-round history and the communication ledger.
    """
    if not isinstance(algorithm, Algorithm):
        raise TypeError(f"algorithm must be a gpflow_fed.federated.Algorithm, got {type(algorithm).__name__}")
    if not isinstance(dataset, FederatedDataset):
        raise TypeError(f"dataset must be a gpflow_fed.data.FederatedDataset, got {type(dataset).__name__}")
    if options is not None and not isinstance(options, RunOptions):
        raise TypeError(f"options must be a RunOptions, got {type(options).__name__}")
    if protection is not None and not isinstance(protection, Protection):
        raise TypeError(f"protection must be a Protection, got {type(protection).__name__}")
    return (runtime or LocalRuntime()).execute(
        algorithm, dataset, options=options, protection=protection, monitor=monitor, seed=seed
    )
