"""Federated algorithms (each an :class:`~gpflow_fed.federated.Algorithm`)."""

from .fsgp import FSGP, FSGPState, initial_inducing_inputs

__all__: list = ["FSGP", "FSGPState", "initial_inducing_inputs"]
