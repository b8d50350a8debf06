"""The allow-list of algorithm factories a Flower run config may name.

A Flower run config is written by whoever submits the run, not by the party whose SuperNode executes it, so the
name in its ``algorithm`` key must never be imported or called as such: ``"subprocess:run"`` would run. A party
runs only factories it has registered itself:

* in code it imports, with :func:`register_algorithm_factory` (as ``"module:function"`` by default);
* in modules the party's operator lists in the environment variable ``GPFLOW_FED_ALGORITHM_MODULES``
  (comma-separated; imported once, before the first look-up, so their registrations take effect);
* in installed packages, through the entry-point group ``gpflow_fed.algorithm_factories``.

Anything else raises ``ValueError`` before any module named in the config is imported or anything is called.
"""

from __future__ import annotations

import importlib
import os
from importlib.metadata import entry_points
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

__all__ = [
    "ENTRY_POINT_GROUP",
    "TRUSTED_MODULES_ENV",
    "load_factory",
    "register_algorithm_factory",
    "registered_factories",
]

ENTRY_POINT_GROUP = "gpflow_fed.algorithm_factories"
TRUSTED_MODULES_ENV = "GPFLOW_FED_ALGORITHM_MODULES"

Factory = Callable[[Mapping[str, Any]], Any]
_REGISTRY: Dict[str, Factory] = {}
_imported_trusted = False


def register_algorithm_factory(factory: Optional[Factory] = None, *, name: Optional[str] = None) -> Any:
    """Allow ``factory`` (called with the run config, returning an ``Algorithm``) under ``name``.

    Use as ``@register_algorithm_factory`` or ``register_algorithm_factory(fn, name="mypkg:fsgp")``; the
    default name is ``"<module>:<qualname>"``.

    :raises TypeError: ``factory`` is not callable.
    :raises ValueError: ``name`` already names another factory.
    """

    def register(fn: Factory) -> Factory:
        if not callable(fn):
            raise TypeError(f"an algorithm factory must be callable, got {type(fn).__name__}")
        key = name or f"{fn.__module__}:{fn.__qualname__}"
        if _REGISTRY.get(key, fn) is not fn:
            raise ValueError(f"algorithm factory name {key!r} is already registered for another function")
        _REGISTRY[key] = fn
        return fn

    return register if factory is None else register(factory)


def registered_factories() -> Tuple[str, ...]:
    """The names registered in this process (entry points not included)."""
    return tuple(sorted(_REGISTRY))


def _import_trusted_modules() -> None:
    global _imported_trusted
    if _imported_trusted:
        return
    _imported_trusted = True
    for module in filter(None, (m.strip() for m in os.environ.get(TRUSTED_MODULES_ENV, "").split(","))):
        importlib.import_module(module)


def load_factory(spec: object) -> Factory:
    """The registered factory named ``spec`` (see the module docstring); nothing unregistered is imported.

    :raises TypeError: ``spec`` is not a string.
    :raises ValueError: ``spec`` names no registered factory.
    """
    if not isinstance(spec, str):
        raise TypeError(f"the algorithm factory must be named by a string, got {type(spec).__name__}")
    if spec not in _REGISTRY:
        _import_trusted_modules()
    if spec in _REGISTRY:
        return _REGISTRY[spec]
    for point in entry_points(group=ENTRY_POINT_GROUP):
        if spec in (point.name, point.value):
            return point.load()
    raise ValueError(
        f"{spec!r} is not a registered algorithm factory, so it is neither imported nor called; register it with "
        f"gpflow_fed.federated.register_algorithm_factory in a module this party trusts (listed in "
        f"${TRUSTED_MODULES_ENV}) or as an entry point in the group {ENTRY_POINT_GROUP!r}; registered here: "
        f"{list(registered_factories())}"
    )
