"""Deprecated alias of :mod:`gpflow_fed.federated.runtimes.flower.server_app`.

Generated Flower apps of earlier versions name this module.
"""

from gpflow_fed._aliases import alias_module

alias_module(__name__, "gpflow_fed.federated.runtimes.flower.server_app")
