"""Robust aggregation of "mean" phases: coordinate-wise weighted median or trimmed mean, optional clipping.

A "mean" phase reduces the clients' arrays ``a_k`` to ``Σ_k w_k a_k / Σ_k w_k``, where one client sending
``a_k = 10^6`` (or claiming ``w_k = 10^12``) moves the result arbitrarily. :class:`RobustAggregation`
replaces that mean, for each coordinate separately (Yin et al., "Byzantine-Robust Distributed Learning:
Towards Optimal Statistical Rates", ICML 2018, arXiv:1803.01498: coordinate-wise median and trimmed mean),
by:

1. optionally, clipping each client's deviation from the coordinate-wise median ``m`` (all arrays as one
   vector): ``a_k ← m + (a_k − m) · min(1, C / ‖a_k − m‖₂)``;
2. dropping, for each coordinate, the ``g = ⌊trim · K⌋`` smallest and the ``g`` largest of the K values;
3. reducing the kept values with the clients' weights: their weighted median (``method="median"``) or their
   weighted mean (``method="trimmed_mean"``).

Guarantee: if at most ``g`` clients are malicious, each coordinate of the result lies between the smallest
and the largest honest value of that coordinate, *whatever values and weights the malicious clients send*:
after dropping ``g`` values at each end, every kept value is bounded by honest values on both sides, and any
weighted median or mean of kept values stays between them. The trimming counts clients, not weight: trimming
a fraction of the total weight would let one client that claims a weight of 10^12 hold nearly all of it and
survive any trim. With honest weights (the server checks each claimed weight against the size it registered
for that client), the weighted median also resists any ``m < K / 2`` clients sending extreme values (for equal
weights). So set ``trim`` to the fraction of clients that may be malicious.

"Sum" phases cannot be made robust this way. Their sums are sufficient statistics (e.g. FSGP's
``Σ_k Kuf_k Kfu_k`` and ``Σ_k Kuf_k y_k``): the exact result *is* the total over every client, each client's
term is legitimately different in scale and structure, and a median or trimmed sum would be a different, biased
statistic, not a robust estimate of the same one; under secure aggregation the server sees only the total
anyway. What a server can check there: each client's term against what it can be (finite; a Gram term
``Kuf_k Kfu_k`` symmetric positive semi-definite with every entry at most ``N_k σ_f⁴`` for a kernel bounded
by ``σ_f²``; every entry of ``Kuf_k y_k`` at most ``N_k σ_f² max |y|`` when the targets are bounded, e.g.
standardised), the total against the same bounds with ``Σ_k N_k`` (the only check left under secure
aggregation, where the server sees the total alone), and each client's weight against the size it
registered. Those checks bound how far one client can move the total; they cannot tell a plausible lie from
the truth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ...validation import integer, non_negative_float, positive_float

__all__ = ["METHODS", "RobustAggregation", "weighted_median"]

#: the robust reductions :class:`RobustAggregation` offers
METHODS = ("median", "trimmed_mean")


def weighted_median(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Column-wise weighted median of ``values`` ``[K, P]`` with ``weights`` ``[K, P]`` (non-negative).

    The lower and upper weighted medians ``x_(i)``, ``x_(j)`` (the first sorted values whose cumulative weight
    reaches, resp. exceeds, half the total) averaged: with integer weights this equals ``np.median`` of the
    values repeated by their weights, and with equal weights ``np.median`` itself.

    :raises ValueError: mismatched shapes, or a column with no positive weight.
    """
    values = np.asarray(values, dtype=np.float64)
    weights = np.asarray(weights, dtype=np.float64)
    if values.ndim != 2 or values.shape != weights.shape:
        raise ValueError(f"weighted_median: values {values.shape} and weights {weights.shape} must be the same [K, P]")
    order = np.argsort(values, axis=0, kind="stable")
    sorted_values = np.take_along_axis(values, order, axis=0)
    cumulative = np.cumsum(np.take_along_axis(weights, order, axis=0), axis=0)
    total = cumulative[-1]
    if np.any(~(total > 0)):
        raise ValueError("weighted_median: a coordinate has no positive weight among its values")
    half = total / 2.0
    lower = np.argmax(cumulative >= half, axis=0)
    upper = np.argmax(cumulative > half, axis=0)
    columns = np.arange(values.shape[1])
    return (sorted_values[lower, columns] + sorted_values[upper, columns]) / 2.0


