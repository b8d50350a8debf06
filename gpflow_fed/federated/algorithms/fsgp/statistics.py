"""Client sufficient statistics of the collapsed SGPR bound, and their vector-Jacobian products.

One client k with private ``(X_k, Y_k)`` and the shared ``(θ, Z)`` computes (FSGP eqs. 9, 14, 15)

=================  =============================  =========
name               value                          shape
=================  =============================  =========
``kuf_kfu``        ``C_{MN_k} C_{MN_k}ᵀ``         ``[M, M]``
``kuf_y``          ``C_{MN_k} y_k``               ``[M, P]``
``y_squared_sum``  ``Σ_n ‖y_{k,n}‖²``             ``[]``
``trace_kff``      ``Σ_n c(x_{k,n}, x_{k,n})``    ``[]``
``num_data``       ``N_k``                        ``[]``
=================  =============================  =========

with ``C_{MN_k} = c(Z, X_k; θ)``. Their sizes depend on M and P only, never on ``N_k``. Theorem 1 of the
paper: for any orthogonal ``Q`` (``N_k × N_k``), ``(C_{MN_k} Q, Qᵀ y_k)`` gives the same statistics, so the
server cannot recover ``(C_{MN_k}, y_k)`` from them (:func:`statistics_from_cross_covariance` makes this
checkable at the statistics level).
"""

from __future__ import annotations

from typing import List, Mapping, NamedTuple, Sequence

import gpflow
import tensorflow as tf
from check_shapes import check_shapes

__all__ = [
    "ADJOINT_NAMES",
    "STATISTIC_NAMES",
    "SGPRStatistics",
    "sgpr_statistics",
    "statistics_from_cross_covariance",
    "statistics_vjp",
]


class SGPRStatistics(NamedTuple):
    """One client's (or the summed) sufficient statistics of the collapsed SGPR bound (module table)."""

    kuf_kfu: tf.Tensor
    kuf_y: tf.Tensor
    y_squared_sum: tf.Tensor
    trace_kff: tf.Tensor
    num_data: tf.Tensor


STATISTIC_NAMES = SGPRStatistics._fields
"""The names of one client's statistics message, in wire order."""

ADJOINT_NAMES = ("kuf_kfu", "kuf_y", "trace_kff")
"""The statistics that depend on (θ, Z), hence receive an adjoint ``∂F/∂(statistic)`` in exact mode."""


@check_shapes(
    "kuf: [M, N]",
    "Y: [N, P]",
    "kff_diag: [N]",
    "return.kuf_kfu: [M, M]",
    "return.kuf_y: [M, P]",
    "return.y_squared_sum: []",
    "return.trace_kff: []",
    "return.num_data: []",
)
def statistics_from_cross_covariance(kuf: tf.Tensor, Y: tf.Tensor, kff_diag: tf.Tensor) -> SGPRStatistics:
    """The statistics of one client from ``C_{MN_k}``, ``y_k`` and ``diag C_{N_kN_k}`` (eqs. 14–17).

    ``kuf_kfu = C Cᵀ``, ``kuf_y = C y``, ``y_squared_sum = ‖y‖²``, ``trace_kff = Σ diag C_NN``, ``num_data = N_k``.
    """
    return SGPRStatistics(
        kuf_kfu=tf.linalg.matmul(kuf, kuf, transpose_b=True),
        kuf_y=tf.linalg.matmul(kuf, Y),
        y_squared_sum=tf.reduce_sum(tf.square(Y)),
        trace_kff=tf.reduce_sum(kff_diag),
        num_data=tf.cast(tf.shape(Y)[0], Y.dtype),
    )


@check_shapes(
    "X: [N, D]",
    "Y: [N, P]",
    "return.kuf_kfu: [M, M]",
    "return.kuf_y: [M, P]",
)
def sgpr_statistics(
    kernel: gpflow.kernels.Kernel,
    inducing_variable: gpflow.inducing_variables.InducingVariables,
    X: tf.Tensor,
    Y: tf.Tensor,
    whiten: bool = False,
) -> SGPRStatistics:
    """One client's sufficient statistics for the collapsed SGPR bound and posterior (see module table).

    With ``whiten=True`` the client replaces ``C_{MN_k}`` by ``A_k = L⁻¹ C_{MN_k}``, ``L Lᵀ = Kuu + jitter``
    (every client computes the same L from the shared θ, Z), and sends ``A_k A_kᵀ`` and ``A_k y_k``. This is
    the same information (``C Cᵀ = L (A Aᵀ) Lᵀ``) but is what ``gpflow.models.SGPR`` computes internally:
    forming ``C Cᵀ`` first and whitening afterwards loses accuracy when Kuu is ill-conditioned and σ² is
    small (roughly squaring the condition number), which is what let exact federated SGPR drift from
    pooled SGPR on Mauna Loa CO₂.

    :param kernel: the shared kernel ``c(·,·; θ)``.
    :param inducing_variable: the shared inducing inputs Z.
    :param X: the client's inputs ``X_k``.
    :param Y: the client's outputs ``Y_k``.
    :param whiten: send the whitened statistics ``(L⁻¹ C Cᵀ L⁻ᵀ, L⁻¹ C y)``.
    """
    kuf = gpflow.covariances.Kuf(inducing_variable, kernel, X)
    if whiten:
        kuu = gpflow.covariances.Kuu(inducing_variable, kernel, jitter=gpflow.config.default_jitter())
        kuf = tf.linalg.triangular_solve(tf.linalg.cholesky(kuu), kuf, lower=True)
    return statistics_from_cross_covariance(kuf, Y, kernel(X, full_cov=False))


@check_shapes("X: [N, D]", "Y: [N, P]")
def statistics_vjp(
    kernel: gpflow.kernels.Kernel,
    inducing_variable: gpflow.inducing_variables.InducingVariables,
    X: tf.Tensor,
    Y: tf.Tensor,
    adjoints: Mapping[str, tf.Tensor],
    variables: Sequence[tf.Variable],
    whiten: bool = False,
) -> List[tf.Tensor]:
    """``Σ_s ⟨adjoint_s, ∂s/∂v⟩`` for each variable v: the client's share of the exact-mode gradient.

    The global bound ``F`` depends on the data only through the summed statistics ``S = Σ_k S_k``, so
    ``∂F/∂v = ∂F/∂v|_S + Σ_k (∂S_k/∂v)ᵀ ∂F/∂S`` (chain rule). The server computes ``∂F/∂S`` (the adjoints, one
    per name in :data:`ADJOINT_NAMES`) and each client returns its vector-Jacobian product.

    :param adjoints: ``{"kuf_kfu": [M, M], "kuf_y": [M, P], "trace_kff": []}``.
    :param variables: the variables to differentiate (e.g. unconstrained θ and Z); a variable the
        statistics do not depend on gets a zero gradient.
    :param whiten: differentiate the whitened statistics (see :func:`sgpr_statistics`).
    :return: one gradient per variable, in order.
    """
    with tf.GradientTape() as tape:
        stats = sgpr_statistics(kernel, inducing_variable, X, Y, whiten=whiten)
        targets = [getattr(stats, name) for name in ADJOINT_NAMES]
    grads = tape.gradient(
        targets,
        list(variables),
        output_gradients=[tf.cast(adjoints[name], targets[i].dtype) for i, name in enumerate(ADJOINT_NAMES)],
        unconnected_gradients=tf.UnconnectedGradients.ZERO,
    )
    return grads
