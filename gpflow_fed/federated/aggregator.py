"""Deprecated alias of :mod:`gpflow_fed.federated.protection.reduction` (the server side of the former
``Aggregator``; its client side is :mod:`gpflow_fed.federated.protection.encoder`)."""

from gpflow_fed._aliases import alias_module

alias_module(__name__, "gpflow_fed.federated.protection.reduction")
