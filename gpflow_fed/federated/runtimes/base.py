"""What every runtime shares: the Runtime interface, client construction and seeding, evaluation."""

from __future__ import annotations

import abc
from typing import Any, Dict, List, Optional, Tuple

import gpflow
import numpy as np

from ... import metrics as _metrics
from ...data.dataset import FederatedDataset
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
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    K = dataset.num_clients
    clients = [Client(f"client_{k}", data, client_seed(seed, k, K)) for k, data in enumerate(dataset.clients)]
    return clients, sampling_rng(seed, K)


def evaluate_model(model: gpflow.models.GPModel, test: Tuple[np.ndarray, np.ndarray]) -> Dict[str, float]:
    """``test_rmse``, ``test_mae`` and ``test_nlpd`` (per point) of ``model.predict_y`` on ``test``."""
    X, Y = test
    mean, var = (t.numpy() for t in model.predict_y(X))
    return {
        "test_rmse": _metrics.rmse(Y, mean),
        "test_mae": _metrics.mae(Y, mean),
        "test_nlpd": _metrics.nlpd(Y, mean, var),
    }
