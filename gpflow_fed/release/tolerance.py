"""Privacy tolerances: scalars, vectors, matrices Ξ and kernel-based tolerances H (Tuo & Bhattacharya §4.2–4.3).

Convention (the paper's): a kernel tolerance ``H`` asks for ``Var[βᵀf(S) | W] ≥ βᵀ H_SS β`` for every β, so
for ``H = αK`` a *larger* α hides *more* (α = 0.9 leaves at most 10 % of the prior variance explainable).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import check_shapes, inherit_check_shapes

from .linalg import as_inputs, kernel_diag, kernel_matrix, psd_check

Tolerance = Union[float, np.ndarray, gpflow.kernels.Kernel]


class ProportionalKernel(gpflow.kernels.Kernel):
    r"""The kernel tolerance ``H = αK`` for ``0 < α < 1`` (§4.3–4.4).

    ``K − H = (1 − α)K`` is positive definite whenever K is, so Ξ = H_SS is valid for any sensitive set, and
    the uniformly privacy-aware solution has the closed form ``G(ℝᵈ) = (1 − α)⁻¹ K_XX`` (end of §4.4).
    The base kernel is held by reference: fitting its hyperparameters updates H too.

    :param kernel: the GP's covariance K.
    :param alpha: the fraction of the prior variance that must stay unexplained, ``0 < α < 1``.
    :raises ValueError: if α is outside (0, 1).
    """

    def __init__(self, kernel: gpflow.kernels.Kernel, alpha: float) -> None:
        if not isinstance(kernel, gpflow.kernels.Kernel):
            raise TypeError(f"ProportionalKernel needs a gpflow Kernel, got {type(kernel).__name__}")
        alpha = float(alpha)
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"H = αK needs 0 < α < 1, got α = {alpha}; α ≥ 1 makes K − H not positive definite")
        super().__init__()
        self.base_kernel = kernel
        self.alpha = alpha

    @inherit_check_shapes
    def K(self, X: tf.Tensor, X2: Optional[tf.Tensor] = None) -> tf.Tensor:
        return self.alpha * self.base_kernel(X, X2)  # through __call__: the base kernel's active_dims apply

    @inherit_check_shapes
    def K_diag(self, X: tf.Tensor) -> tf.Tensor:
        return self.alpha * self.base_kernel(X, full_cov=False)


def _se_thetas(kernel: gpflow.kernels.SquaredExponential, input_dim: int) -> np.ndarray:
    """θ₀ per input dimension for ``K = σ² exp(−Σ_j θ₀ⱼ (x_j − y_j)²)``, i.e. θ₀ = 1 / (2ℓ²)."""
    lengthscales = np.atleast_1d(np.asarray(kernel.lengthscales.numpy(), dtype=float))
    if lengthscales.size == 1:
        lengthscales = np.full(input_dim, lengthscales[0])
    if lengthscales.size != input_dim:
        raise ValueError(f"the kernel has {lengthscales.size} lengthscales but input_dim = {input_dim}")
    return 1.0 / (2.0 * lengthscales**2)


def gaussian_tolerance_kernel(
    kernel: gpflow.kernels.SquaredExponential, c: float, theta: float, input_dim: int
) -> gpflow.kernels.Kernel:
    r"""The tolerance kernel ``H(x, y) = c·exp(−θ‖x − y‖²)`` of Example 3, validated against K.

    For ``K = σ² exp(−θ₀‖x − y‖²)`` the Fourier transforms give ``R̃_K / R̃_H ≥ 1`` everywhere iff
    ``0 ≤ c/σ² ≤ 1`` and ``(c/σ²)^{2/d} θ₀ ≤ θ ≤ θ₀`` (Example 3; c = 1 excluded so that K − H is positive
    definite, Proposition 1). For an ARD K with ``θ₀ⱼ = 1/(2ℓⱼ²)`` the same argument per dimension gives
    ``θ ≤ minⱼ θ₀ⱼ`` and ``∏ⱼ (θ/θ₀ⱼ)^{1/2} ≥ c/σ²``.

    :param kernel: K, a ``gpflow.kernels.SquaredExponential`` (θ₀ = 1/(2ℓ²)).
    :param c: H's variance, ``0 ≤ c < σ²``.
    :param theta: H's inverse squared length, θ > 0.
    :param input_dim: d, the input dimension.
    :return: H as a (non-trainable) ``SquaredExponential`` with variance c and lengthscale ``1/√(2θ)`` (the
        zero kernel when c = 0).
    :raises TypeError: if K is not a SquaredExponential.
    :raises ValueError: if (c, θ) lies outside the validity range (the message gives the range).
    """
    if not isinstance(kernel, gpflow.kernels.SquaredExponential):
        raise TypeError(
            f"gaussian_tolerance_kernel needs K = SquaredExponential, got {type(kernel).__name__}; "
            "for other kernels pass H directly (it is checked numerically) or use ProportionalKernel"
        )
    if int(input_dim) < 1:
        raise ValueError(f"input_dim must be ≥ 1, got {input_dim}")
    d = int(input_dim)
    sigma2 = float(kernel.variance.numpy())
    theta0 = _se_thetas(kernel, d)
    c, theta = float(c), float(theta)
    ratio = c / sigma2
    lower = float(ratio ** (2.0 / d) * theta0.max()) if theta0.min() == theta0.max() else None
    valid = 0.0 <= ratio < 1.0 and theta > 0.0 and theta <= theta0.min() * (1 + 1e-12)
    valid = valid and float(np.prod(np.sqrt(theta / theta0))) >= ratio * (1 - 1e-12)
    if not valid:
        rng = (
            f"0 ≤ c < σ² = {sigma2:.6g} and {lower:.6g} ≤ θ ≤ {theta0.min():.6g}"
            if lower is not None
            else f"0 ≤ c < σ² = {sigma2:.6g}, θ ≤ {theta0.min():.6g} and ∏ⱼ(θ/θ₀ⱼ)^(1/2) ≥ c/σ²"
        )
        raise ValueError(
            f"invalid (c, θ) = ({c:g}, {theta:g}) for H = c·exp(−θ‖x−y‖²): K − H is not positive definite; "
            f"choose {rng} (Example 3)"
        )
    if c == 0.0:
        return _ZeroKernel()
    H = gpflow.kernels.SquaredExponential(variance=c, lengthscales=1.0 / np.sqrt(2.0 * theta))
    gpflow.set_trainable(H, False)
    return H


class _ZeroKernel(gpflow.kernels.Kernel):
    """H = 0 (c = 0 in Example 3): no correlated requirement, Ξ = 0."""

    @inherit_check_shapes
    def K(self, X: tf.Tensor, X2: Optional[tf.Tensor] = None) -> tf.Tensor:
        other = X if X2 is None else X2
        return tf.zeros((tf.shape(X)[0], tf.shape(other)[0]), dtype=X.dtype)

    @inherit_check_shapes
    def K_diag(self, X: tf.Tensor) -> tf.Tensor:
        return tf.zeros((tf.shape(X)[0],), dtype=X.dtype)


@check_shapes("points: [N, D]")
def check_tolerance_kernel(kernel: gpflow.kernels.Kernel, H: gpflow.kernels.Kernel, points: np.ndarray) -> float:
    """Numerically check that ``K − H`` is positive definite on ``points`` (§4.3); return its smallest eigenvalue.

    A general GPflow kernel H has no closed-form validity range, so this is checked on the points where it is
    used (the sensitive inputs, and the training inputs for region refinement).

    :raises ValueError: if ``K_PP − H_PP`` is not positive definite or ``H_PP`` is not PSD.
    """
    P = as_inputs(points, "points")
    Hm = kernel_matrix(H, P)
    psd_check(Hm, "H evaluated at the sensitive inputs", "H must be a positive semi-definite kernel", strict=False)
    return psd_check(
        kernel_matrix(kernel, P) - Hm,
        "K − H at the sensitive inputs",
        "choose H smaller than K (e.g. ProportionalKernel(kernel, alpha) with 0 < alpha < 1, or "
        "gaussian_tolerance_kernel within its validity range)",
        strict=True,
    )


@dataclass(frozen=True)
class ResolvedTolerance:
    """A tolerance resolved at the sensitive inputs S.

    :param Xi: ``[γ, γ]`` the matrix Ξ of the strong condition (eq. 11).
    :param xi: ``[γ]`` the per-input tolerances ξᵢ = Ξᵢᵢ of the weak condition (eq. 10).
    :param prior_variance: ``[γ]`` ``K(sᵢ, sᵢ)``.
    :param kind: ``"scalar" | "vector" | "matrix" | "kernel"``.
    """

    Xi: np.ndarray
    xi: np.ndarray
    prior_variance: np.ndarray
    kind: str


def resolve_tolerance(
    kernel: gpflow.kernels.Kernel, S: np.ndarray, tolerance: Tolerance, *, check_prior: bool = True
) -> ResolvedTolerance:
    """Turn a scalar, vector, matrix or kernel tolerance into (Ξ, ξ) at the sensitive inputs S and validate it.

    Scalar/vector tolerances give Ξ = diag(ξ); a kernel H gives Ξ = H_SS (§4.3). The checks common to all
    methods are: ξᵢ ≥ 0, ξᵢ < K(sᵢ, sᵢ) (eq. 5 needs ξ < K_ss) and Ξ PSD. Whether ``K_SS − Ξ ≻ 0`` holds is
    checked by the strong method only (it is what the Schur argument of eq. 11 needs).

    :param check_prior: refuse ``ξᵢ ≥ K(sᵢ, sᵢ)`` here (the floor on f); the record floor checks
        ``ξ < K(s, s) + σ²`` per record instead (:func:`~gpflow_fed.release.obfuscation.target_tolerance`).
    :raises ValueError: naming the problem and the fix.
    :raises TypeError: for an unsupported tolerance type.
    """
    gamma = S.shape[0]
    prior = kernel_diag(kernel, S)
    if isinstance(tolerance, gpflow.kernels.Kernel):
        Xi, kind = kernel_matrix(tolerance, S), "kernel"
        psd_check(
            Xi,
            "the tolerance kernel H at the sensitive inputs",
            "H must be a positive semi-definite kernel",
            strict=False,
        )
    else:
        if isinstance(tolerance, (str, bytes)) or tolerance is None:
            raise TypeError(f"tolerance must be a number, vector, matrix or gpflow Kernel, got {tolerance!r}")
        array: np.ndarray = np.asarray(tolerance, dtype=gpflow.default_float())
        if not np.all(np.isfinite(array)):
            raise ValueError("tolerance contains NaN or inf values")
        if array.ndim == 0:
            Xi, kind = np.diag(np.full(gamma, float(array))), "scalar"
        elif array.ndim == 1 or (array.ndim == 2 and array.shape[1] == 1 and gamma != 1):
            array = array.reshape(-1)
            if array.shape[0] != gamma:
                raise ValueError(
                    f"tolerance has {array.shape[0]} entries but there are {gamma} sensitive inputs; "
                    "pass one per sensitive input or a scalar"
                )
            Xi, kind = np.diag(array), "vector"
        elif array.ndim == 2 and array.shape == (gamma, gamma):
            Xi, kind = array, "matrix"
            if np.any(np.diag(Xi) < 0):
                raise ValueError(
                    f"negative tolerance on the diagonal of Ξ ({np.diag(Xi).min():g}); tolerances are "
                    "variances and must be ≥ 0"
                )
            psd_check(
                Xi,
                "the tolerance matrix Ξ",
                "pass a symmetric positive semi-definite Ξ (e.g. H_SS of a kernel H)",
                strict=False,
            )
        else:
            raise ValueError(
                f"tolerance of shape {array.shape} does not match {gamma} sensitive inputs; pass a "
                f"scalar, a [{gamma}] vector or a [{gamma}, {gamma}] matrix"
            )
    xi = np.diag(Xi).copy()
    if np.any(xi < 0):
        raise ValueError(f"negative tolerance {xi.min():g}; tolerances are variances and must be ≥ 0")
    bad = np.flatnonzero(xi >= prior) if check_prior else np.zeros(0, dtype=int)
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"tolerance {xi[i]:g} at sensitive input {i} is ≥ the prior variance K(s, s) = {prior[i]:g}; no noise can "
            "reach it (eq. 5 needs ξ < K(s, s)). Lower the tolerance below the prior variance"
        )
    return ResolvedTolerance(Xi=0.5 * (Xi + Xi.T), xi=xi, prior_variance=prior, kind=kind)
