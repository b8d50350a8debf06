"""Two-dimensional classification datasets of the Recyclable-GP paper (Moreno-Muñoz et al., App. E).

* :func:`banana`: a generated two-class banana problem in 2-D (standardised) and :func:`quadrant_tasks`
  splitting any 2-D dataset into the four sign quadrants.
* :func:`digit_pixels`: pixel-wise classification of one 8×8 scikit-learn digit (inputs on ``[−1, 1]²``,
  label "ink > threshold"), split into four corner tasks for recycling into one classifier.

Every generator is deterministic given ``seed``.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import gpflow
import numpy as np
from check_shapes import check_shapes

__all__ = ["banana", "digit_pixels", "quadrant_tasks"]


def banana(num_data: int = 5300, seed: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """A two-class banana problem: class 1 on a noisy parabolic arc, class 0 on a shifted, reflected arc,
    both with isotropic Gaussian noise 0.4; inputs standardised. Returns ``X [N, 2]``, ``Y [N, 1]`` in {0, 1}."""
    if isinstance(num_data, bool) or not isinstance(num_data, (int, np.integer)) or num_data < 2:
        raise ValueError(f"num_data must be an integer ≥ 2, got {num_data!r}")
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, num_data)
    t = rng.uniform(-1.6, 1.6, num_data)
    arc = np.stack([t, t**2 - 1.0], axis=1)
    other = np.stack([t + 0.7, 0.6 - 0.8 * t**2], axis=1)
    X = np.where(labels[:, None] == 1, arc, other) + 0.4 * rng.standard_normal((num_data, 2))
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    dtype = gpflow.default_float()
    return X.astype(dtype), labels[:, None].astype(dtype)


@check_shapes("X: [N, 2]", "Y: [N, P]")
def quadrant_tasks(
    X: np.ndarray, Y: np.ndarray, center: Optional[np.ndarray] = None
) -> List[Tuple[np.ndarray, np.ndarray]]:
    """Split a 2-D dataset into its four quadrants around ``center`` (default the origin), ordered
    (+,+), (−,+), (−,−), (+,−). Empty quadrants raise ``ValueError``."""
    X, Y = np.asarray(X), np.asarray(Y)
    c = np.zeros(2) if center is None else np.asarray(center, dtype=float)
    right, top = X[:, 0] >= c[0], X[:, 1] >= c[1]
    masks = [right & top, ~right & top, ~right & ~top, right & ~top]
    for q, mask in enumerate(masks):
        if not np.any(mask):
            raise ValueError(f"quadrant {q + 1} around {c.tolist()} has no points")
    return [(X[m], Y[m]) for m in masks]


def digit_pixels(
    index: int = 0, threshold: float = 4.0
) -> Tuple[np.ndarray, np.ndarray, List[Tuple[np.ndarray, np.ndarray]]]:
    """Pixel-wise classification of scikit-learn's 8×8 digit ``index`` (the paper uses 28×28 MNIST, §E(v)).

    Inputs: the pixel grid on ``[−1, 1]²`` with the vertical axis pointing up; label 1 where the intensity
    (0–16) exceeds ``threshold``. Returns ``(X [64, 2], Y [64, 1], corners)`` with ``corners`` the four
    4×4 corner tasks of :func:`quadrant_tasks` (pixel centres never lie on the axes).
    """
    from sklearn.datasets import load_digits

    images = load_digits().images
    if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not 0 <= index < len(images):
        raise ValueError(f"index must be an integer in [0, {len(images)}), got {index!r}")
    image = images[int(index)]
    axis = np.linspace(-1.0, 1.0, 8)
    cols, rows = np.meshgrid(axis, axis[::-1])
    dtype = gpflow.default_float()
    X = np.stack([cols.ravel(), rows.ravel()], axis=1).astype(dtype)
    Y = (image.ravel() > threshold).astype(dtype)[:, None]
    return X, Y, quadrant_tasks(X, Y)
