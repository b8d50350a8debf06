"""Public bounds of a FedAvg reply (``Algorithm.payload_bound``; issue 43, the clip leak), shared by FSGP's and FGP's
``"train"`` and FedAvgNN's.

A FedAvg reply is ``local_steps`` (P) Adam steps of the party's own optimiser from the broadcast, so each value lies
within the Adam displacement bound ``δ`` of its broadcast value (:func:`~.fsgp.checks.adam_displacement_bound`),
whatever the data: ``|value| ≤ max |broadcast value| + δ`` (:func:`fedavg_value_bounds`). Over that box the positive
transforms of a GP's noise variance σ² and stationary kernel variance v give their extremes at the box's corners
(:func:`variance_extremes`), and a per-point Gaussian log density (an exact GP's ``log p(y_k) / N_k``, or FSGP's local
ELBO) is bounded from them and the party's domain (:func:`log_density_bound`). Public numbers only: the broadcast,
the algorithm's constants and the party's :class:`~gpflow_fed.federated.protocol.domain.DataDomain`.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

import gpflow
import numpy as np
import tensorflow as tf

from ...training.state import SharedState, resolve_path

__all__ = ["fedavg_move", "fedavg_value_bounds", "log_density_bound", "variance_extremes"]


def fedavg_move(learning_rate: float, local_steps: int, round: int) -> float:
    """How far one coordinate can move in round ``round``'s ``local_steps`` Adam steps
    (:func:`~.fsgp.checks.adam_displacement_bound`); ``inf`` for a negative round, which no schedule sends (its
    ``ρ(t)`` at ``t ≤ 0`` is no bound), so the party refuses it."""
    from .fsgp.checks import adam_displacement_bound  # here: fsgp's algorithm imports this module

    if int(round) < 0:
        return float("inf")
    return adam_displacement_bound(float(learning_rate), int(local_steps), int(round))


def fedavg_value_bounds(params: Mapping[str, Any], move: float, relative_slack: float = 0.0) -> Dict[str, float]:
    """Per key of a FedAvg broadcast, the largest ``|value|`` of the reply: ``(max |broadcast value| + move) · (1 +
    relative_slack)`` (the slack covers the round-off of steps taken in a narrower float than float64). A non-finite
    broadcast value gives a non-finite bound (the party refuses)."""
    out: Dict[str, float] = {}
    with np.errstate(over="ignore", invalid="ignore"):
        for key, value in params.items():
            largest = float(np.max(np.abs(np.asarray(value, np.float64)), initial=0.0))  # NaN propagates
            out[key] = (largest + float(move)) * (1.0 + float(relative_slack))
    return out


def _extremes(module: Any, parameter: Any, shared: SharedState, params: Mapping[str, Any], move: float) -> np.ndarray:
    """The constrained values of the scalar ``parameter`` at the box's two corners ``u ∓ move`` (its unconstrained
    broadcast value ``u`` where it is shared, else its own value at both)."""
    for key, path in shared.paths.items():
        if key in params and resolve_path(module, path) is parameter:
            u = float(np.asarray(params[key], np.float64))
            corners = tf.constant([u - move, u + move], dtype=parameter.dtype)
            transform = parameter.transform
            return np.asarray(transform.forward(corners).numpy() if transform is not None else corners.numpy())
    value = float(parameter.numpy())
    return np.array([value, value])


def variance_extremes(
    module: Any, shared: SharedState, params: Mapping[str, Any], move: float
) -> Optional[Tuple[float, float, float]]:
    """``(σ²₋, σ²₊, v₊)`` of ``module`` (a GPflow model with a Gaussian likelihood) over the box ``|u − params| ≤
    move`` of the unconstrained shared values: the noise variance's least and largest value and the kernel variance's
    largest (``max_x k(x, x)`` of a ``gpflow.kernels.Stationary`` kernel). Each transform is evaluated at both corners
    (no assignment to ``module``: its values are read, never changed). None for a kernel that is not stationary, or a
    likelihood without a variance."""
    kernel = getattr(module, "kernel", None)
    noise_variance = getattr(getattr(module, "likelihood", None), "variance", None)
    if not isinstance(kernel, gpflow.kernels.Stationary) or not isinstance(noise_variance, gpflow.Parameter):
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        noise = _extremes(module, noise_variance, shared, params, move)
        variance = _extremes(module, kernel.variance, shared, params, move)
    return float(np.min(noise)), float(np.max(noise)), float(np.max(variance))


def log_density_bound(
    rows: float, targets: Any, noise_low: float, noise_high: float, variance_high: float, *, trace_term: bool
) -> float:
    """A bound on ``|log N(Y | 0, Q + σ² I)| / N`` (P outputs, ``rows`` N, ``|y_np| ≤ Ȳ_p = targets[p]``) for every
    ``Q ⪰ 0`` with ``tr Q ≤ N v₊`` and σ² ∈ [σ²₋, σ²₊]:

        P/2 (log 2π + max(|log σ²₋|, |log(σ²₊ + N v₊)|)) + (Σ_p Ȳ_p² [+ P v₊]) / (2σ²₋)

    (``log det(Q + σ² I) / N`` lies between ``log σ²`` and ``log(σ² + N v)`` as every eigenvalue of Q is within
    ``tr Q``; ``y_pᵀ (Q + σ² I)⁻¹ y_p ≤ N Ȳ_p² / σ²``). ``trace_term``: also the Titsias trace term ``P tr(K − Q) / (2σ²
    N) ≤ P v / (2σ²)`` (FSGP's local ELBO); without it, an exact GP's ``log p(y) / N`` (Q = K). A zero σ²₋ or an
    overflow gives ``inf`` (the party refuses)."""
    targets = np.asarray(targets, np.float64)
    P, squares, N = float(targets.size), float(np.sum(targets**2)), float(rows)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        log_det = np.max(np.abs(np.log([noise_low, noise_high + N * variance_high])))  # NaN propagates
        quadratic = squares + (P * variance_high if trace_term else 0.0)
        return float(0.5 * P * (np.log(2 * np.pi) + log_det) + quadratic / (2 * noise_low))
