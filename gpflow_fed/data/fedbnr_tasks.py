"""The FedBNR thesis' tasks (§3.2): the range-split synthetic experiment, the step function of Fig. 3.2, and
the real-data protocol of §3.2.2 (8:1:1 split, sorted-chunk feature skew, distillation data from validation).

The thesis does not state its synthetic "true underlying function"; :func:`fedbnr_function` is this package's
choice, ``f(x) = sin(1.5x) + 0.5 cos(0.5x) + 0.1x``, smooth and non-periodic on [−5, 15].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np
from check_shapes import check_shapes

from .dataset import FederatedDataset, validate_regression_data
from .partition import most_correlated_feature, sorted_chunk_partition

__all__ = [
    "FedBNRTask",
    "fedbnr_function",
    "fedbnr_real_task",
    "new_client_task",
    "step_function_data",
    "two_range_clients",
]


@check_shapes("X: [N, 1]", "return: [N, 1]")
def fedbnr_function(X: np.ndarray) -> np.ndarray:
    """The synthetic ground truth ``f(x) = sin(1.5x) + 0.5 cos(0.5x) + 0.1x``."""
    X = np.asarray(X, dtype=float)
    return np.sin(1.5 * X) + 0.5 * np.cos(0.5 * X) + 0.1 * X


def _check(num_data: int, noise_std: float) -> None:
    if isinstance(num_data, bool) or not isinstance(num_data, (int, np.integer)) or num_data < 2:
        raise ValueError(f"num_data must be an integer ≥ 2, got {num_data!r}")
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
    if isinstance(num_new, bool) or not isinstance(num_new, (int, np.integer)) or num_new < 1:
        raise ValueError(f"num_new must be a positive integer, got {num_new!r}")
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


@dataclass(frozen=True)
class FedBNRTask:
    """A real-data task of §3.2.2.

    :param dataset: the clients (sorted-chunk skew) and the test set.
    :param distillation: 80 % of the validation set (FedBNR-KD's server data).
    :param validation: the other 20 % of the validation set.
    :param feature: the column the training rows were sorted by.
    :param correlation: its correlation with the target (the thesis reports it per dataset).
    """

    dataset: FederatedDataset
    distillation: Tuple[np.ndarray, np.ndarray]
    validation: Tuple[np.ndarray, np.ndarray]
    feature: int
    correlation: float


def fedbnr_real_task(
    X: np.ndarray, Y: np.ndarray, num_clients: int, *, seed: int = 0, name: str = "dataset", kd_fraction: float = 0.8,
    feature: Optional[int] = None,
) -> FedBNRTask:
    """The thesis' protocol: a random 8:1:1 train:test:validation split; inputs and target standardised with
    the training split's mean and standard deviation (in a deployment these come from secure sums of Σx and
    Σx²); training rows sorted by the feature most correlated with the target, cut into 2K chunks, two per
    client (:func:`~gpflow_fed.data.sorted_chunk_partition`); ``kd_fraction`` of the validation rows become
    the distillation data."""
    X_arr, Y_arr = validate_regression_data(X, Y, f"fedbnr_real_task({name})")
    Y_arr = Y_arr[:, :1]
    if not 0 < kd_fraction < 1:
        raise ValueError(f"kd_fraction must be in (0, 1), got {kd_fraction!r}")
    n = X_arr.shape[0]
    order = np.random.default_rng(seed).permutation(n)
    n_test = n_val = max(1, int(round(0.1 * n)))
    test, val, train = order[:n_test], order[n_test : n_test + n_val], order[n_test + n_val :]
    x_mean, x_std = X_arr[train].mean(0), X_arr[train].std(0)
    x_std = np.where(x_std > 0, x_std, 1.0)
    y_mean, y_std = Y_arr[train].mean(0), Y_arr[train].std(0)
    y_std = np.where(y_std > 0, y_std, 1.0)
    Xs, Ys = (X_arr - x_mean) / x_std, (Y_arr - y_mean) / y_std
    parts = sorted_chunk_partition(Xs[train], Ys[train], num_clients, seed=seed, feature=feature)
    X_tr, Y_tr = Xs[train], Ys[train]
    column = most_correlated_feature(X_tr, Y_tr) if feature is None else int(feature)
    corr = float(np.corrcoef(X_tr[:, column], Y_tr[:, 0])[0, 1])
    dataset = FederatedDataset([(X_tr[idx], Y_tr[idx]) for idx in parts], test=(Xs[test], Ys[test]), name=name)
    n_kd = max(1, int(round(kd_fraction * len(val))))
    return FedBNRTask(
        dataset=dataset,
        distillation=(Xs[val[:n_kd]], Ys[val[:n_kd]]),
        validation=(Xs[val[n_kd:]], Ys[val[n_kd:]]),
        feature=column,
        correlation=corr,
    )
