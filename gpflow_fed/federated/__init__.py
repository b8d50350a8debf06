"""The federated core, in layers that import only downward:

* :mod:`.protocol`: the contract (:class:`Message`, :class:`Algorithm`, the transport, the ledger, faults);
* :mod:`.protection`: what protects an exchange (a client's :class:`ClientPolicy`, the server's :class:`Protection`,
  secure aggregation, differential privacy, robust aggregation);
* :mod:`.engine`: one run (options, the round loop, the phase owner, a party's endpoint, checkpoints, the result);
* :mod:`.algorithms`: FSGP, PVI, FGP, FedBNR, Recycle, Moments, ... (each an :class:`Algorithm`);
* :mod:`.runtimes`: transports that host the engine (local, ``tf.distribute``, Flower);
* :func:`run` (:mod:`.api`): an algorithm over a federated dataset on a runtime.

Every public name below is imported on first use (PEP 562), so ``import gpflow_fed.federated.protection.secagg``
imports neither TensorFlow nor the layers above it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, List

if TYPE_CHECKING:  # the names, for type checkers
    from ..training.state import SharedState, resolve_path
    from ..training.stopping import Plateau
    from .api import run
    from .engine.factories import register_algorithm_factory
    from .engine.options import RunOptions
    from .engine.result import FederatedResult
    from .protection.distributed_dp import DistributedDP
    from .protection.dp import DifferentialPrivacy, PrivacyAccountant
    from .protection.masking import SecureAggregation
    from .protection.policy import ClientPolicy
    from .protection.reduction import reduce_messages
    from .protection.request import Protection
    from .protection.robust import RobustAggregation
    from .protocol.algorithm import Aggregate, Algorithm, BroadcastRefused, FederationInfo
    from .protocol.client import Client
    from .protocol.faults import ClientUpdateError, FaultPolicy, RoundFailedError
    from .protocol.ledger import Channel, CommunicationLedger, LedgerEntry
    from .protocol.messages import Message, SERVER
    from .protocol.sampling import num_sampled_clients, sample_clients
    from .runtimes.base import Runtime
    from .runtimes.distribute import DistributeRuntime
    from .runtimes.local import LocalRuntime


#: public name -> the module that defines it
_EXPORTS = {
    "Aggregate": ".protocol.algorithm",
    "Algorithm": ".protocol.algorithm",
    "BroadcastRefused": ".protocol.algorithm",
    "FederationInfo": ".protocol.algorithm",
    "Client": ".protocol.client",
    "Channel": ".protocol.ledger",
    "CommunicationLedger": ".protocol.ledger",
    "LedgerEntry": ".protocol.ledger",
    "SERVER": ".protocol.messages",
    "Message": ".protocol.messages",
    "ClientUpdateError": ".protocol.faults",
    "FaultPolicy": ".protocol.faults",
    "RoundFailedError": ".protocol.faults",
    "num_sampled_clients": ".protocol.sampling",
    "sample_clients": ".protocol.sampling",
    "DifferentialPrivacy": ".protection.dp",
    "PrivacyAccountant": ".protection.dp",
    "DistributedDP": ".protection.distributed_dp",
    "RobustAggregation": ".protection.robust",
    "SecureAggregation": ".protection.masking",
    "ClientPolicy": ".protection.policy",
    "Protection": ".protection.request",
    "reduce_messages": ".protection.reduction",
    "RunOptions": ".engine.options",
    "FederatedResult": ".engine.result",
    "register_algorithm_factory": ".engine.factories",
    "Runtime": ".runtimes.base",
    "LocalRuntime": ".runtimes.local",
    "DistributeRuntime": ".runtimes.distribute",
    "run": ".api",
    "SharedState": "..training.state",
    "resolve_path": "..training.state",
    "Plateau": "..training.stopping",
}
_SUBPACKAGES = ("algorithms", "engine", "protection", "protocol", "runtimes")

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
    "FaultPolicy",
    "FederatedResult",
    "FederationInfo",
    "LedgerEntry",
    "LocalRuntime",
    "Message",
    "Plateau",
    "PrivacyAccountant",
    "Protection",
    "RobustAggregation",
    "RoundFailedError",
    "RunOptions",
    "Runtime",
    "SERVER",
    "SecureAggregation",
    "SharedState",
    "algorithms",
    "engine",
    "num_sampled_clients",
    "protection",
    "protocol",
    "reduce_messages",
    "register_algorithm_factory",
    "resolve_path",
    "run",
    "runtimes",
    "sample_clients",
]


def __getattr__(name: str) -> Any:
    """Import ``name``'s module on first use; ``FlowerRuntime`` needs the optional extra ``flower`` (flwr)."""
    if name in _SUBPACKAGES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
        globals()[name] = value
        return value
    if name == "FlowerRuntime":
        try:
            from .runtimes.flower.runtime import FlowerRuntime
        except ImportError as exc:
            raise ImportError(f"FlowerRuntime needs Flower: pip install 'gpflow-fed[flower]' ({exc})") from exc
        return FlowerRuntime
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(__all__))
