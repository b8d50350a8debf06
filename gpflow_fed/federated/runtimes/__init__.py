"""Runtimes: transports that host the engine's round loop (:mod:`.local`, :mod:`.distribute`, :mod:`.flower`).

Names are imported on first use (PEP 562): ``gpflow_fed.federated.runtimes.flower.commands`` (the command lines of
Flower's processes) imports no TensorFlow.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, List

if TYPE_CHECKING:  # the names, for type checkers
    from .base import Runtime, evaluate_model, make_clients
    from .distribute import DistributeRuntime
    from .local import LocalRuntime

_EXPORTS = {
    "Runtime": ".base",
    "evaluate_model": ".base",
    "make_clients": ".base",
    "DistributeRuntime": ".distribute",
    "LocalRuntime": ".local",
}

__all__ = [
    "DistributeRuntime",
    "LocalRuntime",
    "Runtime",
    "evaluate_model",
    "make_clients",
]


def __getattr__(name: str) -> Any:
    """Import ``name``'s module on first use."""
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(__all__))
