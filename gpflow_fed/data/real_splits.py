"""Federated splits of the real datasets (:func:`~gpflow_fed.data.load_dataset`) as the papers' experiments make
them: PVI's standardised iid or regional clients (Bui et al., arXiv:1811.11206, §6.2) and the FedBNR thesis'
8:1:1 sorted-chunk protocol (§3.2.2) with its distillation data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np

from .dataset import FederatedDataset, validate_regression_data
from .partition import make_federated, most_correlated_feature, sorted_chunk_partition
from .real import load_dataset
from .standardize import Standardizer

__all__ = ["REGIONAL", "FedBNRTask", "fedbnr_real_task", "real_split"]

REGIONAL = ("ozone",)
"""Datasets :func:`real_split` splits into regional clients (k-means on their coordinates), in place of the PVI
paper's weather stations."""


def real_split(
    name: str,
    split: int,
    num_clients: int = 10,
    max_points: int = 0,
    regional: Optional[bool] = None,
    standardize: bool = True,
) -> FederatedDataset:
    """The standardised federated split of a real dataset for PVI (used by ``gpflow-fed pvi`` and the benchmarks).

    At most ``max_points`` rows (a random subset drawn with seed 0; 0 keeps all), 10 % held out for testing
    (seed ``split``), then ``num_clients`` clients: regional (k-means on the coordinates) for :data:`REGIONAL`
    datasets, homogeneous (iid) otherwise, or as ``regional`` says; standardised by
    :meth:`FederatedDataset.standardized` (pooled statistics from per-client summaries).

    :param standardize: ``False`` returns the split in the data's units (then call ``.standardized()`` to keep
        the standardiser, as the command line does).
    :raises ValueError: ``regional`` clients for a dataset without coordinates.
    """
    real = load_dataset(name)
    X, Y, coords = real.X, real.Y, real.coordinates
    if max_points and X.shape[0] > max_points:
        keep = np.sort(np.random.default_rng(0).choice(X.shape[0], max_points, replace=False))
        X, Y, coords = X[keep], Y[keep], None if coords is None else coords[keep]
    regional = name in REGIONAL if regional is None else regional
    if regional and coords is None:
        raise ValueError(f"dataset {name!r} has no coordinates for regional clients")
    partition = dict(partition="spatial", coordinates=coords) if regional else dict(partition="iid")
    dataset = make_federated(X, Y, num_clients=num_clients, test_fraction=0.1, seed=split, name=name, **partition)
    return dataset.standardized()[0] if standardize else dataset


@dataclass(frozen=True)
class FedBNRTask:
    """A real-data task of §3.2.2.

    :param dataset: the clients (sorted-chunk skew) and the test set.
    :param distillation: 80 % of the validation set (FedBNR-KD's server data).
    :param validation: the other 20 % of the validation set.
    :param feature: the column the training rows were sorted by.
    :param correlation: its correlation with the target (the thesis reports it per dataset).
    :param standardizer: the training split's moments every array above was standardised with.
    """

    dataset: FederatedDataset
    distillation: Tuple[np.ndarray, np.ndarray]
    validation: Tuple[np.ndarray, np.ndarray]
    feature: int
    correlation: float
    standardizer: Optional[Standardizer] = None


def fedbnr_real_task(
    X: np.ndarray,
    Y: np.ndarray,
    num_clients: int,
    *,
    seed: int = 0,
    name: str = "dataset",
    kd_fraction: float = 0.8,
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
    scaler = Standardizer.from_data(X_arr[train], Y_arr[train])
    Xs, Ys = scaler.transform(X_arr, Y_arr)
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
        standardizer=scaler,
    )
