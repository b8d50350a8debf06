r"""The weakly privacy-aware SDP (eq. 10) at scale: block-Krylov reduction with a certified optimality gap.

Tuo & Bhattacharya leave the scalability of the weak solution open (§6). With ``C = K_XX + V ≻ 0``,
``bᵢ = K_{X,sᵢ}`` and ``mᵢ = K(sᵢ,sᵢ) − ξᵢ > 0`` the SDP (10) is

    ``min tr Σ  s.t.  Σ + C ⪰ bᵢbᵢᵀ / mᵢ (i = 1..γ),  Σ ⪰ 0``,

equivalently (Schur complement) ``bᵢᵀ(C + Σ)⁻¹bᵢ ≤ mᵢ``: the predictive variance at ``sᵢ`` is ≥ ξᵢ (eq. 5).

**Reduction (exact).** Let Q (``[N, k]``, orthonormal) span the block Krylov space
``𝒦 = span{B, CB, C²B, …}`` (it starts from B, so every ``bᵢ = Q hᵢ`` with ``hᵢ = Qᵀbᵢ``) and restrict
``Σ = Q S Qᵀ``. Completing Q to an orthonormal basis ``[Q, Q⊥]`` and taking the Schur complement of the
``Q⊥`` block (where ``Σ`` and ``bᵢ`` vanish) shows that constraint i is *equivalent* to the k-dimensional

    ``S + G⁻¹ ⪰ hᵢhᵢᵀ / mᵢ``,  ``G = QᵀC⁻¹Q``

(``G⁻¹`` is the Schur complement of C onto range Q). So every S feasible in k dimensions gives a Σ feasible
for the full problem: the reduced optimum is an upper bound, tightening as 𝒦 grows. All γ constraints share
``S + G⁻¹``; they are one linear matrix inequality of size ``k + γ``:

    ``[[S + G⁻¹, H], [Hᵀ, Z]] ⪰ 0,  Zᵢᵢ ≤ mᵢ``  (``H = QᵀB``; Z free symmetric),

because this holds iff ``Z ⪰ HᵀG̃⁻¹H`` with ``G̃ = S + G⁻¹``, i.e. iff ``hᵢᵀG̃⁻¹hᵢ ≤ mᵢ`` for every i.

**Certificate.** In the same bordered form the dual of (10) is
``max −⟨Y₁₁, C⟩ − 2⟨Y₁₂, B⟩ − νᵀm`` over ``[[Y₁₁, Y₁₂], [Y₁₂ᵀ, diag ν]] ⪰ 0``, ``Y₁₁ ⪯ I`` (weak duality:
any such point bounds the optimal trace from below). The small problem's dual ``(Y₁₁, Y₁₂, ν)``, lifted to
``(QY₁₁Qᵀ, QY₁₂, ν)``, satisfies both conditions in N dimensions (a congruence, and Q orthonormal), and its
value is ``−⟨Y₁₁, QᵀCQ⟩ − 2⟨Y₁₂, QᵀB⟩ − νᵀm``: the small optimum minus ``⟨Y₁₁, QᵀCQ − G⁻¹⟩`` (the Krylov
"escape", which for a Krylov basis lives on the last block only) — an O(k²) evaluation, no N×N eigenvalue.
Solver round-off is removed before the bound is evaluated (:func:`_lifted_lower_bound`). The Krylov space
grows by one block (at most γ columns, one O(N²γ) product) until ``(tr Σ − bound) / tr Σ ≤ gap_rtol``; the
small SDP is first solved once ``k‖QᵀCQ − G⁻¹‖₂ / tr(QᵀCQ) ≤ ESCAPE_RTOL`` (or at the largest dimension).

**Exact feasibility.** The reduced S is projected onto the PSD cone and shifted by ``2δ·I_k`` when a reduced
constraint is violated by δ (solver round-off); the returned Σ is then checked in full dimension by one
Cholesky of ``C + Σ``: ``minᵢ (Var[f(sᵢ) | W] − ξᵢ) / mᵢ ≥ −FEASIBILITY_RTOL`` or ValueError.

**Small solver.** The reduced SDP is solved by a numpy log-barrier method in the k(k+1)/2 entries of S
(:func:`_small_weak_barrier`; it uses that all γ constraints share ``S + G⁻¹``: constraint i is the scalar
``hᵢᵀ(S + G⁻¹)⁻¹hᵢ ≤ mᵢ``). The KKT conditions make each dual multiplier rank one, ``Λᵢ = λᵢuᵢuᵢᵀ`` with
``uᵢ = (S + G⁻¹)⁻¹hᵢ``; with the uᵢ of the barrier solution fixed, the best λ is a small SDP in γ scalars
(:func:`_rank_one_lower_bound`), and the lifted bound is evaluated at that exactly dual-feasible point. If the
barrier fails, or ``k > BARRIER_MAX_DIMENSION``, the bordered LMI above goes to Clarabel (``small_solver=
"clarabel"`` forces it).

Cost: O(N³/3) for two Cholesky factorisations (C, and the final check), O(N²k) for the Krylov products and
solves, plus the small SDP: per Newton step O(k⁶/8) for the factorisation of the k(k+1)/2-dimensional Newton
system (a few dozen steps), against Clarabel's bordered LMI whose cost grows like ``(k + γ)⁶``.
"""

