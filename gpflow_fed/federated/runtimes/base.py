"""What every runtime shares: the Runtime interface, client construction and seeding."""

from __future__ import annotations

import abc
from typing import Any, List, Optional, Tuple

import numpy as np

from ...metrics import evaluate_model  # noqa: F401  (the runtimes evaluate with it)
from ...data.dataset import FederatedDataset
from ...validation import integer
from ..algorithm import Algorithm
from ..client import Client
from ..result import FederatedResult


class Runtime(abc.ABC):
    """Executes an :class:`~gpflow_fed.federated.Algorithm` over a :class:`FederatedDataset`."""

    @abc.abstractmethod
    def execute(
        self, algorithm: Algorithm, dataset: FederatedDataset, *, monitor: Optional[Any] = None, seed: int = 0
    ) -> FederatedResult:
        """Run every round and return the result."""


def client_seed(seed: int, index: int, num_clients: int) -> int:
    """Client ``index``'s seed: child ``index + 1`` of ``SeedSequence(seed).spawn(K + 1)``.

    :raises ValueError: ``index`` outside ``[0, K)``.
    """
    if not 0 <= index < num_clients:
        raise ValueError(f"client index {index} is outside [0, {num_clients}); number the parties 0 … K-1")
    return int(np.random.SeedSequence(int(seed)).spawn(num_clients + 1)[index + 1].generate_state(1)[0])


def sampling_rng(seed: int, num_clients: int) -> np.random.Generator:
    """The server's client-sampling RNG: child 0 of ``SeedSequence(seed).spawn(K + 1)``."""
    return np.random.default_rng(np.random.SeedSequence(int(seed)).spawn(num_clients + 1)[0])


def make_clients(dataset: FederatedDataset, seed: int) -> Tuple[List[Client], np.random.Generator]:
    """Build ``Client("client_k")`` objects with seeds derived from ``seed``, and the server's sampling RNG.

    Seeds come from ``numpy.random.SeedSequence(seed).spawn(K + 1)`` (:func:`client_seed`,
    :func:`sampling_rng`), so the same seed gives the same run on every runtime (a Flower party derives its own).
    """
    integer(seed, "seed", minimum=0)
    K = dataset.num_clients
    clients = [Client(f"client_{k}", data, client_seed(seed, k, K)) for k, data in enumerate(dataset.clients)]
    return clients, sampling_rng(seed, K)
