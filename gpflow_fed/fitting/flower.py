"""A table run on Flower (``gpflow-fed flower server``): :func:`gpflow_fed.fit`'s job over a Flower grid.

* :data:`server_app`: the ServerApp of a table run: the runtime's ServerApp
  (:func:`~gpflow_fed.federated.runtimes.flower.server_app.make_server_app`) with :func:`table_job` (fit's job,
  :func:`gpflow_fed.fitting.job.moments_then_train`, run over the grid) and model saving
  (:func:`~gpflow_fed.models.save_model`);
* the factories every party trusts (declared as entry points in ``setup.cfg``, group
  ``gpflow_fed.algorithm_factories``): :data:`FIT_FACTORY` (fit's methods) and
  :data:`~gpflow_fed.federated.runtimes.flower.records.MOMENTS_FACTORY` (the moments job).


A Flower run config names a registered factory (:mod:`gpflow_fed.federated.engine.factories`); ``"gpflow-fed:fit"``
(:data:`FIT_FACTORY`, registered when this module is imported, as the ServerApp and ClientApp do) builds the
algorithm :func:`gpflow_fed.fit` would: ``method`` (``fsgp``, ``pvi`` or ``fedbnr``) with
:data:`gpflow_fed.fitting.DEFAULTS` updated by the run config's keys of that method (``rounds``, ``local-steps``,
``num-inducing``, ``learning-rate``, …: the defaults' names with ``-`` for ``_``) and the run's ``seed``. Its
inducing inputs and random features need no client data, so every party builds the same algorithm.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, NoReturn, Optional, Tuple

import numpy as np

from .checks import check_settings
from .defaults import DEFAULTS, METHODS
from .methods import algorithm
from ..federated.protocol.algorithm import Algorithm, FederationInfo
from ..data.standardize import Standardizer
from ..federated.algorithms.moments import Moments
from ..federated.engine.factories import register_algorithm_factory
from ..federated.engine.result import FederatedResult
from ..federated.runtimes.flower.app_config import FIT_FACTORY
from ..federated.runtimes.flower.records import MOMENTS_FACTORY
from ..federated.runtimes.flower.server_app import FlowerServer, make_server_app
from ..models.saving import save_model
from .job import moments_then_train

__all__ = [
    "FIT_FACTORY",
    "FitMethod",
    "fit_method",
    "method_settings",
    "moments_algorithm",
    "server_app",
    "table_job",
]


def method_settings(method: str, config: Mapping[str, Any]) -> Dict[str, Any]:
    """``method``'s settings a run config gives: ``{name: value}`` for each key of ``DEFAULTS[method]`` the config
    has (written with ``-``: ``local-steps`` for ``local_steps``).

    :raises ValueError: an unknown method.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    return {name: config[name.replace("_", "-")] for name in DEFAULTS[method] if name.replace("_", "-") in config}


class FitMethod(Algorithm[Any]):
    """``fit``'s algorithm for ``method``, completed when a run binds it to a federation.

    A Flower server holds no data, so the input dimension D that the kernel and the inducing inputs need is known
    only from the parties' descriptions: :meth:`bind` returns ``gpflow_fed.fitting.algorithm(method, D, seed,
    **settings)``, bound. This object is configuration only; every other method refuses until it is bound.

    :param method: one of :data:`~gpflow_fed.fitting.METHODS`.
    :param seed: the run's seed (PVI's initial Z, FedBNR's random features).
    :param settings: overrides of ``DEFAULTS[method]``.
    :raises ValueError: an unknown method or setting, or a setting out of range (a count below 1, ...:
        :func:`.checks.check_settings`; a setting of the wrong kind is its ``ArgumentTypeError``, also a ``TypeError``).
    """

    def __init__(self, method: str, seed: int = 0, **settings: Any) -> None:
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        unknown = sorted(set(settings) - set(DEFAULTS[method]))
        if unknown:
            raise ValueError(f"{method}: unknown settings {unknown}; known: {sorted(DEFAULTS[method])}")
        try:
            check_settings(method, settings)  # e.g. rounds=0 in a run config: refused here, not trained silently
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{method}: {exc}") from None
        super().__init__(rounds=int({**DEFAULTS[method], **settings}["rounds"]))
        self.name = method
        self.method = method
        self.seed = int(seed)
        self.settings = dict(settings)

    def bind(self, info: FederationInfo) -> Algorithm:
        return algorithm(self.method, int(info.input_dim), self.seed, **self.settings).bind(info)

    def _unbound(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError(f"FitMethod({self.method!r}) is configuration only: run it (the run binds it to a federation)")

    initial_state = broadcast = client_update = server_update = result = _unbound


def fit_method(run_config: Mapping[str, Any]) -> FitMethod:
    """The run config's :class:`FitMethod`: ``method`` (default ``fsgp``), its settings (:func:`method_settings`)
    and ``seed`` (default 0)."""
    method = str(run_config.get("method", "fsgp"))
    return FitMethod(method, seed=int(run_config.get("seed", 0)), **method_settings(method, run_config))


register_algorithm_factory(fit_method, name=FIT_FACTORY)


def moments_algorithm(run_config: Mapping[str, Any]) -> Moments:
    """The moments job's algorithm (:data:`~gpflow_fed.federated.runtimes.flower.records.MOMENTS_FACTORY`)."""
    return Moments()


register_algorithm_factory(moments_algorithm, name=MOMENTS_FACTORY)


def table_job(
    run_job: Callable[[Any, Optional[Standardizer]], FederatedResult],
    server: FlowerServer,
    test: Optional[Tuple[np.ndarray, np.ndarray]],
) -> FederatedResult:
    """fit's job over the server's grid (:func:`~gpflow_fed.fitting.job.moments_then_train`): the moments, then the
    server's algorithm on the rows each party standardises itself; the result is :func:`gpflow_fed.fit`'s (its model
    in the target's units, its ledger the moments' messages then the training's) and equals ``fit`` on the same
    parties and seed."""

    def report(moments: FederatedResult, scaler: Standardizer) -> None:
        how = "secure aggregation" if server.protection.secure else "plain sums"
        server.report(
            f"moments agreed ({how}, {moments.seconds:.1f} s); the parties standardise their own rows with them"
        )

    return moments_then_train(run_job, lambda: server.algorithm, test, "the Flower run", report)


#: the ServerApp of a table run (``serverapp = "gpflow_fed.fitting.flower:server_app"``)
server_app = make_server_app(job=table_job, save=save_model)