from __future__ import annotations

import time
import warnings
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Optional, cast

import cvxpy as cp
import gpflow
import numpy as np
from check_shapes import check_shapes
from scipy.linalg import cho_factor, cho_solve, cholesky, solve_triangular

from .lowrank import LowRankCovariance, orthonormal_block
from .sdp import check_sdp_size

#: Default certified relative optimality gap ``(tr Σ − lower bound) / tr Σ``.
GAP_RTOL = 1e-6
#: Accepted full-dimensional feasibility margin ``minᵢ (Var[f(sᵢ)|W] − ξᵢ) / mᵢ`` (round-off).
FEASIBILITY_RTOL = 1e-9
#: The small SDP is first solved once the Krylov escape ``k‖T − G⁻¹‖₂ / tr T`` (``T = QᵀCQ``) is below this.
ESCAPE_RTOL = 1e-6
#: Clarabel tolerances for the small SDPs (on the problem scaled so that ``max diag C = 1``).
SMALL_SDP_TOL = 1e-10


@dataclass(frozen=True)
class WeakCertificate:
    """What the reduced weak solve proved about the returned Σ.

    :param objective: ``tr Σ`` of the returned (feasible) Σ — an upper bound on the optimum of (10).
    :param lower_bound: a certified lower bound on the optimum of (10) (weak duality, module docstring).
    :param relative_gap: ``(objective − lower_bound) / objective`` (0 when Σ = 0 is optimal).
    :param feasibility_margin: ``minᵢ (Var[f(sᵢ) | W] − ξᵢ)``, computed in full dimension by a Cholesky of
        ``K + V + Σ`` (≥ 0 up to round-off).
    :param krylov_dimension: k, the dimension of the final Krylov space.
    :param steps: the number of Krylov blocks.
    :param seconds: wall-clock time of the solve (excluding the kernel matrices).
    :param solver: ``"krylov"`` (this module).
    """

    objective: float
    lower_bound: float
    relative_gap: float
    feasibility_margin: float
    krylov_dimension: int
    steps: int
    seconds: float
    solver: str = "krylov"


class CertifiedCovariance(LowRankCovariance):
    """A :class:`LowRankCovariance` Σ with the :class:`WeakCertificate` of its solve (``.certificate``)."""

    def __init__(self, eigenvalues: np.ndarray, eigenvectors: np.ndarray, certificate: WeakCertificate) -> None:
        super().__init__(eigenvalues, eigenvectors)
        self.certificate = certificate

    def __repr__(self) -> str:
        c = self.certificate
        return (
            f"CertifiedCovariance(N={self.shape[0]}, rank={self.rank}, trace={self.trace():.8g}, "
            f"gap={c.relative_gap:.1e}, margin={c.feasibility_margin:.1e}, k={c.krylov_dimension})"
        )


