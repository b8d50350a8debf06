"""Fixtures shared by the federated tests."""

import numpy as np
import pytest

from gpflow_fed.data import FederatedDataset


@pytest.fixture
def dataset():
    rng = np.random.default_rng(0)
    clients = [(rng.normal(size=(n, 2)), rng.normal(loc=k, size=(n, 1))) for k, n in enumerate([5, 7, 9, 11])]
    return FederatedDataset(clients=clients, test=(rng.normal(size=(6, 2)), rng.normal(size=(6, 1))), name="toy")
