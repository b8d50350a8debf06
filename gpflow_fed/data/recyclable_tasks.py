"""Datasets of the Recyclable-GP paper (Moreno-Muñoz et al., App. E; spec ``recyclable-gp.md`` §6.2).

* :func:`toy_concatenation`: K = 5 consecutive segments of ``[0, 5.5]``, 500 points each, biased sinusoid
  ``f_b(x) = f(x) + 3x − 7.5`` with ``f(x) = 4.5 cos(2πx + 1.5π) − 3 sin(4.3πx + 0.3π)``, noise sd 2.
* :func:`distributed_segments`: the "10k / 100k" setting — T = 50 segments of width 0.1 on ``[0, 5]``,
  ``N_k`` points each, ``replicas`` independent (overlapping) copies; test: 400 points on ``[−0.5, 5.5]``.
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

from .dataset import FederatedDataset

__all__ = [
    "banana",
    "digit_pixels",
    "distributed_segments",
    "quadrant_tasks",
    "smooth_function",
    "smooth_function_bias",
    "toy_concatenation",
]


@check_shapes("x: [N, 1]", "return: [N, 1]")
def smooth_function(x: np.ndarray) -> np.ndarray:
    """``f(x) = 4.5 cos(2πx + 1.5π) − 3 sin(4.3πx + 0.3π)`` (spec §6.2)."""
    x = np.asarray(x)
    return 4.5 * np.cos(2 * np.pi * x + 1.5 * np.pi) - 3.0 * np.sin(4.3 * np.pi * x + 0.3 * np.pi)


@check_shapes("x: [N, 1]", "return: [N, 1]")
def smooth_function_bias(x: np.ndarray) -> np.ndarray:
    """``f_b(x) = f(x) + 3x − 7.5`` (spec §6.2)."""
    return smooth_function(x) + 3.0 * np.asarray(x) - 7.5


def _count(value: object, what: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{what} must be an integer ≥ {minimum}, got {value!r}")
    return int(value)


def _segments(
    rng: np.random.Generator, low: float, high: float, num: int, per: int, bias: bool, noise_std: float
) -> List[Tuple[np.ndarray, np.ndarray]]:
    f = smooth_function_bias if bias else smooth_function
    width = (high - low) / num
    clients = []
    for k in range(num):
        x = np.sort(rng.uniform(low + k * width, low + (k + 1) * width, (per, 1)), axis=0)
        clients.append((x, f(x) + noise_std * rng.standard_normal(x.shape)))
    return clients


def toy_concatenation(
    num_tasks: int = 5, num_per_task: int = 500, seed: int = 0, noise_std: float = 2.0
) -> FederatedDataset:
    """Toy concatenation (experiment (i)): ``num_tasks`` consecutive segments of ``[0, 5.5]`` with ``f_b``.

    The test set is a 400-point grid on ``[−0.5, 6]`` with noisy targets; the latent values are
    ``smooth_function_bias(X_test)``.
    """
    num_tasks, num_per_task = _count(num_tasks, "num_tasks"), _count(num_per_task, "num_per_task")
    rng = np.random.default_rng(seed)
    clients = _segments(rng, 0.0, 5.5, num_tasks, num_per_task, True, noise_std)
    X_test = np.linspace(-0.5, 6.0, 400)[:, None]
    Y_test = smooth_function_bias(X_test) + noise_std * rng.standard_normal(X_test.shape)
    return FederatedDataset(clients, test=(X_test, Y_test), name="recyclable-toy-concatenation")


def distributed_segments(
    num_segments: int = 50, num_per_segment: int = 200, replicas: int = 1, seed: int = 0, noise_std: float = 2.0
) -> FederatedDataset:
    """The distributed setting (experiment (ii)): ``replicas`` × ``num_segments`` tasks of width 0.1 on
    ``[0, 5]`` with the unbiased ``f``; 10k = ``(50, 200, 1)``, 100k = ``(50, 400, 5)``.

    Test: 400 equispaced points on ``[−0.5, 5.5]`` with noisy targets; latent values ``smooth_function(X_test)``.
    """
    num_segments = _count(num_segments, "num_segments")
    num_per_segment, replicas = _count(num_per_segment, "num_per_segment"), _count(replicas, "replicas")
    rng = np.random.default_rng(seed)
    clients = []
    for _ in range(replicas):
        clients += _segments(rng, 0.0, 0.1 * num_segments, num_segments, num_per_segment, False, noise_std)
    X_test = np.linspace(-0.5, 0.1 * num_segments + 0.5, 400)[:, None]
    Y_test = smooth_function(X_test) + noise_std * rng.standard_normal(X_test.shape)
    return FederatedDataset(clients, test=(X_test, Y_test), name=f"recyclable-distributed-{len(clients)}")


def banana(num_data: int = 5300, seed: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """A two-class banana problem: class 1 on a noisy parabolic arc, class 0 on a shifted, reflected arc,
    both with isotropic Gaussian noise 0.4; inputs standardised. Returns ``X [N, 2]``, ``Y [N, 1]`` in {0, 1}."""
    num_data = _count(num_data, "num_data", 2)
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


def digit_pixels(index: int = 0, threshold: float = 4.0) -> Tuple[np.ndarray, np.ndarray, List[Tuple[np.ndarray, np.ndarray]]]:
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
