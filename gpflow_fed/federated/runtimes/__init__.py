"""Runtimes that execute federated algorithms."""

from .base import Runtime, evaluate_model, make_clients
from .distribute import DistributeRuntime
from ..faults import ClientUpdateError, FaultPolicy, RoundFailedError
from .local import LocalRuntime

__all__ = [
    "ClientUpdateError",
    "DistributeRuntime",
    "FaultPolicy",
    "LocalRuntime",
    "RoundFailedError",
    "Runtime",
    "evaluate_model",
    "make_clients",
]
