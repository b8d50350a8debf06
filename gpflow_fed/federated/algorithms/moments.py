"""Federated standardisation as a recorded, protected exchange: the pooled mean and standard deviation of every
input and output column from per-client sums, through the same phase owner as every other algorithm.

Secure aggregation sums fixed-point numbers in a bounded range (``SecureAggregation.fractional_bits``), while a
party's columns can be years (Σ a² ≈ 4·10⁶ N_k) or prices, so the sums are taken on a common power-of-two scale
agreed first. Two exchanges, every client once each, for its columns ``A_k = [X_k, Y_k]`` ``[N_k, L]``:

1. ``"magnitudes"``: ``exponents`` ``[L, B]``, a one-hot row per column marking the binary exponent e of
   ``max_n |a_n|`` (``max |a| < 2^e``, e clipped to [−64, 64], B = 129 buckets). The sum counts, per column, the
   clients whose largest value has each exponent; the server takes the largest exponent with a count ≥ ½ as the
   column's E and broadcasts ``scale = 2^{−E}`` ``[L]``.
2. ``"moments"``: ``count = N_k``, ``sum = Σ_n s a_n`` ``[L]`` and ``sum_squares = Σ_n (s a_n)²`` ``[L]``
   (scaled values lie in [−1, 1]), and the server computes

       N = Σ_k N_k,   m = Σ_k sum_k / (N s),   σ² = (Σ_k sum_squares_k / N − (s m)²) / s²,

   the pooled column means and (population) variances; a zero standard deviation becomes 1. A power of two scales
   exactly, so aggregated in the clear the moments equal those of the raw sums to the bit.

Each message is recorded in the ledger like any other. What the sums reveal: the pooled means and variances (which
the standardised model reveals anyway) and, from the first exchange, how many clients have their largest value of
each column within each power of two. A client with N_k ≤ 2 would give its rows back from its own (count, sum, sum
of squares): its policy refuses to send them in plain, and every masked group must hold at least 3 points
(``min_cohort_data``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping, Optional, Tuple, cast

import numpy as np

from ...data.standardize import Standardizer
from ...models.mean_predictor import MeanPredictor
from ..protocol.algorithm import Aggregate, Algorithm, FederationInfo, ReplySpec
from ..protocol.client import Client
from ..protocol.domain import DataDomain
from ..protocol.messages import Message

__all__ = ["MAGNITUDES_PHASE", "MOMENTS_PHASE", "Moments", "MomentsState"]

#: the exchanges of a moments run: the columns' scales, then the scaled sums
MAGNITUDES_PHASE, MOMENTS_PHASE = "magnitudes", "moments"
#: the binary exponents a column's largest magnitude is placed among (``max |a| < 2^e``)
EXPONENTS = np.arange(-64, 65)


@dataclass(frozen=True)
class MomentsState:
    """The server's state: the columns' scales ``2^{−E}`` after the first exchange, the pooled column means and
    standard deviations after the second."""

    input_dim: int
    output_dim: int
    scale: Optional[np.ndarray] = None
    mean: Optional[np.ndarray] = None
    std: Optional[np.ndarray] = None


class Moments(Algorithm[MomentsState]):
    """Pooled column means and standard deviations of ``[X, Y]`` from the clients' sums (module docstring)."""

    name = "moments"

    def __init__(self) -> None:
        super().__init__(rounds=0)
        self._sizes: Optional[Mapping[str, int]] = None  # the run's registered client sizes (bind)

    def bind(self, info: FederationInfo) -> "Moments":
        """The run's Moments, which knows the registered client sizes its masked count is checked against."""
        bound = super().bind(info)
        assert isinstance(bound, Moments)
        bound._sizes = dict(info.client_sizes)
        return bound

    def final_phases(self) -> Tuple[str, ...]:
        return (MAGNITUDES_PHASE, MOMENTS_PHASE)

    def aggregation(self, phase: str) -> str:
        return "sum"

    def initial_state(self, info: FederationInfo) -> MomentsState:
        return MomentsState(int(info.input_dim), int(info.output_dim))

    def broadcast(self, state: MomentsState, round: int, phase: str) -> Mapping[str, np.ndarray]:
        if phase != MOMENTS_PHASE:
            return {}
        if state.scale is None:
            raise RuntimeError("Moments: the 'moments' exchange needs the scales of a 'magnitudes' exchange")
        return {"scale": state.scale}

    def reply_spec(self, state: MomentsState, round: int, phase: str) -> ReplySpec:
        L = state.input_dim + state.output_dim
        if phase == MAGNITUDES_PHASE:
            return {"exponents": (L, len(EXPONENTS))}
        return {"count": (1,), "sum": (L,), "sum_squares": (L,)}

    def expected_weight(self, phase: str, num_data: int) -> float:
        return float(num_data)

    def min_cohort_data(self, phase: str) -> Optional[int]:
        """3: the count, sum and sum of squares of two numbers give them back (up to order)."""
        return 3

    def client_update(self, client: Client, broadcast: Message) -> Message:
        X, Y = client.data
        A = np.concatenate([np.asarray(X, np.float64), np.asarray(Y, np.float64)], axis=1)
        if broadcast.phase == MAGNITUDES_PHASE:
            if broadcast.arrays:
                raise ValueError("Moments: the 'magnitudes' broadcast carries arrays; it has none")
            return self.reply(client, broadcast, {"exponents": _one_hot_exponents(A)}, weight=float(A.shape[0]))
        if broadcast.phase != MOMENTS_PHASE:
            raise ValueError(f"Moments: unknown phase {broadcast.phase!r}")
        scale = _checked_scale(broadcast.arrays, A.shape[1])
        S = A * scale
        arrays = {"count": np.array([float(A.shape[0])]), "sum": S.sum(axis=0), "sum_squares": (S**2).sum(axis=0)}
        return self.reply(client, broadcast, arrays, weight=float(A.shape[0]))

    def payload_bound(self, broadcast: Message, domain: DataDomain) -> Optional[Mapping[str, float]]:
        """Public bounds of a reply (``Algorithm.payload_bound``): the one-hot exponents ≤ 1; with N = ``domain.rows``
        and ``m = max_j s_j A_j`` (``s`` the broadcast's scales, ``A`` the domain's column bounds), ``count`` ≤ N,
        ``sum`` ≤ N m and ``sum_squares`` ≤ N m². A scale the server made large for a column is refused on these
        numbers before anything is encoded, never clipped (issue 43: a clipped sum swept over the scale gave each
        party's values)."""
        if broadcast.phase == MAGNITUDES_PHASE:
            return {"exponents": 1.0}
        scale = _checked_scale(broadcast.arrays, len(domain.columns))
        with np.errstate(over="ignore", invalid="ignore"):  # float64: beyond its range, inf (refused), not an error
            largest = np.max(np.abs(scale) * domain.columns, initial=0.0)
            N = np.float64(domain.rows)
            return {"count": float(N), "sum": float(N * largest), "sum_squares": float(N * np.square(largest))}

    def check_reply(self, state: Any, phase: str, message: Message, num_data: int) -> Optional[str]:
        """One exponent per column (a one-hot row); a count equal to the registered N_k, non-negative sums of
        squares, and ``(Σa)² ≤ N Σa²`` (Cauchy–Schwarz)."""
        if phase == MAGNITUDES_PHASE:
            return _exponents_fault(message.arrays["exponents"], 1, one_hot=True)
        return _moments_fault(message.arrays, num_data)

    def check_sum(self, state: Any, aggregate: Aggregate) -> Optional[str]:
        tolerance = 1e-6 * len(aggregate.senders)
        if aggregate.phase == MAGNITUDES_PHASE:
            return _exponents_fault(aggregate.arrays["exponents"], len(aggregate.senders), tolerance=tolerance)
        if self._sizes is not None:
            expected = sum(int(self._sizes[c]) for c in aggregate.senders)
            if abs(float(np.asarray(aggregate["count"]).ravel()[0]) - expected) > 0.5 + tolerance:
                return f"its count is not the senders' registered {expected} points"
        return _moments_fault(aggregate.arrays, None, tolerance=tolerance)

    def server_update(self, state: MomentsState, aggregate: Aggregate) -> MomentsState:
        if aggregate.phase == MAGNITUDES_PHASE:
            counts = np.asarray(aggregate["exponents"], np.float64)
            present = counts >= 0.5
            # the largest exponent a client marked (under DP noise: the largest noised count ≥ ½); none: scale 1
            top = np.where(present.any(axis=1), EXPONENTS[::-1][np.argmax(present[:, ::-1], axis=1)], 0)
            return replace(state, scale=np.ldexp(1.0, -top.astype(np.int64)))
        count = float(np.asarray(aggregate["count"])[0])
        if not count > 0:
            raise ValueError("moments: the clients' summed count is not positive (DP noise, or no data)")
        scale = cast(np.ndarray, state.scale)
        scaled_mean = np.asarray(aggregate["sum"], np.float64) / count
        scaled_variance = np.maximum(np.asarray(aggregate["sum_squares"], np.float64) / count - scaled_mean**2, 0.0)
        std = np.sqrt(scaled_variance) / scale
        return replace(state, mean=scaled_mean / scale, std=np.where(std > 0, std, 1.0))

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


