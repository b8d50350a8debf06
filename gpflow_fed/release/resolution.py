r"""The recording resolution of a target, and the full-rank noise of that size a release adds (issue 44).

A release publishes ``W = Y + Lω`` with ``W − Y`` in range(Σ), of rank r (3 for one sensitive record with the strong
method). A target recorded on a grid of spacing Δ (a CSV with 2 decimals: Δ = 0.01) is knowledge beyond the Gaussian
prior the floor is computed under: enumerating the grid values of r pivot rows and keeping the noise vector ω that
puts every other row on the grid gives all of Y exactly (issue 44, "A target recorded on a coarse grid").

So :func:`~gpflow_fed.models.release` adds, on top of ``Lω``, independent full-rank noise ``τη``, ``η ~ N(0, I_N)``,
with ``τ = Δ`` (:func:`resolution_noise`). Why ``τ = Δ`` suffices: given any ω, row j's offset from the grid,
``(W_j − L_jω − a) mod Δ = (τη_j) mod Δ``, has the density of a Gaussian of sd τ wrapped on a circle of length Δ, which
by Poisson summation is ``(1/Δ)(1 + 2Σ_{k≥1} exp(−2π²k²τ²/Δ²) cos(2πkx/Δ))``: at τ = Δ the relative ripple is
``2·exp(−2π²) ≈ 5.4e-9`` per row, so whether a candidate ω puts the rows on the grid is the same for every ω to
that precision, and the grid no longer selects candidates (measured: the attack that recovered Y exactly finds no
candidate, ``tests/release/test_resolution.py``). τ = Δ/2 would leave a ripple of 2·exp(−π²/2) ≈ 1.4e-2 per row,
which over N rows accumulates into a likelihood that can still rank candidates.

What :func:`recording_resolution` finds (τ, issue 44's third attacker broke a first version that asked every record
to share one grid: an offset of 1e9, one off-grid record, or one record with more decimals gave τ = 0 or a τ far
below the records' grid, and the lattice attack gave Y back):

* **The precision floor** (:func:`precision_floor`): the finest decimal step ``10^-k`` that can be told from round-off
  at the data's magnitude (``ROUNDOFF_ULPS`` ulps of ``max|Y|`` are at most ``MAX_ROUNDOFF_FRACTION`` of a step;
  the release computes it from ``max_j(|W₀_j| + 6·√Σ_jj)``, ``W₀ = Y + Lω`` before the resolution noise, so that
  it publishes nothing of Y beyond W₀ and Σ). A target stored as float32 (at least 3 values exactly float32 that are
  not short decimals) has float32's round-off (:func:`storage_roundoff`): its binary grid and a decimal grid passed
  through float32 are then covered (a fresh attacker's lattice attack gave a float32 target back bit-exactly).
  Whether Y lies on a finer grid (a float64 value is on the grid of its own ulps) cannot be tested, so τ is never
  below the floor: 1e-11 for data of magnitude 1 (far below any noise a release designs), 0.01 near 1e9.
  Full-precision records get the floor (1e-10 for 5,000 standard normal draws, magnitude ≈ 4).
* **Grids shared by groups of records**: for each level ``10^-k`` from about twice Y's standard deviation down to the
  floor, the records whose differences are multiples of ``10^-k`` form groups; a group's spacing is ``g·10^-k`` (g
  the gcd of its grid counts). A group counts when it holds at least :data:`MIN_GROUP_ROWS` records and as large a
  group is unlikely (below :data:`CHANCE_PROBABILITY`) under the structure already found at finer levels (the
  records uniform on their nearest counting ancestor's grid, or continuous). τ is the largest spacing that counts.
  So one off-grid record, a minority recorded with more decimals, or records recorded as integers among 2-decimal
  ones no longer hide the grid: the lattice attack needs only r + 1 records on a known grid, the rest it treats as
  unknowns.

Where no decimal grid counts, the same is done at binary levels ``2^-k`` (a float32 reading shifted or scaled in
float64, ``C + 273.15``: no value is float32, but the differences are on its grid; a fifth fresh attacker's LLL gave
such a target back bit-exactly when only decimal levels were read).

Found: decimal grids (0.01), half-steps (0.5), integers (1, or 10 for multiples of 10), affine images of a decimal
grid (``1.8·C + 32`` with C to 0.1: 0.18), any of these at a large offset, and a subset of records on a coarser grid
than the rest. A grid that is not a decimal fraction (thirds, 1/7) is found only as a coarser decimal one when it
exists (thirds with integer parts: 1) or not at all: declare it (``release(resolution=...)``). A grid shared by a few
records *by chance* is not knowledge an attacker has and is not counted; a grid an attacker knows from elsewhere
that the data do not show (a protocol saying "site B rounds to integers" for a handful of records among many) must
be declared.
"""

