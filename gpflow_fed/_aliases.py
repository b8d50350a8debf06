"""Deprecated module aliases: an old import path that names the module's new home.

A module moved by a refactor leaves a two-line file at its old path::

    from gpflow_fed._aliases import alias_module
    alias_module(__name__, "gpflow_fed.new.home")

Importing the old path then warns ``DeprecationWarning`` once and gives the new module itself (``sys.modules``
maps both names to one object), so every name, private ones included, resolves as before: code, pickled references
and the ``module:qualname`` strings that checkpoints and Flower apps store (``…runtimes.flower_server:app``) keep
working for one release.
"""

from __future__ import annotations

import importlib
import sys
import warnings

__all__ = ["alias_module"]


def alias_module(old: str, new: str) -> None:
    """Make ``old`` (being imported now) an alias of module ``new``, with a ``DeprecationWarning``."""
    warnings.warn(
        f"{old} is deprecated and will be removed in the next release; import {new} instead",
        DeprecationWarning,
        stacklevel=3,
    )
    sys.modules[old] = importlib.import_module(new)
