"""Client: owns its private data, its model copy, its own optimizer and its local state."""

from __future__ import annotations

from typing import Any, Dict, Tuple

import numpy as np


class Client:
    """One party of a federation.

    The client's data never leaves this object: a runtime passes the client to
    :meth:`Algorithm.client_update`, and only the :class:`~gpflow_fed.federated.Message` that method
    returns crosses the channel.

    :param client_id: a stable identifier (``"client_0"``, ...), used as the message sender.
    :param data: the private ``(X_k, Y_k)``, already validated.
    :param seed: this client's seed, derived deterministically from the run's seed.

    Attributes an algorithm may use: ``model`` (the client's GPflow model copy), ``optimizer`` (a fresh
    ``tf_keras`` optimizer, created per client and never deep-copied) and ``state`` (a dict for anything
    else the algorithm keeps between rounds, e.g. PVI factors).
    """

    def __init__(self, client_id: str, data: Tuple[np.ndarray, np.ndarray], seed: int) -> None:
        self.id = client_id
        self._data = data
        self.seed = int(seed)
        self.rng = np.random.default_rng(self.seed)
        self.model: Any = None
        self.optimizer: Any = None
        self.state: Dict[str, Any] = {}

    @property
    def data(self) -> Tuple[np.ndarray, np.ndarray]:
        """The private ``(X_k, Y_k)``; read it only inside the client's own update."""
        return self._data

    @property
    def num_data(self) -> int:
        """N_k."""
        return int(self._data[0].shape[0])

    def __repr__(self) -> str:
        return f"Client(id={self.id!r}, N_k={self.num_data})"