from __future__ import annotations

import math
from functools import reduce
from typing import Callable, List, Optional

import gpflow
import numpy as np
from scipy.stats import poisson

from .. import randomness

__all__ = [
    "CHANCE_PROBABILITY",
    "FLOAT32_ULPS",
    "FLOAT64_ROUNDOFF",
    "MAX_RESOLUTION",
    "MAX_ROUNDOFF_FRACTION",
    "MIN_GROUP_ROWS",
    "RESOLUTION_TEST_ENTROPY",
    "SHORT_DECIMALS",
    "ROUNDOFF_ULPS",
    "check_resolution",
    "precision_floor",
    "storage_roundoff",
    "recording_resolution",
    "resolution_noise",
]

#: A difference of two records times 10^k is an integer when within this many float64 ulps of the data's magnitude
#: (times 10^k): a value read from text is within ½ ulp, one computed by an affine map (``1.8·C + 32``) within ≈ 2.
ROUNDOFF_ULPS = 16
#: The same for a target stored as float32 (or passed through it): each value is within ½ float32 ulp of what was
#: recorded, a difference within 1 (:func:`storage_roundoff`).
FLOAT32_ULPS = 2
#: Values equal to themselves rounded to this many decimals are short decimals (20.25), float32 by coincidence.
SHORT_DECIMALS = 6
#: The round-off allowance must stay below this fraction of one grid step, else 10^-k cannot be told apart from
#: round-off at the data's magnitude (part of the precision floor, module docstring).
MAX_ROUNDOFF_FRACTION = 1e-3
#: The fewest records a grid group needs to count (two records' difference is always a multiple of itself).
MIN_GROUP_ROWS = 3
#: A group counts when a group as large arises by chance with probability below this (Poisson bound, docstring).
CHANCE_PROBABILITY = 1e-6
#: A resolution above this is refused (τ² must be a finite float64, as a noise factor's entries, ±1e150).
MAX_RESOLUTION = 1e150
#: Entropy of the test-only stream of the resolution noise (``insecure_noise_seed`` given), apart from ω's stream.
RESOLUTION_TEST_ENTROPY = 0x5EED_D1C3


def storage_roundoff(Y: np.ndarray, min_rows: int = MIN_GROUP_ROWS) -> float:
    r"""The relative round-off u of the target's storage: ``FLOAT32_ULPS · ε₃₂`` if at least ``min_rows`` values are
    exactly float32 without being short decimals (``round(v, SHORT_DECIMALS) ≠ v``: ``float32(20.13)``, a float32
    reading; a float64 value is float32 by chance with probability 2⁻²⁹), else ``ROUNDOFF_ULPS · ε₆₄``.

    A float32 target is on a binary grid (2⁻²⁰ near 20) and a 2-decimal one passed through float32 is off its decimal
    grid by up to ½ float32 ulp: with float64's round-off the detection saw neither, τ was the floor, and a fresh
    attacker's lattice attack gave every row back bit-exactly from ``model.npz`` (issue 44).

    :param Y: ``[N]`` or ``[N, 1]`` finite outputs.
    :param min_rows: how many float32 values make the storage float32.
    """
    values = np.asarray(Y, dtype=np.float64).reshape(-1)
    with np.errstate(over="ignore"):  # beyond float32's range: inf, not equal
        single = values.astype(np.float32).astype(np.float64) == values
    short = np.round(values, SHORT_DECIMALS) == values
    if np.count_nonzero(single & ~short) >= min_rows:
        return FLOAT32_ULPS * float(np.finfo(np.float32).eps)
    return ROUNDOFF_ULPS * float(np.finfo(np.float64).eps)


