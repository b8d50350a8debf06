"""The job behind :func:`gpflow_fed.fit`: agree the moments across the parties, then train on standardised rows.

:func:`standardize` runs :class:`~gpflow_fed.federated.algorithms.Moments` (each party's column counts, sums and
sums of squares, summed under the run's protection) and standardises every party's rows with the agreed moments.
"""

from __future__ import annotations

from typing import Optional, Tuple

from ..data.dataset import FederatedDataset
from ..data.standardize import Standardizer
from ..federated.algorithms.moments import Moments
from ..federated.algorithms.moments import standardize as apply_moments
from ..federated.api import run
from ..federated.engine.options import RunOptions
from ..federated.engine.result import FederatedResult
from ..federated.protection.request import Protection
from ..federated.runtimes.base import Runtime

__all__ = ["standardize"]


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
    result = run(Moments(), dataset, runtime=runtime, options=options, protection=protection, seed=seed)
    standardized, scaler = apply_moments(dataset, result)
    return standardized, scaler, result