@dataclass(frozen=True)
class RobustAggregation:
    """A robust replacement for the weighted mean of "mean" phases (module docstring for the guarantee).

    :param method: ``"median"`` (coordinate-wise weighted median) or ``"trimmed_mean"`` (coordinate-wise
        weighted mean after trimming).
    :param trim: the fraction of clients that may be malicious, in [0, 0.5): ``⌊trim · K⌋`` values are
        dropped at each end of every coordinate before the weighted median or mean.
    :param clip_norm: C > 0 or ``None``: clip each client's deviation from the coordinate-wise median to L2
        norm C (all arrays together) before trimming.
    :raises ValueError: an unknown method or a setting out of range.
    :raises TypeError: a setting of the wrong type.
    """

    method: str = "median"
    trim: float = 0.1
    clip_norm: Optional[float] = None

    def __post_init__(self) -> None:
        if not isinstance(self.method, str) or self.method not in METHODS:
            raise ValueError(f"RobustAggregation: method must be one of {METHODS}, got {self.method!r}")
        trim = non_negative_float(self.trim, "RobustAggregation: trim")
        if not trim < 0.5:
            raise ValueError(
                f"RobustAggregation: trim must be in [0, 0.5) (a fraction dropped at each end), got {trim}"
            )
        object.__setattr__(self, "trim", trim)
        if self.clip_norm is not None:
            object.__setattr__(self, "clip_norm", positive_float(self.clip_norm, "RobustAggregation: clip_norm"))

    def trimmed(self, num_clients: int) -> int:
        """``g = ⌊trim · K⌋``, the values dropped at each end of each coordinate (at most this many malicious
        clients are tolerated whatever their weights)."""
        num_clients = integer(num_clients, "RobustAggregation: the number of clients", minimum=1)
        return int(math.floor(self.trim * num_clients + 1e-9))

    def reduce(self, arrays: Sequence[Mapping[str, np.ndarray]], weights: Sequence[float]) -> Dict[str, np.ndarray]:
        """The robust aggregate of one "mean" phase.

        :param arrays: one ``{name: array}`` per client, the same names and shapes for all.
        :param weights: ``w_k ≥ 0``, one per client, with a positive total (e.g. the client sizes the server
            registered).
        :return: ``{name: float64 array}`` of the same shapes.
        :raises ValueError: no clients, mismatched lengths, names or shapes, non-finite values, negative or
            non-finite weights, or no positive weight among the kept values of a coordinate.
        """
        names, shapes, stacked = _stack(arrays)
        w = _check_weights(weights, stacked.shape[0])
        if self.clip_norm is not None:
            stacked = _clip_to_median(stacked, self.clip_norm)
        K = stacked.shape[0]
        g = self.trimmed(K)
        order = np.argsort(stacked, axis=0, kind="stable")
        kept = order[g : K - g]
        values = np.take_along_axis(stacked, kept, axis=0)
        kept_weights = w[kept]
        if self.method == "median":
            flat = weighted_median(values, kept_weights)
        else:
            totals = kept_weights.sum(axis=0)
            if np.any(~(totals > 0)):
                raise ValueError("RobustAggregation: after trimming, a coordinate has no client with positive weight")
            flat = (kept_weights * values).sum(axis=0) / totals
        out: Dict[str, np.ndarray] = {}
        offset = 0
        for name, shape in zip(names, shapes):
            size = int(np.prod(shape, dtype=np.int64))
            out[name] = flat[offset : offset + size].reshape(shape)
            offset += size
        return out


def _stack(arrays: Sequence[Mapping[str, np.ndarray]]) -> Tuple[List[str], List[Tuple[int, ...]], np.ndarray]:
    """Each client's arrays, in sorted-name order, as one row of a ``[K, P]`` float64 matrix (validated)."""
    if isinstance(arrays, Mapping) or not len(arrays):
        raise ValueError("RobustAggregation.reduce: arrays must be a non-empty sequence of {name: array} mappings")
    first = arrays[0]
    if not isinstance(first, Mapping) or not first:
        raise ValueError("RobustAggregation.reduce: arrays[0] must be a non-empty {name: array} mapping")
    names = sorted(first)
    shapes = [np.shape(first[n]) for n in names]
    rows = []
    for k, payload in enumerate(arrays):
        if not isinstance(payload, Mapping) or sorted(payload) != names:
            got = sorted(payload) if isinstance(payload, Mapping) else type(payload).__name__
            raise ValueError(f"RobustAggregation.reduce: client {k} sends {got}, expected names {names}")
        parts = []
        for n, shape in zip(names, shapes):
            if np.iscomplexobj(payload[n]):
                raise ValueError(f"RobustAggregation.reduce: client {k}'s {n!r} is complex")
            a = np.asarray(payload[n], dtype=np.float64)
            if a.shape != shape:
                raise ValueError(f"RobustAggregation.reduce: client {k}'s {n!r} has shape {a.shape}, expected {shape}")
            if not np.all(np.isfinite(a)):
                raise ValueError(f"RobustAggregation.reduce: client {k}'s {n!r} has NaN or inf values")
            parts.append(a.ravel())
        rows.append(np.concatenate(parts))
    return names, shapes, np.stack(rows)


def _check_weights(weights: Sequence[float], K: int) -> np.ndarray:
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (K,):
        raise ValueError(f"RobustAggregation.reduce: {K} clients need {K} weights, got shape {w.shape}")
    if not np.all(np.isfinite(w)) or np.any(w < 0) or not w.sum() > 0:
        raise ValueError(f"RobustAggregation.reduce: weights must be finite, ≥ 0 and not all 0, got {w.tolist()[:10]}")
    return w


def _clip_to_median(stacked: np.ndarray, clip_norm: float) -> np.ndarray:
    """Rows of ``stacked`` moved towards the coordinate-wise median until their distance is ≤ ``clip_norm``."""
    center = np.median(stacked, axis=0)
    deviation = stacked - center
    norms = np.sqrt(np.sum(np.square(deviation), axis=1))
    factors = np.where(norms > clip_norm, clip_norm / np.where(norms > 0, norms, 1.0), 1.0)
    return center + deviation * factors[:, None]