#: float64's relative round-off allowance (:func:`storage_roundoff` of a float64 target)
FLOAT64_ROUNDOFF = ROUNDOFF_ULPS * float(np.finfo(np.float64).eps)


def _log(base: int) -> Callable[[float], float]:
    """The logarithm to ``base`` (10 or 2), exact at powers of it."""
    return math.log10 if base == 10 else math.log2


def _finest_level(magnitude: float, roundoff: float, base: int = 10) -> int:
    """The largest k whose round-off allowance ``u · base^k · magnitude`` is at most :data:`MAX_ROUNDOFF_FRACTION`
    of a step ``base^-k``."""
    return math.floor(_log(base)(MAX_ROUNDOFF_FRACTION / (roundoff * magnitude)))


def precision_floor(magnitude: float, roundoff: float = FLOAT64_ROUNDOFF) -> float:
    r"""``10^-k`` for the finest decimal level k that :func:`recording_resolution` can test at a magnitude: the largest
    k whose round-off allowance ``u · 10^k · magnitude`` is at most :data:`MAX_ROUNDOFF_FRACTION` of a step: with
    float64's ``u = ROUNDOFF_ULPS · ε₆₄`` 1e-11 at magnitude 1, 0.01 at 1e9; with float32's (:func:`storage_roundoff`)
    1e-3 at magnitude 1, 0.01 at 20; 0 at magnitude 0.

    :param magnitude: ``max|Y|``, or the release's public stand-in for it (:func:`recording_resolution`).
    :param roundoff: u, the storage's relative round-off (:func:`storage_roundoff`).
    """
    if not (math.isfinite(magnitude) and magnitude >= 0):
        raise ValueError(f"magnitude must be a finite number ≥ 0, got {magnitude}")
    return 0.0 if magnitude == 0.0 else 10.0 ** (-_finest_level(magnitude, roundoff))


def _residue_groups(scaled: np.ndarray, allowance: float) -> List[np.ndarray]:
    """Index arrays of the records whose scaled values agree modulo 1 to ``2·allowance`` (single linkage on the circle
    of residues ``scaled − round(scaled)``), the largest first."""
    residues = scaled - np.round(scaled)
    order = np.argsort(residues, kind="stable")
    groups = np.split(order, np.flatnonzero(np.diff(residues[order]) > 2 * allowance) + 1)
    if len(groups) > 1 and residues[order[0]] + 1.0 - residues[order[-1]] <= 2 * allowance:
        groups = [np.concatenate([groups[-1], groups[0]]), *groups[1:-1]]  # the circle closes
    return sorted(groups, key=len, reverse=True)


def _group_step(counts: np.ndarray) -> int:
    """The gcd of a group's grid counts relative to its first member (0: all equal)."""
    first = int(counts[0])
    return reduce(math.gcd, (abs(int(c) - first) for c in counts[1:]), 0)


def _chance_size(rows: int, classes: float) -> int:
    """The smallest n such that, of ``rows`` records spread uniformly over ``classes`` classes, some class holding n
    or more has probability at most :data:`CHANCE_PROBABILITY` (union bound over the classes, Poisson counts)."""
    lam = rows / classes
    guess = float(poisson.isf(CHANCE_PROBABILITY / classes, lam))  # NaN below scipy's range: start at the minimum
    n = max(MIN_GROUP_ROWS, int(guess) - 1 if math.isfinite(guess) else 0)
    while classes * float(poisson.sf(n - 1, lam)) > CHANCE_PROBABILITY:
        n += 1
    return n


