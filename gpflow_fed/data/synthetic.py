"""Synthetic regression datasets of the papers this package implements; every generator is deterministic given
``seed`` (a ``numpy.random.default_rng`` stream).

FSGP (Guo et al., ``papers/fsgp-federated-sparse-gp.txt``, §4):

* Synthetic dataset 1 (eq. 18): ``f(x) = 3 sin(2πx/20)`` on ``[−10, 10]``; 500 evenly spaced training inputs,
  300 test inputs "generated in the same way" (evenly spaced on the same interval); i.i.d. noise ``N(0, 0.5²)``
  on both training and test outputs.
* Synthetic dataset 2 (eq. 19): ``f(x) = 2.5 sin(2π(x₁ + x₂)/90)`` on ``[−25, 25]²``; a 70 × 70 training grid
  (4900 points) and a 30 × 30 test grid (900 points); i.i.d. noise ``N(0, 0.4²)``.

  The training noise is drawn before the test noise.

Recyclable GPs (Moreno-Muñoz et al., App. E): consecutive segments of an interval, one task (client) each, of
the smooth function ``f(x) = 4.5 cos(2πx + 1.5π) − 3 sin(4.3πx + 0.3π)`` (optionally with the bias
``3x − 7.5``), noise sd 2: :func:`recyclable_segments` (with latent values), :func:`toy_concatenation`
(experiment (i)) and :func:`distributed_segments` (experiment (ii), the "10k / 100k" setting).

FedBNR (thesis §3.2.1): :func:`two_range_clients` and :func:`new_client_task` (range-split clients of
:func:`fedbnr_function`) and :func:`step_function_data` (Fig. 3.2). The thesis does not state its synthetic
"true underlying function"; :func:`fedbnr_function` is this package's choice,
``f(x) = sin(1.5x) + 0.5 cos(0.5x) + 0.1x``, smooth and non-periodic on [−5, 15].

PVI (Bui et al., arXiv:1811.11206, §6.1): :func:`pvi_five_partition_toy`, a 1-D task split into contiguous
input regions.
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
    "distributed_segments",
    "fedbnr_function",
    "fsgp_latent_1",
    "fsgp_latent_2",
    "fsgp_synthetic_1",
    "fsgp_synthetic_2",
    "new_client_task",
    "pvi_five_partition_toy",
    "recyclable_latent",
    "recyclable_segments",
    "smooth_function",
    "smooth_function_bias",
    "step_function_data",
    "toy_concatenation",
    "two_range_clients",
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
    X_train: np.ndarray = np.linspace(-10.0, 10.0, num_train, dtype=dtype)[:, None]
    X_test: np.ndarray = np.linspace(-10.0, 10.0, num_test, dtype=dtype)[:, None]
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
    X_train: np.ndarray = _grid(-25.0, 25.0, grid_train).astype(dtype)
    X_test: np.ndarray = _grid(-25.0, 25.0, grid_test).astype(dtype)
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
    """Recyclable-GP toy tasks (Moreno-Muñoz et al., App. E).

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
            X: np.ndarray = np.sort(rng.uniform(start, start + width, size=(points_per_task, 1)), axis=0).astype(dtype)
            F = recyclable_latent(X, bias)
            tasks.append((X, F + noise_std * rng.standard_normal(F.shape)))
            latents.append(F)
    X_test: np.ndarray = np.linspace(test_interval[0], test_interval[1], num_test, dtype=dtype)[:, None]
    F_test = recyclable_latent(X_test, bias)
    Y_test = F_test + noise_std * rng.standard_normal(F_test.shape)
    return SegmentedRegression(tuple(tasks), tuple(latents), X_test, Y_test, F_test, float(noise_std))


# --- Recyclable-GP paper, App. E (experiments (i) and (ii)) ---------------------------------------------


@check_shapes("x: [N, 1]", "return: [N, 1]")
def smooth_function(x: np.ndarray) -> np.ndarray:
    """``f(x) = 4.5 cos(2πx + 1.5π) − 3 sin(4.3πx + 0.3π)`` (Moreno-Muñoz et al., App. E)."""
    x = np.asarray(x)
    return 4.5 * np.cos(2 * np.pi * x + 1.5 * np.pi) - 3.0 * np.sin(4.3 * np.pi * x + 0.3 * np.pi)


@check_shapes("x: [N, 1]", "return: [N, 1]")
def smooth_function_bias(x: np.ndarray) -> np.ndarray:
    """``f_b(x) = f(x) + 3x − 7.5`` (Moreno-Muñoz et al., App. E)."""
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


# --- FedBNR thesis, §3.2.1 -----------------------------------------------------------------------------


@check_shapes("X: [N, 1]", "return: [N, 1]")
def fedbnr_function(X: np.ndarray) -> np.ndarray:
    """The synthetic ground truth ``f(x) = sin(1.5x) + 0.5 cos(0.5x) + 0.1x``."""
    X = np.asarray(X, dtype=float)
    return np.sin(1.5 * X) + 0.5 * np.cos(0.5 * X) + 0.1 * X


