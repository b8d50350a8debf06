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
:data:`DEFAULTS` for its ``--help``), and :func:`fit` checks its arguments, the table and the parties before it
imports TensorFlow: a missing value, a wrong column, a constant target, too few parties for the protection asked or
a count below 1 (``rounds=0``) is a ``ValueError``, an unknown setting or a value of the wrong kind a ``TypeError``,
in a fraction of a second, naming the parameter to change.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any, Optional, Sequence

from .checks import PARAMETERS
from .defaults import DEFAULTS, METHODS

__all__ = ["DEFAULTS", "METHODS", "fit"]  # and, imported when first used, algorithm, in_user_units and standardize


def __getattr__(name: str) -> Any:
    """``algorithm`` and ``in_user_units`` (:mod:`.methods`) and ``standardize`` (:mod:`.job`), imported when first
    used: this module imports no TensorFlow until then."""
    if name in ("algorithm", "in_user_units"):
        from . import methods

        return getattr(methods, name)
    if name == "standardize":
        from .job import standardize

        return standardize
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
        are agreed first in a recorded, protected exchange (:func:`~gpflow_fed.fitting.standardize`), and its
        messages lead ``result.ledger``.
    :param settings: override :data:`DEFAULTS` (``num_inducing``, ``rounds``, ``local_steps``,
        ``learning_rate``…) and pass the algorithm's own keywords (see :func:`algorithm`).
    :return: the result; ``result.model`` is a :class:`~gpflow_fed.models.StandardizedModel`: raw inputs in,
        predictions (``predict_f``, ``predict_y``, ``predict_log_density``) in the target's units, saved and
        loaded as one file (``result.model.save(path)``). With a test set, ``result.metrics`` holds
        ``test_rmse``, ``test_mae``, ``test_nlpd``, ``test_coverage_90`` (target units), their
        ``*_standardized`` forms, and ``baseline_rmse`` / ``baseline_nlpd`` of predicting the mean
        (:mod:`gpflow_fed.evaluation`). ``result.standardizer`` holds the agreed moments.
    :raises TypeError: before TensorFlow is imported: a setting ``method`` does not take (naming the closest known
        name and the method's settings), or an argument or setting of the wrong kind (:mod:`.checks`:
        :func:`~.checks.check_arguments`, :func:`~.checks.check_settings`).
    :raises ValueError: before anything is trained (and, for a table, before TensorFlow is imported): an unknown method;
        a count below 1 (``rounds``, ``local_steps``, ``num_inducing``…; FedBNR's ``rounds=0`` is its phase 2 alone), a
        non-positive rate or variance, a ``client_fraction`` outside (0, 1], a ``seed`` below 0, a ``test_fraction``
        outside [0, 1), a choice not among the method's, a ``kernel`` for PVI; table input without ``party_column`` and
        ``target``; a table error of :func:`~gpflow_fed.data.split_table` (a missing or non-numeric value, a wrong
        column, a party with fewer than 2 rows, a target with the same value in every row or too small a relative
        spread, :data:`~gpflow_fed.data.tabular.MIN_RELATIVE_STD`); fewer parties than the protection's masked sums need
        (``SecureAggregation.min_cohort``, 2 by default), in all or per round (``client_fraction``); or FSGP's
        ``num_inducing`` not below the training rows (:mod:`.checks`). Each names the parameter to change.
    :warns OverconfidenceWarning: the held-out 90 % interval covers fewer than 70 % of the test points.
    """
    from ..data.tabular import check_target_spread, split_table
    from .checks import check_arguments, check_inducing, check_parties, check_settings, required_cohort

    if not isinstance(method, str) or method not in METHODS:
        raise ValueError(f"fit: method must be one of {METHODS}, got {method!r}")
    try:
        check_arguments(
            method, features=features, test_fraction=test_fraction, kernel=kernel, runtime=runtime,
            protection=protection, monitor=monitor, seed=seed,
        )  # fmt: skip
        check_settings(method, settings, "fit", _PARAMETERS)
    except (TypeError, ValueError) as exc:  # ArgumentTypeError stays one: both a TypeError and a ValueError
        raise type(exc)(f"fit: {exc}") from None
    dataset_module = sys.modules.get("gpflow_fed.data.dataset")  # a FederatedDataset exists only once it is loaded
    given = dataset_module is not None and isinstance(data, dataset_module.FederatedDataset)
    if given:
        if party_column is not None or target is not None or features is not None:
            raise ValueError("fit: party_column/target/features describe a table; a FederatedDataset has its clients")
        parties, decides = tuple(data.names), "the FederatedDataset's clients"
        rows = int(data.num_data)
        try:
            check_target_spread(data.pooled()[1], "Y", {"target": "output Y"})
        except ValueError as exc:
            raise ValueError(f"fit: {exc}") from None
    else:
        if party_column is None or target is None:
            raise ValueError("fit: a table needs party_column= (who holds each row) and target= (the output column)")
        try:
            split = split_table(
                data, party_column=party_column, target=target, features=features, test_fraction=test_fraction,
                seed=seed,
            )  # fmt: skip
        except ValueError as exc:
            raise ValueError(f"fit: {exc}") from None
        parties, decides = split.parties, f"party_column={party_column!r}"
        rows = sum(int(Y.shape[0]) for _, Y in split.clients)
    minimum, reason = required_cohort(protection)
    spelling = {**PARAMETERS, "parties": decides}
    fraction = settings.get("client_fraction") if method != "pvi" else None  # PVI collects: no masked rounds
    try:
        check_parties(parties, minimum, reason, client_fraction=fraction, spelling=spelling)
        if method == "fsgp":
            M = settings.get("num_inducing", DEFAULTS["fsgp"]["num_inducing"])
            check_inducing(M, rows, minimum > 1, spelling)  # minimum 1: no secure aggregation
    except ValueError as exc:
        raise ValueError(f"fit: {exc}") from None

    from ..data.tabular import dataset_from_split
    from .job import in_process, moments_then_train
    from .methods import algorithm

    raw = data if given else dataset_from_split(split)
    run_job = in_process(raw, runtime=runtime, protection=protection, monitor=monitor, seed=seed)

    def training() -> Any:
        return algorithm(method, raw.input_dim, seed, kernel, **settings)

    return moments_then_train(run_job, training, raw.test, f"fit(method={method!r})", stacklevel=3)


#: ``fit``'s own keywords, as an unknown setting's message lists them
_PARAMETERS = tuple(name for name in inspect.signature(fit).parameters if name != "settings")
