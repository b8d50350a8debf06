"""Deprecated alias of :mod:`gpflow_fed.release`, kept for one release after the rename.

``import gpflow_fed.privacy`` and each old submodule (``gpflow_fed.privacy.obfuscation``, ...) warn
``DeprecationWarning`` and give the very same objects as :mod:`gpflow_fed.release`: each old submodule *is* the new
module (its ``sys.modules`` entry is replaced), so private names and ``isinstance`` checks keep working.
"""

from __future__ import annotations

import warnings

from .._aliases import alias_module

from ..release import *  # noqa: F401,F403 -- the alias re-exports the whole public API
from ..release import __all__  # noqa: F401

OLD, NEW = __name__, "gpflow_fed.release"


def alias_submodule(old: str) -> None:
    """Make the module named ``old`` (``gpflow_fed.privacy.<name>``) the module ``gpflow_fed.release.<name>``."""
    alias_module(old, NEW + old[len(OLD) :])


warnings.warn(
    f"{OLD} is deprecated and will be removed in the next release; import {NEW} instead",
    DeprecationWarning,
    stacklevel=2,
)