def _check(num_data: int, noise_std: float) -> None:
    _count(num_data, "num_data", 2)
    if not (np.isfinite(noise_std) and noise_std >= 0):
        raise ValueError(f"noise_std must be non-negative, got {noise_std!r}")


def _test_grid(low: float = -5.0, high: float = 5.0, num: int = 200) -> Tuple[np.ndarray, np.ndarray]:
    X = np.linspace(low, high, num)[:, None]
    return X, fedbnr_function(X)


def two_range_clients(num_data: int = 200, noise_std: float = 0.5, seed: int = 0) -> FederatedDataset:
    """§3.2.1: ``num_data`` points uniform on [−5, 5] with Gaussian noise (σ = 0.5); client 0 holds the points
    in [−5, 0], client 1 those in (0, 5]. The test set is the noiseless ``f`` on a grid of [−5, 5]."""
    _check(num_data, noise_std)
    rng = np.random.default_rng(seed)
    X = rng.uniform(-5.0, 5.0, size=(num_data, 1))
    Y = fedbnr_function(X) + noise_std * rng.normal(size=X.shape)
    left = X[:, 0] <= 0
    if left.all() or (~left).all():
        raise ValueError("both ranges need at least one point; increase num_data")
    return FederatedDataset([(X[left], Y[left]), (X[~left], Y[~left])], test=_test_grid(), name="fedbnr-two-ranges")


def new_client_task(
    new_range: Tuple[float, float], num_new: int, *, num_data: int = 200, noise_std: float = 0.5, seed: int = 0
) -> FederatedDataset:
    """§3.2.1, second part: the two clients of :func:`two_range_clients` plus a new client with ``num_new``
    points uniform on ``new_range`` (the thesis: [−5, 5] and [5, 15]); the test set still covers [−5, 5].
    The new client is the last one."""
    low, high = (float(v) for v in new_range)
    if not high > low:
        raise ValueError(f"new_range must be (low, high) with high > low, got {new_range!r}")
    _count(num_new, "num_new")
    _check(num_data, noise_std)
    base = two_range_clients(num_data, noise_std, seed)
    rng = np.random.default_rng(np.random.SeedSequence([seed, num_new]))
    X = rng.uniform(low, high, size=(num_new, 1))
    Y = fedbnr_function(X) + noise_std * rng.normal(size=X.shape)
    return FederatedDataset(list(base.clients) + [(X, Y)], test=base.test, name=f"fedbnr-new-client-{low:g}-{high:g}")


def step_function_data(num_data: int = 100, noise_std: float = 0.05, seed: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """Fig. 3.2's step function: ``y = 1[x > 0] + ε`` for x uniform on [−1, 1]."""
    _check(num_data, noise_std)
    rng = np.random.default_rng(seed)
    X = np.sort(rng.uniform(-1.0, 1.0, size=(num_data, 1)), axis=0)
    return X, (X > 0).astype(float) + noise_std * rng.normal(size=X.shape)


# --- PVI paper (Bui et al., arXiv:1811.11206), §6.1 ----------------------------------------------------


def pvi_five_partition_toy(
    num_data: int = 500,
    num_clients: int = 5,
    noise_variance: float = 0.05,
    num_test: int = 200,
    seed: int = 0,
) -> FederatedDataset:
    """A 1-D regression task split into ``num_clients`` contiguous input regions (one per client).

    The paper does not state its generating function, N or noise; here
    ``x ~ U(−3, 3)``, ``y = sin(2x) + 0.3 x + ε`` with ``ε ~ N(0, noise_variance)``, and client k holds the
    points of the k-th of ``num_clients`` equal-width input intervals, so the inducing inputs have to spread
    across disjoint regions, the situation of the paper's Fig. 1. Test inputs are uniform on the same domain.

    :raises ValueError: non-positive sizes or noise, or fewer than 2 points per client on average.
    """
    if num_clients < 1 or num_data < 2 * num_clients or num_test < 1:
        raise ValueError("need num_clients ≥ 1, num_data ≥ 2·num_clients and num_test ≥ 1")
    if noise_variance <= 0:
        raise ValueError(f"noise_variance must be positive, got {noise_variance}")
    rng = np.random.default_rng(seed)
    dtype = gpflow.default_float()

    def sample(n: int) -> tuple:
        X = np.sort(rng.uniform(-3.0, 3.0, (n, 1)), axis=0)
        return X.astype(dtype), (
            np.sin(2 * X) + 0.3 * X + np.sqrt(noise_variance) * rng.standard_normal((n, 1))
        ).astype(dtype)

    X, Y = sample(num_data)
    edges = np.linspace(-3.0, 3.0, num_clients + 1)
    region = np.clip(np.searchsorted(edges, X[:, 0], side="right") - 1, 0, num_clients - 1)
    clients = [(X[region == k], Y[region == k]) for k in range(num_clients)]
    return FederatedDataset(clients, test=sample(num_test), name="pvi-five-partition")
