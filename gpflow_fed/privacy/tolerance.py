"""Deprecated alias of :mod:`gpflow_fed.release.tolerance` (see :mod:`gpflow_fed.privacy`)."""

from . import alias_submodule

alias_submodule(__name__)
