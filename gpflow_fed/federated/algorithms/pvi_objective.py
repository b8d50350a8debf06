"""The PVI free energy of one client for the sparse-GP HVM (paper eq. 7 with the α-scaling of §4.1)::

    L_k,α = E_{q(Z)q(β)}[ ELL_k(Z, β) − KL[q(u|Z,β) ‖ q_\\k(u|Z,β)] ] − KL[q(β) ‖ q_\\k(β)] − α KL[q(Z) ‖ q_\\k(Z)]

(spec §2.1). q(u|Z,β) and the cavity are re-projected from pseudo-sets at every sampled (Z_s, β_s) in
the whitened form of spec §1.4; the same (Z_s, β_s), jitter and noise are used for q, the cavity and the ELL
(spec P10). With cavity = prior this is the global objective L̃_α of paper eqs. (6), (13), (14).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import check_shapes

from ...posteriors.whitened import meanfield_gaussian_kl, whitened_kl, whitened_marginals, whitened_posterior

RHO_CLIP = 10.0
"""log β samples are clipped to [−10, 10] before exponentiating (spec P6)."""


@check_shapes("X1: [N, D]", "X2: [N2, D]", "lengthscales: [D]", "variance: []", "return: [N, N2]")
def squared_exponential(X1: tf.Tensor, X2: tf.Tensor, lengthscales: tf.Tensor, variance: tf.Tensor) -> tf.Tensor:
    """SE-ARD ``σ_f² exp(−½ Σ_d (x_d − x'_d)²/ℓ_d²)`` as a pure function of sampled β (spec P11)."""
    A, B = X1 / lengthscales, X2 / lengthscales
    r2 = tf.reduce_sum(A**2, 1)[:, None] + tf.reduce_sum(B**2, 1)[None, :] - 2.0 * tf.matmul(A, B, transpose_b=True)
    return variance * tf.exp(-0.5 * tf.maximum(r2, 0.0))


@dataclass
class HyperModel:
    """How β enters: learned β = (ℓ_1..ℓ_D, σ_f², [σ_n²]) for an SE-ARD kernel (and a Gaussian noise), or the
    given GPflow kernel and likelihood with fixed hyperparameters."""

    kernel: gpflow.kernels.Kernel
    likelihood: gpflow.likelihoods.Likelihood
    input_dim: int
    learn: bool

    @property
    def learn_noise(self) -> bool:
        return self.learn and isinstance(self.likelihood, gpflow.likelihoods.Gaussian)

    @property
    def num_hyper(self) -> int:
        """H = D + 1, or D + 2 with a learned Gaussian noise variance (0 when β is fixed)."""
        return (self.input_dim + 1 + int(self.learn_noise)) if self.learn else 0

    def initial_log_beta(self) -> np.ndarray:
        """log of the given kernel (and noise) values, the initial mean of q(log β)."""
        ls = np.broadcast_to(np.asarray(self.kernel.lengthscales.numpy(), float), (self.input_dim,))
        values = list(ls) + [float(self.kernel.variance.numpy())]
        if self.learn_noise:
            values.append(float(self.likelihood.variance.numpy()))
        return np.log(np.asarray(values))

    def K(self, X1: tf.Tensor, X2: tf.Tensor, beta: Optional[tf.Tensor]) -> tf.Tensor:
        if not self.learn:
            return self.kernel(X1, X2)
        return squared_exponential(X1, X2, beta[: self.input_dim], beta[self.input_dim])

    def Kdiag(self, X: tf.Tensor, beta: Optional[tf.Tensor]) -> tf.Tensor:
        if not self.learn:
            return self.kernel(X, full_cov=False)
        return beta[self.input_dim] * tf.ones(tf.shape(X)[:1], dtype=X.dtype)

    def noise(self, beta: Optional[tf.Tensor]) -> Optional[tf.Tensor]:
        """σ_n² of this sample (None when the likelihood is not a learned Gaussian)."""
        if self.learn_noise:
            return beta[self.input_dim + 1]
        if isinstance(self.likelihood, gpflow.likelihoods.Gaussian):
            return tf.convert_to_tensor(self.likelihood.variance)
        return None

    def ell(self, X: tf.Tensor, Y: tf.Tensor, mean: tf.Tensor, var: tf.Tensor, beta: Optional[tf.Tensor]) -> tf.Tensor:
        """Σ_n E_{N(f; μ_n, v_n)} log p(y_n | f, β): closed form for Gaussian (spec §2.2), quadrature otherwise."""
        noise = self.noise(beta)
        if noise is not None:
            return tf.reduce_sum(-0.5 * np.log(2 * np.pi) - 0.5 * tf.math.log(noise) - 0.5 * ((Y - mean) ** 2 + var) / noise)
        return tf.reduce_sum(self.likelihood.variational_expectations(X, mean, var, Y))


@dataclass
class PseudoSets:
    """The u-factors of a group of clients: DPO pseudo-data ``(V [J, D], m [J, 1], s [J])`` (diagonal S) or
    summed CPO natural parameters ``(η [M, 1], Λ [M, M])`` over u."""

    V: Optional[tf.Tensor] = None
    m: Optional[tf.Tensor] = None
    s: Optional[tf.Tensor] = None
    eta: Optional[tf.Tensor] = None
    Lam: Optional[tf.Tensor] = None

    def precision(self, hyper: HyperModel, Z: tf.Tensor, L: tf.Tensor, beta: Optional[tf.Tensor]) -> Tuple[tf.Tensor, tf.Tensor]:
        """Whitened ``(Σ_j H_jᵀ S_j⁻¹ H_j, Σ_j H_jᵀ S_j⁻¹ m_j)`` (spec §1.4; DPO H_jᵀ = L⁻¹K_ZV, CPO H = L)."""
        if self.V is not None:
            sd = tf.sqrt(self.s)
            Ps = tf.linalg.triangular_solve(L, hyper.K(Z, self.V, beta), lower=True) / sd[None, :]
            return tf.matmul(Ps, Ps, transpose_b=True), tf.matmul(Ps, self.m / sd[:, None])
        LtLam = tf.matmul(L, self.Lam, transpose_a=True)
        return tf.matmul(LtLam, L), tf.matmul(L, self.eta, transpose_a=True)


def assemble(parts: Sequence[Tuple[tf.Tensor, tf.Tensor]], M: tf.Tensor, dtype: tf.DType) -> Tuple[tf.Tensor, tf.Tensor]:
    """``(μ_w, L_B)`` of q(w) ∝ N(w; 0, I) Π_j (pseudo-likelihood j) from whitened precision parts."""
    B = tf.eye(M, dtype=dtype) + tf.add_n([p[0] for p in parts]) if parts else tf.eye(M, dtype=dtype)
    b = tf.add_n([p[1] for p in parts]) if parts else tf.zeros([M, 1], dtype=dtype)
    return whitened_posterior(B, b)


def sample_terms(
    hyper: HyperModel,
    X: tf.Tensor,
    Y: tf.Tensor,
    Z: tf.Tensor,
    beta: Optional[tf.Tensor],
    own: Sequence[PseudoSets],
    cavity: Sequence[PseudoSets],
    jitter: tf.Tensor,
) -> Tuple[tf.Tensor, tf.Tensor]:
    """``(ELL_k(Z, β), KL_u(Z, β))`` for one sample (spec §2.2, §2.3); q = cavity × own factors."""
    M = tf.shape(Z)[0]
    L = tf.linalg.cholesky(hyper.K(Z, Z, beta) + jitter * tf.eye(M, dtype=Z.dtype))
    cav_parts = [c.precision(hyper, Z, L, beta) for c in cavity]
    own_parts = [o.precision(hyper, Z, L, beta) for o in own]
    mu_c, LB_c = assemble(cav_parts, M, Z.dtype)
    mu, LB = assemble(cav_parts + own_parts, M, Z.dtype)
    A = tf.linalg.triangular_solve(L, hyper.K(Z, X, beta), lower=True)
    mean, var = whitened_marginals(A, hyper.Kdiag(X, beta), mu, LB)
    return hyper.ell(X, Y, mean, var, beta), whitened_kl(mu, LB, mu_c, LB_c)


def predictive_marginals(
    hyper: HyperModel, Xnew: tf.Tensor, Z: tf.Tensor, beta: Optional[tf.Tensor], sets: Sequence[PseudoSets], jitter: float
) -> Tuple[tf.Tensor, tf.Tensor]:
    """``(μ_*, v_*)`` of q(f_* | Z, β) with every client's factor projected onto Z (spec §4)."""
    M = tf.shape(Z)[0]
    L = tf.linalg.cholesky(hyper.K(Z, Z, beta) + jitter * tf.eye(M, dtype=Z.dtype))
    mu, LB = assemble([s.precision(hyper, Z, L, beta) for s in sets], M, Z.dtype)
    A = tf.linalg.triangular_solve(L, hyper.K(Z, Xnew, beta), lower=True)
    return whitened_marginals(A, hyper.Kdiag(Xnew, beta), mu, LB)


def meanfield_kl_natural(mean: tf.Tensor, var: tf.Tensor, cav_nu: tf.Tensor, cav_lam: tf.Tensor) -> tf.Tensor:
    """KL[N(mean, var) ‖ cavity] with the cavity in natural parameters (spec §2.4, §2.5)."""
    return meanfield_gaussian_kl(mean, var, cav_nu / cav_lam, 1.0 / cav_lam)
