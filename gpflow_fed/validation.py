"""Checks of scalar arguments: counts, positive numbers, fractions.

Every helper returns the value as a plain Python ``int`` or ``float`` (so settings stay JSON-able) and names
the argument in its error. A bool is never accepted as a number (``True`` is not a count of 1 or a learning
rate of 1.0). A value of the wrong kind raises :class:`ArgumentTypeError`, which is both a ``TypeError`` and a
``ValueError``; a number out of range raises ``ValueError``.
"""

from __future__ import annotations

from numbers import Integral, Real
from typing import Any, Optional

import numpy as np

__all__ = ["ArgumentTypeError", "integer", "non_negative_float", "positive_float", "probability"]


class ArgumentTypeError(TypeError, ValueError):
    """An argument of the wrong kind (e.g. a bool or a string where a number is expected).

    Both a ``TypeError`` and a ``ValueError``: some callers of the package catch one, some the other.
    """


def _is_bool(value: Any) -> bool:
    return isinstance(value, (bool, np.bool_)) or getattr(value, "dtype", None) == np.bool_


def _count_phrase(minimum: Optional[int]) -> str:
    if minimum is None:
        return "an integer"
    if minimum == 0:
        return "a non-negative integer"
    if minimum == 1:
        return "a positive integer (at least 1)"
    return f"an integer, at least {minimum}"


def integer(value: Any, name: str, minimum: Optional[int] = None) -> int:
    """``value`` as an ``int``: a Python or numpy integer (not a bool), at least ``minimum`` if given.

    :raises ArgumentTypeError: not an integer.
    :raises ValueError: below ``minimum``.
    """
    phrase = _count_phrase(minimum)
    if _is_bool(value) or not isinstance(value, Integral):
        raise ArgumentTypeError(f"{name} must be {phrase}, got {value!r} ({type(value).__name__})")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be {phrase}, got {value!r}")
    return int(value)


def _real(value: Any, name: str) -> float:
    """``float(value)`` for a real scalar (Python, numpy, or a 0-d array or tensor), never a bool."""
    if _is_bool(value):
        raise ArgumentTypeError(f"{name} must be a number, not a bool (got {value!r})")
    if isinstance(value, Real) or (hasattr(value, "__float__") and np.ndim(value) == 0):
        try:
            return float(value)
        except (TypeError, ValueError):  # e.g. a complex 0-d array
            pass
    raise ArgumentTypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")


def positive_float(value: Any, name: str) -> float:
    """``value`` as a ``float`` in ``(0, ∞)``.

    :raises ArgumentTypeError: not a real number.
    :raises ValueError: zero, negative, infinite or NaN.
    """
    v = _real(value, name)
    if not (np.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be positive and finite, got {value!r}")
    return v


def non_negative_float(value: Any, name: str) -> float:
    """``value`` as a ``float`` in ``[0, ∞)``.

    :raises ArgumentTypeError: not a real number.
    :raises ValueError: negative, infinite or NaN.
    """
    v = _real(value, name)
    if not (np.isfinite(v) and v >= 0):
        raise ValueError(f"{name} must be non-negative and finite, got {value!r}")
    return v


def probability(value: Any, name: str, *, include_one: bool = True) -> float:
    """``value`` as a ``float`` in ``(0, 1]`` (or ``(0, 1)`` with ``include_one=False``), e.g. a fraction of
    clients or of data.

    :raises ArgumentTypeError: not a real number.
    :raises ValueError: outside the interval, or NaN.
    """
    interval = "(0, 1]" if include_one else "(0, 1)"
    v = _real(value, name)
    if not (0.0 < v < 1.0 or (include_one and v == 1.0)):
        raise ValueError(f"{name} must lie in {interval}, got {value!r}")
    return v


#: how close (relative to a column's spread, at least 1) a public input may come to a released one
PUBLIC_INPUT_RTOL = 1e-6


def public_inputs_on_released(X_public: np.ndarray, X: np.ndarray, rtol: float = PUBLIC_INPUT_RTOL) -> int:
    """How many rows of ``X_public`` [M, D] sit on a row of ``X`` [N, D] (every column within ``rtol`` times
    ``max(1, the column's spread over both)``).

    A privacy-aware release fits its hyperparameters on public data; public data *at a released input* carries the
    output there (exactly, rounded or re-measured), and the fitted hyperparameters then give it back from the release.
    """
    Xp, Xr = np.asarray(X_public, np.float64), np.asarray(X, np.float64)
    both = np.concatenate([Xp, Xr], axis=0)
    scale = np.maximum(1.0, np.ptp(both, axis=0)) * float(rtol)
    from scipy.spatial import cKDTree

    distance, _ = cKDTree(Xr / scale).query(Xp / scale, k=1, p=np.inf)
    return int(np.sum(distance <= 1.0))