def _one_hot_exponents(A: np.ndarray) -> np.ndarray:
    """``[L, B]``: for each column, 1 at the binary exponent e of its largest magnitude (``max |a| < 2^e``)."""
    if not np.all(np.isfinite(A)):
        raise ValueError("Moments: the client's columns hold values that are not finite")
    largest = np.abs(A).max(axis=0) if A.shape[0] else np.zeros(A.shape[1])
    exponents = np.frexp(largest)[1]
    if np.any(exponents > EXPONENTS[-1]):
        raise ValueError(f"Moments: a column holds values of magnitude ≥ 2^{EXPONENTS[-1]}; rescale it first")
    exponents = np.where(largest > 0, np.maximum(exponents, EXPONENTS[0]), EXPONENTS[0])
    one_hot = np.zeros((A.shape[1], len(EXPONENTS)))
    one_hot[np.arange(A.shape[1]), exponents - EXPONENTS[0]] = 1.0
    return one_hot


def _checked_scale(arrays: Mapping[str, np.ndarray], L: int) -> np.ndarray:
    """The broadcast's ``scale``: exactly that array, ``[L]`` powers of two within the exponents' range."""
    if set(arrays) != {"scale"}:
        raise ValueError("Moments: the 'moments' broadcast must carry exactly 'scale'")
    scale = np.asarray(arrays["scale"], np.float64)
    if scale.shape != (L,) or not np.all(np.isfinite(scale)) or np.any(scale <= 0):
        raise ValueError(f"Moments: 'scale' must be {L} positive finite numbers")
    mantissa, exponent = np.frexp(scale)
    if np.any(mantissa != 0.5) or np.any(exponent - 1 < -EXPONENTS[-1]) or np.any(exponent - 1 > -EXPONENTS[0]):
        raise ValueError("Moments: 'scale' must hold powers of two 2^−E with E among the exponents' range")
    return scale


def _exponents_fault(
    exponents: np.ndarray, clients: int, tolerance: float = 0.0, one_hot: bool = False
) -> Optional[str]:
    counts = np.asarray(exponents, np.float64)
    if one_hot and not np.all((counts == 0.0) | (counts == 1.0)):
        return "its exponents are not one-hot"
    if np.any(counts < -0.5 - tolerance) or np.any(np.abs(counts.sum(axis=1) - clients) > 1e-9 + tolerance):
        return "its exponents do not mark one per column and client"
    return None


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
