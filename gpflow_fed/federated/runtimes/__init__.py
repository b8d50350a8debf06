"""Runtimes that execute federated algorithms."""

from .base import ClientUpdateError, Runtime, evaluate_model, make_clients
from .local import LocalRuntime

__all__ = ["ClientUpdateError", "LocalRuntime", "Runtime", "evaluate_model", "make_clients"]
