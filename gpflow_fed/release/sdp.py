"""The weakly privacy-aware SDP (eq. 10) and the diagonal-Σ SDP of Example 1, solved with cvxpy.

Solver accuracy: Clarabel (the default; an interior-point method) is run with ``tol_gap_abs = tol_gap_rel =
tol_feas = 1e-9`` on the problem scaled so that ``max diag K = 1``. After solving, Σ is symmetrised and
projected onto the PSD cone, and each constraint ``Σ + K + V − bᵢbᵢᵀ/(K(sᵢ,sᵢ) − ξᵢ) ⪰ 0`` is evaluated. A
residual violation δ (≤ 1e-6 of the scale, else the solve is rejected) is repaired by adding ``2δ·I``
so the returned Σ is feasible up to round-off and its trace exceeds the solver's
optimum by at most ``2Nδ``; :class:`SDPInfo` reports the achieved numbers. SCS may be chosen with
``solver="SCS"`` (lower accuracy; the same repair and checks apply).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, cast

import cvxpy as cp
import gpflow
import numpy as np

#: Feasibility and gap tolerances given to Clarabel (relative to the scaled problem).
CLARABEL_TOL = 1e-9
#: Largest violation (relative to the scale) that is repaired rather than rejected.
MAX_REPAIR_RTOL = 1e-6

#: The largest memory (bytes) a Clarabel SDP may be estimated to need before it is built (:func:`check_sdp_size`):
#: 4 GiB. A weak region at N = 120 grew past 10 GB in one Clarabel solve (issue 44).
MAX_SDP_BYTES = 4 * 2**30
#: Clarabel's memory per squared entry of a PSD cone: a cone of side n has ``t = n(n+1)/2`` entries and its dense
#: scaling block in the KKT system ``t²`` (8 bytes each). Measured (``/usr/bin/time -v``, maximum resident set minus
#: the 0.75 GB of the imports) for the reduced weak LMI of side 60, 80, 100, 120 (k = γ = side/2): 195 MB, 600 MB,
#: 1.45 GB, 2.98 GB, i.e. 7.3, 7.1, 7.1, 7.1 times ``8t²``: 56 bytes per ``t²`` (the scaling block, the KKT matrix
#: and its LDLᵀ factor). The dense weak SDP's γ LMIs of side N share the variable Σ, whose fill in the factor counts
#: as one more cone: measured 1.09 GB (N = 60, γ = 3) and 2.16 GB (N = 80, γ = 2), estimated with γ + 2 cones
#: 0.94 GB and 2.35 GB.
SDP_BYTES_PER_CONE_ENTRY_SQUARED = 56


def sdp_bytes(cone_sides: "list[int]") -> int:
    """The estimated memory (bytes) of a Clarabel solve with PSD cones of these sides:
    ``SDP_BYTES_PER_CONE_ENTRY_SQUARED · Σ (n(n+1)/2)²``."""
    return int(SDP_BYTES_PER_CONE_ENTRY_SQUARED * sum((n * (n + 1) // 2) ** 2 for n in cone_sides))


def check_sdp_size(cone_sides: "list[int]", what: str, remedy: str) -> None:
    """Refuse, before the problem is built, an SDP whose estimated memory (:func:`sdp_bytes`) exceeds
    :data:`MAX_SDP_BYTES`.

    :raises ValueError: naming ``what`` (the sizes), the estimate, the limit and ``remedy``.
    """
    need = sdp_bytes(cone_sides)
    if need > MAX_SDP_BYTES:
        raise ValueError(
            f"{what}: Clarabel would need about {need / 2**30:.1f} GiB (PSD cones of side "
            f"{_sides(cone_sides)}; the limit is {MAX_SDP_BYTES / 2**30:g} GiB, release.sdp.MAX_SDP_BYTES); {remedy}"
        )


def _sides(cone_sides: "list[int]") -> str:
    """``"120 ×31"`` for 31 cones of side 120, ``"169"`` for one."""
    counts: "dict[int, int]" = {}
    for n in cone_sides:
        counts[n] = counts.get(n, 0) + 1
    return ", ".join(f"{n} ×{c}" if c > 1 else str(n) for n, c in counts.items())


@dataclass(frozen=True)
class SDPInfo:
    """What the SDP solve achieved.

    :param solver: the cvxpy solver used.
    :param status: cvxpy's status string.
    :param objective: the solver's optimal trace (unscaled).
    :param repair: the shift δ added to restore exact feasibility.
    :param min_constraint_eigenvalue: the smallest eigenvalue over all constraints after repair (≥ 0).
    """

    solver: str
    status: str
    objective: float
    repair: float
    min_constraint_eigenvalue: float


def solve_privacy_sdp(
    C: np.ndarray,
    KXS: np.ndarray,
    margin: np.ndarray,
    *,
    diagonal: bool = False,
    solver: Optional[str] = None,
) -> "tuple[np.ndarray, SDPInfo]":
    r"""Solve ``min tr Σ s.t. Σ + C − bᵢbᵢᵀ / mᵢ ⪰ 0 (i = 1..γ), Σ ⪰ 0`` (eq. 10; Σ diagonal if ``diagonal``).

    :param C: ``[N, N]`` ``K_XX + V``.
    :param KXS: ``[N, γ]`` columns ``bᵢ = K_{X, sᵢ}``.
    :param margin: ``[γ]`` ``mᵢ = K(sᵢ, sᵢ) − ξᵢ > 0``.
    :param diagonal: restrict Σ to diagonal matrices (the comparison method of Example 1).
    :param solver: ``"CLARABEL"`` (default) or ``"SCS"``.
    :return: ``(Σ, info)`` with Σ ``[N, N]`` PSD and exactly feasible.
    :raises ValueError: unknown solver, an infeasible/failed solve (the message names the status and the fix), or a
        problem estimated to need more than :data:`MAX_SDP_BYTES` (:func:`check_sdp_size`; before it is built).
    """
    solver = (solver or "CLARABEL").upper()
    if solver not in ("CLARABEL", "SCS"):
        raise ValueError(f"unknown SDP solver {solver!r}; use 'CLARABEL' (default) or 'SCS'")
    N, gamma = KXS.shape
    check_sdp_size(  # Σ ⪰ 0 and the fill of the shared Σ in the KKT factor count as two more cones (measured)
        [N] * (gamma + (0 if diagonal else 2)),
        f"the dense {'diagonal' if diagonal else 'weak'} SDP has one N×N LMI per sensitive point (N = {N}, "
        f"{gamma} sensitive points{'' if diagonal else ', and Σ ⪰ 0'})",
        "use fewer sensitive points, method='weak' with the Krylov reduction (solver='krylov', the default), or "
        "method='strong' (a closed form)",
    )
    scale = float(max(np.max(np.diag(C)), np.finfo(float).tiny))
    Cs, Bs = C / scale, KXS / np.sqrt(scale)
    if diagonal:
        s = cp.Variable(N, nonneg=True)
        Sigma_var: cp.Expression = cp.diag(s)
    else:
        Sigma_var = cp.Variable((N, N), PSD=True)
    constraints = []
    for i in range(KXS.shape[1]):
        b = Bs[:, i : i + 1]
        M = Cs - (b @ b.T) / margin[i]
        constraints.append(Sigma_var + 0.5 * (M + M.T) >> 0)
    problem = cp.Problem(cp.Minimize(cp.trace(Sigma_var)), constraints)
    options = (
        dict(tol_gap_abs=CLARABEL_TOL, tol_gap_rel=CLARABEL_TOL, tol_feas=CLARABEL_TOL)
        if solver == "CLARABEL"
        else dict(eps=1e-9, max_iters=200_000)
    )
    try:
        problem.solve(solver=solver, **options)
    except cp.error.SolverError as exc:
        raise ValueError(
            f"the privacy SDP failed in {solver} ({exc}); try solver='SCS'/'CLARABEL' or "
            "method='strong', which has a closed form"
        ) from exc
    if problem.status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE):
        raise ValueError(
            f"the privacy SDP is {problem.status} ({solver}); check that every tolerance is below the "
            "prior variance, or use method='strong'"
        )
    # s.value is set by the successful solve above
    value = np.diag(cast(np.ndarray, s.value)) if diagonal else np.asarray(Sigma_var.value)
    value = 0.5 * (value + value.T)
    if not diagonal:
        lam, vecs = np.linalg.eigh(value)
        value = (vecs * np.clip(lam, 0.0, None)) @ vecs.T
    else:
        value = np.diag(np.clip(np.diag(value), 0.0, None))
    worst = min(
        float(np.linalg.eigvalsh(value + Cs - (Bs[:, i : i + 1] @ Bs[:, i : i + 1].T) / margin[i])[0])
        for i in range(KXS.shape[1])
    )
    repair = max(0.0, -worst)
    if repair > MAX_REPAIR_RTOL:
        raise ValueError(
            f"the privacy SDP solution violates its constraints by {repair:.2e} (relative) in {solver}; "
            "use solver='CLARABEL' or method='strong'"
        )
    if repair > 0.0:
        # Enough to make every constraint PSD up to floating-point round-off on the repaired matrix.
        value = value + 2.0 * repair * np.eye(N, dtype=value.dtype)
    final = min(
        float(np.linalg.eigvalsh(value + Cs - (Bs[:, i : i + 1] @ Bs[:, i : i + 1].T) / margin[i])[0])
        for i in range(KXS.shape[1])
    )
    Sigma: np.ndarray = (value * scale).astype(gpflow.default_float())
    info = SDPInfo(
        solver=solver,
        status=str(problem.status),
        objective=float(problem.value) * scale,
        repair=2.0 * repair * scale,
        min_constraint_eigenvalue=final * scale,
    )
    return Sigma, info
