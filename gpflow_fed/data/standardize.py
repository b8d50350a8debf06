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
from typing import Sequence, Tuple, overload

import gpflow
import numpy as np
from check_shapes import check_shapes

__all__ = ["Standardizer", "agreed_standardizer", "client_moments", "combine_moments"]

Moments = Tuple[int, np.ndarray, np.ndarray]


@check_shapes("A: [N, L]")
def client_moments(A: np.ndarray) -> Moments:
    """One client's summary ``(N_k, m_k: [L], S_k: [L])`` of its columns (see the module docstring)."""
    A_arr: np.ndarray = np.asarray(A, dtype=gpflow.default_float())
    mean = A_arr.mean(axis=0)
    return int(A_arr.shape[0]), mean, ((A_arr - mean) ** 2).sum(axis=0)


def combine_moments(moments: Sequence[Moments]) -> Tuple[np.ndarray, np.ndarray]:
    """Global ``(mean: [L], std: [L])`` from the clients' ``(N_k, m_k, S_k)``; a zero std becomes 1."""
    if len(moments) == 0:
        raise ValueError("combine_moments needs the summaries of at least one client")
    sizes: np.ndarray = np.array([n for n, _, _ in moments], dtype=gpflow.default_float())
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

    @classmethod
    @check_shapes("X: [N, D]", "Y: [N, P]")
    def from_data(cls, X: np.ndarray, Y: np.ndarray) -> "Standardizer":
        """The column means and (population) standard deviations of arrays held in one place, a zero standard
        deviation replaced by 1 (for federated data use :meth:`FederatedDataset.standardized
        <gpflow_fed.data.FederatedDataset.standardized>`, which never pools the clients' rows)."""

        def moments(A: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
            array: np.ndarray = np.asarray(A, dtype=gpflow.default_float())
            std = array.std(0)
            return array.mean(0), np.where(std > 0, std, 1.0)

        (X_mean, X_std), (Y_mean, Y_std) = moments(X), moments(Y)
        return cls(X_mean=X_mean, X_std=X_std, Y_mean=Y_mean, Y_std=Y_std)

    @overload
    def transform(self, X: np.ndarray) -> np.ndarray: ...
    @overload
    def transform(self, X: np.ndarray, Y: np.ndarray) -> Tuple[np.ndarray, np.ndarray]: ...
    @overload
    def transform(self, X: np.ndarray, Y: "np.ndarray | None") -> "np.ndarray | Tuple[np.ndarray, np.ndarray]": ...

    def transform(self, X: np.ndarray, Y: "np.ndarray | None" = None) -> "np.ndarray | Tuple[np.ndarray, np.ndarray]":
        """Standardise inputs ``X: [N, D]`` to ``(X − μ_X)/σ_X``, and outputs ``Y: [N, P]`` to ``(Y − μ_Y)/σ_Y``
        when given: returns ``X'`` or ``(X', Y')``."""
        X_out = self._scale(X, self.X_mean, self.X_std, "X")
        return X_out if Y is None else (X_out, self._scale(Y, self.Y_mean, self.Y_std, "Y"))

    @overload
    def inverse_transform(self, mean: np.ndarray) -> np.ndarray: ...
    @overload
    def inverse_transform(self, mean: np.ndarray, var: np.ndarray) -> Tuple[np.ndarray, np.ndarray]: ...
    @overload
    def inverse_transform(
        self, mean: np.ndarray, var: "np.ndarray | None"
    ) -> "np.ndarray | Tuple[np.ndarray, np.ndarray]": ...

    def inverse_transform(
        self, mean: np.ndarray, var: "np.ndarray | None" = None
    ) -> "np.ndarray | Tuple[np.ndarray, np.ndarray]":
        """A model's predictions ``[N, P]`` back in the outputs' units: the mean ``μ_Y + σ_Y · mean`` and, when
        given, the variance ``σ_Y² · var``: returns ``mean'`` or ``(mean', var')``."""
        mean_out = self.Y_mean + self.Y_std * self._checked(mean, self.Y_mean, "mean")
        return mean_out if var is None else (mean_out, self.Y_std**2 * self._checked(var, self.Y_mean, "var"))

    @staticmethod
    def _checked(A: np.ndarray, reference: np.ndarray, name: str) -> np.ndarray:
        array: np.ndarray = np.asarray(A, dtype=gpflow.default_float())
        width = int(np.size(reference))
        if array.ndim != 2 or array.shape[1] != width:
            raise ValueError(f"Standardizer: {name} must have shape [N, {width}], got {array.shape}")
        return array

    def _scale(self, A: np.ndarray, mean: np.ndarray, std: np.ndarray, name: str) -> np.ndarray:
        return (self._checked(A, mean, name) - mean) / std


def agreed_standardizer(clients: Sequence[Tuple[np.ndarray, np.ndarray]]) -> "Standardizer":
    """The :class:`Standardizer` every party uses, from each client's ``(N_k, m_k, S_k)`` of ``[X_k, Y_k]``
    (:func:`client_moments`), combined exactly by :func:`combine_moments`; no rows are pooled.

    This is the one place the moments are exchanged (:meth:`FederatedDataset.standardized
    <gpflow_fed.data.FederatedDataset.standardized>`, hence :func:`gpflow_fed.fit` and the command line, call
    it). Today the summaries are combined in plain, outside the run's ledger; the federated core's protected
    exchange (secure aggregation and DP of a recorded "moments" phase) is to replace the plain sum here.

    :param clients: ``[(X_k: [N_k, D], Y_k: [N_k, P])]``.
    """
    if len(clients) == 0:
        raise ValueError("agreed_standardizer needs at least one client")
    D = int(np.shape(clients[0][0])[1])
    mean, std = combine_moments([client_moments(np.concatenate([X, Y], axis=1)) for X, Y in clients])
    return Standardizer(X_mean=mean[:D], X_std=std[:D], Y_mean=mean[D:], Y_std=std[D:])
