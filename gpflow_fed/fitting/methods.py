"""The methods of :func:`gpflow_fed.fit` (and of a table run on Flower): each one's algorithm and defaults, and how a
run on standardised data is returned in the user's units.

They live in ``federated`` so that both :mod:`gpflow_fed.fitting` and the Flower runtime
(:mod:`~gpflow_fed.federated.runtimes.flower`) use them without an import cycle between the packages; the methods'
names and defaults are plain data in :mod:`gpflow_fed.fitting.defaults`, which the command line reads without
TensorFlow.
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, Tuple

import numpy as np

from .checks import check_settings
from .defaults import DEFAULTS, METHODS

__all__ = ["DEFAULTS", "METHODS", "algorithm", "composed_privacy", "in_user_units"]


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
    :raises TypeError: a setting ``method`` does not take, or of the wrong kind (:func:`.checks.check_settings`).
    :raises ValueError: an unknown method, a setting out of range (:func:`.checks.check_settings`), or a kernel for
        PVI (it learns a distribution over the kernel's hyperparameters).
    """
    if method not in METHODS:
        raise ValueError(f"fit: method must be one of {METHODS}, got {method!r}")
    check_settings(method, settings, "algorithm", ("method", "input_dim", "seed", "kernel"))
    options = {**DEFAULTS[method], **settings}
    if method == "fsgp":
        import gpflow

        from ..federated.algorithms import FSGP

        kernel = kernel or gpflow.kernels.SquaredExponential(lengthscales=np.ones(input_dim))
        return FSGP(kernel, options.pop("num_inducing"), **options)
    if method == "pvi":
        if kernel is not None:
            raise ValueError("fit(method='pvi') uses PVI's own prior over kernel hyperparameters; drop kernel=")
        from ..federated.algorithms.pvi.methods import make_pvi

        variant, rounds, M = options.pop("variant", "dpo"), options.pop("rounds"), options.pop("num_inducing")
        return make_pvi(variant, input_dim, rounds, M, seed, **options)
    from ..federated.algorithms import FedBNR
    from ..kernels import deep_urk

    hidden, num_samples = options.pop("hidden"), options.pop("num_samples")
    kernel = kernel or deep_urk(input_dim, hidden=(hidden,), num_samples=num_samples, seed=seed)
    return FedBNR(kernel, **options)


def in_user_units(
    result: Any, moments: Any, scaler: Any, test: Any = None, what: str = "the model", stacklevel: int = 2
) -> Any:
    """A run on standardised data as :func:`fit` returns it: ``result.model`` a
    :class:`~gpflow_fed.models.StandardizedModel` (raw inputs in, the target's units out), ``result.standardizer``
    the agreed moments, ``result.ledger`` the moments exchange's messages then the training's, ``result.privacy``
    (with DP) every noised release of the data, the moments' and the training's, composed (:func:`composed_privacy`),
    and with a raw ``test`` set ``result.metrics`` in the target's units beside predicting the mean.

    :param result: the training run's :class:`~gpflow_fed.federated.FederatedResult` (changed in place).
    :param moments: the moments run's result (:func:`~gpflow_fed.fitting.standardize`).
    :param scaler: the :class:`~gpflow_fed.data.Standardizer` it agreed.
    :param test: the held-out ``(X, Y)`` in raw units, or None.
    :param what: how the over-confidence warning names the model.
    :warns OverconfidenceWarning: the held-out 90 % interval covers fewer than 70 % of the test points.
    """
    from ..evaluation import OverconfidenceWarning, calibration_message, held_out_metrics, mean_baseline
    from ..federated.protocol.ledger import CommunicationLedger
    from ..models import StandardizedModel

    ledger = CommunicationLedger()  # every byte that left a client: the moments exchange, then the training
    ledger.extend(moments.ledger.entries)
    ledger.extend(result.ledger.entries)
    result.ledger = ledger
    if result.accountant is not None or moments.accountant is not None:
        result.privacy, result.accountant = composed_privacy(moments, result)
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


def composed_privacy(moments: Any, result: Any) -> Tuple[Dict[str, Any], Any]:
    """One accountant for one data set: the moments run's noised releases, then the training's, composed at the
    run's DP settings (both runs share them), as ``result.privacy`` reports them: the accountant's (ε, δ) over every
    release, the phases it covers named by run (``moments/<phase>``, then the training's) and those it does not.

    :param moments: the moments run's :class:`~gpflow_fed.federated.FederatedResult`.
    :param result: the training run's.
    :return: the report and the composed accountant.
    :raises ValueError: the runs used different DP settings.
    """
    from ..federated.engine.loop import with_coverage_warning

    first, second = moments.accountant, result.accountant
    if first is None or second is None:
        raise ValueError("fit: the moments and the training ran under different protection (DP in one run only)")
    accountant = second.after(first)
    earlier, later = moments.privacy or {}, result.privacy or {}
    report: Dict[str, Any] = dict(accountant.report())
    for key in ("phases", "phases_not_covered"):
        report[key] = [f"moments/{p}" for p in earlier.get(key, [])] + list(later.get(key, []))
    return with_coverage_warning(report), accountant
