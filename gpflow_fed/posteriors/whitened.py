"""Whitened linear-Gaussian algebra for q(u | Z, β) built from the prior and pseudo-likelihood factors.

Paper: *Federated Learning of Sparse Gaussian Processes* (the PVI paper of the docs guide 'PVI'). The stable
form of its eq. (22): with ``u = L w`` (``L = chol K_ZZ``) the prior is N(0, I) and each factor j is a linear-Gaussian
observation ``m_j ~ N(H_j w, S_j)``. Writing ``Ps_j = H_jᵀ S_j^{-½ᵀ}`` and ``r_j = S_j^{-½} m_j``:

    B = I + Σ_j Ps_j Ps_jᵀ,    μ_w = B⁻¹ Σ_j Ps_j r_j,    q(w) = N(μ_w, B⁻¹).

DPO (paper eq. 12): ``H_jᵀ = L⁻¹ K_{Z V_j}``. CPO (paper §5.1): ``H_j = L``. Nothing here inverts K_ZZ or
forms the DPO "mean" Λ̃⁻¹η̃ of paper eq. (25), which does not exist when M_k < M (Λ̃_k is then singular).
"""

from __future__ import annotations

from typing import Sequence, Tuple

import tensorflow as tf
from check_shapes import check_shapes


@check_shapes("return[0]: [batch..., M, 1]", "return[1]: [batch..., M, M]")
def assemble_whitened(
    terms: Sequence[Tuple[tf.Tensor, tf.Tensor]], M: int, dtype: tf.DType
) -> Tuple[tf.Tensor, tf.Tensor]:
    """``(μ_w, L_B)`` of q(w) ∝ N(w; 0, I) Π_j t_j(w) from each factor's whitened ``(Ps_j Ps_jᵀ, Ps_j r_j)``:
    ``B = I + Σ_j Ps_j Ps_jᵀ``, ``b = Σ_j Ps_j r_j`` (no factors: the prior)."""
    if not terms:
        return tf.zeros([M, 1], dtype=dtype), tf.eye(M, dtype=dtype)
    B = tf.eye(M, dtype=dtype) + tf.add_n([t[0] for t in terms])
    return whitened_posterior(B, tf.add_n([t[1] for t in terms]))


@check_shapes(
    "B: [batch..., M, M]", "b: [batch..., M, 1]", "return[0]: [batch..., M, 1]", "return[1]: [batch..., M, M]"
)
def whitened_posterior(B: tf.Tensor, b: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
    """``(μ_w, L_B)`` with ``L_B = chol(B)``, ``μ_w = L_B⁻ᵀ L_B⁻¹ b`` (paper eq. 22 in whitened form)."""
    LB = tf.linalg.cholesky(B)
    c = tf.linalg.triangular_solve(LB, b, lower=True)
    return tf.linalg.triangular_solve(LB, c, lower=True, adjoint=True), LB


@check_shapes(
    "A: [batch..., M, N]",
    "Kdiag: [batch..., N]",
    "mu_w: [batch..., M, 1]",
    "LB: [batch..., M, M]",
    "return[0]: [batch..., N, 1]",
    "return[1]: [batch..., N, 1]",
)
def whitened_marginals(A: tf.Tensor, Kdiag: tf.Tensor, mu_w: tf.Tensor, LB: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
    """Marginals of q(f_n) with ``a_n = L⁻¹ k_{Z x_n}`` (the sparse-GP marginals inside paper eq. 7):
    ``μ_n = a_nᵀ μ_w``, ``v_n = k_nn − a_nᵀ a_n + ‖L_B⁻¹ a_n‖²`` (leading batch dimensions broadcast)."""
    mean = tf.matmul(A, mu_w, transpose_a=True)
    LBinvA = tf.linalg.triangular_solve(LB, A, lower=True)
    var = Kdiag - tf.reduce_sum(A**2, axis=-2) + tf.reduce_sum(LBinvA**2, axis=-2)
    return mean, var[..., None]


@check_shapes(
    "mu: [batch..., M, 1]",
    "LB: [batch..., M, M]",
    "mu_c: [batch..., M, 1]",
    "LBc: [batch..., M, M]",
    "return: [batch...]",
)
def whitened_kl(mu: tf.Tensor, LB: tf.Tensor, mu_c: tf.Tensor, LBc: tf.Tensor) -> tf.Tensor:
    """KL[N(μ, B⁻¹) ‖ N(μ_c, B_c⁻¹)] in whitened coordinates: the u-KL between q and a cavity
    that share Z (paper eq. 7); both are Gaussian over the same w = L⁻¹u, so

    ``½[tr(B_c B⁻¹) + (μ − μ_c)ᵀ B_c (μ − μ_c) − M + log|B| − log|B_c|]``; K_ZZ drops out.
    """
    M = tf.cast(tf.shape(mu)[-2], mu.dtype)
    trace = tf.reduce_sum(tf.linalg.triangular_solve(LB, LBc, lower=True) ** 2, axis=[-2, -1])
    maha = tf.reduce_sum(tf.matmul(LBc, mu - mu_c, transpose_a=True) ** 2, axis=[-2, -1])
    logdet = 2.0 * (
        tf.reduce_sum(tf.math.log(tf.linalg.diag_part(LB)), -1)
        - tf.reduce_sum(tf.math.log(tf.linalg.diag_part(LBc)), -1)
    )
    return 0.5 * (trace + maha - M + logdet)


@check_shapes("mu: [batch..., M, 1]", "LB: [batch..., M, M]", "return: [batch...]")
def whitened_prior_kl(mu: tf.Tensor, LB: tf.Tensor) -> tf.Tensor:
    """KL[N(μ_w, B⁻¹) ‖ N(0, I)] = ½[tr(B⁻¹) + μ_wᵀμ_w − M + log|B|] (whitened form of KL[q(u) ‖ p(u)])."""
    eye = tf.broadcast_to(tf.eye(tf.shape(mu)[-2], dtype=mu.dtype), tf.shape(LB))
    return whitened_kl(mu, LB, tf.zeros_like(mu), eye)
