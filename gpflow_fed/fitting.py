"""``gpflow_fed.fit``: one call from your data to a trained federated model — sugar over
:func:`gpflow_fed.federated.run`.

>>> result = gpflow_fed.fit(df, party_column="hospital", target="los")  # doctest: +SKIP
>>> result.metrics["test_rmse"]  # in the units of "los"  # doctest: +SKIP

is the same as building the :class:`~gpflow_fed.data.FederatedDataset` with
:func:`~gpflow_fed.data.federated_from_table`, standardising it (:meth:`FederatedDataset.standardized`), and
calling ``run(FSGP(SquaredExponential(lengthscales=ones(D)), 20), dataset)``; the test metrics are then
reported in the target's own units and the standardizer is kept on the result (``result.standardizer``) to map
new inputs and predictions.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

__all__ = ["fit", "METHODS"]

METHODS = ("fsgp", "pvi", "fedbnr")


def _algorithm(method: str, input_dim: int, num_inducing: int, kernel: Any, seed: int, options: dict) -> Any:
    import gpflow

    if method == "fsgp":
        from .federated.algorithms import FSGP

        kernel = kernel or gpflow.kernels.SquaredExponential(lengthscales=np.ones(input_dim))
        return FSGP(kernel, num_inducing, **options)
    if method == "pvi":
        if kernel is not None:
            raise ValueError("fit(method='pvi') uses PVI's own prior over kernel hyperparameters; drop kernel=")
        from .federated.algorithms.pvi.methods import make_pvi

        return make_pvi(
            options.pop("variant", "dpo"), input_dim, options.pop("rounds", 20), num_inducing, seed, **options
        )
    from .federated.algorithms import FedBNR
    from .kernels import deep_urk

    kernel = kernel or deep_urk(input_dim, hidden=(50,), num_samples=50, seed=seed)
    options = {"noise_variance": 0.5, "prior_variance": 1.0, **options}
    return FedBNR(kernel, **options)


def fit(
    data: Any,
    method: str = "fsgp",
    *,
    party_column: Optional[str] = None,
    target: Optional[str] = None,
    features: Optional[Sequence[str]] = None,
    test_fraction: float = 0.2,
    kernel: Any = None,
    num_inducing: int = 20,
    runtime: Any = None,
    monitor: Any = None,
    seed: int = 0,
    **options: Any,
) -> Any:
    """Train ``method`` on ``data`` with sensible defaults and return the
    :class:`~gpflow_fed.federated.FederatedResult` of :func:`~gpflow_fed.federated.run`.

    :param data: a :class:`~gpflow_fed.data.FederatedDataset`, or a table (pandas DataFrame, dict of columns,
        or CSV path) with ``party_column`` naming each row's party.
    :param method: ``"fsgp"`` (FSGP, FedAvg on Titsias bounds; Guo et al., doi:10.1007/978-3-031-13832-4_23),
        ``"pvi"`` (partitioned variational inference with DPO factors; arXiv:1811.11206) or ``"fedbnr"``.
    :param party_column: table input only: the column naming each row's party; :param target: the output column;
        :param features: the input columns (default: all others).
    :param test_fraction: table input only: held-out rows of each party (the shared test set).
    :param kernel: the initial kernel (default: squared exponential with unit ARD lengthscales for FSGP,
        a deep URK for FedBNR).
    :param num_inducing: M (FSGP: Z spread over the standardised inputs; PVI: M).
    :param runtime: / :param monitor: / :param seed: passed to :func:`~gpflow_fed.federated.run`.
    :param options: the algorithm's own keywords (FSGP: ``rounds``, ``local_steps``, ``learning_rate``,
        ``noise_variance``, ``mode``…; PVI: ``rounds``, ``local_steps``, ``variant`` = dpo/cpo/fixed/fedavg).
    :return: the result; ``result.metrics`` (``test_rmse``, ``test_mae``, ``test_nlpd``) are in the target's
        units and ``result.standardizer`` maps inputs and predictions (the model works in standardised units).
    :raises ValueError: an unknown method, or table input without ``party_column`` and ``target``.
    """
    from .data import FederatedDataset, federated_from_table
    from .federated import run
    from .metrics import evaluate_model

    if method not in METHODS:
        raise ValueError(f"fit: method must be one of {METHODS}, got {method!r}")
    if isinstance(data, FederatedDataset):
        if party_column is not None or target is not None or features is not None:
            raise ValueError("fit: party_column/target/features describe a table; a FederatedDataset has its clients")
        raw = data
    else:
        if party_column is None or target is None:
            raise ValueError("fit: a table needs party_column= (who holds each row) and target= (the output column)")
        raw = federated_from_table(
            data, party_column=party_column, target=target, features=features, test_fraction=test_fraction, seed=seed
        )
    dataset, scaler = raw.standardized()
    algorithm = _algorithm(method, dataset.input_dim, num_inducing, kernel, seed, dict(options))
    result = run(algorithm, dataset, runtime=runtime, monitor=monitor, seed=seed)
    result.standardizer = scaler
    if raw.test is not None:
        result.metrics = evaluate_model(result.model, raw.test, scaler)
    return result
