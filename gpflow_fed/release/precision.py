r"""Refuse inputs so far from zero, in lengthscales, that float64 computes a stationary kernel in round-off (issue 44).

GPflow computes an isotropic stationary kernel (SquaredExponential, Matérn, RationalQuadratic, …) from
``r² = ‖x/ℓ‖² + ‖x'/ℓ‖² − 2 (x/ℓ)·(x'/ℓ)`` (``gpflow.utilities.ops.square_distance``): three numbers of size
``‖x/ℓ‖²`` whose difference is ``r² = O(1)``. Each carries a rounding of about ``ε‖x/ℓ‖²``, so ``r²`` does too, at
any ``r``: with Unix timestamps (``x ≈ 1.7e9`` s) and ``ℓ = 30`` s, ``‖x/ℓ‖ ≈ 5.7e7`` and the round-off of ``r²`` is
0.1–1, so the owner's kernel matrix is mostly noise. The release then designs Σ for, and verifies the floor on, that
noise, while a reader who subtracts a reference value from the column (a stationary kernel sees only differences)
computes the exact kernel: a record reported at variance 1.000 ξ had an exact posterior variance of 0.37 ξ.
:func:`~gpflow_fed.release.linalg.check_kernel_numerics` (``‖x/ℓ‖ ≤ 1/√ε``, where the round-off reaches 1) only
stops the kernel from being *all* round-off; this module bounds it to what the release's own checks can tell apart.

The bound (:func:`squared_distance_roundoff`). With ``u = ε/2`` the unit round-off and ``m_d = max |x_d/ℓ_d|`` over
every input the release evaluates the kernel at, each of ``Σ_d x_d²``, ``Σ_d x'_d²`` and ``2 Σ_d x_d x'_d`` (D terms)
is rounded by at most ``D·u·Σ_d m_d²``, ``D·u·Σ_d m_d²`` and ``2D·u·Σ_d m_d²``, and their first sum by
``2u·Σ_d m_d²``: in all ``(4D + 2)·u·Σ m_d² = (2D + 1)·ε·Σ_d m_d²``, i.e. ``c = 2D + 1`` (3 for one column). Measured
(GPflow 2.11, one column, 300 points, ``‖x/ℓ‖`` from 1e4 to 5.7e7): ``max |r²_float − r²_exact| = 1.6–2.0·ε‖x/ℓ‖²``.

The tolerance: ρ ≤ :data:`MAX_SQUARED_DISTANCE_ROUNDOFF` = 1e-8 and, when σ² > 0,
``ρ·κ₀ ≤`` :data:`MAX_AMPLIFIED_ROUNDOFF` = 0.01 with ``κ₀ = (tr K + Nσ²)/σ²`` (:func:`amplification`), the bound on
the condition number of ``K + σ²I`` by which a perturbation of K grows in the posterior. Measured with ``release``
(strong method, default θ range, ``ProportionalKernel(SE, 0.5)``, the record in the middle; its exact posterior
variance recomputed on ``X − offset`` and compared with the reported one): a deviation *shows* once it reaches the
floor check's own slack, ``FLOOR_RTOL`` = 1e-6 of the prior variance (also the six digits the CLI prints). It showed at
(ρ where the relative deviation reached 1e-6; N records; records per lengthscale; κ₀):

=========  ===  =====  ======  ==========  ======  =====================
σ²          N   per ℓ  κ₀      shows at ρ  ρ·κ₀    limit, margin
=========  ===  =====  ======  ==========  ======  =====================
1e-2        40    8    4.0e3   3.5e-5      0.14    1e-8, 3500×
1e-2        40    2    4.0e3   4e-5        0.16    1e-8, 4000×
1e-3        40    8    4.0e4   7e-6        0.28    1e-8, 700×
1e-4        40    8    4.0e5   4.8e-6      1.9     1e-8, 480×
1e-4       160   32    1.6e6   6.7e-6      11      6.3e-9, 1070×
1e-6        40    8    4.0e7   7e-7        28      2.5e-10, 2800×
1e-6        40    2    4.0e7   4e-6        160     2.5e-10, 16000×
1e-6       160   32    1.6e8   2.5e-7      40      6.3e-11, 4000×
1e-8        40    8    4.0e9   5.4e-9      22      2.5e-12, 2200×
1e-10       40    8    4.0e11  1e-10       40      2.5e-14, 4000×
=========  ===  =====  ======  ==========  ======  =====================

Matérn 1/2 and 3/2 (σ² = 1e-6, N = 40, 8 per ℓ) deviated less than SE: 1.8e-7 and 7.9e-8 at ρ = 6.7e-6. Below those
points the deviation fell with ρ (e.g. σ² = 1e-2: 7e-10 at ρ = 6.7e-8; σ² = 1e-8: 9e-8 at 6.7e-10); far above them
it reached 13–16 % (ρ ≥ 6e-5 at σ² ≤ 1e-4) and the attacker's −21 % (ρ = 2e-2, ‖x/ℓ‖ = 1.7e7) and 0.63 ξ (ρ = 2,
timestamps, ℓ = 30 s). The plain rule binds for σ² ≳ 1e-4 (where the amplification stays ≈ 0.1–0.3), the amplified
one below; every measured point lies ≥ 480× above the limit in force. In one column the plain rule admits ``‖x/ℓ‖ ≤
3.9e3`` at the smallest lengthscale of the θ range (ℓ/2 by default): years such as 2024 with ℓ ≥ 1.04 years;
timestamps of 1.7e9 s with ℓ ≥ 8.8e5 s (10 days); anything else after subtracting a reference value. Not covered: σ²
= 0 (a deterministic target, κ₀ unbounded), where the release's float64 computation deviates by 1e-8 even without an
offset (the conditioning of K itself) and by 1.6e-6 at ‖x/ℓ‖ = 100 (ρ = 6.7e-12): only the plain rule applies there.

The θ range the release designs Σ over scales the lengthscales (by default ×½ … ×2): every kernel of it is checked,
so the bound holds at its smallest lengthscales too.

Other kernels:

* An **anisotropic** stationary kernel (GPflow's ``Cosine``) uses the difference ``x/ℓ − x'/ℓ`` of the scaled
  inputs, not ``r²``: its round-off is ``ε·m_d`` per column, linear, not squared (measured: 4e-8 at ‖x/ℓ‖ = 5.7e7).
  It is bounded by ``2π·2ε·Σ_d m_d`` (the slope of ``cos(2πd)``) against the same tolerance.
* GPflow's **Periodic** kernel computes ``sin(π(x − x')/p)`` from the difference of the *raw* inputs (exact for two
  values within a factor 2 of each other), not from ``‖x‖²``: there is no cancellation (measured: ``K(X)`` and
  ``K(X − X₀)`` agree bit for bit at ‖x/p‖ = 3e7). Its round-off grows with the spread of the inputs in periods:
  ``4ε·Σ_d (π·spread_d/p_d)/ℓ_d²`` (ℓ of its base kernel), checked against the same tolerance (only a spread of
  ~1e6 periods or more reaches it).
* A **non-stationary** kernel (``Linear``, ``Polynomial``, ``ArcCosine``) computes ``x·x'`` without subtracting two
  large numbers: each entry is rounded to ε of its own size, ``σ²‖x‖‖x'‖``, as at any input. The offset is part of
  such a model (it changes the kernel), not round-off; the ill-conditioning an offset brings (a near rank-one ``K``)
  is the conditioning bound of :func:`~gpflow_fed.release.linalg.check_kernel_numerics`, not this check.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import gpflow
import numpy as np

from .linalg import FLOAT64_EPS, stationary_parts
from .theta import ThetaRange, theta_grid

#: The largest estimated round-off ρ of a stationary kernel's ``r²`` at the release's inputs (module docstring: ≥ 480×
#: below every ρ at which a measured reported floor deviated from the exact one by the floor check's slack, 1e-6).
MAX_SQUARED_DISTANCE_ROUNDOFF = 1e-8
#: The largest ``ρ·κ₀``, κ₀ = (tr K + Nσ²)/σ² (:func:`amplification`; module docstring: the measured deviations
#: reached 1e-6 at ρ·κ₀ ≥ 1.9 wherever σ² ≤ 1e-4).
MAX_AMPLIFIED_ROUNDOFF = 1e-2


def _columns(part: gpflow.kernels.Kernel, width: int) -> np.ndarray:
    """The input columns (indices into X) that ``part`` sees."""
    return np.arange(width)[part.active_dims] if isinstance(part.active_dims, slice) else np.asarray(part.active_dims)


def _per_column(values: np.ndarray, D: int) -> np.ndarray:
    """A parameter (scalar or one per column) as ``[D]``."""
    return np.broadcast_to(np.asarray(values, dtype=np.float64).reshape(-1), (D,))


def squared_distance_roundoff(
    kernel: gpflow.kernels.Kernel, points: Sequence[np.ndarray]
) -> List[Tuple[str, float, List[Tuple[int, float, float, float]]]]:
    r"""The estimated round-off of ``r²`` (or of its analogue) for each stationary or periodic part of ``kernel``.

    :param kernel: the kernel (sums and products are searched, as by
        :func:`~gpflow_fed.release.linalg.stationary_parts`).
    :param points: ``[N_i, D]`` arrays of every input the kernel is evaluated at (X, sensitive inputs, a region's
        corners); one width D.
    :return: per part: its class name, the bound (module docstring, the sum of the columns' terms) and, per column it
        sees, ``(column, m_d, ℓ_d, term_d)`` with ``m_d`` the largest ``|x_d/ℓ_d|`` (Periodic: the spread in
        periods ``spread_d/p_d``, ``ℓ_d`` its period).
    """
    arrays = [np.asarray(p, dtype=np.float64) for p in points if np.asarray(p).size]
    if not arrays:
        return []
    P = np.concatenate([a.reshape(a.shape[0], -1) for a in arrays], axis=0)
    width = P.shape[1]
    magnitude = np.max(np.abs(P), axis=0)
    spread = np.max(P, axis=0) - np.min(P, axis=0)
    found: List[Tuple[str, float, List[Tuple[int, float, float, float]]]] = []
    parts = [kernel, *getattr(kernel, "submodules", ())]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for part in stationary_parts(kernel):
            cols = _columns(part, width)
            ell = _per_column(part.lengthscales.numpy(), cols.size)
            m = magnitude[cols] / ell
            if isinstance(part, gpflow.kernels.IsotropicStationary):
                terms = (2 * cols.size + 1) * FLOAT64_EPS * np.square(m)
            else:  # differences of the scaled inputs (Cosine): linear round-off
                terms = 2 * np.pi * 2 * FLOAT64_EPS * m
            found.append((type(part).__name__, float(np.sum(terms)), list(zip(cols.tolist(), m, ell, terms))))
        for part in parts:
            if not isinstance(part, gpflow.kernels.Periodic):
                continue
            cols = _columns(part, width)
            period = _per_column(part.period.numpy(), cols.size)
            base = _per_column(part.base_kernel.lengthscales.numpy(), cols.size)
            terms = 4 * FLOAT64_EPS * np.pi * (spread[cols] / period) / np.square(base)
            found.append(
                (
                    type(part).__name__,
                    float(np.sum(terms)),
                    list(zip(cols.tolist(), spread[cols] / period, period, terms)),
                )
            )
    return [
        (name, bound, [(int(c), float(m), float(e), float(t)) for c, m, e, t in cols]) for name, bound, cols in found
    ]


def amplification(kernel: gpflow.kernels.Kernel, X: np.ndarray, noise_variance: Optional[float]) -> float:
    r"""``κ₀ = (tr K + Nσ²)/σ²`` at the rows ``X`` (``tr K`` from ``k(x, x)``, which no ``r²`` enters): a bound on the
    condition number of ``K + σ²I``, by which a perturbation of K can grow in the posterior; 0 when σ² is None or 0
    (see :func:`check_input_precision`)."""
    if noise_variance is None or not noise_variance > 0:
        return 0.0
    diag = np.asarray(kernel(np.asarray(X, dtype=np.float64), full_cov=False).numpy(), dtype=np.float64)
    return float((np.sum(diag) + diag.shape[0] * noise_variance) / noise_variance)


def check_input_precision(
    kernels: Sequence[gpflow.kernels.Kernel],
    X: np.ndarray,
    points: Sequence[np.ndarray] = (),
    *,
    noise_variance: Optional[float] = None,
    names: Optional[Sequence[str]] = None,
) -> None:
    r"""Refuse, in one ``ValueError``, inputs at which float64 computes the kernel in round-off beyond the tolerance.

    Refused when, for some kernel of ``kernels`` and some stationary or periodic part, the round-off ρ of ``r²``
    (:func:`squared_distance_roundoff`) exceeds :data:`MAX_SQUARED_DISTANCE_ROUNDOFF`, or ``ρ·κ₀`` exceeds
    :data:`MAX_AMPLIFIED_ROUNDOFF` with ``κ₀`` of the first kernel (:func:`amplification`; module docstring).

    :param kernels: the design kernel first, then every kernel of its θ range (the smallest lengthscales decide).
    :param X: the owner's inputs ``[N, D]``.
    :param points: every other input the release evaluates the kernel at: the sensitive inputs, a region's corners.
    :param noise_variance: σ² of the design (None or 0: the amplified rule does not apply).
    :param names: the columns' names (default ``column 0``, ``column 1``, …).
    :raises ValueError: naming the column(s), their distance from zero in lengthscales and the remedy.
    """
    kernels = list(kernels)
    if not kernels:
        return
    kappa = amplification(kernels[0], X, noise_variance)
    limit = MAX_SQUARED_DISTANCE_ROUNDOFF
    if kappa > 0:
        limit = min(limit, MAX_AMPLIFIED_ROUNDOFF / kappa)
    worst: Dict[Tuple[int, str], Tuple[float, float, float]] = {}
    for kernel in kernels:
        for name, bound, columns in squared_distance_roundoff(kernel, [X, *points]):
            if not bound <= limit:  # name the columns that carry it (at least one has a share ≥ limit/D)
                for col, m, ell, term in columns:
                    if not term <= limit / len(columns):
                        key = (col, name)
                        worst[key] = max(worst.get(key, (0.0, 0.0, 0.0)), (term, m, ell))
    if not worst:
        return
    labels = list(names) if names is not None else None
    found = []
    for (col, name), (term, m, ell) in sorted(worst.items(), key=lambda item: -item[1][0]):
        label = repr(labels[col]) if labels is not None and col < len(labels) else f"column {col}"
        if name == "Periodic":
            found.append(f"{label} ({name}): inputs spanning {m:.3g} periods (p = {ell:.3g}), round-off {term:.2g}")
        else:
            found.append(
                f"{label} ({name}): inputs up to {m:.3g} lengthscales from zero (ℓ = {ell:.3g}), round-off of r² "
                f"about {term:.2g}"
            )
    rule = f"tolerance {MAX_SQUARED_DISTANCE_ROUNDOFF:g}"
    if kappa > 0 and limit < MAX_SQUARED_DISTANCE_ROUNDOFF:
        rule = (
            f"tolerance {limit:.2g}: {MAX_AMPLIFIED_ROUNDOFF:g} over (tr K + Nσ²)/σ² = {kappa:.3g}, by which σ² = "
            f"{noise_variance:.3g} lets round-off of K grow in the posterior"
        )
    remedy = (
        "subtract a reference value from the column (e.g. its first or smallest value) in X, the sensitive inputs and "
        "any region alike: a stationary kernel sees only differences, so the model and its lengthscales are unchanged"
    )
    if any(name == "Periodic" for _, name in worst):
        remedy += "; a periodic part spanning that many periods needs a longer period or fewer rows"
    raise ValueError(
        "the inputs lie too far from zero for float64 to compute the kernel: "
        + "; ".join(found)
        + f" ({rule}; GPflow computes r² = ‖x/ℓ‖² + ‖x'/ℓ‖² − 2(x/ℓ)·(x'/ℓ), whose round-off is about "
        "(2D + 1)·ε·‖x/ℓ‖², so Σ would be designed and the floor checked on rounding noise, issue 44); " + remedy
    )


def region_corners(region: object) -> np.ndarray:
    """``[2·parts, D]`` the lower and upper corners of every box of a region (its grid lies between them), or an
    empty array for a region without boxes."""
    boxes = [region]
    corners = []
    while boxes:
        r = boxes.pop()
        boxes.extend(getattr(r, "regions", ()))
        if hasattr(r, "lower") and hasattr(r, "upper"):
            corners.extend([np.asarray(r.lower, dtype=np.float64), np.asarray(r.upper, dtype=np.float64)])
    return np.asarray(corners, dtype=np.float64) if corners else np.zeros((0, 1))


def range_kernels(
    kernel: gpflow.kernels.Kernel, theta_range: ThetaRange, theta_points: int
) -> "list[gpflow.kernels.Kernel]":
    """The design kernel and every kernel of its θ grid (:func:`~gpflow_fed.release.theta.theta_grid`); an invalid
    range gives the design kernel alone (the release refuses it later, where it always did)."""
    try:
        grid = theta_grid(kernel, theta_range, theta_points)
    except ValueError:
        grid = []
    return [kernel, *(at for _, at in grid)]