def _small_weak_sdp(Ginv: np.ndarray, H: np.ndarray, m: np.ndarray) -> "tuple[np.ndarray, np.ndarray, np.ndarray]":
    """``min tr S s.t. [[S + G⁻¹, H], [Hᵀ, Z]] ⪰ 0, Zᵢᵢ ≤ mᵢ, S ⪰ 0`` with Clarabel.

    :return: ``(S [k, k] PSD, Y [k + γ, k + γ], ν [γ])``: the primal S and the duals of the LMI and of
        ``Zᵢᵢ ≤ mᵢ``.
    :raises ValueError: a problem estimated to need more than :data:`~gpflow_fed.release.sdp.MAX_SDP_BYTES`
        (:func:`~gpflow_fed.release.sdp.check_sdp_size`), before it is built.
    """
    k, gamma = H.shape
    check_sdp_size(
        [k + gamma, k],
        f"the reduced weak SDP has one LMI of side k + γ = {k + gamma} (Krylov dimension k = {k}, γ = {gamma} "
        "sensitive points: for a region, its grid points and records)",
        "use fewer sensitive points (for a region a lower density= or a smaller region), or method='strong' "
        "(a closed form)",
    )
    S = cp.Variable((k, k), PSD=True)
    Z = cp.Variable((gamma, gamma), symmetric=True)
    lmi = cp.bmat([[S + 0.5 * (Ginv + Ginv.T), H], [H.T, Z]])
    constraints = [lmi >> 0, cp.diag(Z) <= m]
    problem = cp.Problem(cp.Minimize(cp.trace(S)), constraints)
    try:
        problem.solve(solver="CLARABEL", tol_gap_abs=SMALL_SDP_TOL, tol_gap_rel=SMALL_SDP_TOL, tol_feas=SMALL_SDP_TOL)
    except cp.error.SolverError as exc:
        raise ValueError(
            f"the reduced weak SDP failed in Clarabel ({exc}); use solver='dense' for small N or method='strong'"
        ) from exc
    if problem.status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE) or S.value is None:
        raise ValueError(
            f"the reduced weak SDP is {problem.status}; check that every tolerance is below the prior "
            "variance, or use solver='dense' or method='strong'"
        )
    value = 0.5 * (S.value + S.value.T)
    lam, vecs = np.linalg.eigh(value)
    Y = np.asarray(constraints[0].dual_value, dtype=float)
    nu = np.asarray(constraints[1].dual_value, dtype=float).reshape(-1)
    return (vecs * np.clip(lam, 0.0, None)) @ vecs.T, 0.5 * (Y + Y.T), nu


#: Largest Krylov dimension k for the numpy barrier solver (its Newton system has k(k+1)/2 unknowns).
BARRIER_MAX_DIMENSION = 80
#: The barrier path stops once its duality-gap bound ``(k + γ)/t`` is below this fraction of ``tr S``.
BARRIER_RTOL = 1e-8
#: Newton steps per centring stage, and the factor by which t grows between stages.
BARRIER_MAX_NEWTON, BARRIER_GROWTH = 60, 50.0


class _BarrierFailure(RuntimeError):
    """The numpy barrier method could not follow the central path (the caller falls back to Clarabel)."""


