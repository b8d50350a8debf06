"""Deprecated alias of :mod:`gpflow_fed.models.experts`."""

from gpflow_fed._aliases import alias_module

alias_module(__name__, "gpflow_fed.models.experts")
