"""Federated standardisation as a recorded, protected exchange: the pooled mean and standard deviation of every
input and output column from per-client sums, through the same phase owner as every other algorithm.

Client k sends, once, for its columns ``A_k = [X_k, Y_k]`` ``[N_k, L]``: ``count = N_k``, ``sum = Σ_n a_n`` ``[L]``
and ``sum_squares = Σ_n a_n²`` ``[L]`` (2L + 1 numbers, independent of N_k). The server learns only their sums under
secure aggregation (the default), noised under DP if the run asks for it, and computes

    N = Σ_k N_k,   m = Σ_k sum_k / N,   s² = Σ_k sum_squares_k / N − m²,

the pooled column means and (population) variances; a zero standard deviation becomes 1. Each client's message is
recorded in the ledger like any other. What the sums reveal: the pooled means and variances, which the standardised
model reveals anyway. A client with N_k ≤ 2 would give its rows back from its own (count, sum, sum of squares): its
policy refuses to send them in plain, and every masked group must hold at least 3 points (``min_cohort_data``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping, Optional, Tuple

import numpy as np

from ...data.dataset import FederatedDataset
from ...data.standardize import Standardizer
from ...models.mean_predictor import MeanPredictor
from ..algorithm import Aggregate, Algorithm, FederationInfo, ReplySpec
from ..client import Client
from ..messages import Message

__all__ = ["MOMENTS_PHASE", "Moments", "MomentsState"]

#: the one exchange of a moments run
MOMENTS_PHASE = "moments"


@dataclass(frozen=True)
class MomentsState:
    """The server's state: the pooled column means and standard deviations once the phase has run."""

    input_dim: int
    output_dim: int
    mean: Optional[np.ndarray] = None
    std: Optional[np.ndarray] = None


class Moments(Algorithm):
    """Pooled column means and standard deviations of ``[X, Y]`` from the clients' sums (module docstring)."""

    name = "moments"

    def __init__(self) -> None:
        super().__init__(rounds=0)

    def final_phases(self) -> Tuple[str, ...]:
        return (MOMENTS_PHASE,)

    def aggregation(self, phase: str) -> str:
        return "sum"

    def initial_state(self, info: FederationInfo) -> MomentsState:
        return MomentsState(int(info.input_dim), int(info.output_dim))

    def broadcast(self, state: MomentsState, round: int, phase: str) -> Mapping[str, np.ndarray]:
        return {}

    def reply_spec(self, state: MomentsState, round: int, phase: str) -> ReplySpec:
        L = state.input_dim + state.output_dim
        return {"count": (1,), "sum": (L,), "sum_squares": (L,)}

    def expected_weight(self, phase: str, num_data: int) -> float:
        return float(num_data)

    def min_cohort_data(self, phase: str) -> Optional[int]:
        """3: the count, sum and sum of squares of two numbers give them back (up to order)."""
        return 3

    def client_update(self, client: Client, broadcast: Message) -> Message:
        X, Y = client.data
        A = np.concatenate([np.asarray(X, np.float64), np.asarray(Y, np.float64)], axis=1)
        arrays = {"count": np.array([float(A.shape[0])]), "sum": A.sum(axis=0), "sum_squares": (A**2).sum(axis=0)}
        return self.reply(client, broadcast, arrays, weight=float(A.shape[0]))

    def check_reply(self, state: Any, phase: str, message: Message, num_data: int) -> Optional[str]:
        """A count equal to the registered N_k, non-negative sums of squares, and ``(Σa)² ≤ N Σa²`` (Cauchy–Schwarz)."""
        return _moments_fault(message.arrays, num_data)

    def check_sum(self, state: Any, aggregate: Aggregate) -> Optional[str]:
        return _moments_fault(aggregate.arrays, None, tolerance=1e-6 * len(aggregate.senders))

    def server_update(self, state: MomentsState, aggregate: Aggregate) -> MomentsState:
        count = float(np.asarray(aggregate["count"])[0])
        if not count > 0:
            raise ValueError("moments: the clients' summed count is not positive (DP noise, or no data)")
        mean = np.asarray(aggregate["sum"], np.float64) / count
        variance = np.maximum(np.asarray(aggregate["sum_squares"], np.float64) / count - mean**2, 0.0)
        std = np.sqrt(variance)
        return replace(state, mean=mean, std=np.where(std > 0, std, 1.0))

    def result(self, state: MomentsState) -> MeanPredictor:
        """The predict-the-mean model of the outputs (the standardisation is :meth:`standardizer`)."""
        mean, std = self._moments(state)
        D = state.input_dim
        return MeanPredictor(mean[D:], std[D:] ** 2)

    def standardizer(self, state: MomentsState) -> Standardizer:
        """The :class:`~gpflow_fed.data.Standardizer` of the pooled columns."""
        mean, std = self._moments(state)
        D = state.input_dim
        return Standardizer(X_mean=mean[:D], X_std=std[:D], Y_mean=mean[D:], Y_std=std[D:])

    @staticmethod
    def _moments(state: MomentsState) -> Tuple[np.ndarray, np.ndarray]:
        if state.mean is None or state.std is None:
            raise ValueError("Moments: the moments phase has not run (use gpflow_fed.federated.run)")
        return state.mean, state.std

    def copy_state(self, state: MomentsState) -> MomentsState:
        return replace(state)


def _moments_fault(arrays: Mapping[str, np.ndarray], num_data: Optional[int], tolerance: float = 0.0) -> Optional[str]:
    count = float(np.asarray(arrays["count"]).ravel()[0])
    if num_data is not None and abs(count - num_data) > 0.5:
        return f"its count differs from its registered {int(num_data)} points"
    squares = np.asarray(arrays["sum_squares"], np.float64)
    sums = np.asarray(arrays["sum"], np.float64)
    scale = 1e-9 * np.maximum(1.0, count * squares) + tolerance
    if np.any(squares < -scale) or np.any(sums**2 > count * squares + scale):
        return "its sums of squares are inconsistent with its sums and count"
    return None


def standardize(dataset: FederatedDataset, result: Any) -> Tuple[FederatedDataset, Standardizer]:
    """``dataset`` standardised with the moments a :class:`Moments` run agreed (``result`` of that run)."""
    scaler = result.algorithm.standardizer(result.state)
    clients = [scaler.transform(X, Y) for X, Y in dataset.clients]
    test = None if dataset.test is None else scaler.transform(*dataset.test)
    names = getattr(dataset, "client_names", None)
    return FederatedDataset(clients=clients, test=test, name=dataset.name, client_names=names), scaler
