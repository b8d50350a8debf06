"""The built-in algorithm factory of a table run on Flower: :func:`gpflow_fed.fit`'s methods from the run config.

A Flower run config names a registered factory (:mod:`gpflow_fed.federated.engine.factories`); ``"gpflow-fed:fit"``
(:data:`FIT_FACTORY`, registered when this module is imported, as the ServerApp and ClientApp do) builds the
algorithm :func:`gpflow_fed.fit` would: ``method`` (``fsgp``, ``pvi`` or ``fedbnr``) with
:data:`gpflow_fed.fitting.DEFAULTS` updated by the run config's keys of that method (``rounds``, ``local-steps``,
``num-inducing``, ``learning-rate``, …: the defaults' names with ``-`` for ``_``) and the run's ``seed``. Its
inducing inputs and random features need no client data, so every party builds the same algorithm.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, NoReturn

from .defaults import DEFAULTS, METHODS
from .methods import algorithm
from ..federated.protocol.algorithm import Algorithm, FederationInfo
from ..federated.engine.factories import register_algorithm_factory

__all__ = ["FIT_FACTORY", "FitMethod", "fit_method", "method_settings"]

#: the registered name of :func:`fit_method`
FIT_FACTORY = "gpflow-fed:fit"


def method_settings(method: str, config: Mapping[str, Any]) -> Dict[str, Any]:
    """``method``'s settings a run config gives: ``{name: value}`` for each key of ``DEFAULTS[method]`` the config
    has (written with ``-``: ``local-steps`` for ``local_steps``).

    :raises ValueError: an unknown method.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    return {name: config[name.replace("_", "-")] for name in DEFAULTS[method] if name.replace("_", "-") in config}


class FitMethod(Algorithm):
    """``fit``'s algorithm for ``method``, completed when a run binds it to a federation.

    A Flower server holds no data, so the input dimension D that the kernel and the inducing inputs need is known
    only from the parties' descriptions: :meth:`bind` returns ``gpflow_fed.fitting.algorithm(method, D, seed,
    **settings)``, bound. This object is configuration only; every other method refuses until it is bound.

    :param method: one of :data:`~gpflow_fed.fitting.METHODS`.
    :param seed: the run's seed (PVI's initial Z, FedBNR's random features).
    :param settings: overrides of ``DEFAULTS[method]``.
    :raises ValueError: an unknown method or setting.
    """

    def __init__(self, method: str, seed: int = 0, **settings: Any) -> None:
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        unknown = sorted(set(settings) - set(DEFAULTS[method]))
        if unknown:
            raise ValueError(f"{method}: unknown settings {unknown}; known: {sorted(DEFAULTS[method])}")
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
