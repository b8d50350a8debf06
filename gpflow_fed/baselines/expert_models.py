"""Experts for the committee baselines of Recyclable GPs (the distributed-GP methods of its §4.1(ii) and
Table 3): one exact GP regression per partition, each with its own kernel hyperparameters and Gaussian noise,
trained with L-BFGS.

Combine them with :class:`~gpflow_fed.baselines.ExpertCommittee` (PoE, GPoE, BCM, rBCM). SVGP experts are the
local models themselves (``RecyclableModel.to_svgp()``).
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import gpflow
import numpy as np

__all__ = ["fit_gpr_experts"]


def fit_gpr_experts(
    partitions: Sequence[Tuple[np.ndarray, np.ndarray]],
    kernel: Optional[gpflow.kernels.Kernel] = None,
    noise_variance: float = 1.0,
    maxiter: int = 100,
) -> List[gpflow.models.GPR]:
    """Fit ``gpflow.models.GPR`` on every ``(X_k, Y_k)`` by maximising its log marginal likelihood
    ``log N(y_k | 0, K_k + σ_k²I)``; each expert starts from a copy of ``kernel`` (default SE) and ``noise_variance``.

    :raises ValueError: for no partitions or a non-positive noise variance.
    """
    parts = list(partitions)
    if not parts:
        raise ValueError("fit_gpr_experts needs at least one partition")
    if not noise_variance > 0:
        raise ValueError(f"noise_variance must be positive, got {noise_variance}")
    template = kernel if kernel is not None else gpflow.kernels.SquaredExponential()
    experts = []
    for X, Y in parts:
        model = gpflow.models.GPR(
            (np.asarray(X, dtype=gpflow.default_float()), np.asarray(Y, dtype=gpflow.default_float())),
            gpflow.utilities.deepcopy(template),
            noise_variance=noise_variance,
        )
        if maxiter:
            gpflow.optimizers.Scipy().minimize(
                model.training_loss, model.trainable_variables, options={"maxiter": maxiter}
            )
        experts.append(model)
    return experts