#: the largest |Y| a release takes: beyond it a target's variance (a sum of squares) overflows float64
MAX_MAGNITUDE: float = 1e150


def recording_resolution(Y: np.ndarray, min_rows: int = MIN_GROUP_ROWS, magnitude: Optional[float] = None) -> float:
    r"""The resolution τ a release of Y adds: the coarsest grid spacing a group of records shares beyond chance, and
    at least :func:`precision_floor` (module docstring).

    For each decimal level ``Δ = 10^-k`` from about twice Y's standard deviation down to the precision floor, the
    records are grouped by ``10^k (Y_i − min Y)`` modulo 1, to the round-off allowance (single linkage): a group of n
    records lies on the grid ``a + gΔ``, g the gcd of its members' grid counts. Levels are read from the finest: a
    group *counts* when ``n ≥ min_rows`` and as large a group is unlikely by chance (:func:`_chance_size`) under the
    structure already found: if its nearest ancestor group (the group at a finer level holding it) that counts lies
    on ``a' + s`` with m members, those m records fill the c classes of ``s`` modulo Δ (c the denominator of s/Δ);
    with no such ancestor the N records are continuous, in ``1 / (2·allowance)`` windows. τ is the largest ``gΔ`` that
    counts. So 2-decimal records are 0.01 whatever their integer parts share, a subset recorded as integers among
    finer records is 1, and full-precision records get the floor.

    :param Y: ``[N]`` or ``[N, 1]`` finite outputs.
    :param min_rows: the fewest records a group needs (≥ 3: two records' difference is a multiple of itself).
    :param magnitude: the scale of the round-off allowance and of the floor; None: ``max|Y|``. The release passes
        ``max_j(|W₀_j| + 6·√Σ_jj)`` (``W₀ = Y + Lω``, the release before the resolution noise), so that the floor,
        which τ is for full-precision data, is post-processing of W₀ and Σ, not a function of Y (it would publish Y's
        order of magnitude); it exceeds ``max|Y|`` unless the noise draws 6 sd.
    :raises ValueError: Y is empty or not finite, min_rows < 3, or magnitude is not a finite number ≥ 0.
    """
    values = np.asarray(Y, dtype=np.float64).reshape(-1)
    if values.size == 0 or not np.all(np.isfinite(values)):
        raise ValueError(
            f"Y must be a non-empty finite array to find its recording resolution, got shape {values.shape}"
        )
    if isinstance(min_rows, bool) or not isinstance(min_rows, (int, np.integer)) or min_rows < MIN_GROUP_ROWS:
        raise ValueError(f"min_rows must be an integer ≥ {MIN_GROUP_ROWS}, got {min_rows!r}")
    largest = float(np.max(np.abs(values)))
    if largest > MAX_MAGNITUDE:  # its squares (a variance, a Gram matrix) overflow float64
        raise ValueError(
            f"Y holds values up to {largest:.3g}, beyond the ±{MAX_MAGNITUDE:g} a release computes with (their squares "
            "overflow); rescale the target (a unit change) before releasing it"
        )
    magnitude = largest if magnitude is None else float(magnitude)
    roundoff = storage_roundoff(values, min_rows)
    floor = precision_floor(magnitude, roundoff)
    spread = float(np.std(values))
    if floor == 0.0 or spread == 0.0:
        return floor
    diffs = values - float(np.min(values))
    decimal = _grid_resolution(diffs, magnitude, roundoff, spread, min_rows, 10)
    if decimal == 0.0:  # no decimal grid: a binary one (a float32 reading shifted in float64, 273.15 + C)
        return max(floor, _grid_resolution(diffs, magnitude, roundoff, spread, min_rows, 2))
    return max(floor, decimal)


