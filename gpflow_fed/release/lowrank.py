r"""Low-rank positive parts by block Krylov (beyond the paper: O(N²γ) instead of O(N³)).

The strong solution is ``Σ = A⁺`` with ``A = BBᵀ − C`` (eq. 8, 11, 13), ``C = K_XX + V ⪰ 0`` and ``B: [N, γ]``
(``BBᵀ = K_XS (K_SS − Ξ)⁻¹ K_SX``). By Weyl's inequality A has at most γ positive eigenvalues, so Σ has rank ≤ γ.

**Where the positive eigenvectors live.** If ``Au = λu`` with ``λ > 0`` then ``u = (C + λI)⁻¹B(Bᵀu)``: every
positive eigenvector lies in ``(C + λI)⁻¹ range(B)``. The block Krylov space
``𝒦_m = span{B, CB, …, C^{m−1}B}`` (which equals ``span{B, AB, …}`` because ``ABX = B(BᵀBX) − CBX``) contains
polynomial approximations of ``(C + λI)⁻¹B`` for every λ ≥ 0 at once. The start block is B itself, so an
eigenvalue of any multiplicity ≤ γ is resolved in one block run (no restarts, no deflation passes, no random
start vectors: the result is deterministic). Each step costs one ``[N, N] × [N, γ]`` product, O(N²γ); a
smooth kernel's spectrum decays fast, so few steps are needed.

**Certificate (O(N k²), no N×N factorisation).** Let Q (``[N, k]``, orthonormal) span 𝒦_m and Σ be the
Rayleigh–Ritz positive part on it. The guarantee (eq. 11) at the sensitive inputs is
``I − Bᵀ(C + Σ)⁻¹B ⪰ 0`` (Schur complement). With ``M = C + Σ``, the Galerkin solution ``X̂ = Q(QᵀMQ)⁻¹QᵀB``
and its residual ``R = B − MX̂`` (``X̂ᵀR = 0``) give the exact identity
``BᵀM⁻¹B = BᵀX̂ + RᵀM⁻¹R ⪯ BᵀX̂ + RᵀR / λ₋``, where ``λ₋ ≤ λ_min(M)`` is a rigorous lower bound
(``λ_min(M) ≥ λ_min(C) ≥ max(min V, Gershgorin bound of K + V)``). So
``λ_min(I − BᵀX̂ − RᵀR/λ₋) ≥ −tol`` proves the strong condition for the returned Σ. Everything is computed from
``Q`` and ``CQ``, which the Krylov run already holds. When no positive ``λ₋`` is available (V = 0 and a kernel
matrix that is not diagonally dominant) the caller certifies with one Cholesky instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import gpflow
import numpy as np
from check_shapes import check_shapes
from scipy.linalg import cho_factor, cho_solve

#: Ritz values below ``POSITIVE_RTOL · scale`` are treated as zero (scale = max of diag(K + V) and ‖bᵢ‖²).
POSITIVE_RTOL = 1e-12
#: Residual ``‖Au − θu‖ ≤ RESIDUAL_RTOL · scale`` required of every kept Ritz pair.
RESIDUAL_RTOL = 1e-10
#: Certificate tolerance: ``λ_min(I − Bᵀ(K + V + Σ)⁻¹B) ≥ −CERTIFY_TOL`` (dimensionless).
CERTIFY_TOL = 1e-9
#: Columns whose norm falls below this fraction after re-orthogonalisation are dropped (Krylov breakdown).
BREAKDOWN_RTOL = 1e-10


class LowRankCovariance:
    r"""A PSD matrix ``Σ = O diag(λ) Oᵀ`` stored by its r positive eigenpairs (O: ``[N, r]`` orthonormal).

    ``np.asarray(Σ)`` gives the dense ``[N, N]`` matrix; ``trace``, ``diagonal``, ``matmul`` and ``factor``
    never form it.

    :param eigenvalues: ``[r]`` positive eigenvalues λ.
    :param eigenvectors: ``[N, r]`` orthonormal eigenvectors O.
    """

    def __init__(self, eigenvalues: np.ndarray, eigenvectors: np.ndarray) -> None:
        lam: np.ndarray = np.asarray(eigenvalues, dtype=gpflow.default_float()).reshape(-1)
        vecs: np.ndarray = np.asarray(eigenvectors, dtype=gpflow.default_float())
        if vecs.ndim != 2 or vecs.shape[1] != lam.shape[0]:
            raise ValueError(f"eigenvectors of shape {vecs.shape} do not match {lam.shape[0]} eigenvalues")
        if np.any(lam < 0):
            raise ValueError("LowRankCovariance needs non-negative eigenvalues")
        self.eigenvalues = lam
        self.eigenvectors = vecs

    @property
    def shape(self) -> Tuple[int, int]:
        """``(N, N)``."""
        return (self.eigenvectors.shape[0], self.eigenvectors.shape[0])

    @property
    def rank(self) -> int:
        """r, the number of stored eigenpairs."""
        return int(self.eigenvalues.shape[0])

    def trace(self) -> float:
        """``tr Σ = Σᵢ λᵢ``."""
        return float(np.sum(self.eigenvalues))

    def diagonal(self) -> np.ndarray:
        """``[N]`` the diagonal of Σ (per-datum synthetic noise variances)."""
        return np.einsum("nr,r,nr->n", self.eigenvectors, self.eigenvalues, self.eigenvectors)

    def factor(self) -> np.ndarray:
        """``[N, r]`` L with ``Σ = L Lᵀ`` (``L = O diag(√λ)``)."""
        return self.eigenvectors * np.sqrt(self.eigenvalues)[None, :]

    def matmul(self, V: np.ndarray) -> np.ndarray:
        """``Σ V`` in O(N r) per column."""
        return (
            self.eigenvectors @ (self.eigenvalues[:, None] * (self.eigenvectors.T @ V))
            if V.ndim == 2
            else (self.eigenvectors @ (self.eigenvalues * (self.eigenvectors.T @ V)))
        )

    def __array__(self, dtype: Optional[np.dtype] = None, copy: Optional[bool] = None) -> np.ndarray:
        dense = (self.eigenvectors * self.eigenvalues[None, :]) @ self.eigenvectors.T
        dense = 0.5 * (dense + dense.T)
        return dense if dtype is None else dense.astype(dtype)

    def __repr__(self) -> str:
        return f"LowRankCovariance(N={self.shape[0]}, rank={self.rank}, trace={self.trace():.6g})"


@dataclass(frozen=True)
class KrylovInfo:
    """Diagnostics of :func:`krylov_positive_part`.

    :param basis_size: k, the dimension of the final Krylov space.
    :param steps: the number of block steps (``[N, N] × [N, γ]`` products).
    :param max_residual: ``maxᵢ ‖Auᵢ − θᵢuᵢ‖ / scale`` over the kept Ritz pairs.
    :param certified_margin: the certified lower bound on ``λ_min(I − Bᵀ(K + V + Σ)⁻¹B)``, or None when no
        positive lower bound on ``λ_min(K + V)`` was available (the caller must certify another way).
    :param converged: whether every kept Ritz pair met :data:`RESIDUAL_RTOL`.
    """

    basis_size: int
    steps: int
    max_residual: float
    certified_margin: Optional[float]
    converged: bool


def min_eigenvalue_lower_bound(KXX: np.ndarray, v: np.ndarray) -> float:
    r"""A rigorous lower bound ``λ₋ ≤ λ_min(K + V)``: ``max(min V − δ, minᵢ (Kᵢᵢ + vᵢ − Σ_{j≠i}|Kᵢⱼ|))``.

    The first term uses ``K ⪰ 0`` (Weyl), with ``δ = N·ε·max|K|`` covering the rounding of the computed K; the
    second is Gershgorin's disc bound on the computed ``K + V`` (useful for nearly diagonal K with V = 0).
    O(N²), no factorisation. May be ≤ 0 (then no bound is available).
    """
    N = KXX.shape[0]
    diag = np.diag(KXX)
    rows = np.empty(N, dtype=KXX.dtype)
    for start in range(0, N, 1024):  # row blocks: no N×N temporary
        rows[start : start + 1024] = np.sum(np.abs(KXX[start : start + 1024]), axis=1)
    off = rows - np.abs(diag)
    gershgorin = float(np.min(diag + v - off))
    rounding = N * float(np.finfo(KXX.dtype).eps) * float(np.max(np.abs(diag)))
    return max(float(np.min(v)) - rounding, gershgorin)


def orthonormal_block(Z: np.ndarray, Q: Optional[np.ndarray], reference: float) -> np.ndarray:
    """Orthonormalise the columns of Z against Q (twice, classical Gram–Schmidt) and among themselves.

    Directions with norm below ``BREAKDOWN_RTOL · reference`` after projection are dropped (an SVD of the
    projected block reveals its numerical rank).
    """
    if Q is not None and Q.shape[1]:
        for _ in range(2):
            Z = Z - Q @ (Q.T @ Z)
    U, s, _ = np.linalg.svd(Z, full_matrices=False)
    keep = s > BREAKDOWN_RTOL * reference
    U = U[:, keep]
    if Q is not None and Q.shape[1] and U.shape[1]:
        U = U - Q @ (Q.T @ U)
        U, _ = np.linalg.qr(U)
    return U


@check_shapes("B: [N, G]", "KXX: [N, N]", "v: [N]")
def krylov_positive_part(
    B: np.ndarray, KXX: np.ndarray, v: np.ndarray, *, max_basis: Optional[int] = None
) -> "tuple[Optional[LowRankCovariance], KrylovInfo]":
    r"""``(BBᵀ − K − V)⁺`` (eq. 8, 11, 13) by block Krylov from the start block B, with a cheap certificate.

    Each step adds ``C Q_j`` (``C = K + V``; one O(N²γ) product), re-orthogonalised against the basis; then
    Rayleigh–Ritz on ``T = QᵀAQ = (QᵀB)(BᵀQ) − QᵀCQ`` gives Ritz pairs (θ, u = Qw), and the positive ones with
    residual ``‖Au − θu‖ ≤ RESIDUAL_RTOL · scale`` form Σ. Once all of them have converged, the certificate
    of the module docstring is evaluated; the run stops when it holds (``≥ −CERTIFY_TOL``), when the Krylov space
    becomes invariant, or at ``max_basis`` columns.

    :param B: ``[N, γ]`` with ``BBᵀ`` the positive term.
    :param KXX: ``[N, N]`` K.
    :param v: ``[N]`` the diagonal of V.
    :param max_basis: the largest Krylov dimension tried (default ``min(N − 1, max(40γ, 400))``).
    :return: ``(Σ, info)``; Σ is None when the Ritz pairs did not converge within ``max_basis``. Σ is proved
        private only when ``info.certified_margin ≥ −CERTIFY_TOL``; when it is None (no bound ``λ₋ > 0``
        exists) or below that, the caller must certify Σ another way or not use it.
    """
    N, gamma = B.shape
    dtype = gpflow.default_float()
    max_basis = min(N - 1, max(40 * gamma, 400)) if max_basis is None else int(max_basis)
    scale = float(max(np.max(np.diag(KXX) + v), np.max(np.sum(B * B, axis=1)), np.finfo(float).tiny))
    lam_lower = min_eigenvalue_lower_bound(KXX, v)
    b_norm = float(np.linalg.norm(B, 2))

    def apply_C(Z: np.ndarray) -> np.ndarray:
        return KXX @ Z + v[:, None] * Z

    Q = orthonormal_block(B, None, b_norm)
    if Q.shape[1] == 0:  # B = 0: A = −C ⪯ 0, so Σ = 0 (and I − 0 ⪰ 0).
        empty = LowRankCovariance(np.zeros(0, dtype=dtype), np.zeros((N, 0), dtype=dtype))
        return empty, KrylovInfo(0, 0, 0.0, 1.0, True)
    CQ = apply_C(Q)
    steps, last_new = 1, Q.shape[1]
    while True:
        BtQ = B.T @ Q
        T = BtQ.T @ BtQ - Q.T @ CQ
        theta, W = np.linalg.eigh(0.5 * (T + T.T))
        keep = theta > POSITIVE_RTOL * scale
        Wp, thp = W[:, keep], theta[keep]
        U = Q @ Wp
        AU = B @ (BtQ @ Wp) - CQ @ Wp
        max_res = float(np.max(np.linalg.norm(AU - U * thp[None, :], axis=0))) / scale if thp.size else 0.0
        converged = max_res <= RESIDUAL_RTOL
        margin = _galerkin_margin(B, Q, CQ, Wp, thp, lam_lower) if converged else None
        info = KrylovInfo(Q.shape[1], steps, max_res, margin, converged)
        if converged and (margin is None or margin >= -CERTIFY_TOL):
            return LowRankCovariance(thp, U), info
        if Q.shape[1] >= max_basis:
            break
        # Next block: C times the newest block (the B part of A Q_j already lies in span Q).
        Z = CQ[:, -last_new:]
        new = orthonormal_block(Z, Q, float(np.linalg.norm(Z, 2)) or 1.0)[:, : max_basis - Q.shape[1]]
        if new.shape[1] == 0:  # invariant subspace: the Ritz pairs are exact up to rounding
            break
        Q = np.concatenate([Q, new], axis=1)
        CQ = np.concatenate([CQ, apply_C(new)], axis=1)
        steps, last_new = steps + 1, new.shape[1]
    return (LowRankCovariance(thp, U) if converged else None), info


def _galerkin_margin(
    B: np.ndarray, Q: np.ndarray, CQ: np.ndarray, Wp: np.ndarray, theta: np.ndarray, lam_lower: float
) -> Optional[float]:
    r"""A certified lower bound on ``λ_min(I − Bᵀ(C + Σ)⁻¹B)`` for ``Σ = (QWp) diag(θ) (QWp)ᵀ`` (module doc).

    Returns None when ``λ₋ ≤ 0`` (no rigorous bound on the Galerkin error) or ``QᵀMQ`` is not numerically PD.
    """
    if lam_lower <= 0:
        return None
    QtCQ = Q.T @ CQ
    G = 0.5 * (QtCQ + QtCQ.T) + (Wp * theta[None, :]) @ Wp.T
    QtB = Q.T @ B
    try:
        Y = cho_solve(cho_factor(G, lower=True, check_finite=False), QtB, check_finite=False)
    except np.linalg.LinAlgError:
        return None
    R = B - CQ @ Y - (Q @ Wp) @ (theta[:, None] * (Wp.T @ Y))
    upper = QtB.T @ Y + (R.T @ R) / lam_lower
    return float(np.linalg.eigvalsh(np.eye(B.shape[1]) - 0.5 * (upper + upper.T))[0])
