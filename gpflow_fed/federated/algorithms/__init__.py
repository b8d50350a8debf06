"""Federated algorithms (each an :class:`~gpflow_fed.federated.Algorithm`)."""

__all__: list = []
