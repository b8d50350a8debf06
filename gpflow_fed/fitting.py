"""``gpflow_fed.fit``: one call from your data to a trained federated model in your units — sugar over
:func:`gpflow_fed.federated.run`.

>>> result = gpflow_fed.fit(df, party_column="hospital", target="los")  # doctest: +SKIP
>>> mean, var = result.model.predict_y(X_raw)  # raw inputs in, the units of "los" out  # doctest: +SKIP
>>> result.model.save("los.npz")  # one file; StandardizedModel.load("los.npz") reads it back  # doctest: +SKIP

is the same as building the :class:`~gpflow_fed.data.FederatedDataset` with
:func:`~gpflow_fed.data.federated_from_table`, standardising it with moments agreed across the parties
(:meth:`FederatedDataset.standardized`), calling ``run(algorithm(method, D), dataset)`` and wrapping the model in
a :class:`~gpflow_fed.models.StandardizedModel`. The command line (``gpflow-fed fsgp/pvi/fedbnr --csv``) builds
its algorithms with the same :func:`algorithm` and :data:`DEFAULTS`, so the same table and seed give the same
model either way.

This module imports no TensorFlow until :func:`fit` or :func:`algorithm` runs (the command line reads
:data:`DEFAULTS` for its ``--help``).
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, Optional, Sequence

import numpy as np

__all__ = ["DEFAULTS", "METHODS", "algorithm", "fit", "in_user_units"]

METHODS = ("fsgp", "pvi", "fedbnr")

#: Every method's default settings, shared by :func:`fit` and the command line, on standardised data. Chosen by
#: ``benchmarks/fit_defaults.py`` (saved run ``benchmarks/results/fit_defaults.json``): the candidate with the
#: lowest mean standardised test NLPD over two real tables (diabetes, concrete; 5 parties; 3 seeds).
#: Z, for FSGP and PVI, needs no client data (FSGP: ``inducing_grid([(-2, 2)] * D, M)``; PVI: N(0, I) draws).
DEFAULTS: Dict[str, Dict[str, Any]] = {
    "fsgp": dict(num_inducing=30, rounds=100, local_steps=3, learning_rate=0.1, noise_variance=0.1),
    "pvi": dict(num_inducing=20, rounds=20, local_steps=500),
    "fedbnr": dict(
        rounds=10, local_steps=10, learning_rate=0.01, num_samples=50, hidden=50, noise_variance=0.5,
        prior_variance=1.0,
    ),
}  # fmt: skip


def algorithm(method: str, input_dim: int, seed: int = 0, kernel: Any = None, **settings: Any) -> Any:
    """The algorithm ``fit`` runs: ``method``'s :data:`DEFAULTS` updated by ``settings``.

    :param method: one of :data:`METHODS`.
    :param input_dim: D of the (standardised) data.
    :param seed: PVI's initial Z draw and FedBNR's random features.
    :param kernel: FSGP: the initial kernel (default squared exponential with unit ARD lengthscales, the FSGP
        paper's θ = 1); FedBNR: a URK (default :func:`~gpflow_fed.kernels.deep_urk` of ``hidden``/``num_samples``).
    :param settings: ``num_inducing`` (M), ``rounds``, ``local_steps``, ``learning_rate``, ``noise_variance``
        and the algorithm's own keywords (FSGP: ``client_fraction``, ``mode``, ``stopping``…; PVI:
        ``variant`` = dpo/cpo/fixed/fedavg, ``patience``…; FedBNR: ``aggregation``, ``protocol``…).
    :raises ValueError: an unknown method, or a kernel for PVI (it learns a distribution over the kernel's
        hyperparameters).
    """
    if method not in METHODS:
        raise ValueError(f"fit: method must be one of {METHODS}, got {method!r}")
    options = {**DEFAULTS[method], **settings}
    if method == "fsgp":
        import gpflow

        from .federated.algorithms import FSGP

        kernel = kernel or gpflow.kernels.SquaredExponential(lengthscales=np.ones(input_dim))
        return FSGP(kernel, options.pop("num_inducing"), **options)
    if method == "pvi":
        if kernel is not None:
            raise ValueError("fit(method='pvi') uses PVI's own prior over kernel hyperparameters; drop kernel=")
        from .federated.algorithms.pvi.methods import make_pvi

        variant, rounds, M = options.pop("variant", "dpo"), options.pop("rounds"), options.pop("num_inducing")
        return make_pvi(variant, input_dim, rounds, M, seed, **options)
    from .federated.algorithms import FedBNR
    from .kernels import deep_urk

    hidden, num_samples = options.pop("hidden"), options.pop("num_samples")
    kernel = kernel or deep_urk(input_dim, hidden=(hidden,), num_samples=num_samples, seed=seed)
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
    runtime: Any = None,
    protection: Any = None,
    monitor: Any = None,
    seed: int = 0,
    **settings: Any,
) -> Any:
    """Train ``method`` on ``data`` and return the :class:`~gpflow_fed.federated.FederatedResult` of
    :func:`~gpflow_fed.federated.run`, its model in your units.

    :param data: a :class:`~gpflow_fed.data.FederatedDataset`, or a table (pandas DataFrame, dict of columns,
        or CSV path) with ``party_column`` naming each row's party.
    :param method: ``"fsgp"`` (FSGP, FedAvg on Titsias bounds; Guo et al., doi:10.1007/978-3-031-13832-4_23),
        ``"pvi"`` (partitioned variational inference with DPO factors; arXiv:1811.11206) or ``"fedbnr"``.
    :param party_column: table input only: the column naming each row's party; :param target: the output column;
        :param features: the input columns (default: all others).
    :param test_fraction: table input only: held-out rows of each party (the shared test set).
    :param kernel: see :func:`algorithm`.
    :param runtime: / :param protection: / :param monitor: / :param seed: passed to
        :func:`~gpflow_fed.federated.run` (``protection``: default secure aggregation). The standardisation's moments
        are agreed first in a recorded, protected exchange (:func:`~gpflow_fed.federated.standardize`), and its
        messages lead ``result.ledger``.
    :param settings: override :data:`DEFAULTS` (``num_inducing``, ``rounds``, ``local_steps``,
        ``learning_rate``…) and pass the algorithm's own keywords (see :func:`algorithm`).
    :return: the result; ``result.model`` is a :class:`~gpflow_fed.models.StandardizedModel`: raw inputs in,
        predictions (``predict_f``, ``predict_y``, ``predict_log_density``) in the target's units, saved and
        loaded as one file (``result.model.save(path)``). With a test set, ``result.metrics`` holds
        ``test_rmse``, ``test_mae``, ``test_nlpd``, ``test_coverage_90`` (target units), their
        ``*_standardized`` forms, and ``baseline_rmse`` / ``baseline_nlpd`` of predicting the mean
        (:mod:`gpflow_fed.evaluation`). ``result.standardizer`` holds the agreed moments.
    :raises ValueError: an unknown method, or table input without ``party_column`` and ``target``.
    :warns OverconfidenceWarning: the held-out 90 % interval covers fewer than 70 % of the test points.
    """
    from .data import FederatedDataset, federated_from_table
    from .federated import run, standardize

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
    dataset, scaler, moments = standardize(raw, runtime=runtime, protection=protection, seed=seed)
    model_algorithm = algorithm(method, dataset.input_dim, seed, kernel, **settings)
    result = run(model_algorithm, dataset, runtime=runtime, protection=protection, monitor=monitor, seed=seed)
    return in_user_units(result, moments, scaler, raw.test, f"fit(method={method!r})", stacklevel=3)


def in_user_units(
    result: Any, moments: Any, scaler: Any, test: Any = None, what: str = "the model", stacklevel: int = 2
) -> Any:
    """A run on standardised data as :func:`fit` returns it: ``result.model`` a
    :class:`~gpflow_fed.models.StandardizedModel` (raw inputs in, the target's units out), ``result.standardizer``
    the agreed moments, ``result.ledger`` the moments exchange's messages then the training's, and with a raw
    ``test`` set ``result.metrics`` in the target's units beside predicting the mean.

    :param result: the training run's :class:`~gpflow_fed.federated.FederatedResult` (changed in place).
    :param moments: the moments run's result (:func:`~gpflow_fed.federated.standardize`).
    :param scaler: the :class:`~gpflow_fed.data.Standardizer` it agreed.
    :param test: the held-out ``(X, Y)`` in raw units, or None.
    :param what: how the over-confidence warning names the model.
    :warns OverconfidenceWarning: the held-out 90 % interval covers fewer than 70 % of the test points.
    """
    from .evaluation import OverconfidenceWarning, calibration_message, held_out_metrics, mean_baseline
    from .federated import CommunicationLedger
    from .models import StandardizedModel

    ledger = CommunicationLedger()  # every byte that left a client: the moments exchange, then the training
    ledger.extend(moments.ledger.entries)
    ledger.extend(result.ledger.entries)
    result.ledger = ledger
    result.model = StandardizedModel(result.model, scaler)
    result.standardizer = scaler
    if test is not None:
        metrics = held_out_metrics(result.model, test, scaler)
        baseline = mean_baseline(test, scaler)
        metrics.update(baseline_rmse=baseline["test_rmse"], baseline_nlpd=baseline["test_nlpd"])
        result.metrics = metrics
        message = calibration_message(metrics, int(test[0].shape[0]), what)
        if message is not None:
            warnings.warn(message, OverconfidenceWarning, stacklevel=stacklevel)
    return result