def _grid_resolution(
    diffs: np.ndarray, magnitude: float, roundoff: float, spread: float, min_rows: int, base: int
) -> float:
    """The largest spacing ``g·base^-k`` a group of records shares beyond chance, over the levels ``base^-k`` from
    about twice the spread down to the finest the round-off allows (:func:`recording_resolution`; 0: none)."""
    N = diffs.size
    finest = _finest_level(magnitude, roundoff, base)
    tau = 0.0
    # per record, its nearest counting ancestor at the finer levels: members m (0: none), gcd g and level k
    members, steps, levels = np.zeros(N, np.int64), np.zeros(N, np.int64), np.zeros(N, np.int64)
    for k in range(finest, min(finest, math.ceil(-_log(base)(2.0 * spread))) - 1, -1):
        allowance = roundoff * float(base) ** k * magnitude
        scaled = diffs * float(base) ** k
        counts = np.round(scaled)
        below = (np.zeros(N, np.int64), np.zeros(N, np.int64), np.zeros(N, np.int64))
        for group in _residue_groups(scaled, allowance):
            if group.size < min_rows:
                break  # the rest are smaller (largest first) and have no counting ancestor either
            g = _group_step(counts[group])
            first = int(group[0])  # one group at the finer level holds all of this one's members
            if not members[first]:  # continuous records: N of them in 1 / (2·allowance) windows
                pool, classes = N, 1.0 / (2.0 * allowance)
            else:  # the ancestor's m records on s = g'·b^-k' fill s modulo b^-k: denominator of g'/b^(k'−k)
                scale = base ** (int(levels[first]) - k)
                step = int(steps[first])
                pool, classes = int(members[first]), float(scale // math.gcd(step, scale)) if step else 1.0
            counted = g > 0 and classes > 1.0 and group.size >= _chance_size(pool, classes)
            if counted:
                tau = max(tau, g / base**k if k > 0 else float(g * base ** (-k)))  # exact decimals: 18/100
            found = (group.size, g, k) if counted else (members[first], steps[first], levels[first])
            for array, value in zip(below, found):
                array[group] = value
        members, steps, levels = below
    return tau


def check_resolution(resolution: Optional[float]) -> Optional[float]:
    """``resolution`` validated: None (detect it) or a number in ``[0, MAX_RESOLUTION]``.

    :raises ValueError: naming the value.
    """
    if resolution is None:
        return None
    if isinstance(resolution, bool) or not isinstance(resolution, (int, float, np.integer, np.floating)):
        raise ValueError(f"resolution must be None (detected from Y) or a number ≥ 0, got {resolution!r}")
    if not (math.isfinite(float(resolution)) and 0 <= float(resolution) <= MAX_RESOLUTION):
        raise ValueError(
            f"resolution must be None (detected from Y) or a finite number ≥ 0 (at most {MAX_RESOLUTION:g}), "
            f"got {resolution}"
        )
    return float(resolution)


def resolution_noise(rows: int, tau: float, insecure_noise_seed: Optional[int] = None) -> np.ndarray:
    """``[rows, 1]`` draws of ``τη``, ``η ~ N(0, I)``, from the OS (:func:`~gpflow_fed.randomness.protective_rng`).

    :param rows: N.
    :param tau: τ ≥ 0, the noise's standard deviation (the recording resolution).
    :param insecure_noise_seed: tests only, as for :func:`~gpflow_fed.release.obfuscate`: the stream is derived from
        it and :data:`RESOLUTION_TEST_ENTROPY`, apart from the stream that draws ω from the same seed.
    """
    seed = randomness.check_insecure_seed(insecure_noise_seed, "insecure_noise_seed")
    if seed is not None:
        seed = int(np.random.SeedSequence([RESOLUTION_TEST_ENTROPY, seed]).generate_state(1)[0])
    rng = randomness.protective_rng(seed)  # looked up at call time (tests substitute it)
    return float(tau) * rng.standard_normal((int(rows), 1)).astype(gpflow.default_float())
