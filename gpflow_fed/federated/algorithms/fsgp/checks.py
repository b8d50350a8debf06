"""What the FSGP server can verify of the statistics it receives, and what a FedAvg update can be.

A client's statistics (FSGP eq. 12) are ``C Cᵀ`` ``[M, M]``, ``C y`` ``[M, P]``, ``‖y‖²``, ``tr K_ff`` and ``N_k``, with
``C = k(Z, X_k)`` (or ``L⁻¹ C`` whitened, ``L = chol K_uu``). Whatever the data, they satisfy

* ``num_data = N_k``, the size the client registered (a sum: the registered sizes of the senders);
* ``[[C Cᵀ, C y], [yᵀ Cᵀ, yᵀ y]] ⪰ 0`` — it is ``[C; yᵀ] [C; yᵀ]ᵀ`` — so ``C Cᵀ ⪰ 0`` and, for the summed outputs,
  ``Σ_p c_pᵀ (C Cᵀ)⁺ c_p ≤ ‖y‖²`` (the Schur complement); ``‖y‖² ≥ 0``;
* ``0 ≤ tr K_ff ≤ N_k max_x k(x, x)``, for a stationary kernel ``N_k σ_f²``;
* ``|(C Cᵀ)_ij| ≤ N_k σ_f⁴`` (unwhitened, stationary kernel: ``|k(z, x)| ≤ σ_f²``);
* whitened, ``tr(A Aᵀ) ≤ tr K_ff`` with ``A = L⁻¹ C``: each column's ``‖L⁻¹ k(Z, x)‖² = k(Z, x)ᵀ K_uu⁻¹ k(Z, x)`` is
  the Nyström approximation of ``k(x, x)``, never above it (so also ``≤ N_k σ_f²``).

A FedAvg update is ``local_steps`` Adam steps from the broadcast. Adam moves a coordinate by at most
``lr · √(1−β₂ᵗ)/(1−β₁ᵗ) · |m̂/√v̂|`` a step, and ``|m_t|/√v_t ≤ (1−β₁)/√(1−β₂) · (1 − β₁²/β₂)^{-1/2}``
(Cauchy–Schwarz over the moment sums; ≈ 7.3 for the default β₁ = 0.9, β₂ = 0.999), so a coordinate moves at most
``8 · lr · local_steps`` from the broadcast; a reply beyond that did not come from the algorithm.

These checks catch statistics that are *inconsistent*: impossible for any data of the registered size. A client
that lies consistently (statistics of other data of the same size) passes them; the registered ``N_k`` is itself the
client's claim. Under differential privacy the noise breaks the PSD and bound checks, so noised sums are not checked
(they are post-processed instead).
"""

from __future__ import annotations

from typing import Mapping, Optional

import numpy as np

__all__ = ["ADAM_STEP_BOUND", "displacement_fault", "statistics_fault"]

#: the bound on one Adam step's move of a coordinate, in learning rates (module docstring)
ADAM_STEP_BOUND = 8.0
#: relative tolerance of the checks (the statistics are float64 sums, or fixed-point decodes of them)
RELATIVE_TOLERANCE = 1e-7


