"""PseudoObservations: a decoupled pseudo-observation (DPO) factor t(u) = N(m; K_VZ K_ZZ⁻¹ u, S).

*Federated Learning of Sparse Gaussian Processes* (the PVI paper of the docs guide 'PVI'), eq. (12): the factor
is a Gaussian pseudo-likelihood of pseudo-targets ``m`` observed at pseudo-inputs ``V`` through the sparse-GP
projection ``A = K_VZ K_ZZ⁻¹`` of the inducing outputs ``u = f(Z)``. Because ``V`` and ``Z`` are decoupled, the
factor keeps its meaning when ``Z`` changes (paper §5.2).
"""

from __future__ import annotations

from typing import Callable, Optional, Tuple

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import Shape, check_shapes
from gpflow.utilities import positive, triangular

S_FLOOR = 1e-6
"""Lower bound on every pseudo-noise variance, so S stays positive definite: diagonal S is ``S_FLOOR + exp(raw)``."""


def as_float_array(value: object, name: str, ndims: Tuple[int, ...]) -> np.ndarray:
    if isinstance(value, (tf.Variable, tf.Tensor)):
        value = value.numpy()
    try:
        array: np.ndarray = np.asarray(value, dtype=gpflow.default_float())
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a numeric array ({exc})") from exc
    if array.ndim not in ndims:
        raise ValueError(f"{name} must have rank in {ndims}, got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} contains NaN or inf values")
    return array


