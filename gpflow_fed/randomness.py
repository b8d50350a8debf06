"""Deprecated alias of :mod:`gpflow_fed.federated.protection.randomness`."""

from gpflow_fed._aliases import alias_module

alias_module(__name__, "gpflow_fed.federated.protection.randomness")
