"""Initial inducing inputs Z that need no client data: a space-filling design over a known box, or points
summarising public data. (:func:`~gpflow_fed.federated.algorithms.initial_inducing_inputs` reproduces the FSGP
paper's draw from the pooled training inputs, which a real federation does not have.)"""

from __future__ import annotations

from typing import Sequence, Tuple

import gpflow
import numpy as np
from check_shapes import check_shapes

from ...validation import integer

__all__ = ["inducing_from_public", "inducing_grid"]

#: the box an integer M is spread over when the inputs are standardised (about 95 % of a unit normal).
STANDARDISED_BOX = (-2.0, 2.0)


@check_shapes("return: [M, D]")
def inducing_grid(bounds: Sequence[Tuple[float, float]], num_inducing: int) -> np.ndarray:
    """M points spread over the box ``bounds`` = ``[(low_1, high_1), …, (low_D, high_D)]``: an even grid for
    D = 1 (ends included), the unscrambled Halton sequence for D > 1 (a full grid would need ``M^(1/D)``
    points per axis). Deterministic and data-free: the box comes from public knowledge of the input domain
    (e.g. ages 18–90), or is ``[(-2, 2)] * D`` for standardised inputs.

    :param bounds: one ``(low, high)`` pair per input dimension, ``low < high``, finite.
    :param num_inducing: M ≥ 1.
    :return: ``[M, D]`` array of ``gpflow.default_float()``.
    """
    M = integer(num_inducing, "inducing_grid: num_inducing", minimum=1)
    box = np.asarray(bounds, dtype=float)
    if box.ndim != 2 or box.shape[1] != 2 or box.shape[0] < 1:
        raise ValueError(
            f"inducing_grid: bounds must be [(low, high), ...], one pair per input dimension; got shape {box.shape}"
        )
    low, high = box[:, 0], box[:, 1]
    if not (np.all(np.isfinite(box)) and np.all(low < high)):
        raise ValueError(f"inducing_grid: every bound needs finite low < high, got {box.tolist()}")
    if box.shape[0] == 1:
        unit = np.linspace(0.0, 1.0, M)[:, None] if M > 1 else np.full((1, 1), 0.5)
    else:
        from scipy.stats import qmc

        unit = qmc.Halton(d=box.shape[0], scramble=False).random(M + 1)[1:]  # the first Halton point is 0
    return (low + unit * (high - low)).astype(gpflow.default_float())


@check_shapes("X_public: [N, D]", "return: [M, D]")
def inducing_from_public(X_public: np.ndarray, num_inducing: int, seed: int = 0) -> np.ndarray:
    """M k-means centroids (k-means++ start) of public inputs ``X_public`` — a published sample, a synthetic
    design, or a consenting party's rows; never the clients' private data.

    :param X_public: ``[N, D]`` public inputs, N ≥ M distinct rows.
    :param num_inducing: M ≥ 1.
    :param seed: seed of the k-means++ start (not privacy noise: the inputs are public).
    :return: ``[M, D]`` array of ``gpflow.default_float()``.
    """
    from scipy.cluster.vq import kmeans2

    M = integer(num_inducing, "inducing_from_public: num_inducing", minimum=1)
    X: np.ndarray = np.asarray(X_public, dtype=gpflow.default_float())
    if not np.all(np.isfinite(X)):
        raise ValueError("inducing_from_public: X_public contains NaN or inf values")
    distinct = np.unique(X, axis=0).shape[0]
    if M > distinct:
        raise ValueError(f"inducing_from_public: M = {M} exceeds the {distinct} distinct public inputs; lower M")
    centroids, _ = kmeans2(X, M, minit="++", seed=np.random.default_rng(seed))
    return centroids.astype(gpflow.default_float())
