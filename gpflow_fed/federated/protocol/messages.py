"""The message: the only thing that crosses from a client to the server (docs guide 'The federated core',
"What leaves a client")."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

import numpy as np

SERVER = "server"


def _frozen_array(value: object, name: str) -> np.ndarray:
    array = np.array(value, copy=True)
    if array.dtype == object:
        raise TypeError(f"payload array {name!r} has dtype object; send numeric arrays only")
    array.setflags(write=False)
    return array


@dataclass(frozen=True)
class Message:
    """A frozen record of named numpy arrays sent between a client and the server.

    :param sender: who sent it (a client id, or ``"server"`` for a broadcast).
    :param round: the communication round (0-based).
    :param phase: which exchange of the round this message belongs to (algorithms may have several).
    :param arrays: the payload; every array is copied and made read-only, so a message cannot alias
        a client's private tensors.
    :param weight: the weight of this message in the server's weighted sum (e.g. ``N_k`` for FedAvg).
    :param metrics: scalar diagnostics that also leave the client (counted by the ledger).
    """

    sender: str
    round: int
    phase: str
    arrays: Mapping[str, np.ndarray]
    weight: float = 1.0
    metrics: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        frozen = {str(k): _frozen_array(v, k) for k, v in dict(self.arrays).items()}
        object.__setattr__(self, "arrays", MappingProxyType(frozen))
        object.__setattr__(self, "metrics", MappingProxyType({str(k): float(v) for k, v in dict(self.metrics).items()}))
        weight = float(self.weight)
        if not np.isfinite(weight) or weight < 0:
            raise ValueError(f"message weight must be finite and non-negative, got {self.weight!r}")
        object.__setattr__(self, "weight", weight)

    @property
    def nbytes(self) -> int:
        """Bytes on the wire: the arrays, the weight and the metrics (8 bytes per scalar)."""
        return int(sum(a.nbytes for a in self.arrays.values()) + 8 + 8 * len(self.metrics))

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]
