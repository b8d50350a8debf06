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

What :func:`recording_resolution` finds: the largest Δ such that every ``Y_i − min(Y)`` is an integer multiple of Δ to
round-off, through the decimal digits: for k = 0, 1, …, :data:`MAX_DECIMALS` decimals, the differences times 10^k are
integers (to :data:`ROUNDOFF_ULPS` units in the last place of the data's magnitude) and Δ is their gcd over 10^k. So
decimal grids (0.01), half-steps (0.5), integer data (1, or 10 for multiples of 10) and affine images of a decimal
grid (``1.8·C + 32`` with C to 0.1: Δ = 0.18) are found; full-precision floats give no grid (Δ = 0). A grid that is
not a decimal fraction (thirds, 1/7) is not found: declare it (``release(resolution=...)``).
"""

from __future__ import annotations

import math
from functools import reduce
from typing import Optional

import gpflow
import numpy as np

from .. import randomness

__all__ = [
    "MAX_DECIMALS",
    "MAX_RESOLUTION",
    "RESOLUTION_TEST_ENTROPY",
    "ROUNDOFF_ULPS",
    "check_resolution",
    "recording_resolution",
    "resolution_noise",
]

#: Decimal digits tried by :func:`recording_resolution` (0, 1, …, 12).
MAX_DECIMALS = 12
#: A difference times 10^k is an integer when within this many float64 ulps of the data's magnitude (times 10^k).
ROUNDOFF_ULPS = 64
#: The round-off allowance must stay below this fraction of one grid step, else k decimals cannot be told apart from
#: noise at that magnitude and are not tried (a full-precision value passes with probability about twice this).
MAX_ROUNDOFF_FRACTION = 1e-3
#: A resolution above this is refused (τ² must be a finite float64, as a noise factor's entries, ±1e150).
MAX_RESOLUTION = 1e150
#: Entropy of the test-only stream of the resolution noise (``insecure_noise_seed`` given), apart from ω's stream.
RESOLUTION_TEST_ENTROPY = 0x5EED_D1C3


def recording_resolution(Y: np.ndarray) -> float:
    r"""The largest Δ such that every ``Y_i − min(Y)`` is an integer multiple of Δ to round-off (0: no such grid).

    For ``k = 0 … MAX_DECIMALS``: ``n_i = round(10^k (Y_i − min Y))`` must match ``10^k (Y_i − min Y)`` within
    ``ROUNDOFF_ULPS · ε · 10^k · max|Y|`` (ε the float64 machine epsilon), a margin tried only while it stays below
    ``MAX_ROUNDOFF_FRACTION``; the first k that fits gives ``Δ = gcd(n) / 10^k``. Y constant (every difference 0)
    gives 0: there is no spacing to find.

    :param Y: ``[N]`` or ``[N, 1]`` finite outputs.
    :raises ValueError: Y is empty or not finite.
    """
    values = np.asarray(Y, dtype=np.float64).reshape(-1)
    if values.size == 0 or not np.all(np.isfinite(values)):
        raise ValueError(
            f"Y must be a non-empty finite array to find its recording resolution, got shape {values.shape}"
        )
    diffs = values - float(np.min(values))
    if not np.any(diffs > 0):
        return 0.0
    magnitude = float(np.max(np.abs(values)))
    for k in range(MAX_DECIMALS + 1):
        scale = 10.0**k
        allowance = ROUNDOFF_ULPS * np.finfo(np.float64).eps * scale * magnitude
        if allowance > MAX_ROUNDOFF_FRACTION:
            break
        scaled = diffs * scale
        counts = np.round(scaled)
        if np.all(np.abs(scaled - counts) <= allowance):
            step = reduce(math.gcd, (int(c) for c in counts), 0)
            return step / scale
    return 0.0


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