def _small_weak_barrier(Ginv: np.ndarray, H: np.ndarray, m: np.ndarray) -> "tuple[np.ndarray, np.ndarray]":
    r"""``min tr S s.t. S ⪰ 0, hᵢᵀ(S + G⁻¹)⁻¹hᵢ ≤ mᵢ`` by a primal log-barrier method with Newton steps.

    The barrier ``t·tr S − log det S − Σᵢ log rᵢ``, ``rᵢ = mᵢ − hᵢᵀM⁻¹hᵢ``, ``M = S + G⁻¹`` describes the
    same feasible set as the bordered LMI of :func:`_small_weak_sdp` (``hᵢᵀM⁻¹hᵢ ≤ mᵢ`` is the Schur
    complement of ``[[M, hᵢ], [hᵢᵀ, mᵢ]] ⪰ 0``) in k(k+1)/2 unknowns instead of Clarabel's cone of size
    ``k + γ``. With ``uᵢ = M⁻¹hᵢ`` its gradient is ``tI − S⁻¹ − Σᵢ uᵢuᵢᵀ/rᵢ`` and its Hessian the quadratic
    form ``tr(S⁻¹XS⁻¹X) + Σᵢ [2(Xuᵢ)ᵀM⁻¹(Xuᵢ)/rᵢ + (uᵢᵀXuᵢ)²/rᵢ²]``, assembled in the orthonormal ``svec``
    basis of symmetric matrices, in the eigenbasis of S with a Jacobi scaling (S approaches rank ≤ γ). Every
    iterate is strictly feasible. At the end of the path ``tr S`` exceeds the reduced optimum by at most
    ``(k + γ)/t ≤ BARRIER_RTOL·tr S``.

    :return: ``(S, U)``: S [k, k] (positive definite, strictly feasible) and ``U = M⁻¹H`` [k, γ].
    :raises _BarrierFailure: no strictly feasible start, or a centring stage that does not converge.
    """
    k, gamma = H.shape
    Ginv = 0.5 * (Ginv + Ginv.T)
    a, b = np.triu_indices(k)
    w = np.where(a == b, 1.0, np.sqrt(2.0))  # svec(X) = X[a, b]·w is an isometry
    c = np.where(a == b, 0.5, np.sqrt(0.5))  # svec basis vectors: e_aa and (e_ab + e_ba)/√2
    cc = np.outer(c, c)
    eye = np.eye(k)

    def smat(v: np.ndarray) -> np.ndarray:
        X = np.zeros((k, k))
        X[a, b] = v / w
        X[b, a] = v / w
        return X

    def kron_sym(X: np.ndarray, Y: np.ndarray) -> np.ndarray:
        """``X ⊗ Y + Y ⊗ X`` restricted to symmetric matrices, in the svec basis (up to the factor cc)."""
        aa, bb, ab, ba = np.ix_(a, a), np.ix_(b, b), np.ix_(a, b), np.ix_(b, a)
        return X[aa] * Y[bb] + X[ab] * Y[ba] + Y[aa] * X[bb] + Y[ab] * X[ba]

    def evaluate(S: np.ndarray) -> "Optional[tuple[float, np.ndarray, np.ndarray, np.ndarray]]":
        try:
            Ls = np.linalg.cholesky(S)
            Lm = np.linalg.cholesky(S + Ginv)
        except np.linalg.LinAlgError:
            return None
        U = cho_solve((Lm, True), H, check_finite=False)
        r = m - np.einsum("ki,ki->i", H, U)
        if np.any(r <= 0):
            return None
        return 2.0 * float(np.sum(np.log(np.diag(Ls)))), Lm, U, r

    S = (2.0 * float(np.max(np.sum(H * H, axis=0) / m)) + 1e-12) * eye  # then hᵢᵀM⁻¹hᵢ < mᵢ/2
    state = evaluate(S)
    if state is None:
        raise _BarrierFailure("no strictly feasible starting point")
    nbar = k + gamma
    t = nbar / float(np.trace(S))
    while True:
        for it in range(BARRIER_MAX_NEWTON):
            logdet, Lm, U, r = state
            sig, V = np.linalg.eigh(S)
            Minv = V.T @ cho_solve((Lm, True), V, check_finite=False)
            Ur = V.T @ U
            g = t * eye - np.diag(1.0 / sig) - (Ur / r) @ Ur.T
            P = (Ur * (2.0 / r)) @ Ur.T
            A = Ur[a] * Ur[b] * (w[:, None] / r)
            Hs = cc * kron_sym(Minv, P) + A @ A.T
            Hs[np.diag_indices_from(Hs)] += 1.0 / (sig[a] * sig[b])  # tr(S⁻¹XS⁻¹X): diagonal in this basis
            gs = g[a, b] * w
            sc = 1.0 / np.sqrt(np.diag(Hs))
            try:
                d = -sc * cho_solve(cho_factor(0.5 * (Hs + Hs.T) * np.outer(sc, sc)), gs * sc)
            except np.linalg.LinAlgError as exc:
                raise _BarrierFailure("singular Newton system") from exc
            dec = -float(gs @ d)  # squared Newton decrement
            if dec <= 2e-10:
                break
            if it == BARRIER_MAX_NEWTON - 1:
                raise _BarrierFailure(f"centring stalled at t = {t:.3g}")
            D = V @ smat(d) @ V.T
            f0 = t * float(np.trace(S)) - logdet - float(np.sum(np.log(r)))
            step = 1.0
            while True:  # full steps near the centre (dec < 1/4), Armijo backtracking elsewhere
                trial = S + step * D
                new = evaluate(trial)
                if new is not None and (
                    dec < 0.25
                    or t * float(np.trace(trial)) - new[0] - float(np.sum(np.log(new[3]))) <= f0 - 0.25 * step * dec
                ):
                    break
                step *= 0.5
                if step < 1e-14:
                    raise _BarrierFailure("line search failed")
            S, state = 0.5 * (trial + trial.T), new
        if nbar / t <= BARRIER_RTOL * float(np.trace(S)):
            return S, state[2]
        t *= BARRIER_GROWTH


