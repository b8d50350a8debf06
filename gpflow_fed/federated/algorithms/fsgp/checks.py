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

A FedAvg update is ``local_steps`` (P) steps of the client's own ``tf_keras`` Adam (β₁ = 0.9, β₂ = 0.999; the client
keeps its moments and step count t between rounds) from the broadcast. Step t moves a coordinate by
``lr · √(1−β₂ᵗ)/(1−β₁ᵗ) · |m_t|/(√v_t + ε)``, and over all gradient sequences (Cauchy–Schwarz on the moment sums,
attained by some sequence) ``|m_t|/√v_t ≤ (1−β₁)/√(1−β₂) · √(Σ_{k<t} (β₁²/β₂)^k)``; so step t moves a coordinate by
at most ``ρ(t) · lr`` with

    ρ(t) = (1−β₁)/(1−β₁ᵗ) · √((1−β₂ᵗ)/(1−β₂) · (1 − qᵗ)/(1 − q)),   q = β₁²/β₂      (:func:`adam_step_ratio`),

``ρ(1) = 1`` (the first step moves each coordinate by exactly lr, whatever the gradient), ρ(20) = 1.16, ρ(100) = 2.24,
rising to 7.27 as t → ∞. In round r (0-based) a client has taken at most ``(r + 1) · P`` steps, so its reply lies
within ``lr · Σ_{t = rP+1}^{(r+1)P} ρ(t)`` of the broadcast in every coordinate (:func:`adam_displacement_bound`):
about ``lr · P`` in the first rounds — at most the learning rate per step and coordinate — where the box was
``8 · lr · P`` before issue 44 (a client lying at 98 % of that box raised the test RMSE from 0.103 to 0.727). A reply
beyond the bound did not come from the algorithm. A client inside it can still steer: the bound limits how far, not
in which direction (docs/guides/threat-model.md gives the measured damage).

These checks catch statistics that are *inconsistent*: impossible for any data of the registered size. A client
that lies consistently (statistics of other data of the same size) passes them; the registered ``N_k`` is itself the
client's claim. Under differential privacy the noise breaks the PSD and bound checks, so noised sums are not checked
(they are post-processed instead).
"""

from __future__ import annotations

import functools
from typing import List, Mapping, Optional, Sequence, Tuple

import numpy as np
from check_shapes import check_shapes

__all__ = [
    "ADAM_BETAS",
    "adam_displacement_bound",
    "adam_step_ratio",
    "displacement_fault",
    "displacement_faults",
    "statistics_fault",
]

#: the tf_keras Adam defaults the clients use (FSGP's local optimiser)
ADAM_BETAS = (0.9, 0.999)
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


@check_shapes("t: [T]", "return: [T]")
def adam_step_ratio(t: np.ndarray, betas: Tuple[float, float] = ADAM_BETAS) -> np.ndarray:
    """``ρ(t)``: the largest move of one coordinate by Adam's step ``t`` (1-based), in learning rates (module
    docstring); ``ρ(1) = 1``, increasing to ``(1−β₁)/√((1−β₂)(1−β₁²/β₂))`` (7.27 for the defaults)."""
    b1, b2 = betas
    t = np.asarray(t, dtype=np.float64)
    q = b1**2 / b2
    return (1 - b1) / (1 - b1**t) * np.sqrt((1 - b2**t) / (1 - b2) * (1 - q**t) / (1 - q))


@functools.lru_cache(maxsize=64)  # asked for every reply of a round, with the same scalars
def adam_displacement_bound(
    learning_rate: float, local_steps: int, round: int, betas: Tuple[float, float] = ADAM_BETAS
) -> float:
    """How far, per coordinate, ``local_steps`` Adam steps of round ``round`` (0-based) can move a value:
    ``lr · Σ_{t = round·P + 1}^{(round + 1)·P} ρ(t)`` (a client that skipped rounds has taken fewer steps, and ρ
    increases with t, so this bounds every client)."""
    P = int(local_steps)
    steps = np.arange(int(round) * P + 1, (int(round) + 1) * P + 1)
    return float(learning_rate) * float(np.sum(adam_step_ratio(steps, betas)))


def displacement_fault(
    values: Mapping[str, np.ndarray],
    broadcast: Mapping[str, np.ndarray],
    learning_rate: float,
    local_steps: int,
    round: int,
    absolute_tolerance: float = 0.0,
) -> Optional[str]:
    """Why a FedAvg reply (or a mean of replies) is not ``local_steps`` Adam steps of round ``round`` from
    ``broadcast`` (:func:`adam_displacement_bound`), or None.

    :param absolute_tolerance: the round-off of a fixed-point mean (masked sums).
    """
    bound = adam_displacement_bound(learning_rate, local_steps, round)
    allowed = bound * (1 + RELATIVE_TOLERANCE) + absolute_tolerance
    for name, value in values.items():
        if name not in broadcast:
            continue
        value, centre = np.asarray(value, np.float64), np.asarray(broadcast[name], np.float64)
        if value.shape != centre.shape:
            return f"its {name!r} has shape {value.shape}, not the broadcast's {centre.shape}"
        moved = np.abs(value - centre)
        if moved.size and moved.max() > allowed:
            return (
                f"its {name!r} moved further from the broadcast than {local_steps} Adam steps of learning rate "
                f"{learning_rate:g} can in round {round} ({bound:.6g} per coordinate)"
            )
    return None


#: the most bytes :func:`displacement_faults` stacks at once (per broadcast name)
STACK_BYTES = 1 << 26


def displacement_faults(
    replies: Sequence[Mapping[str, np.ndarray]],
    broadcast: Mapping[str, np.ndarray],
    learning_rate: float,
    local_steps: int,
    round: int,
) -> List[Optional[str]]:
    """:func:`displacement_fault` of each of a cohort's FedAvg replies of round ``round``, in order, with each
    broadcast name's largest move over the cohort computed at once (the replies' arrays stacked, in chunks of at most
    :data:`STACK_BYTES`) instead of one reply at a time. A reply whose move is not within the bound (or not a number),
    or whose array cannot be stacked with the broadcast's shape, is judged on its own by :func:`displacement_fault`, so
    every verdict is exactly the per-reply one (issue 46: the per-reply Python of a large cohort)."""
    allowed = adam_displacement_bound(learning_rate, local_steps, round) * (1 + RELATIVE_TOLERANCE)
    suspect = np.zeros(len(replies), dtype=bool)
    for name, value in broadcast.items():
        centre = np.asarray(value, np.float64)
        members = [i for i, reply in enumerate(replies) if name in reply]
        if centre.size == 0 or not members:
            continue
        rows = max(1, STACK_BYTES // (centre.size * 8))
        for start in range(0, len(members), rows):
            chunk = members[start : start + rows]
            arrays = [np.asarray(replies[i][name]) for i in chunk]
            same = np.fromiter((a.shape == centre.shape for a in arrays), bool, len(chunk))
            suspect[np.asarray(chunk)[~same]] = True
            if not same.any():
                continue
            stacked = np.stack([a for a, ok in zip(arrays, same) if ok]).astype(np.float64, copy=False)
            moved = np.abs(stacked - centre[None]).reshape(int(same.sum()), -1).max(axis=1)
            suspect[np.asarray(chunk)[same][~(moved <= allowed)]] = True
    return [
        displacement_fault(reply, broadcast, learning_rate, local_steps, round) if flagged else None
        for reply, flagged in zip(replies, suspect)
    ]
