"""Synthetic regression datasets of the FSGP paper (Guo et al., ``papers/fsgp-federated-sparse-gp.txt``, §4).

* Synthetic dataset 1 (eq. 18): ``f(x) = 3 sin(2πx/20)`` on ``[−10, 10]``; 500 evenly spaced training inputs,
  300 test inputs "generated in the same way" (evenly spaced on the same interval); i.i.d. noise ``N(0, 0.5²)``
  on both training and test outputs.
* Synthetic dataset 2 (eq. 19): ``f(x) = 2.5 sin(2π(x₁ + x₂)/90)`` on ``[−25, 25]²``; a 70 × 70 training grid
  (4900 points) and a 30 × 30 test grid (900 points); i.i.d. noise ``N(0, 0.4²)``.

Both generators are deterministic given ``seed`` (a ``numpy.random.default_rng`` stream; the training noise is
drawn before the test noise).

The Recyclable-GP toy tasks (``spec/recyclable-gp.md`` §6.2) are :func:`recyclable_segments`: consecutive
segments of an interval, one task (client) each, of the smooth function
``f(x) = 4.5 cos(2πx + 1.5π) − 3 sin(4.3πx + 0.3π)`` (optionally with the bias ``3x − 7.5``), noise sd 2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, List, Tuple

import gpflow
import numpy as np
from check_shapes import check_shapes

from ..validation import integer
from .dataset import FederatedDataset

__all__ = [
    "SegmentedRegression",
    "SyntheticRegression",
    "fsgp_latent_1",
    "fsgp_latent_2",
    "fsgp_synthetic_1",
    "fsgp_synthetic_2",
    "recyclable_latent",
    "recyclable_segments",
]


@dataclass(frozen=True, eq=False)
class SyntheticRegression:
    """A synthetic regression problem with its noise-free latent values.

    Unpacks as ``X_train, Y_train, X_test, Y_test = data``.

    :param X_train: ``[N, D]`` training inputs.
    :param Y_train: ``[N, 1]`` noisy training outputs ``f(X_train) + ε``.
    :param X_test: ``[N_test, D]`` test inputs.
    :param Y_test: ``[N_test, 1]`` noisy test outputs ``f(X_test) + ε``.
    :param F_train: ``[N, 1]`` latent ``f(X_train)``.
    :param F_test: ``[N_test, 1]`` latent ``f(X_test)``.
    :param noise_std: standard deviation of the Gaussian noise ε.
    :param name: a label for logs and tables.
    """

    X_train: np.ndarray
    Y_train: np.ndarray
    X_test: np.ndarray
    Y_test: np.ndarray
    F_train: np.ndarray
    F_test: np.ndarray
    noise_std: float
    name: str

    def __iter__(self) -> Iterator[np.ndarray]:
        return iter((self.X_train, self.Y_train, self.X_test, self.Y_test))


@check_shapes("X: [N, 1]", "return: [N, 1]")
def fsgp_latent_1(X: np.ndarray) -> np.ndarray:
    """Latent function of FSGP synthetic dataset 1 (eq. 18): ``f(x) = 3 sin(2πx/20)``."""
    return 3.0 * np.sin(2.0 * np.pi * np.asarray(X) / 20.0)


@check_shapes("X: [N, 2]", "return: [N, 1]")
def fsgp_latent_2(X: np.ndarray) -> np.ndarray:
    """Latent function of FSGP synthetic dataset 2 (eq. 19): ``f(x) = 2.5 sin(2π(x₁ + x₂)/90)``."""
    X = np.asarray(X)
    return 2.5 * np.sin(2.0 * np.pi * (X[:, :1] + X[:, 1:2]) / 90.0)



def _grid(low: float, high: float, per_axis: int) -> np.ndarray:
    axis = np.linspace(low, high, per_axis)
    x1, x2 = np.meshgrid(axis, axis, indexing="ij")
    return np.stack([x1.ravel(), x2.ravel()], axis=1)


def fsgp_synthetic_1(seed: int = 0, num_train: int = 500, num_test: int = 300) -> SyntheticRegression:
    """FSGP synthetic dataset 1 (eq. 18).

    ``x`` evenly spaced on ``[−10, 10]`` (``num_train`` training and ``num_test`` test points, both including the
    end points), ``y = 3 sin(2πx/20) + ε`` with ``ε ~ N(0, 0.5²)`` i.i.d.

    :param seed: seed of the noise.
    :param num_train: N (the paper: 500).
    :param num_test: number of test points (the paper: 300).
    :return: a :class:`SyntheticRegression` with ``X: [N, 1]``, ``Y: [N, 1]`` in ``gpflow.default_float()``.
    """
    num_train = integer(num_train, "num_train", minimum=2)
    num_test = integer(num_test, "num_test", minimum=2)
    dtype = gpflow.default_float()
    rng = np.random.default_rng(seed)
    X_train = np.linspace(-10.0, 10.0, num_train, dtype=dtype)[:, None]
    X_test = np.linspace(-10.0, 10.0, num_test, dtype=dtype)[:, None]
    F_train, F_test = fsgp_latent_1(X_train), fsgp_latent_1(X_test)
    noise_std = 0.5
    Y_train = F_train + noise_std * rng.standard_normal(F_train.shape)
    Y_test = F_test + noise_std * rng.standard_normal(F_test.shape)
    return SyntheticRegression(
        X_train, Y_train.astype(dtype), X_test, Y_test.astype(dtype), F_train, F_test, noise_std, "fsgp-synthetic-1"
    )


def fsgp_synthetic_2(seed: int = 0, grid_train: int = 70, grid_test: int = 30) -> SyntheticRegression:
    """FSGP synthetic dataset 2 (eq. 19).

    Inputs on regular grids over ``[−25, 25]²`` (``grid_train²`` training points, the paper's 70 × 70 = 4900, and
    ``grid_test²`` test points, the paper's 30 × 30 = 900; each axis evenly spaced including the end points),
    ``y = 2.5 sin(2π(x₁ + x₂)/90) + ε`` with ``ε ~ N(0, 0.4²)`` i.i.d.

    :param seed: seed of the noise.
    :param grid_train: training points per axis.
    :param grid_test: test points per axis.
    :return: a :class:`SyntheticRegression` with ``X: [N, 2]``, ``Y: [N, 1]`` in ``gpflow.default_float()``.
    """
    grid_train = integer(grid_train, "grid_train", minimum=2)
    grid_test = integer(grid_test, "grid_test", minimum=2)
    dtype = gpflow.default_float()
    rng = np.random.default_rng(seed)
    X_train = _grid(-25.0, 25.0, grid_train).astype(dtype)
    X_test = _grid(-25.0, 25.0, grid_test).astype(dtype)
    F_train, F_test = fsgp_latent_2(X_train), fsgp_latent_2(X_test)
    noise_std = 0.4
    Y_train = F_train + noise_std * rng.standard_normal(F_train.shape)
    Y_test = F_test + noise_std * rng.standard_normal(F_test.shape)
    return SyntheticRegression(
        X_train, Y_train.astype(dtype), X_test, Y_test.astype(dtype), F_train, F_test, noise_std, "fsgp-synthetic-2"
    )


@check_shapes("X: [N, 1]", "return: [N, 1]")
def recyclable_latent(X: np.ndarray, bias: bool = False) -> np.ndarray:
    """The Recyclable-GP toy function ``f(x) = 4.5 cos(2πx + 1.5π) − 3 sin(4.3πx + 0.3π)``
    (``smooth_function``), plus ``3x − 7.5`` when ``bias`` (``smooth_function_bias``, ``f_b``)."""
    x = np.asarray(X)
    f = 4.5 * np.cos(2 * np.pi * x + 1.5 * np.pi) - 3.0 * np.sin(4.3 * np.pi * x + 0.3 * np.pi)
    return f + (3.0 * x - 7.5 if bias else 0.0)


@dataclass(frozen=True, eq=False)
class SegmentedRegression:
    """Per-task data of :func:`recyclable_segments` and a common test grid.

    :param tasks: ``[(X_k: [N_k, 1], Y_k: [N_k, 1]), ...]``, one per task (client).
    :param latents: ``[F_k: [N_k, 1], ...]`` noise-free values at each task's inputs.
    :param X_test: ``[N_test, 1]`` equispaced test inputs.
    :param Y_test: ``[N_test, 1]`` noisy test outputs (NLPD is computed against them).
    :param F_test: ``[N_test, 1]`` latent test values (RMSE/MAE are computed against them in the paper).
    :param noise_std: the noise standard deviation (2 in the paper's code).
    """

    tasks: Tuple[Tuple[np.ndarray, np.ndarray], ...]
    latents: Tuple[np.ndarray, ...]
    X_test: np.ndarray
    Y_test: np.ndarray
    F_test: np.ndarray
    noise_std: float

    def federated(self, name: str = "recyclable-segments") -> FederatedDataset:
        """The tasks as clients of a :class:`~gpflow_fed.data.FederatedDataset` with ``(X_test, Y_test)``."""
        return FederatedDataset(clients=list(self.tasks), test=(self.X_test, self.Y_test), name=name)


def recyclable_segments(
    num_segments: int = 5,
    points_per_task: int = 500,
    interval: Tuple[float, float] = (0.0, 5.5),
    *,
    bias: bool = True,
    replicas: int = 1,
    noise_std: float = 2.0,
    num_test: int = 400,
    test_interval: Tuple[float, float] = (-0.5, 6.0),
    seed: int = 0,
) -> SegmentedRegression:
    """Recyclable-GP toy tasks (``spec/recyclable-gp.md`` §6.2).

    The interval ``[a, b]`` is cut into ``T = num_segments`` segments ``[a + tΔ, a + (t + 1)Δ]``,
    ``Δ = (b − a)/T``; task t draws ``points_per_task`` inputs uniformly on its segment (sorted) and observes
    ``y = f(x) + noise_std·ε``, ``ε ~ N(0, 1)``, with ``f`` :func:`recyclable_latent`. With ``replicas = r`` the
    T segments are sampled r times independently (overlapping tasks; K = r·T, replica-major order). The test
    set is ``num_test`` equispaced points on ``test_interval`` with noisy outputs.

    Defaults: experiment (i), "toy concatenation": K = 5 on ``[0, 5.5]``, N_k = 500, biased ``f_b``, test grid
    of 400 points on ``[−0.5, 6]``. Experiment (ii): ``recyclable_segments(50, 200, (0, 5), bias=False,
    test_interval=(-0.5, 5.5))`` (10k points), with ``replicas=5, points_per_task=400`` for 100k.
    """
    num_segments = integer(num_segments, "num_segments", minimum=1)
    points_per_task = integer(points_per_task, "points_per_task", minimum=1)
    replicas = integer(replicas, "replicas", minimum=1)
    num_test = integer(num_test, "num_test", minimum=2)
    for what, (low, high) in (("interval", interval), ("test_interval", test_interval)):
        if not (np.isfinite(low) and np.isfinite(high) and low < high):
            raise ValueError(f"{what} must be (low, high) with low < high, got {(low, high)}")
    if not np.isfinite(noise_std) or noise_std < 0:
        raise ValueError(f"noise_std must be a non-negative number, got {noise_std}")
    dtype = gpflow.default_float()
    rng = np.random.default_rng(seed)
    width = (interval[1] - interval[0]) / num_segments
    tasks: List[Tuple[np.ndarray, np.ndarray]] = []
    latents: List[np.ndarray] = []
    for _ in range(replicas):
        for t in range(num_segments):
            start = interval[0] + t * width
            X = np.sort(rng.uniform(start, start + width, size=(points_per_task, 1)), axis=0).astype(dtype)
            F = recyclable_latent(X, bias)
            tasks.append((X, F + noise_std * rng.standard_normal(F.shape)))
            latents.append(F)
    X_test = np.linspace(test_interval[0], test_interval[1], num_test, dtype=dtype)[:, None]
    F_test = recyclable_latent(X_test, bias)
    Y_test = F_test + noise_std * rng.standard_normal(F_test.shape)
    return SegmentedRegression(tuple(tasks), tuple(latents), X_test, Y_test, F_test, float(noise_std))
