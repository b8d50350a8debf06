"""Mean-field Gaussian factors in natural parameters, for q(Z), q(log β) and their PVI factors.

PVI (docs guide 'PVI') forms each client's cavity ``q / t_k`` and its new factor ``q_new / q_cavity`` by
subtracting natural parameters; a factor's precision may be negative, a distribution's may not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import numpy as np
from check_shapes import check_shapes

MIN_PRECISION = 1e-6
"""Floor for a clipped cavity precision: division can leave a cavity with a non-positive precision."""


@dataclass(frozen=True)
class NaturalGaussian:
    """Per-coordinate natural parameters ``(ν, λ) = (μ/σ², 1/σ²)`` of a mean-field Gaussian (or a factor,
    whose λ may be negative). ``N(0, 1)`` (the priors p̃(Z) and p(log β)) is ``(0, 1)``."""

    nu: np.ndarray
    lam: np.ndarray

    @classmethod
    def from_moments(cls, mean: np.ndarray, var: np.ndarray) -> "NaturalGaussian":
        mean, var = np.asarray(mean, float), np.asarray(var, float)
        if np.any(var <= 0):
            raise ValueError("variances must be positive to convert to natural parameters")
        return cls(mean / var, 1.0 / var)

    @classmethod
    def standard(cls, shape: Tuple[int, ...]) -> "NaturalGaussian":
        """The N(0, 1) prior on every coordinate."""
        return cls(np.zeros(shape), np.ones(shape))

    @classmethod
    def unit(cls, shape: Tuple[int, ...]) -> "NaturalGaussian":
        """The factor t ≡ 1 (zero natural parameters)."""
        return cls(np.zeros(shape), np.zeros(shape))

    def __add__(self, other: "NaturalGaussian") -> "NaturalGaussian":
        return NaturalGaussian(self.nu + other.nu, self.lam + other.lam)

    def __sub__(self, other: "NaturalGaussian") -> "NaturalGaussian":
        return NaturalGaussian(self.nu - other.nu, self.lam - other.lam)

    def scale(self, rho: float) -> "NaturalGaussian":
        return NaturalGaussian(rho * self.nu, rho * self.lam)

    @property
    def is_proper(self) -> bool:
        """True when every precision is positive and finite (a valid distribution)."""
        return bool(np.all(np.isfinite(self.lam)) and np.all(np.isfinite(self.nu)) and np.all(self.lam > 0))

    def moments(self) -> Tuple[np.ndarray, np.ndarray]:
        """``(μ, σ²)``; raises ``ValueError`` if some precision is not positive (an improper distribution)."""
        if not self.is_proper:
            raise ValueError(
                f"improper Gaussian: {int(np.sum(~(self.lam > 0)))} coordinate(s) have non-positive precision "
                "(increase damping or use the sequential schedule)"
            )
        return self.nu / self.lam, 1.0 / self.lam

    def clipped(self, floor: float = MIN_PRECISION) -> Tuple["NaturalGaussian", int]:
        """Clip non-positive precisions to ``floor`` keeping the mean where it is defined (ν set to 0 there);
        returns the clipped distribution and the number of clipped coordinates."""
        bad = ~(self.lam > floor)
        lam = np.where(bad, floor, self.lam)
        nu = np.where(bad, 0.0, self.nu)
        return NaturalGaussian(nu, lam), int(np.sum(bad))


@check_shapes("matrix: [M, M]", "return: [L]")
def pack_lower(matrix: np.ndarray) -> np.ndarray:
    """The lower triangle of a symmetric ``[M, M]`` matrix as ``M(M+1)/2`` numbers (row-major)."""
    return np.asarray(matrix)[np.tril_indices(matrix.shape[0])]


@check_shapes("packed: [L]", "return: [M, M]")
def unpack_lower(packed: np.ndarray, M: int) -> np.ndarray:
    """Inverse of :func:`pack_lower` (returns the symmetric matrix)."""
    out = np.zeros((M, M))
    out[np.tril_indices(M)] = packed
    return out + np.tril(out, -1).T
