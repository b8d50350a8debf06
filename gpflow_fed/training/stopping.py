"""A stopping rule for iterative training: stop when the training objective has reached a plateau.

Guo et al. train FSGP for a fixed T = 5,000 rounds; :class:`Plateau` lets a run stop earlier, once the objective
it reports no longer moves, so that methods are compared at convergence rather than at a fixed budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..validation import integer, positive_float

__all__ = ["Plateau"]


@dataclass(frozen=True)
class Plateau:
    """Stop when the means of the last two windows of ``window`` objective values differ by less than
    ``tolerance`` relative to the earlier one: ``|m₂ − m₁| < tolerance · max(|m₁|, 1e-12)``.

    Window means, not single values, make the rule usable for FedAvg, whose per-round objective (the sampled
    clients' local bounds) is noisy.

    :param window: values per window (≥ 1); the rule needs ``2·window`` values before it can stop.
    :param tolerance: relative change (> 0) below which training stops.
    :raises TypeError: a non-integer window or non-numeric tolerance.
    :raises ValueError: a window < 1 or a tolerance ≤ 0.
    """

    window: int = 50
    tolerance: float = 1e-3

    def __post_init__(self) -> None:
        integer(self.window, "Plateau: window", minimum=1)
        positive_float(self.tolerance, "Plateau: tolerance")

    def reached(self, values: Sequence[float]) -> bool:
        """Whether ``values`` (the objective, oldest first) have reached the plateau.

        :raises ValueError: a non-finite value in the two windows compared.
        """
        if len(values) < 2 * self.window:
            return False
        tail = np.asarray(values[-2 * self.window :], dtype=float)
        if not np.all(np.isfinite(tail)):
            raise ValueError("Plateau: the objective is not finite")
        before, last = tail[: self.window].mean(), tail[self.window :].mean()
        return bool(abs(last - before) < self.tolerance * max(abs(before), 1e-12))