class PseudoObservations(gpflow.inducing_variables.InducingVariables):
    """Pseudo-data ``(V, m, S)`` attached to inducing inputs ``Z``: q(u) ∝ p(u) N(m; K_VZ K_ZZ⁻¹ u, S).

    With ``Z=None`` the pseudo-inputs are also the inducing inputs (``Z = V``, the coupled case, where the
    factor is N(m; u, S) and q is a GP regression posterior on the pseudo-data).

    :param V: pseudo-inputs ``[J, D]``.
    :param m: pseudo-targets ``[J]`` or ``[J, 1]``.
    :param S: pseudo-noise, diagonal (``[J]`` or ``[J, 1]``, every entry ≥ 1e-6) or full ``[J, J]``
        (symmetric positive definite, stored through its Cholesky factor).
    :param Z: inducing inputs ``[M, D]`` (default: ``V``).
    :param dynamic: let the number of pseudo-points change by ``assign`` (a diagonal S only; used for the
        union of other clients' pseudo-sets in a PVI cavity, whose size varies between clients).
    :raises ValueError: non-finite values, mismatched shapes, non-positive diagonal S, or a full S that is
        not symmetric positive definite (use a diagonal S, or add a multiple of the identity).
    """

    def __init__(
        self,
        V: object,
        m: object,
        S: object,
        Z: Optional[object] = None,
        *,
        dynamic: bool = False,
        name: Optional[str] = None,
    ):
        super().__init__(name=name)
        V_arr = as_float_array(V, "V", (2,))
        m_arr = as_float_array(m, "m", (1, 2)).reshape(-1, 1)
        S_arr = as_float_array(S, "S", (1, 2))
        J, D = V_arr.shape
        if J < 1:
            raise ValueError("PseudoObservations needs at least one pseudo-point (M_k ≥ 1), got 0")
        if m_arr.shape[0] != J:
            raise ValueError(f"m has {m_arr.shape[0]} entries but V has {J} rows")
        self.full_S = S_arr.ndim == 2 and S_arr.shape == (J, J)
        if self.full_S:
            if not np.allclose(S_arr, S_arr.T, rtol=1e-10, atol=1e-12):
                raise ValueError("S is not symmetric; pass a symmetric positive-definite [J, J] matrix")
            try:
                chol = np.linalg.cholesky(S_arr)
            except np.linalg.LinAlgError as exc:
                raise ValueError(
                    "S is not positive definite (non-PSD pseudo-noise); add jitter or use a diagonal S"
                ) from exc
            self.S_sqrt = gpflow.Parameter(chol, transform=triangular(), name="S_sqrt")
        else:
            S_diag = S_arr.reshape(-1)
            if S_diag.shape[0] != J:
                raise ValueError(f"S must be [J], [J, 1] or [J, J] with J = {J}, got shape {S_arr.shape}")
            if np.any(S_diag <= S_FLOOR):
                raise ValueError(
                    f"diagonal S must be > {S_FLOOR} everywhere (non-PSD pseudo-noise), got min {S_diag.min()}"
                )
            shape = [None] if dynamic else None
            self.S_diag = gpflow.Parameter(
                S_diag, transform=positive(lower=S_FLOOR, base="exp"), name="S_diag", shape=shape
            )
        if dynamic and self.full_S:
            raise ValueError("dynamic=True needs a diagonal S (a full S has a fixed size)")
        self.V = gpflow.Parameter(V_arr, name="V", shape=[None, D] if dynamic else None)
        self.m = gpflow.Parameter(m_arr, name="m", shape=[None, 1] if dynamic else None)
        if Z is None:
            self.Z = None
        else:
            Z_arr = as_float_array(Z, "Z", (2,))
            if Z_arr.shape[1] != D:
                raise ValueError(f"Z has {Z_arr.shape[1]} columns but V has D = {D}")
            if Z_arr.shape[0] < 1:
                raise ValueError("Z needs at least one inducing input")
            self.Z = gpflow.Parameter(Z_arr, name="Z")

    @property
    def inducing_inputs(self) -> tf.Tensor:
        """Z ``[M, D]`` (``V`` in the coupled case)."""
        return tf.convert_to_tensor(self.V if self.Z is None else self.Z)

    @property
    def num_pseudo(self) -> int:
        """J = M_k, the number of pseudo-points (its current value when ``dynamic``)."""
        return int(self.V.shape[0]) if self.V.shape[0] is not None else int(tf.shape(self.V)[0])

    @property
    def num_inducing(self) -> tf.Tensor:
        return tf.shape(self.inducing_inputs)[0]

    @property
    def shape(self) -> Shape:
        Z = self.inducing_inputs
        return (Z.shape[0], Z.shape[1], 1)

    @property
    def S(self) -> tf.Tensor:
        """The pseudo-noise covariance ``[J, J]`` (dense, for references and tests)."""
        if self.full_S:
            return tf.matmul(self.S_sqrt, self.S_sqrt, transpose_b=True)
        return tf.linalg.diag(tf.convert_to_tensor(self.S_diag))

    @check_shapes("P: [batch..., M, J]", "return[0]: [batch..., M, J]", "return[1]: [J, 1]")
    def noise_whiten(self, P: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
        """``(P S^{-½}ᵀ, S^{-½} m)`` with ``S^{½}`` the Cholesky factor (or √diag): so that
        ``P S⁻¹ Pᵀ = Ps Psᵀ`` and ``P S⁻¹ m = Ps r`` (see :mod:`gpflow_fed.posteriors.whitened`)."""
        m = tf.convert_to_tensor(self.m)
        if self.full_S:
            Ls = tf.convert_to_tensor(self.S_sqrt)
            Ps = tf.linalg.adjoint(tf.linalg.triangular_solve(Ls, tf.linalg.adjoint(P), lower=True))
            return Ps, tf.linalg.triangular_solve(Ls, m, lower=True)
        sd = tf.sqrt(tf.convert_to_tensor(self.S_diag))
        return P / sd, m / sd[:, None]

    @check_shapes(
        "Z: [batch..., M, D]", "L: [batch..., M, M]", "return[0]: [batch..., M, M]", "return[1]: [batch..., M, 1]"
    )
    def whitened_terms(self, kernel: Callable, Z: tf.Tensor, L: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
        """This factor's whitened precision and shift ``(Ps Psᵀ, Ps r)`` with ``P = L⁻¹ K_ZV`` (paper eq. 12
        in whitened form), for ``L = chol K_ZZ`` at ``Z`` (a leading sample dimension of Z, L and the kernel
        broadcasts)."""
        P = tf.linalg.triangular_solve(L, kernel(Z, tf.convert_to_tensor(self.V)), lower=True)
        Ps, r = self.noise_whiten(P)
        return tf.matmul(Ps, Ps, transpose_b=True), tf.matmul(Ps, r)
