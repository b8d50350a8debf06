"""Client sampling per round: max(⌈Kρ⌉, 1) clients without replacement (FSGP paper §3.1)."""

from __future__ import annotations

import math
from typing import List, Sequence

import numpy as np

from ...validation import probability


def num_sampled_clients(num_clients: int, client_fraction: float) -> int:
    """``max(⌈Kρ⌉, 1)``, robust to round-off in ``Kρ`` (e.g. ``10 * 0.3`` gives 3, not 4)."""
    validate_client_fraction(client_fraction)
    if num_clients < 1:
        raise ValueError(f"need at least one client, got {num_clients}")
    return max(math.ceil(num_clients * client_fraction - 1e-9), 1)


def validate_client_fraction(client_fraction: float) -> None:
    """Raise ``TypeError`` for a bool (``True`` is not ρ = 1) and ``ValueError`` unless ``0 < ρ ≤ 1``."""
    probability(client_fraction, "client_fraction")


def sample_clients(client_ids: Sequence[str], client_fraction: float, rng: np.random.Generator) -> List[str]:
    """Choose ``max(⌈Kρ⌉, 1)`` distinct clients uniformly at random, returned in their original order."""
    count = num_sampled_clients(len(client_ids), client_fraction)
    if count == len(client_ids):
        return list(client_ids)
    chosen = np.sort(rng.choice(len(client_ids), size=count, replace=False))
    return [client_ids[i] for i in chosen]
