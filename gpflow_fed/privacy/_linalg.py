"""Deprecated alias of :mod:`gpflow_fed.release._linalg` (see :mod:`gpflow_fed.privacy`)."""

from . import alias_submodule

alias_submodule(__name__)
