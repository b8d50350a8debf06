"""What bounds a party's data: the numbers from which its payload's public bound is computed.

Secure aggregation sums fixed-point codes in a range ±R that the party's own policy sets. A value beyond it would
have to be clipped, and a clipped sum ``Σ_k clip(v c_k, R)`` swept over a scale v that the server broadcasts (a
kernel variance, a column scale, a parameter value) changes slope exactly where each party saturates: the server
reads every party's entries from the sums alone (issue 43, the twelfth attacker). So a party encodes a phase only
when its algorithm bounds every entry of the reply from public numbers (``Algorithm.payload_bound``): the broadcast
and this :class:`DataDomain`. A bound within the range means no value of the party's data is ever clipped; a bound
beyond it is refused before anything is encoded, on those numbers alone.

The domain is computed from the party's own data (:meth:`DataDomain.of`) and rounded up to powers of two, so the
refusals it decides can tell a server the binary exponent of the largest magnitude of each column (what the
``"magnitudes"`` exchange of :mod:`~gpflow_fed.federated.algorithms.moments` sums anyway) and nothing finer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import numpy as np

__all__ = ["DataDomain", "power_of_two_ceiling"]


def power_of_two_ceiling(values: np.ndarray) -> np.ndarray:
    """The least power of two ``≥ |v|`` for each ``v`` of ``values`` ``[L]`` (0 for 0, ``inf`` for a non-finite value
    or one whose power of two is beyond float64)."""
    magnitude = np.abs(np.asarray(values, dtype=np.float64))
    out = np.zeros_like(magnitude)
    positive = magnitude > 0
    with np.errstate(over="ignore", invalid="ignore"):
        mantissa, exponent = np.frexp(magnitude[positive])  # |v| = m 2^e, 0.5 ≤ m < 1
        out[positive] = np.where(mantissa == 0.5, magnitude[positive], np.ldexp(1.0, exponent))
    out[~np.isfinite(magnitude)] = np.inf
    return out


@dataclass(frozen=True)
class DataDomain:
    """The bounds a party's payload bounds are computed from.

    :param rows: N_k, the party's number of rows (its registered size, public).
    :param inputs: per input column d, a power of two ≥ ``max_n |x_{n,d}|``.
    :param targets: per output column p, a power of two ≥ ``max_n |y_{n,p}|``.
    """

    rows: int
    inputs: Tuple[float, ...]
    targets: Tuple[float, ...]

    @classmethod
    def of(cls, X: np.ndarray, Y: np.ndarray) -> "DataDomain":
        """The domain of the party's data ``(X, Y)`` (``[N, D]``, ``[N, P]``): its row count and each column's largest
        magnitude rounded up to a power of two (:func:`power_of_two_ceiling`; an empty column's bound is 0)."""
        X, Y = np.asarray(X, dtype=np.float64), np.asarray(Y, dtype=np.float64)

        def column_bounds(A: np.ndarray) -> Tuple[float, ...]:
            largest = np.max(np.abs(A), axis=0) if A.shape[0] else np.zeros(A.shape[1])
            return tuple(float(b) for b in power_of_two_ceiling(largest))

        return cls(int(X.shape[0]), column_bounds(X), column_bounds(Y))

    @property
    def columns(self) -> np.ndarray:
        """The bounds of ``[X, Y]``'s columns, inputs first ``[D + P]``."""
        return np.array(self.inputs + self.targets, dtype=np.float64)
