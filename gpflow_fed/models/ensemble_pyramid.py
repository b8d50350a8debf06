"""Ensembles of ensembles ("pyramids", Recyclable GPs App. E.1(iii)).

A fitted :class:`~gpflow_fed.models.EnsembleSVGP` ``{μ_*, L_*, Z_*, ψ}`` has the structure of a recyclable
model, so at the next level it enters the ensemble bound as a local model with ``K_k ← K_**``.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import gpflow
import numpy as np

from ..validation import integer
from .ensemble_svgp import EnsembleSVGP, as_recyclable

__all__ = ["fit_pyramid"]


def fit_pyramid(
    local_models: Sequence[Any],
    group_size: int,
    kernel: gpflow.kernels.Kernel,
    Z: np.ndarray,
    *,
    likelihood: Optional[gpflow.likelihoods.Likelihood] = None,
    maxiter: int = 100,
    method: str = "collapsed",
) -> EnsembleSVGP:
    """Ensembles of ensembles: ensemble consecutive groups of ``group_size`` models, export each fitted
    ensemble as a recyclable model, and repeat until one ensemble remains (every node starts from a copy of
    ``kernel`` and the inducing inputs ``Z``, as in the paper's 1M experiment).

    :raises ValueError: for an empty list or ``group_size < 2``.
    """
    level = [as_recyclable(m, i) for i, m in enumerate(local_models)]
    if not level:
        raise ValueError("fit_pyramid needs at least one local model")
    group_size = integer(group_size, "group_size", minimum=2)
    while True:
        nodes = []
        for start in range(0, len(level), group_size):
            node = EnsembleSVGP(
                level[start : start + group_size],
                gpflow.utilities.deepcopy(kernel),
                np.array(Z, copy=True),
                likelihood=None if likelihood is None else gpflow.utilities.deepcopy(likelihood),
            )
            node.fit(maxiter=maxiter, method=method)
            nodes.append(node)
        if len(nodes) == 1:
            return nodes[0]
        level = [n.to_recyclable(name=f"node_{i}") for i, n in enumerate(nodes)]