def _rank_one_lower_bound(U: np.ndarray, Ginv: np.ndarray, T: np.ndarray, H: np.ndarray, m: np.ndarray) -> float:
    r"""A certified lower bound from rank-one dual multipliers ``Λᵢ = λᵢuᵢuᵢᵀ`` (``uᵢ = M⁻¹hᵢ``, the KKT form).

    With the directions uᵢ fixed, the reduced dual ``max Σᵢ λᵢ[(uᵢᵀhᵢ)²/mᵢ − uᵢᵀG⁻¹uᵢ]`` over ``λ ≥ 0``,
    ``Σᵢ λᵢuᵢuᵢᵀ ⪯ I`` is a small SDP in γ scalars (Clarabel). The point ``Y = Σᵢ vᵢvᵢᵀ``,
    ``vᵢ = √λᵢ[uᵢ; −(uᵢᵀhᵢ/mᵢ)eᵢ]`` is PSD by construction; after scaling λ so that ``λ_max(Y₁₁) ≤ 1`` it is
    feasible for the lifted dual (module docstring), whose value is ``Σᵢ λᵢ[(uᵢᵀhᵢ)²/mᵢ − uᵢᵀTuᵢ]``.
    """
    k, gamma = U.shape
    norms = np.maximum(np.linalg.norm(U, axis=0), np.finfo(float).tiny)
    Un = U / norms
    uh = np.einsum("ki,ki->i", U, H)
    value = (uh**2 / m - np.einsum("ki,kl,li->i", U, Ginv, U)) / norms**2
    lam = cp.Variable(gamma, nonneg=True)
    problem = cp.Problem(cp.Maximize(value @ lam), [Un @ cp.diag(lam) @ Un.T << np.eye(k)])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            problem.solve(solver="CLARABEL", tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12)
    except cp.error.SolverError:
        return -np.inf
    if lam.value is None:
        return -np.inf
    lam = np.clip(np.asarray(lam.value, dtype=float), 0.0, None) / norms**2
    top = float(np.linalg.eigvalsh((U * lam) @ U.T)[-1])
    lam = lam / max(1.0, top * (1.0 + 1e-12))
    return float(np.sum(lam * (uh**2 / m - np.einsum("ki,kl,li->i", U, T, U))))


def _one_blas_thread() -> AbstractContextManager[object]:
    """Limit BLAS to one thread where threadpoolctl is installed (else no-op).

    The barrier's Newton systems are small (k(k+1)/2 ≲ 3,240 unknowns) and factored ~60 times; on a shared
    2-core machine multithreaded OpenBLAS made the N = 1,000, γ = 50 case 50 s instead of 6.9 s (measured
    with ``OPENBLAS_NUM_THREADS=2`` vs ``1``, load average 4, see BENCHMARKS.md issue-17 section).
    """
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # optional: installed with scikit-learn
        return nullcontext()
    return threadpool_limits(limits=1, user_api="blas")