def statistics_fault(
    stats: Mapping[str, np.ndarray],
    num_data: float,
    *,
    kernel_variance: Optional[float],
    whitened: bool,
    absolute_tolerance: float = 0.0,
) -> Optional[str]:
    """Why ``stats`` cannot be the statistics of ``num_data`` points (module docstring), or None.

    :param stats: ``kuf_kfu``, ``kuf_y``, ``y_squared_sum``, ``trace_kff``, ``num_data``.
    :param num_data: the registered size (a sum: the senders' registered sizes).
    :param kernel_variance: ``max_x k(x, x)`` of the kernel at the broadcast hyperparameters (σ_f² of a stationary
        kernel), or None when there is no such bound.
    :param whitened: the statistics are whitened (``L⁻¹ C``): the entry bound does not apply.
    :param absolute_tolerance: the round-off of a fixed-point sum (cohort size × ``2^-f``).
    :return: a reason naming the check (never a value of the statistics), or None.
    """
    K = np.asarray(stats["kuf_kfu"], dtype=np.float64)
    c = np.asarray(stats["kuf_y"], dtype=np.float64)
    yy = float(np.asarray(stats["y_squared_sum"]))
    trace = float(np.asarray(stats["trace_kff"]))
    n = float(np.asarray(stats["num_data"]))
    scale = max(1.0, float(np.max(np.abs(K))) if K.size else 1.0, abs(yy))
    tol = RELATIVE_TOLERANCE * scale + absolute_tolerance
    if abs(n - float(num_data)) > 0.5:
        return f"its statistics count a number of points other than its registered {int(num_data)}"
    if yy < -tol:
        return "its sum of squared outputs ‖y‖² is negative"
    if trace < -tol:
        return "its trace of K_ff is negative"
    if kernel_variance is not None and trace > float(num_data) * kernel_variance * (1 + RELATIVE_TOLERANCE) + tol:
        return "its trace of K_ff exceeds N_k times the kernel's largest prior variance"
    if kernel_variance is not None and not whitened:
        if float(np.max(np.abs(K))) > float(num_data) * kernel_variance**2 * (1 + RELATIVE_TOLERANCE) + tol:
            return "an entry of its C Cᵀ exceeds N_k σ_f⁴"
    if whitened and float(np.trace(K)) > trace * (1 + RELATIVE_TOLERANCE) + tol:
        return "its whitened C Cᵀ has a trace above its trace of K_ff"
    symmetric = 0.5 * (K + K.T)
    if float(np.max(np.abs(K - K.T))) > tol:
        return "its C Cᵀ is not symmetric"
    eigenvalues, eigenvectors = np.linalg.eigh(symmetric)
    if eigenvalues.size and eigenvalues[0] < -tol:
        return "its C Cᵀ is not positive semi-definite"
    # C y = C (y): in every eigendirection u_i of C Cᵀ, (u_iᵀ C y_p)² ≤ λ_i ‖y_p‖² (Cauchy–Schwarz), and over the
    # well-conditioned directions the Schur complement ‖y‖² − Σ_i ‖u_iᵀ C y‖² / λ_i stays ≥ 0
    projected = eigenvectors.T @ c  # [M, P]
    along = np.sum(projected**2, axis=1)
    if np.any(along > (np.maximum(eigenvalues, 0.0) + tol) * (max(yy, 0.0) + tol) * (1 + 1e-6)):
        return "its [[C Cᵀ, C y], [yᵀ Cᵀ, ‖y‖²]] is not positive semi-definite"
    conditioned = eigenvalues > 1e4 * tol
    schur = yy - float(np.sum(along[conditioned] / eigenvalues[conditioned]))
    if schur < -(tol + 1e-6 * max(yy, 0.0)):
        return "its [[C Cᵀ, C y], [yᵀ Cᵀ, ‖y‖²]] is not positive semi-definite"
    return None


def displacement_fault(
    values: Mapping[str, np.ndarray], broadcast: Mapping[str, np.ndarray], learning_rate: float, local_steps: int
) -> Optional[str]:
    """Why a FedAvg reply is not ``local_steps`` Adam steps from ``broadcast`` (module docstring), or None."""
    bound = ADAM_STEP_BOUND * float(learning_rate) * int(local_steps)
    for name, value in values.items():
        if name not in broadcast:
            continue
        if (
            float(np.max(np.abs(np.asarray(value, np.float64) - np.asarray(broadcast[name], np.float64)), initial=0.0))
            > bound
        ):
            return (
                f"its {name!r} moved further from the broadcast than {local_steps} Adam steps of learning rate "
                f"{learning_rate:g} can ({bound:g})"
            )
    return None
