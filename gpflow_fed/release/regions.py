r"""Continuous sensitive regions (Tuo & Bhattacharya §4.4): boxes, intervals and unions, discretised.

For a kernel tolerance H with ``K − H`` positive definite, ``Σ_opt(S) = (G(S) − K_XX − V)⁺`` (eq. 13) with
``G(S)ᵢⱼ = ⟨K(·,xᵢ), K(·,xⱼ)⟩_{N_{K−H}(S)}``; for a finite S this is ``K_XS (K_SS − H_SS)⁻¹ K_SX`` (eq. 12).
``G`` grows with S (Theorem 3) and ``G(Sₙ) → G(S̄)`` for grids filling a compact region (Theorem 4), so a
region is handled by refining its grid until ``tr Σ`` stops changing (:func:`refine_region`). For
``H = αK`` the uniformly privacy-aware solution ``(G(ℝᵈ) − K_XX − V)⁺`` with ``G(ℝᵈ) = (1 − α)⁻¹ K_XX``
protects every input at once (:func:`uniform_privacy_covariance`).

Numerics: on dense grids ``K_SS − H_SS`` is numerically singular (condition number ≈ 1e15 already at 9
points on [0.3, 0.5] for Example 1's kernel). A truncated pseudo-inverse there is not monotone in S: each level
drops different directions, and the computed trace can *fall* under refinement (by ~5e-5 relative on that
example), contradicting Theorem 3. Instead G is computed on a well-conditioned subset ``S' ⊆ Sₙ`` chosen by
pivoted Cholesky of ``K_SS − H_SS``: a grid point is added while its residual variance (given the chosen
points, under ``K − H``) exceeds ``PIVOT_RTOL`` of the largest diagonal entry. The points left out are
determined by ``S'`` to that accuracy. :func:`refine_region` forces the previous level's points to be pivoted
first, so ``S'ₙ ⊆ S'ₙ₊₁`` and ``G(S'ₙ) ⪯ G(S'ₙ₊₁)`` (Theorem 3): the computed traces are non-decreasing up to
rounding and converge (Theorem 4).

What float64 can and cannot resolve: for an analytic kernel (SE) and ``H = αK``, ``{K(·, s): s ∈ interval}``
spans a dense subspace of the RKHS, so ``G(S̄) = (1 − α)⁻¹K_XX`` and the exact limit is the uniform solution
(Example 1's kernel on [0.3, 0.5]: exact traces 7.7048, 8.8706, 8.99997 at 5, 9, 17 grid points, limit
``tr K_XX = 9``; 80-digit arithmetic). In float64 the refinement stalls once new grid points are determined by
the pivots to ``PIVOT_RTOL`` (8.751 there): the variance floor then holds on the grid to ~1e-6 of the prior
variance, while the strong condition for extreme combinations β of nearby points is beyond double precision.
When the whole input space should be protected, use :func:`uniform_privacy_covariance`.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass
from typing import List, Optional, Sequence, Union, cast

import gpflow
import numpy as np
from scipy.linalg import solve_triangular

from .linalg import (
    as_inputs,
    check_no_white,
    column_tolerance,
    input_window,
    kernel_matrix,
    noise_vector,
    psd_factor,
    same_inputs,
)
from .lowrank import LowRankCovariance
from .obfuscation import Covariance, positive_part_of_difference
from .tolerance import ProportionalKernel, check_tolerance_kernel


#: The most grid points a region's design takes: the design's kernel matrices are M×M
#: float64 (0.8 GB each at the cap, several at once), so a region many lengthscales wide is refused up front.
MAX_REGION_POINTS = 10_000
#: The most points any discretisation returns (the release checks its floor on a grid 4× denser per axis).
MAX_GRID_POINTS = 1_000_000


def _too_many(count: int, density: float, cap: int, what: str) -> ValueError:
    """The refusal of a grid of ``count`` points above ``cap``, naming how to shrink it."""
    digits = math.log10(count)  # exact for Python ints of any size (float() or str() of a huge one would raise)
    points = f"{count:,}" if count < 10**15 else f"about 1e{digits:.0f}"
    size = f"{count * count * 8 / 2**30:.3g} GiB" if count < 10**150 else f"about 1e{2 * digits - 9.1:.0f} GiB"
    return ValueError(
        f"the sensitive region's {what} at density {density:g} has {points} points, above the {cap:,} a release "
        f"handles (a dense kernel matrix of that grid is {size}): narrow the region to where protection is "
        "needed, or lower the grid density (density=, CLI --density; the default is 4 points per lengthscale and at "
        "least 20 per unit; the floor is then checked on a grid 4 times denser)"
    )


def check_region_size(count: int, density: float) -> None:
    """Refuse a design grid of more than :data:`MAX_REGION_POINTS` points (before any kernel matrix is built; the
    records inside the region are not counted: they are the data's own sensitive inputs, as named points are).

    :raises ValueError: naming the grid's size and how to shrink it.
    """
    if count > MAX_REGION_POINTS:
        raise _too_many(count, density, MAX_REGION_POINTS, "grid")


class Region(abc.ABC):
    """A compact sensitive region that can be discretised on a grid."""

    def grid_size(self, density: float) -> int:
        """How many points :meth:`discretise` returns at ``density`` (subclasses compute it without the grid)."""
        return int(self.discretise(density).shape[0])

    @property
    @abc.abstractmethod
    def input_dim(self) -> int:
        """D, the input dimension."""

    @abc.abstractmethod
    def discretise(self, density: float) -> np.ndarray:
        """``[M, D]`` grid points with about ``density`` points per unit length along each axis."""

    @abc.abstractmethod
    def contains(self, points: np.ndarray) -> np.ndarray:
        """``[N]`` whether each of ``points`` ``[N, D]`` lies in the region (boundary included)."""


class Box(Region):
    """The axis-aligned box ``[lower₁, upper₁] × … × [lower_D, upper_D]`` (a point along a zero-width side).

    :raises ValueError: mismatched lengths, non-finite bounds or ``lower > upper``.
    """

    def __init__(self, lower: Sequence[float], upper: Sequence[float]) -> None:
        lo: np.ndarray = np.atleast_1d(np.asarray(lower, dtype=gpflow.default_float()))
        hi: np.ndarray = np.atleast_1d(np.asarray(upper, dtype=gpflow.default_float()))
        if lo.ndim != 1 or lo.shape != hi.shape:
            raise ValueError(f"Box bounds must be two vectors of one length, got {lo.shape} and {hi.shape}")
        if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
            raise ValueError("Box bounds must be finite")
        if np.any(lo > hi):
            raise ValueError(f"Box needs lower ≤ upper in every dimension, got lower={lo}, upper={hi}")
        self.lower, self.upper = lo, hi

    @property
    def input_dim(self) -> int:
        return int(self.lower.shape[0])

    def _counts(self, density: float) -> List[int]:
        if not (np.isfinite(density) and density > 0):
            raise ValueError(f"density must be a positive number of points per unit length, got {density}")
        counts = []
        for lo, hi in zip(self.lower, self.upper):
            width = float(density) * (float(hi) - float(lo))  # inf for a box wider than float64's range
            if hi == lo:
                counts.append(1)
            else:
                counts.append(int(math.ceil(round(width, 9))) + 1 if math.isfinite(width) else MAX_GRID_POINTS + 1)
        return counts

    def grid_size(self, density: float) -> int:
        """``∏ (⌈density·width⌉ + 1)``, computed in Python integers before any grid is built."""
        return math.prod(self._counts(density))

    def discretise(self, density: float) -> np.ndarray:
        """A tensor grid with ``⌈density·width⌉ + 1`` points per side (one for a zero-width side).

        Doubling an integer density on an integer-width box gives nested grids (Theorem 3's monotonicity).

        :raises ValueError: a density that is not positive, or a grid of more than :data:`MAX_GRID_POINTS` points
            (its size is computed first; nothing is allocated).
        """
        counts = self._counts(density)
        if math.prod(counts) > MAX_GRID_POINTS:
            raise _too_many(math.prod(counts), density, MAX_GRID_POINTS, "grid")
        axes = [np.linspace(lo, hi, count) for lo, hi, count in zip(self.lower, self.upper, counts)]
        mesh = np.meshgrid(*axes, indexing="ij")
        return np.stack([m.reshape(-1) for m in mesh], axis=1)

    def contains(self, points: np.ndarray) -> np.ndarray:
        P: np.ndarray = np.asarray(points, dtype=gpflow.default_float())
        return np.asarray(np.all((P >= self.lower[None, :]) & (P <= self.upper[None, :]), axis=1))

    def __repr__(self) -> str:
        return f"Box(lower={self.lower.tolist()}, upper={self.upper.tolist()})"


class Interval(Box):
    """The interval ``[low, high]`` of a 1-D input space."""

    def __init__(self, low: float, high: float) -> None:
        super().__init__([low], [high])


class RegionUnion(Region):
    """The union of regions of one input dimension; duplicated grid points are merged."""

    def __init__(self, *regions: Region) -> None:
        if not regions:
            raise ValueError("RegionUnion needs at least one region")
        dims = {r.input_dim for r in regions}
        if len(dims) != 1:
            raise ValueError(f"RegionUnion needs regions of one input dimension, got {sorted(dims)}")
        self.regions = tuple(regions)

    @property
    def input_dim(self) -> int:
        return self.regions[0].input_dim

    def contains(self, points: np.ndarray) -> np.ndarray:
        return np.asarray(np.any([r.contains(points) for r in self.regions], axis=0))

    def grid_size(self, density: float) -> int:
        """The parts' grid sizes summed (an upper bound: points shared by two parts are merged)."""
        return sum(r.grid_size(density) for r in self.regions)

    def discretise(self, density: float) -> np.ndarray:
        if self.grid_size(density) > MAX_GRID_POINTS:
            raise _too_many(self.grid_size(density), density, MAX_GRID_POINTS, "grid")
        return unique_points(np.concatenate([r.discretise(density) for r in self.regions], axis=0))


def unique_points(points: np.ndarray) -> np.ndarray:
    """``points`` without repeats, the first of each kept in order; rows equal to
    :func:`~gpflow_fed.release.linalg.column_tolerance` of ``points`` in every column are one point.

    Each column is rounded to its own quantum (before issue 44 every column was rounded to 12 decimals, which
    merged distinct points of a column on a scale of 1e-12 and none of a column of magnitude 1e7 that differed by
    rounding). Two points only merge when they lie within that tolerance in every column (points near a bin's edge
    may stay apart: a duplicate point costs a pivot, never protection).
    """
    P: np.ndarray = np.asarray(points, dtype=gpflow.default_float())
    if P.shape[0] == 0:
        return P
    quantum = column_tolerance(P)  # > 0: it holds ulps of the column's largest magnitude (P/quantum stays finite)
    _, index = np.unique(np.round(P / np.where(quantum > 0, quantum, 1.0)[None, :]), axis=0, return_index=True)
    return P[np.sort(index)]


def check_region(region: Region, X: np.ndarray, tolerance: object) -> None:
    """Check a region against X's input dimension and that the tolerance is a kernel H (before any work).

    :raises TypeError: not a Region, or a non-kernel tolerance.
    :raises ValueError: dimension mismatch.
    """
    if not isinstance(region, Region):
        raise TypeError(f"region must be a Box, Interval or RegionUnion, got {type(region).__name__}")
    if region.input_dim != X.shape[1]:
        raise ValueError(
            f"the region has {region.input_dim} dimensions but X has {X.shape[1]} columns; "
            "give the region in X's input space"
        )
    if not isinstance(tolerance, gpflow.kernels.Kernel):
        raise TypeError(
            "a continuous region needs a kernel tolerance H (e.g. ProportionalKernel(kernel, alpha)): "
            "a scalar ξ at infinitely many points gives Ξ = ξI, which K_SS − Ξ ≻ 0 rules out"
        )


def with_records(grid: np.ndarray, X: np.ndarray, region: Region) -> np.ndarray:
    """``grid`` and every training input inside ``region`` that is not already a grid point (each record inside
    a region is a sensitive input; a grid point on a training input already stands for its records).

    "On" is :func:`~gpflow_fed.release.obfuscation.protected_targets`' match: within X's
    :func:`~gpflow_fed.release.linalg.same_inputs` (float rounding in every column).
    """
    inside = X[region.contains(X)]
    order = np.argsort(grid[:, 0], kind="stable")
    first = grid[order, 0]
    window = input_window(inside[:, 0])
    lo = np.searchsorted(first, inside[:, 0] - window, side="left")
    hi = np.searchsorted(first, inside[:, 0] + window, side="right")
    new = [x for x, a, b in zip(inside, lo, hi) if not np.any(same_inputs(grid[order[a:b]], x))]
    if not new:
        return grid
    _, first = np.unique(np.asarray(new), axis=0, return_index=True)
    return np.concatenate([grid, np.asarray(new)[np.sort(first)]], axis=0)


#: A grid point joins the pivot set while its residual diagonal exceeds this fraction of max diag(K_SS − H_SS).
PIVOT_RTOL = 1e-12


def pivoted_region_factor(KXS: np.ndarray, M: np.ndarray, forced: int = 0) -> "tuple[np.ndarray, np.ndarray]":
    r"""``B = K_XP L_P⁻ᵀ`` with ``BBᵀ = G(P) = K_XP (K_PP − H_PP)⁻¹ K_PX`` (eq. 12) on a pivot set P ⊆ S.

    Pivoted Cholesky of ``M = K_SS − H_SS``: the first ``forced`` points are tried in order (the previous
    refinement level's pivots), then the point with the largest residual diagonal is added, while the
    residual exceeds ``PIVOT_RTOL · max diag M``. ``L_P`` (the Cholesky factor of ``M_PP``) then has diagonal
    ≥ √(PIVOT_RTOL · max diag M), so the triangular solve is well conditioned.

    :param KXS: ``[N, γ]``.
    :param M: ``[γ, γ]`` PSD.
    :param forced: how many leading points to try first, in order.
    :return: ``(B [N, r], P [r])`` with P the indices of the pivots in S.
    """
    gamma = M.shape[0]
    d = np.diag(M).astype(float).copy()
    threshold = PIVOT_RTOL * float(np.max(d))
    L = np.zeros((gamma, gamma), dtype=M.dtype)
    pivots: List[int] = []
    candidates = list(range(min(int(forced), gamma)))
    while len(pivots) < gamma:
        if candidates:
            j = candidates.pop(0)
        else:
            free = np.setdiff1d(np.arange(gamma), pivots)
            j = int(free[np.argmax(d[free])])
        if d[j] <= threshold:
            if candidates or j < forced:
                continue  # a forced point already determined by the others: skip it
            break
        i = len(pivots)
        column = (M[:, j] - L[:, :i] @ L[j, :i]) / np.sqrt(d[j])
        column[pivots] = 0.0
        L[:, i] = column
        d -= column**2
        d[j] = 0.0
        pivots.append(j)
    P = np.asarray(pivots, dtype=int)
    LP = L[P][:, : P.shape[0]]
    return solve_triangular(LP, KXS[:, P].T, lower=True).T, P


def _region_sigma(
    kernel: gpflow.kernels.Kernel,
    X: np.ndarray,
    S: np.ndarray,
    tolerance: gpflow.kernels.Kernel,
    noise_variance: Union[float, np.ndarray],
    low_rank: bool,
    forced: int,
    protect: str = "latent",
    earlier: Optional[Covariance] = None,
) -> "tuple[Covariance, np.ndarray]":
    """Σ_opt(P) (eq. 13) for the pivot set P ⊆ S of :func:`pivoted_region_factor`; returns ``(Σ, S[P])``.

    With ``protect="records"`` a grid point on a training input stands for its record(s) (``K → K + V`` in the
    cross- and prior covariances, as in :mod:`~gpflow_fed.release.obfuscation`); ``earlier`` is Σ₁ held fixed.
    """
    from .obfuscation import protected_targets, target_blocks

    v = noise_vector(noise_variance, X.shape[0])
    targets = protected_targets(X, S, protect)
    CXT, PT = target_blocks(kernel, X, targets, v)
    M = PT - kernel_matrix(tolerance, targets.points)
    B, P = pivoted_region_factor(CXT, 0.5 * (M + M.T), forced)
    KXX = kernel_matrix(kernel, X)
    if earlier is not None:
        KXX += np.asarray(earlier)
    Sigma = positive_part_of_difference(B, KXX, v, low_rank=low_rank and earlier is None)
    return Sigma, targets.points[P]


def _prepare(kernel: gpflow.kernels.Kernel, X: object, region: Region, tolerance: object, density: float) -> np.ndarray:
    """Validate the inputs shared by the region functions (before any heavy work); return X as ``[N, D]``."""
    check_no_white(kernel)
    Xa = as_inputs(X, "X")
    check_region(region, Xa, tolerance)
    if not isinstance(tolerance, ProportionalKernel):
        coarse = region.discretise(max(1.0, density / 8.0))
        # check_region refused any tolerance but a kernel
        check_tolerance_kernel(kernel, cast(gpflow.kernels.Kernel, tolerance), coarse[: min(coarse.shape[0], 400)])
    return Xa


def region_noise_covariance(
    kernel: gpflow.kernels.Kernel,
    X: np.ndarray,
    region: Region,
    tolerance: gpflow.kernels.Kernel,
    *,
    density: float,
    noise_variance: Union[float, np.ndarray] = 0.0,
    low_rank: bool = False,
    method: str = "strong",
    protect: str = "records",
    earlier: Optional[Covariance] = None,
) -> Covariance:
    r"""``Σ_opt(Sₙ) = (G(Sₙ) − K_XX − V)⁺`` (eq. 12–13) for the region's grid ``Sₙ`` at ``density``.

    With ``protect="records"`` (default) every training input inside the region joins ``Sₙ`` and its record is
    protected (``Var[Y_j | W] ≥ H(x_j, x_j)``, cross-covariance ``K + V``); ``"latent"`` is the paper's floor on f
    at the grid points. ``earlier`` is the Σ₁ of an earlier release of these rows, held fixed (the result is Δ's
    covariance, :mod:`~gpflow_fed.release.ledger`).

    G is evaluated on the well-conditioned pivot subset of ``Sₙ`` (module docstring, :func:`pivoted_region_factor`).

    With ``method="weak"`` the weak criterion ``Var[f(s) | W] ≥ H(s, s)`` is imposed at every grid point of
    ``Sₙ`` (the SDP (10) with γ the number of points of ``Sₙ``), solved by the certified Krylov reduction of
    :mod:`~gpflow_fed.release.weak`: the reduction applies unchanged, and on a dense grid the columns of
    ``K_{X,Sₙ}`` are nearly dependent, so the Krylov dimension k stays far below γ (only the size ``k + γ`` of
    the one small LMI grows with the grid). The guarantee holds at the grid points; between them it holds up to
    the grid's resolution (the strong method's region theory, Theorems 3–4, is about eq. 12–13).

    :param tolerance: the kernel H (``K − H`` is checked positive definite on the grid's coarsest level).
    :param method: ``"strong"`` (eq. 12–13) or ``"weak"`` (eq. 10 on the grid).
    :raises TypeError: for a non-kernel tolerance or an unknown region type.
    :raises ValueError: dimension mismatch, ``K − H`` not positive definite, an unknown method, or a weak
        solution that cannot be certified.
    """
    if method not in ("strong", "weak"):
        raise ValueError(f"a region supports method='strong' or 'weak', got {method!r}")
    Xa = _prepare(kernel, X, region, tolerance, density)
    check_region_size(region.grid_size(density), density)
    S = region.discretise(density)
    if protect == "records":
        S = with_records(S, Xa, region)
    if method == "weak":
        from .obfuscation import synthetic_noise_covariance

        return synthetic_noise_covariance(
            kernel, Xa, S, tolerance, noise_variance=noise_variance, method="weak", protect=protect, earlier=earlier
        )
    return _region_sigma(
        kernel, Xa, S, tolerance, noise_variance, low_rank, forced=0, protect=protect, earlier=earlier
    )[0]


@dataclass(frozen=True)
class RegionRefinement:
    """The refinement history of :func:`refine_region`.

    :param densities: the grid densities tried.
    :param num_points: the grid sizes.
    :param traces: ``tr Σ_opt(Sₙ)`` at each density.
    :param converged: whether the last relative change was ≤ ``rtol``.
    :param Sigma: Σ at the last density.
    """

    densities: List[float]
    num_points: List[int]
    traces: List[float]
    converged: bool
    Sigma: Covariance


def refine_region(
    kernel: gpflow.kernels.Kernel,
    X: np.ndarray,
    region: Region,
    tolerance: gpflow.kernels.Kernel,
    *,
    density: float = 4.0,
    noise_variance: Union[float, np.ndarray] = 0.0,
    rtol: float = 1e-3,
    max_refinements: int = 6,
    low_rank: bool = False,
) -> RegionRefinement:
    r"""Double the grid density until ``tr Σ_opt(Sₙ)`` changes by ≤ ``rtol`` (relative) — Theorem 4.

    Each level's pivot set contains the previous one, so the traces are non-decreasing (Theorem 3) up to
    rounding (module docstring).

    :return: the history (densities, grid sizes, traces), whether it converged, and the last Σ.
    """
    if not (0 < rtol < 1) or int(max_refinements) < 1:
        raise ValueError("need 0 < rtol < 1 and max_refinements ≥ 1")
    densities: List[float] = []
    sizes: List[int] = []
    traces: List[float] = []
    Sigma: Optional[Covariance] = None
    converged = False
    Xa = _prepare(kernel, X, region, tolerance, density)
    previous = np.zeros((0, Xa.shape[1]), dtype=Xa.dtype)
    for level in range(int(max_refinements) + 1):
        d = float(density) * 2**level
        # The previous pivots go first (and stay in S even if the grids are not nested): S'ₙ ⊆ S'ₙ₊₁.
        check_region_size(region.grid_size(d), d)
        grid = region.discretise(d)
        S = unique_points(np.concatenate([previous, grid], axis=0))
        Sigma, previous = _region_sigma(kernel, Xa, S, tolerance, noise_variance, low_rank, forced=previous.shape[0])
        trace = Sigma.trace() if isinstance(Sigma, LowRankCovariance) else float(np.trace(Sigma))
        densities.append(d)
        sizes.append(int(region.discretise(d).shape[0]))
        traces.append(trace)
        if level > 0 and abs(traces[-1] - traces[-2]) <= rtol * max(abs(traces[-1]), float(np.finfo(float).tiny)):
            converged = True
            break
    assert Sigma is not None
    return RegionRefinement(densities=densities, num_points=sizes, traces=traces, converged=converged, Sigma=Sigma)


def uniform_privacy_covariance(
    kernel: gpflow.kernels.Kernel, X: np.ndarray, alpha: float, *, noise_variance: Union[float, np.ndarray] = 0.0
) -> np.ndarray:
    r"""The uniformly privacy-aware solution for ``H = αK``: ``(G(ℝᵈ) − K_XX − V)⁺ = (α/(1 − α)·K_XX − V)⁺``.

    With it, ``Var[f(x) | W] ≥ α K(x, x)`` at every input x (and for every finite set, in the strong sense).

    :raises ValueError: unless ``0 < α < 1``.
    """
    alpha = float(alpha)
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"the uniform solution needs H = αK with 0 < α < 1, got α = {alpha}")
    check_no_white(kernel)
    Xa = as_inputs(X, "X")
    A = alpha / (1.0 - alpha) * kernel_matrix(kernel, Xa)
    A[np.diag_indices(Xa.shape[0])] -= noise_vector(noise_variance, Xa.shape[0])
    lam, vecs = psd_factor(A)
    Sigma = (vecs * lam[None, :]) @ vecs.T
    return 0.5 * (Sigma + Sigma.T)
