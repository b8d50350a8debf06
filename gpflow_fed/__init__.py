"""gpflow-fed: federated and privacy-aware Gaussian processes for GPflow 2.

Submodules load on first use (``gpflow_fed.models``, ``from gpflow_fed import federated``), so that
``import gpflow_fed`` and the ``gpflow-fed`` command's ``--help`` do not import TensorFlow. The package's GPflow
dispatch registrations (``Kuu``/``Kuf``, posteriors, ``prior_kl``) are all for its own inducing variables, and
``gpflow_fed.inducing_variables`` loads them with the types, so they are active whenever a type they serve is.
"""

from __future__ import annotations

import importlib
from typing import Any, List

__version__ = "0.1.0"

_SUBMODULES = (
    "baselines",
    "covariances",
    "data",
    "federated",
    "inducing_variables",
    "kernels",
    "likelihoods",
    "metrics",
    "models",
    "monitor",
    "posteriors",
)
#: public functions defined in a submodule and re-exported here: name -> module.
_FUNCTIONS = {"fit": "fitting"}

__all__ = ["__version__", *_SUBMODULES, *_FUNCTIONS]


def __getattr__(name: str) -> Any:
    """Import a submodule on first use (PEP 562); only that one (and what it imports itself)."""
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _FUNCTIONS:
        function = getattr(importlib.import_module(f"{__name__}.{_FUNCTIONS[name]}"), name)
        globals()[name] = function
        return function
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(__all__))
