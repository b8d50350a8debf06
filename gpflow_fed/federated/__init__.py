"""The federated core: messages, the ledger, clients, the Algorithm protocol, runtimes and ``run``."""

from . import algorithms
from .algorithm import Aggregate, Algorithm, BroadcastRefused, FederationInfo
from .api import run, standardize
from .client import Client
from .factories import register_algorithm_factory
from .ledger import Channel, CommunicationLedger, LedgerEntry
from .messages import SERVER, Message
from .options import RunOptions
from .protection import DifferentialPrivacy, DistributedDP, PrivacyAccountant, RobustAggregation, SecureAggregation
from .protection.policy import ClientPolicy
from .protection.reduction import reduce_messages
from .protection.request import Protection
from .result import FederatedResult
from .runtimes import ClientUpdateError, DistributeRuntime, FaultPolicy, LocalRuntime, RoundFailedError, Runtime
from .sampling import num_sampled_clients, sample_clients
from .state import SharedState, resolve_path
from .stopping import Plateau

__all__ = [
    "Aggregate",
    "Algorithm",
    "BroadcastRefused",
    "Channel",
    "Client",
    "ClientPolicy",
    "ClientUpdateError",
    "CommunicationLedger",
    "DifferentialPrivacy",
    "DistributeRuntime",
    "DistributedDP",
    "FederatedResult",
    "FaultPolicy",
    "FederationInfo",
    "LedgerEntry",
    "LocalRuntime",
    "Message",
    "Plateau",
    "PrivacyAccountant",
    "Protection",
    "RoundFailedError",
    "RobustAggregation",
    "RunOptions",
    "Runtime",
    "SERVER",
    "SecureAggregation",
    "SharedState",
    "algorithms",
    "num_sampled_clients",
    "reduce_messages",
    "register_algorithm_factory",
    "resolve_path",
    "run",
    "sample_clients",
    "standardize",
]


def __getattr__(name: str) -> object:
    """``FlowerRuntime`` is imported on first use: it needs the optional extra ``flower`` (flwr)."""
    if name == "FlowerRuntime":
        try:
            from .runtimes.flower.runtime import FlowerRuntime
        except ImportError as exc:
            raise ImportError(f"FlowerRuntime needs Flower: pip install 'gpflow-fed[flower]' ({exc})") from exc
        return FlowerRuntime
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
