"""The job behind :func:`gpflow_fed.fit` and a table run on Flower: agree the moments, then train in the user's units.

One function, :func:`moments_then_train`, holds the order of the two runs and what is returned; how one run is run
is the caller's (:func:`standardize` and ``fit`` run in process with :func:`gpflow_fed.federated.run`; the Flower
table run, :mod:`gpflow_fed.fitting.flower`, runs them over its grid, each party standardising its own rows):

1. :class:`~gpflow_fed.federated.algorithms.Moments`: each party's column counts, sums and sums of squares, summed
   under the run's protection, give the pooled means and scales (a :class:`~gpflow_fed.data.Standardizer`);
2. the algorithm on the parties' rows standardised with them;
3. the model wrapped to take raw inputs and predict in the target's units (:func:`.methods.in_user_units`), the
   ledger the moments' messages then the training's.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

import numpy as np

from ..data.dataset import FederatedDataset
from ..data.standardize import Standardizer
from ..federated.algorithms.moments import Moments
from ..federated.api import run
from ..federated.engine.options import RunOptions
from ..federated.engine.result import FederatedResult
from ..federated.protection.request import Protection
from ..federated.protocol.algorithm import Algorithm
from ..federated.runtimes.base import Runtime
from .methods import in_user_units

__all__ = ["RunJob", "agreed_moments", "moments_then_train", "standardize"]

#: runs one job of the two: ``run_job(algorithm, standardizer)`` with ``standardizer`` None for the moments run (the
#: parties' rows as they are) and the agreed moments for the training (each party standardises its own rows)
RunJob = Callable[[Algorithm, Optional[Standardizer]], FederatedResult]


def agreed_moments(run_job: RunJob) -> Tuple[FederatedResult, Standardizer]:
    """The moments run and the :class:`~gpflow_fed.data.Standardizer` it agreed."""
    moments = run_job(Moments(), None)
    assert isinstance(moments.algorithm, Moments)  # the run's bound copy
    return moments, moments.algorithm.standardizer(moments.state)


def moments_then_train(
    run_job: RunJob,
    algorithm: Callable[[], Algorithm],
    test: Optional[Tuple[np.ndarray, np.ndarray]],
    what: str,
    report: Optional[Callable[[FederatedResult, Standardizer], None]] = None,
    stacklevel: int = 1,
) -> FederatedResult:
    """The moments run, then the training's algorithm on the standardised rows, returned in the target's units.

    :param run_job: how one run is run (:data:`RunJob`).
    :param algorithm: builds the training's algorithm (configuration; the run binds its own copy), once the moments
        are agreed.
    :param test: the held-out ``(X, Y)`` in raw units for ``result.metrics``, or None.
    :param what: how the over-confidence warning names the model.
    :param report: called with the moments run and the agreed moments before the training starts.
    :param stacklevel: of the over-confidence warning, as :func:`.methods.in_user_units`'s, one frame further out.
    :return: the training's :class:`~gpflow_fed.federated.FederatedResult`, as :func:`.methods.in_user_units` makes
        it.
    """
    moments, scaler = agreed_moments(run_job)
    if report is not None:
        report(moments, scaler)
    result = run_job(algorithm(), scaler)
    return in_user_units(result, moments, scaler, test, what, stacklevel=stacklevel + 1)


def in_process(
    dataset: FederatedDataset,
    *,
    runtime: Optional[Runtime] = None,
    options: Optional[RunOptions] = None,
    protection: Optional[Protection] = None,
    monitor: Optional[Any] = None,
    seed: int = 0,
) -> RunJob:
    """:data:`RunJob` on a runtime of this process: the moments run on ``dataset`` as it is (without ``monitor``),
    the training on ``dataset`` transformed with the agreed moments."""

    def run_job(algorithm: Algorithm, scaler: Optional[Standardizer]) -> FederatedResult:
        if scaler is None:
            return run(algorithm, dataset, runtime=runtime, options=options, protection=protection, seed=seed)
        scaled = dataset.transformed(scaler)
        return run(
            algorithm, scaled, runtime=runtime, options=options, protection=protection, monitor=monitor, seed=seed
        )

    return run_job


def standardize(
    dataset: FederatedDataset,
    *,
    runtime: Optional[Runtime] = None,
    options: Optional[RunOptions] = None,
    protection: Optional[Protection] = None,
    seed: int = 0,
) -> Tuple[FederatedDataset, Standardizer, FederatedResult]:
    """Standardise ``dataset`` with moments agreed in a recorded, protected exchange
    (:class:`~gpflow_fed.federated.algorithms.Moments`): under secure aggregation (the default) the server learns
    only the pooled sums; the exchange is in the returned result's ledger (and DP-accounted when ``protection`` asks
    for DP).

    :return: the standardised dataset (clients and test set), the :class:`~gpflow_fed.data.Standardizer`, and the
        moments run's :class:`~gpflow_fed.federated.FederatedResult` (its ledger, privacy report, and ``model``: the
        predict-the-mean baseline).
    """
    moments, scaler = agreed_moments(
        in_process(dataset, runtime=runtime, options=options, protection=protection, seed=seed)
    )
    return dataset.transformed(scaler), scaler, moments
