"""The PVI paper's five-partition synthetic task (paper §6.1, Figs. 1–2; spec §7.3)."""

from __future__ import annotations

import gpflow
import numpy as np

from .dataset import FederatedDataset


def pvi_five_partition_toy(
    num_data: int = 500,
    num_clients: int = 5,
    noise_variance: float = 0.05,
    num_test: int = 200,
    seed: int = 0,
) -> FederatedDataset:
    """A 1-D regression task split into ``num_clients`` contiguous input regions (one per client).

    The paper does not state its generating function, N or noise (spec assumption A16); here
    ``x ~ U(−3, 3)``, ``y = sin(2x) + 0.3 x + ε`` with ``ε ~ N(0, noise_variance)``, and client k holds the
    points of the k-th of ``num_clients`` equal-width input intervals, so the inducing inputs have to spread
    across disjoint regions, the situation of the paper's Fig. 1. Test inputs are uniform on the same domain.

    :raises ValueError: non-positive sizes or noise, or fewer than 2 points per client on average.
    """
    if num_clients < 1 or num_data < 2 * num_clients or num_test < 1:
        raise ValueError("need num_clients ≥ 1, num_data ≥ 2·num_clients and num_test ≥ 1")
    if noise_variance <= 0:
        raise ValueError(f"noise_variance must be positive, got {noise_variance}")
    rng = np.random.default_rng(seed)
    dtype = gpflow.default_float()

    def sample(n: int) -> tuple:
        X = np.sort(rng.uniform(-3.0, 3.0, (n, 1)), axis=0)
        return X.astype(dtype), (np.sin(2 * X) + 0.3 * X + np.sqrt(noise_variance) * rng.standard_normal((n, 1))).astype(dtype)

    X, Y = sample(num_data)
    edges = np.linspace(-3.0, 3.0, num_clients + 1)
    region = np.clip(np.searchsorted(edges, X[:, 0], side="right") - 1, 0, num_clients - 1)
    clients = [(X[region == k], Y[region == k]) for k in range(num_clients)]
    return FederatedDataset(clients, test=sample(num_test), name="pvi-five-partition")
