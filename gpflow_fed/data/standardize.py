"""Federated standardisation: global means and standard deviations from per-client summaries, no pooling.

Each client k summarises a column block ``A_k: [N_k, L]`` by ``(N_k, m_k, S_k)``: its size, column means
``m_k = (1/N_k) Σ_n a_n`` and sums of squared deviations ``S_k = Σ_n (a_n − m_k)²`` (2L + 1 numbers,
independent of N_k). The server combines them exactly (Chan, Golub & LeVeque's pairwise update):

    N = Σ_k N_k,   m = (1/N) Σ_k N_k m_k,   S = Σ_k [S_k + N_k (m_k − m)²],   s = sqrt(S / N),

which equals the mean and (population) standard deviation of the pooled data without forming it, and is
numerically stabler than ``Σ a² / N − m²``. A column with ``s = 0`` is left unscaled (``s`` is set to 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Tuple

import gpflow
import numpy as np
from check_shapes import check_shapes

__all__ = ["Standardizer", "client_moments", "combine_moments"]

Moments = Tuple[int, np.ndarray, np.ndarray]


@check_shapes("A: [N, L]")
def client_moments(A: np.ndarray) -> Moments:
    """One client's summary ``(N_k, m_k: [L], S_k: [L])`` of its columns (see the module docstring)."""
    A_arr = np.asarray(A, dtype=gpflow.default_float())
    mean = A_arr.mean(axis=0)
    return int(A_arr.shape[0]), mean, ((A_arr - mean) ** 2).sum(axis=0)


def combine_moments(moments: Sequence[Moments]) -> Tuple[np.ndarray, np.ndarray]:
    """Global ``(mean: [L], std: [L])`` from the clients' ``(N_k, m_k, S_k)``; a zero std becomes 1."""
    if len(moments) == 0:
        raise ValueError("combine_moments needs the summaries of at least one client")
    sizes = np.array([n for n, _, _ in moments], dtype=gpflow.default_float())
    means = np.stack([m for _, m, _ in moments])
    total = sizes.sum()
    mean = (sizes[:, None] * means).sum(axis=0) / total
    scatter = sum(s for _, _, s in moments) + (sizes[:, None] * (means - mean) ** 2).sum(axis=0)
    std = np.sqrt(scatter / total)
    return mean, np.where(std > 0, std, 1.0)


@dataclass(frozen=True, eq=False)
class Standardizer:
    """Affine maps ``x ↦ (x − μ_X)/σ_X`` and ``y ↦ (y − μ_Y)/σ_Y`` and their inverses for predictions.

    :param X_mean: ``[D]``.
    :param X_std: ``[D]``, positive.
    :param Y_mean: ``[P]``.
    :param Y_std: ``[P]``, positive.
    """

    X_mean: np.ndarray
    X_std: np.ndarray
    Y_mean: np.ndarray
    Y_std: np.ndarray

    @check_shapes("X: [N, D]", "return: [N, D]")
    def transform_X(self, X: np.ndarray) -> np.ndarray:
        """``(X − μ_X)/σ_X``."""
        return (np.asarray(X, dtype=gpflow.default_float()) - self.X_mean) / self.X_std

    @check_shapes("Y: [N, P]", "return: [N, P]")
    def transform_Y(self, Y: np.ndarray) -> np.ndarray:
        """``(Y − μ_Y)/σ_Y``."""
        return (np.asarray(Y, dtype=gpflow.default_float()) - self.Y_mean) / self.Y_std

    @check_shapes("mean: [N, P]", "return: [N, P]")
    def inverse_mean(self, mean: np.ndarray) -> np.ndarray:
        """A predictive mean back in data units: ``μ_Y + σ_Y · mean``."""
        return self.Y_mean + self.Y_std * np.asarray(mean)

    @check_shapes("var: [N, P]", "return: [N, P]")
    def inverse_variance(self, var: np.ndarray) -> np.ndarray:
        """A predictive variance back in data units: ``σ_Y² · var``."""
        return self.Y_std**2 * np.asarray(var)
