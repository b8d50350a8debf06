r"""A release's design at one θ: the floor it promises there and the noise covariance that meets it (issue 44).

A release is designed at the design θ and, since an attacker may fit θ on W, also at every θ of a public range
(:mod:`~gpflow_fed.release.theta`) and at the θ refitted on W (``release(refit_check=True)``). At a θ other than the
design's:

* the **tolerance at θ**: a kernel tolerance ``H = αK`` of the design kernel (:class:`~gpflow_fed.release.
  ProportionalKernel`) follows θ, ``H_θ = αK_θ`` (the fraction α of the prior variance under θ; its per-point floors
  ``αK_θ(s, s)`` are the design's when only lengthscales change and the kernel is stationary); every other tolerance
  (a scalar, a vector, a matrix Ξ, another kernel) stays as designed;
* the **strong floor** ``Var[βᵀT | W] ≥ βᵀΞβ`` is claimed there only when the tolerance follows θ (a fixed Ξ can
  exceed ``K_θ`` in some direction β, and then no noise reaches it); otherwise each target's own floor
  ``Var[Tₐ | W] ≥ ξₐ`` is (with several targets the noise is then solved by the weak method, eq. 10);
* the strong noise there is solved on a pivot set of the targets (:func:`~gpflow_fed.release.regions.
  pivoted_region_factor`, as for region grids): a longer lengthscale makes ``P_T − Ξ_T`` numerically singular for
  nearby targets, and a target its pivots determine to ``PIVOT_RTOL`` adds nothing (eq. 12–13).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import gpflow
import numpy as np

from .linalg import kernel_matrix, noise_vector
from .obfuscation import (
    Covariance,
    Targets,
    positive_part_of_difference,
    synthetic_noise_covariance,
    target_blocks,
    target_tolerance,
)
from .regions import Region, check_region_size, pivoted_region_factor, region_noise_covariance
from .tolerance import ProportionalKernel, Tolerance, resolve_tolerance
from .weak import KrylovError


#: Largest N for which a θ of the range or of the refit check falls back to the dense weak SDP when the Krylov
#: reduction fails (the dense SDP has an N×N variable).
DENSE_FALLBACK_MAX_N = 200


@dataclass(frozen=True)
class Floor:
    """What a release promises at one θ.

    :param targets: the protected targets T.
    :param xi: ``[t]`` each target's tolerance ξₐ.
    :param Xi: ``[t, t]`` Ξ_T.
    :param strong: whether the strong floor ``λ_min(Cov[T | W] − Ξ_T) ≥ 0`` is claimed.
    :param prior: ``[t]`` each target's prior variance under that θ (``K(t, t)``, plus σ² for a record).
    """

    targets: Targets
    xi: np.ndarray
    Xi: np.ndarray
    strong: bool
    prior: np.ndarray


def tolerance_at(tolerance: Tolerance, kernel: gpflow.kernels.Kernel, at: gpflow.kernels.Kernel) -> Tolerance:
    """The tolerance at the θ of ``at`` (a copy of the design ``kernel`` with other values): ``αK_θ`` for a
    :class:`ProportionalKernel` of ``kernel`` itself, otherwise ``tolerance`` as designed."""
    if at is kernel or not (isinstance(tolerance, ProportionalKernel) and tolerance.base_kernel is kernel):
        return tolerance
    return ProportionalKernel(at, tolerance.alpha)


@dataclass(frozen=True)
class ReleaseDesign:
    """Everything that designs a release's Σ but θ: inputs, sensitive inputs (or region grid), tolerance, σ², method.

    :param kernel: the design kernel (θ as designed).
    :param X: ``[N, D]`` the released inputs.
    :param S: ``[γ, D]`` the sensitive inputs (a region's grid and records).
    :param tolerance: as given to :func:`~gpflow_fed.models.release`.
    :param noise_variance: σ² of V.
    :param targets: the protected targets of ``S``.
    :param method: ``"strong" | "weak" | "diagonal"``.
    :param protect: ``"records"`` or ``"latent"``.
    :param region: the sensitive region, if any (then ``density`` is its grid's).
    :param density: the region grid's density.
    :param low_rank: see :func:`~gpflow_fed.release.synthetic_noise_covariance`.
    :param solver: likewise.
    """

    kernel: gpflow.kernels.Kernel
    X: np.ndarray
    S: np.ndarray
    tolerance: Tolerance
    noise_variance: float
    targets: Targets
    method: str = "strong"
    protect: str = "records"
    region: Optional[Region] = None
    density: Optional[float] = None
    low_rank: Optional[bool] = None
    solver: Optional[str] = None

    def __post_init__(self) -> None:
        """Refuse a region's grid too large to design on (its kernel matrices are γ×γ), before any is built."""
        if self.region is not None and self.density is not None:
            check_region_size(self.region.grid_size(self.density), self.density)

    def follows(self, at: gpflow.kernels.Kernel) -> bool:
        """Whether the tolerance at ``at``'s θ is the design's own form there (the design, or ``αK_θ``)."""
        return at is self.kernel or tolerance_at(self.tolerance, self.kernel, at) is not self.tolerance

    def floor(self, at: gpflow.kernels.Kernel) -> Floor:
        """The floor promised at ``at``'s θ (the tolerance at θ; the strong floor only where it follows θ).

        A target whose tolerance reaches its prior variance under θ is *not* refused here (``prior`` says so).
        """
        v = noise_vector(self.noise_variance, self.X.shape[0])
        prior = np.diag(target_blocks(at, self.X, self.targets, v)[1]).copy()
        tolerance = tolerance_at(self.tolerance, self.kernel, at)
        resolved = resolve_tolerance(at, self.S, tolerance, check_prior=False)
        Xi, xi = target_tolerance(resolved, self.targets, prior, check_prior=False)
        strong = self.method == "strong" and self.region is None and self.follows(at)
        return Floor(self.targets, xi, Xi, strong, prior)

    def solve(self, at: gpflow.kernels.Kernel, fixed: Optional[np.ndarray]) -> Covariance:
        """The minimum-trace noise covariance meeting the floor at ``at``'s θ with ``fixed`` (noise already in W) held.

        At a θ where the strong floor is not claimed (:meth:`floor`), several targets are solved by the weak method;
        where the Krylov reduction fails (it needs a positive definite ``K_θ + V + Σ``, which a longer lengthscale or
        σ² = 0 can make numerically singular, and a certificate within its dimension), the dense SDP is used, and for
        a region's grid at a θ of the range the strong noise (eq. 12–13), which meets every per-point floor too.

        :raises ValueError: as :func:`~gpflow_fed.release.synthetic_noise_covariance` /
            :func:`~gpflow_fed.release.region_noise_covariance` (e.g. a tolerance at or above a prior variance).
        """
        tolerance = tolerance_at(self.tolerance, self.kernel, at)
        method = self.method
        if method == "strong" and not self.follows(at) and self.targets.points.shape[0] > 1:
            method = "weak"
        if self.region is not None:
            if not isinstance(tolerance, gpflow.kernels.Kernel) or self.density is None:
                raise TypeError("a region's design needs a kernel tolerance and a density")
            # at a θ of the range where the weak Krylov reduction cannot certify, the strong noise (eq. 12–13),
            # which meets every per-point floor too (more noise, never less protection)
            methods = [method, "strong"] if method == "weak" and at is not self.kernel else [method]
            for attempt, region_method in enumerate(methods):
                try:
                    return region_noise_covariance(
                        at,
                        self.X,
                        self.region,
                        tolerance,
                        density=self.density,
                        noise_variance=self.noise_variance,
                        low_rank=bool(self.low_rank),
                        method=region_method,
                        protect=self.protect,
                        earlier=fixed,
                    )
                except KrylovError:
                    if attempt == len(methods) - 1:
                        raise
            raise AssertionError("unreachable: the last method raises or returns")
        if method == "strong" and at is not self.kernel:
            return self._strong_pivoted(at, tolerance, fixed)
        solvers = [self.solver if method == self.method else None, "dense"]
        for attempt, solver in enumerate(solvers):
            try:
                return synthetic_noise_covariance(
                    at,
                    self.X,
                    self.S,
                    tolerance,
                    noise_variance=self.noise_variance,
                    method=method,
                    low_rank=self.low_rank,
                    solver=solver,
                    protect=self.protect,
                    earlier=fixed,
                )
            except KrylovError:
                if fixed is None or attempt or self.X.shape[0] > DENSE_FALLBACK_MAX_N:
                    raise
        raise AssertionError("unreachable: the dense solver raises or returns")

    def _strong_pivoted(
        self, at: gpflow.kernels.Kernel, tolerance: Tolerance, fixed: Optional[np.ndarray]
    ) -> Covariance:
        """``(C_XP (P_P − Ξ_P)⁻¹ C_PX − K_θ − V − fixed)⁺`` on the pivot set P of ``P_T − Ξ_T`` (eq. 8/11 at θ)."""
        v = noise_vector(self.noise_variance, self.X.shape[0])
        CXT, PT = target_blocks(at, self.X, self.targets, v)
        resolved = resolve_tolerance(at, self.S, tolerance, check_prior=False)
        Xi, _ = target_tolerance(resolved, self.targets, np.diag(PT))
        M = PT - Xi
        B, _ = pivoted_region_factor(CXT, 0.5 * (M + M.T))
        KXX = kernel_matrix(at, self.X)
        if fixed is not None:
            KXX += np.asarray(fixed)
        return positive_part_of_difference(B, KXX, v, low_rank=False)


__all__ = ["DENSE_FALLBACK_MAX_N", "Floor", "ReleaseDesign", "tolerance_at"]