def _small_solve(
    Ginv: np.ndarray, H: np.ndarray, m: np.ndarray, T: np.ndarray, solver: str
) -> "tuple[np.ndarray, float]":
    """The reduced weak SDP and a certified lower bound: the numpy barrier first, Clarabel as the fallback."""
    if solver == "barrier" and H.shape[0] <= BARRIER_MAX_DIMENSION:
        try:
            with _one_blas_thread():
                S, U = _small_weak_barrier(Ginv, H, m)
        except _BarrierFailure:
            pass
        else:
            return S, _rank_one_lower_bound(U, Ginv, T, H, m)
    S, Y, nu = _small_weak_sdp(Ginv, H, m)
    return S, _lifted_lower_bound(Y, nu, T, H, m)


def _repair(S: np.ndarray, Ginv: np.ndarray, H: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Shift S by ``2δ·I`` if a reduced constraint ``S + G⁻¹ − hᵢhᵢᵀ/mᵢ`` has smallest eigenvalue −δ < 0."""
    M = S + 0.5 * (Ginv + Ginv.T)
    worst = min(float(np.linalg.eigvalsh(M - np.outer(H[:, i], H[:, i]) / m[i])[0]) for i in range(H.shape[1]))
    if worst < 0.0:
        S = S + 2.0 * (-worst) * np.eye(S.shape[0], dtype=S.dtype)
    return S


#: Eigenvalues of the lifted dual block ``Y₁₁`` are clipped to ``[DUAL_FLOOR, 1]`` before ν is recomputed.
DUAL_FLOOR = 1e-13


def _lifted_lower_bound(Y: np.ndarray, nu: np.ndarray, T: np.ndarray, QtB: np.ndarray, m: np.ndarray) -> float:
    r"""A certified lower bound on the full optimum from the reduced dual, lifted by Q (module docstring).

    The dual of (10) in bordered form is ``max −⟨Y₁₁, C⟩ − 2⟨Y₁₂, B⟩ − νᵀm`` over
    ``[[Y₁₁, Y₁₂], [Y₁₂ᵀ, diag ν]] ⪰ 0``, ``Y₁₁ ⪯ I``. Lifting ``(QY₁₁Qᵀ, QY₁₂, ν)`` keeps both conditions
    and gives ``−⟨Y₁₁, T⟩ − 2⟨Y₁₂, QᵀB⟩ − νᵀm`` with ``T = QᵀCQ``. Solver round-off is removed first:
    the eigenvalues of ``Y₁₁`` are clipped to ``[DUAL_FLOOR, 1]`` and ν is raised until
    ``diag ν ⪰ Y₁₂ᵀY₁₁⁻¹Y₁₂`` (the Schur complement), so the evaluated point is exactly dual feasible.
    """
    k = T.shape[0]
    Y12 = Y[:k, k:]
    lam, V = np.linalg.eigh(0.5 * (Y[:k, :k] + Y[:k, :k].T))
    lam = np.clip(lam, DUAL_FLOOR, 1.0)
    Y11 = (V * lam[None, :]) @ V.T
    P = V.T @ Y12
    nu = np.clip(nu, 0.0, None)
    schur = np.diag(nu) - (P / lam[:, None]).T @ P
    nu = nu + max(0.0, -float(np.linalg.eigvalsh(0.5 * (schur + schur.T))[0]))
    return float(-np.sum(Y11 * T) - 2.0 * np.sum(Y12 * QtB) - nu @ m)


def _schur_inverse(L: np.ndarray, Q: np.ndarray) -> np.ndarray:
    """``G⁻¹`` with ``G = QᵀC⁻¹Q`` from the Cholesky factor L of C (via a QR of ``L⁻¹Q``)."""
    W = solve_triangular(L, Q, lower=True, check_finite=False)
    R = cast(np.ndarray, np.linalg.qr(W, mode="r"))  # numpy's stubs type every mode as QRResult; "r" gives R
    Rinv = solve_triangular(R, np.eye(R.shape[0]), lower=False, check_finite=False)
    Ginv = Rinv @ Rinv.T
    return 0.5 * (Ginv + Ginv.T)


class KrylovError(ValueError):
    """The Krylov reduction cannot solve this problem where the dense SDP (``solver="dense"``) can: ``K + V`` (plus
    any earlier Σ) is not numerically positive definite, or no certificate is reached within ``max_dimension``."""


@check_shapes("C: [N, N]", "KXS: [N, G]", "margin: [G]")
def solve_weak_krylov(
    C: np.ndarray,
    KXS: np.ndarray,
    margin: np.ndarray,
    *,
    gap_rtol: float = GAP_RTOL,
    max_dimension: Optional[int] = None,
    small_solver: str = "barrier",
) -> CertifiedCovariance:
    r"""The weak SDP (10) ``min tr Σ s.t. Σ + C ⪰ bᵢbᵢᵀ/mᵢ, Σ ⪰ 0`` by certified block-Krylov reduction.

    :param C: ``[N, N]`` ``K_XX + V`` (must be numerically positive definite).
    :param KXS: ``[N, γ]`` columns ``bᵢ = K_{X, sᵢ}``.
    :param margin: ``[γ]`` ``mᵢ = K(sᵢ, sᵢ) − ξᵢ > 0``.
    :param gap_rtol: the certified relative gap to reach (default 1e-6).
    :param max_dimension: the largest Krylov dimension k tried (default ``min(N, max(12γ, 60))``).
    :param small_solver: ``"barrier"`` (default: the numpy barrier method of :func:`_small_weak_barrier` for
        ``k ≤ BARRIER_MAX_DIMENSION``, Clarabel otherwise or if it fails) or ``"clarabel"`` (always the bordered
        LMI in cvxpy/Clarabel).
    :return: Σ as a :class:`CertifiedCovariance` (rank ≤ k) with its :class:`WeakCertificate`.
    :raises ValueError: ``C`` not positive definite, ``mᵢ ≤ 0``, bad ``gap_rtol``, a failed small SDP, or a
        gap/feasibility margin not reached within ``max_dimension`` (the message names the values reached).
    """
    start = time.perf_counter()
    dtype = gpflow.default_float()
    C = np.asarray(C, dtype=dtype)
    B: np.ndarray = np.asarray(KXS, dtype=dtype)
    m: np.ndarray = np.asarray(margin, dtype=dtype).reshape(-1)
    N, gamma = B.shape
    if not (np.all(np.isfinite(C)) and np.all(np.isfinite(B)) and np.all(np.isfinite(m))):
        raise ValueError("C, KXS and margin must be finite")
    if np.any(m <= 0):
        raise ValueError(
            f"every margin mᵢ = K(sᵢ,sᵢ) − ξᵢ must be > 0, got min {m.min():g}; lower the tolerance "
            "below the prior variance"
        )
    if small_solver not in ("barrier", "clarabel"):
        raise ValueError(f"small_solver must be 'barrier' or 'clarabel', got {small_solver!r}")
    if not 0.0 < gap_rtol < 1.0:
        raise ValueError(f"gap_rtol must lie in (0, 1), got {gap_rtol}")
    max_dim = min(N, max(12 * gamma, 60)) if max_dimension is None else int(max_dimension)
    if max_dim < 1:
        raise ValueError(f"max_dimension must be ≥ 1, got {max_dimension}")
    scale = float(max(np.max(np.diag(C)), np.finfo(float).tiny))
    Cs, Bs = C / scale, B / np.sqrt(scale)
    try:
        L = cholesky(0.5 * (Cs + Cs.T), lower=True, check_finite=False)
    except np.linalg.LinAlgError as exc:
        raise KrylovError(
            "K + V is not numerically positive definite, so the Krylov reduction cannot form "
            "(QᵀC⁻¹Q)⁻¹; pass noise_variance > 0 (or a jitter), or use solver='dense' for small N"
        ) from exc
    CinvB = cho_solve((L, True), Bs, check_finite=False)
    zero_slack = m - np.einsum("ni,ni->i", Bs, CinvB)
    # Σ = 0 already meets every tolerance, to the feasibility margin the certificate accepts (an earlier release
    # that meets the floor exactly leaves a slack of round-off size: the optimum is Σ_Δ = 0, not a relative gap of
    # a round-off trace)
    if np.all(zero_slack >= -FEASIBILITY_RTOL * m):
        zero = WeakCertificate(
            0.0,
            0.0,
            0.0,
            float(np.min(zero_slack)) * scale,
            0,
            0,
            time.perf_counter() - start,
        )
        return CertifiedCovariance(np.zeros(0, dtype=dtype), np.zeros((N, 0), dtype=dtype), zero)

    Q = orthonormal_block(Bs, None, float(np.linalg.norm(Bs, 2)))
    CQ = Cs @ Q
    steps, last = 1, Q.shape[1]
    solving = False  # becomes True at the first small solve; from then on every step solves
    while True:
        Ginv = _schur_inverse(L, Q)
        T = Q.T @ CQ
        T = 0.5 * (T + T.T)
        # The lifted bound loses at most ⟨Y₁₁, T − G⁻¹⟩ (Y₁₁ ⪯ I): skip the small SDP while that escape term is
        # visibly large; after the first solve, solve at every step.
        escape = float(np.linalg.norm(T - Ginv, 2)) * T.shape[0] / max(float(np.trace(T)), np.finfo(float).tiny)
        solving = solving or escape <= ESCAPE_RTOL or Q.shape[1] >= max_dim
        if solving:
            H = Q.T @ Bs
            S, lower = _small_solve(Ginv, H, m, T, small_solver)
            S = _repair(S, Ginv, H, m)
            upper = float(np.trace(S))
            gap = (upper - lower) / upper if upper > 0 else 0.0
            if gap <= gap_rtol or Q.shape[1] >= max_dim:
                break
        Z = CQ[:, -last:]
        new = orthonormal_block(Z, Q, float(np.linalg.norm(Z, 2)) or 1.0)[:, : max_dim - Q.shape[1]]
        if new.shape[1] == 0:  # invariant subspace: the reduced problem is the full one
            if solving:
                break
            solving = True  # not solved yet: solve once in this space
            continue
        Q = np.concatenate([Q, new], axis=1)
        CQ = np.concatenate([CQ, Cs @ new], axis=1)
        steps, last = steps + 1, new.shape[1]

    lam, W = np.linalg.eigh(S)
    keep = lam > 0
    eigvecs = Q @ W[:, keep]
    eigvals = lam[keep]
    full = Cs + (eigvecs * eigvals[None, :]) @ eigvecs.T
    try:
        L2 = cholesky(0.5 * (full + full.T), lower=True, overwrite_a=True, check_finite=False)
    except np.linalg.LinAlgError as exc:  # cannot happen for PSD Σ and C ≻ 0 except by round-off
        raise ValueError("K + V + Σ is not numerically positive definite; use solver='dense'") from exc
    del full
    Y = solve_triangular(L2, Bs, lower=True, check_finite=False)
    slack = m - np.einsum("ni,ni->i", Y, Y)  # Var[f(sᵢ)|W] − ξᵢ, scaled
    feasibility = float(np.min(slack / m))
    if gap > gap_rtol or feasibility < -FEASIBILITY_RTOL:
        raise KrylovError(
            f"the weak solution could not be certified within Krylov dimension {Q.shape[1]} (max_dimension="
            f"{max_dim}): relative gap {gap:.2e} (wanted ≤ {gap_rtol:.0e}), relative feasibility margin "
            f"{feasibility:.2e} (wanted ≥ {-FEASIBILITY_RTOL:.0e}); raise max_dimension, loosen gap_rtol, use "
            "solver='dense' for small N, or method='strong'"
        )
    certificate = WeakCertificate(
        objective=float(np.sum(eigvals)) * scale,
        lower_bound=lower * scale,
        relative_gap=float(gap),
        feasibility_margin=float(np.min(slack)) * scale,
        krylov_dimension=int(Q.shape[1]),
        steps=steps,
        seconds=time.perf_counter() - start,
    )
    return CertifiedCovariance(eigvals * scale, eigvecs, certificate)


__all__ = ["CertifiedCovariance", "KrylovError", "WeakCertificate", "solve_weak_krylov", "GAP_RTOL"]
