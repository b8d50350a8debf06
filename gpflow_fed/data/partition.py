"""Partitioners: split N training rows among K clients.

Every partitioner returns a list of K integer index arrays that together cover ``0, ..., N − 1`` exactly once
(each array sorted ascending, none empty). :func:`make_federated` turns such a split into a
:class:`~gpflow_fed.data.FederatedDataset`. Inputs are ``X: [N, D]`` and ``Y: [N, P]`` (a 1-D ``Y`` is read as
``[N, 1]``); they are checked by :func:`~gpflow_fed.data.validate_regression_data`, so bad input raises a
``ValueError``/``TypeError`` naming the problem.

* ``"iid"`` (:func:`iid_partition`): a random permutation cut into K near-equal parts.
* ``"random_sizes"`` (:func:`random_size_partition`): random client sizes, the imbalance of the FSGP paper's
  experiments (§4, where max − min sizes are 59, 634 and 1299); :func:`size_imbalance` reports max − min.
* ``"sorted_chunks"`` (:func:`sorted_chunk_partition`): the FedBNR thesis' feature skew (§ experiments: sort by
  the feature with the largest absolute correlation with the output, cut into chunks, each client takes two).
* ``"group"`` (:func:`group_partition`): one client per value of a grouping column (city, neighbourhood, ...).
* ``"spatial"`` (:func:`spatial_partition`): regional clients from k-means on coordinates.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
from check_shapes import check_shapes

from ..validation import integer, probability
from .dataset import FederatedDataset, validate_regression_data

__all__ = [
    "PARTITIONS",
    "group_partition",
    "iid_partition",
    "make_federated",
    "most_correlated_feature",
    "partition_indices",
    "random_size_partition",
    "size_imbalance",
    "sorted_chunk_partition",
    "spatial_partition",
    "split_indices",
    "holdout_split",
]

Partition = List[np.ndarray]


def _check_clients(num_clients: object, num_data: object) -> Tuple[int, int]:
    num_data = integer(num_data, "num_data (N)", minimum=1)
    num_clients = integer(num_clients, "num_clients (K)", minimum=1)
    if num_clients > num_data:
        raise ValueError(
            f"num_clients K={num_clients} exceeds the number of data points N={num_data}: every client needs a point; "
            "use fewer clients"
        )
    return num_clients, num_data


def _cut(order: np.ndarray, sizes: Union[Sequence[int], np.ndarray]) -> Partition:
    bounds = np.cumsum([0, *sizes])
    return [np.sort(order[bounds[k] : bounds[k + 1]]) for k in range(len(sizes))]


def size_imbalance(partition: Sequence[np.ndarray]) -> int:
    """``max_k N_k − min_k N_k``, the imbalance the FSGP paper reports for its random client sizes (§4)."""
    sizes = [len(idx) for idx in partition]
    if not sizes:
        raise ValueError("size_imbalance needs a non-empty partition")
    return int(max(sizes) - min(sizes))


def iid_partition(num_data: int, num_clients: int, *, seed: int = 0) -> Partition:
    """A uniformly random split into K parts whose sizes differ by at most one."""
    num_clients, num_data = _check_clients(num_clients, num_data)
    order = np.random.default_rng(seed).permutation(num_data)
    return [np.sort(part) for part in np.array_split(order, num_clients)]


def _sizes_with_imbalance(
    num_data: int, num_clients: int, imbalance: int, min_size: int, rng: np.random.Generator
) -> np.ndarray:
    """K sizes ≥ ``min_size`` summing to N whose max − min equals ``imbalance`` exactly."""
    if num_clients == 1:
        if imbalance != 0:
            raise ValueError(f"cannot split N={num_data} into K=1 client with max − min = {imbalance}: it is always 0")
        return np.array([num_data])
    # sizes = base + extra with extra ∈ [0, imbalance]; one client has extra 0, one has extra = imbalance.
    low = max(min_size, -(-(num_data - (num_clients - 1) * imbalance) // num_clients))
    high = (num_data - imbalance) // num_clients
    if high < low:
        raise ValueError(
            f"cannot split N={num_data} into K={num_clients} clients of size ≥ {min_size} "
            f"with max − min = {imbalance}; choose another imbalance"
        )
    interior = rng.integers(0, imbalance + 1, size=num_clients - 2)
    base = int(np.clip(round((num_data - imbalance - interior.sum()) / num_clients), low, high))
    target = num_data - imbalance - num_clients * base  # required Σ interior extras, in [0, (K − 2)·imbalance]
    while interior.sum() != target:
        step = 1 if interior.sum() < target else -1
        movable = np.flatnonzero(interior < imbalance) if step > 0 else np.flatnonzero(interior > 0)
        interior[rng.choice(movable)] += step
    extras = np.concatenate([[0, imbalance], interior])
    return base + extras[rng.permutation(num_clients)]


def random_size_partition(
    num_data: int,
    num_clients: int,
    *,
    seed: int = 0,
    min_size: int = 1,
    concentration: float = 1.0,
    imbalance: Optional[int] = None,
) -> Partition:
    """A random split with random client sizes (the FSGP paper's imbalanced clients, §4).

    Without ``imbalance`` the size proportions are drawn from a symmetric Dirichlet(``concentration``) over the
    ``N − K·min_size`` points beyond each client's minimum (``concentration = 1``: uniform random cut points;
    larger values: more balanced). With ``imbalance`` the sizes are drawn so that ``max N_k − min N_k`` equals it
    exactly (e.g. 59 for the paper's first experiment with N = 500, K = 5). Rows are then assigned at random.

    :param min_size: smallest allowed client size.
    :param concentration: Dirichlet concentration, > 0.
    :param imbalance: exact max − min of the sizes, or ``None``.
    """
    num_clients, num_data = _check_clients(num_clients, num_data)
    min_size = integer(min_size, "min_size", minimum=1)
    if num_clients * min_size > num_data:
        raise ValueError(f"K={num_clients} clients of at least min_size={min_size} need N ≥ {num_clients * min_size}")
    if not np.isfinite(concentration) or concentration <= 0:
        raise ValueError(f"concentration must be a positive number, got {concentration}")
    rng = np.random.default_rng(seed)
    if imbalance is not None:
        sizes = _sizes_with_imbalance(num_data, num_clients, integer(imbalance, "imbalance", minimum=0), min_size, rng)
    else:
        spare = num_data - num_clients * min_size
        proportions = rng.dirichlet(np.full(num_clients, float(concentration)))
        extra = np.floor(proportions * spare).astype(int)
        leftover = spare - extra.sum()  # < K points lost to flooring, given to the largest remainders
        extra[np.argsort(-(proportions * spare - extra), kind="stable")[:leftover]] += 1
        sizes = min_size + extra
    return _cut(rng.permutation(num_data), sizes)


def sorted_chunk_partition(
    X: np.ndarray,
    Y: np.ndarray,
    num_clients: int,
    *,
    seed: int = 0,
    chunks_per_client: int = 2,
    feature: Optional[int] = None,
) -> Partition:
    """Feature-skewed clients as in the FedBNR thesis' experiments.

    The rows are sorted by the feature with the largest absolute Pearson correlation with the first output
    column (or by ``feature`` if given), cut into ``K·chunks_per_client`` contiguous near-equal chunks, and each
    client takes ``chunks_per_client`` of them at random (the thesis: two). The stronger that correlation, the
    stronger the distribution skew between clients.
    """
    X_arr, Y_arr = validate_regression_data(X, Y, "sorted_chunk_partition")
    num_clients, num_data = _check_clients(num_clients, X_arr.shape[0])
    chunks_per_client = integer(chunks_per_client, "chunks_per_client", minimum=1)
    num_chunks = num_clients * chunks_per_client
    if num_chunks > num_data:
        raise ValueError(f"K·chunks_per_client = {num_chunks} chunks exceed N={num_data}; use fewer chunks or clients")
    if feature is None:
        feature = most_correlated_feature(X_arr, Y_arr)
    elif isinstance(feature, bool) or not isinstance(feature, (int, np.integer)) or not 0 <= feature < X_arr.shape[1]:
        raise ValueError(f"feature must be a column index in [0, {X_arr.shape[1]}), got {feature!r}")
    order = np.argsort(X_arr[:, feature], kind="stable")
    chunks = np.array_split(order, num_chunks)
    assignment = np.random.default_rng(seed).permutation(num_chunks).reshape(num_clients, chunks_per_client)
    return [np.sort(np.concatenate([chunks[c] for c in row])) for row in assignment]


@check_shapes("X: [N, D]", "Y: [N, P]")
def most_correlated_feature(X: np.ndarray, Y: np.ndarray) -> int:
    """Index of the column of X with the largest ``|corr(X[:, d], Y[:, 0])|`` (constant columns count as 0)."""
    X_arr, Y_arr = np.asarray(X, dtype=float), np.asarray(Y, dtype=float)
    xc, yc = X_arr - X_arr.mean(axis=0), Y_arr[:, 0] - Y_arr[:, 0].mean()
    denom = np.sqrt((xc**2).sum(axis=0) * (yc**2).sum())
    corr = np.divide(np.abs(xc.T @ yc), denom, out=np.zeros(X_arr.shape[1]), where=denom > 0)
    return int(np.argmax(corr))


def group_partition(groups: Sequence[Any], num_clients: Optional[int] = None) -> Partition:
    """One client per distinct value of ``groups`` (in sorted order of the values).

    With ``num_clients`` smaller than the number of groups, whole groups are merged: largest group first, each
    to the currently smallest client (ties: lowest client index), so no group is split.

    :param groups: ``[N]`` labels (strings or numbers), e.g. a city or neighbourhood column.
    """
    labels = np.asarray(groups)
    if labels.ndim != 1 or labels.size == 0:
        raise ValueError(f"groups must be a non-empty 1-D sequence of labels, got shape {labels.shape}")
    values, inverse = np.unique(labels, return_inverse=True)
    members = [np.flatnonzero(inverse == g) for g in range(len(values))]
    if num_clients is None:
        return members
    num_clients = integer(num_clients, "num_clients (K)", minimum=1)
    if num_clients > len(values):
        raise ValueError(
            f"num_clients K={num_clients} exceeds the {len(values)} distinct groups; use K ≤ {len(values)} "
            "(a group is never split)"
        )
    clients: List[List[np.ndarray]] = [[] for _ in range(num_clients)]
    loads = np.zeros(num_clients, dtype=int)
    for g in sorted(range(len(members)), key=lambda g: (-len(members[g]), g)):
        k = int(np.argmin(loads))
        clients[k].append(members[g])
        loads[k] += len(members[g])
    return [np.sort(np.concatenate(parts)) for parts in clients]


def spatial_partition(
    coordinates: np.ndarray, num_clients: int, *, seed: int = 0, max_iterations: int = 100
) -> Partition:
    """Regional clients: k-means (Lloyd's algorithm, k-means++ start from ``seed``) on the coordinates.

    Each client is one cluster, ordered by the first coordinate of its centre. Deterministic for a given seed.
    An empty cluster during the iterations is re-seeded with the point farthest from its centre.

    :param coordinates: ``[N, C]`` positions, e.g. longitude/latitude (use comparable units per column).
    """
    coords = np.asarray(coordinates, dtype=float)
    if coords.ndim != 2 or coords.shape[1] == 0:
        raise ValueError(f"coordinates must have shape [N, C], got {coords.shape}")
    if not np.all(np.isfinite(coords)):
        raise ValueError("coordinates contain NaN or inf values")
    num_clients, num_data = _check_clients(num_clients, coords.shape[0])
    max_iterations = integer(max_iterations, "max_iterations", minimum=1)
    if len(np.unique(coords, axis=0)) < num_clients:
        raise ValueError(f"fewer than K={num_clients} distinct coordinates: cannot form {num_clients} regions")
    rng = np.random.default_rng(seed)
    centres = [coords[rng.integers(num_data)]]
    for _ in range(1, num_clients):  # k-means++ seeding
        dist2 = np.min(((coords[:, None, :] - np.asarray(centres)[None]) ** 2).sum(-1), axis=1)
        centres.append(coords[rng.choice(num_data, p=dist2 / dist2.sum())])
    centre_arr = np.asarray(centres)
    labels = np.full(num_data, -1)
    for _ in range(max_iterations):
        dist2 = ((coords[:, None, :] - centre_arr[None]) ** 2).sum(-1)
        new_labels = np.argmin(dist2, axis=1)
        for k in range(num_clients):
            counts = np.bincount(new_labels, minlength=num_clients)
            if counts[k] == 0:  # re-seed an empty cluster with the worst-fitted point of a cluster of ≥ 2
                fit = np.where(counts[new_labels] > 1, dist2[np.arange(num_data), new_labels], -1.0)
                new_labels[int(np.argmax(fit))] = k
        if np.array_equal(new_labels, labels):
            break
        labels = new_labels
        centre_arr = np.stack([coords[labels == k].mean(axis=0) for k in range(num_clients)])
    order = np.lexsort(centre_arr.T[::-1])
    return [np.flatnonzero(labels == k) for k in order]


def split_indices(num_data: int, test_fraction: float, *, seed: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """Random ``(train_idx, test_idx)``, sorted, with ``round(test_fraction·N)`` test rows (both parts non-empty)."""
    num_data = integer(num_data, "num_data (N)", minimum=2)
    test_fraction = probability(test_fraction, "test_fraction", include_one=False)
    num_test = int(np.clip(round(test_fraction * num_data), 1, num_data - 1))
    order = np.random.default_rng(seed).permutation(num_data)
    return np.sort(order[num_test:]), np.sort(order[:num_test])


def holdout_split(
    X: np.ndarray, Y: np.ndarray, *, test_fraction: float, seed: int = 0
) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Random split into ``(X_train, Y_train, X_test, Y_test)`` (see :func:`split_indices`). Note the order:
    unlike scikit-learn's ``train_test_split`` (``X_train, X_test, y_train, y_test``), each pair stays together."""
    X_arr, Y_arr = validate_regression_data(X, Y, "holdout_split")
    train, test = split_indices(X_arr.shape[0], test_fraction, seed=seed)
    return X_arr[train], Y_arr[train], X_arr[test], Y_arr[test]


def _iid(X: np.ndarray, Y: np.ndarray, num_clients: int, seed: int) -> Partition:
    return iid_partition(X.shape[0], num_clients, seed=seed)


def _random_sizes(X: np.ndarray, Y: np.ndarray, num_clients: int, seed: int, **kw: Any) -> Partition:
    return random_size_partition(X.shape[0], num_clients, seed=seed, **kw)


def _sorted_chunks(X: np.ndarray, Y: np.ndarray, num_clients: int, seed: int, **kw: Any) -> Partition:
    return sorted_chunk_partition(X, Y, num_clients, seed=seed, **kw)


def _group(X: np.ndarray, Y: np.ndarray, num_clients: Optional[int], seed: int, *, groups: Any = None) -> Partition:
    if groups is None:
        raise ValueError('partition="group" needs groups=<one label per row>')
    return group_partition(groups, num_clients)


def _spatial(
    X: np.ndarray, Y: np.ndarray, num_clients: int, seed: int, *, coordinates: Any = None, **kw: Any
) -> Partition:
    return spatial_partition(X if coordinates is None else coordinates, num_clients, seed=seed, **kw)


PARTITIONS: Dict[str, Callable[..., Partition]] = {
    "iid": _iid,
    "random_sizes": _random_sizes,
    "sorted_chunks": _sorted_chunks,
    "group": _group,
    "spatial": _spatial,
}
_ROW_KEYWORDS = ("groups", "coordinates")  # per-row keyword arrays, subset with the training rows


def partition_indices(
    X: np.ndarray, Y: np.ndarray, partition: str, num_clients: Optional[int], *, seed: int = 0, **kwargs: Any
) -> Partition:
    """Dispatch to a named partitioner of :data:`PARTITIONS`; ``kwargs`` go to it.

    ``"group"`` takes ``groups=`` (``num_clients=None``: one client per group); ``"spatial"`` takes
    ``coordinates=`` (default: X itself) and ``max_iterations=``; ``"random_sizes"`` takes ``min_size=``,
    ``concentration=``, ``imbalance=``; ``"sorted_chunks"`` takes ``chunks_per_client=``, ``feature=``.
    """
    if partition not in PARTITIONS:
        raise ValueError(f"unknown partition {partition!r}; valid partitions: {sorted(PARTITIONS)}")
    if num_clients is None and partition != "group":
        raise ValueError(f'partition="{partition}" needs num_clients=K')
    for key in _ROW_KEYWORDS:
        if kwargs.get(key) is not None and len(kwargs[key]) != np.shape(X)[0]:
            raise ValueError(f"{key} has {len(kwargs[key])} rows but X has {np.shape(X)[0]}")
    try:
        return PARTITIONS[partition](X, Y, num_clients, seed, **kwargs)
    except TypeError as exc:
        if "unexpected keyword" in str(exc):
            raise TypeError(f'partition="{partition}": {exc}; see partition_indices for its options') from exc
        raise


def make_federated(
    X: np.ndarray,
    Y: np.ndarray,
    *,
    partition: str = "iid",
    num_clients: Optional[int] = None,
    test: Optional[Tuple[np.ndarray, np.ndarray]] = None,
    test_fraction: Optional[float] = None,
    seed: int = 0,
    name: str = "dataset",
    **kwargs: Any,
) -> FederatedDataset:
    """Split ``(X, Y)`` among K simulated clients and return a :class:`~gpflow_fed.data.FederatedDataset`.

    :param partition: a name in :data:`PARTITIONS` (``"iid"``, ``"random_sizes"``, ``"sorted_chunks"``,
        ``"group"``, ``"spatial"``); its options go in ``kwargs`` (see :func:`partition_indices`).
    :param num_clients: K (for ``"group"`` optional: default one client per group).
    :param test: an explicit held-out ``(X_test, Y_test)``; or
    :param test_fraction: hold out this random fraction of the rows first (per-row ``groups`` /
        ``coordinates`` are subset with the training rows). Give at most one of ``test`` and ``test_fraction``.
    :param seed: seed of the test split and of the partitioner.
    """
    X_arr, Y_arr = validate_regression_data(X, Y, "make_federated")
    if test is not None and test_fraction is not None:
        raise ValueError("give either test=(X_test, Y_test) or test_fraction, not both")
    if partition not in PARTITIONS:
        raise ValueError(f"unknown partition {partition!r}; valid partitions: {sorted(PARTITIONS)}")
    for key in _ROW_KEYWORDS:
        if kwargs.get(key) is not None and len(kwargs[key]) != X_arr.shape[0]:
            raise ValueError(f"{key} has {len(kwargs[key])} rows but X has {X_arr.shape[0]}")
    if test_fraction is not None:
        train, held_out = split_indices(X_arr.shape[0], test_fraction, seed=seed)
        test = (X_arr[held_out], Y_arr[held_out])
        X_arr, Y_arr = X_arr[train], Y_arr[train]
        for key in _ROW_KEYWORDS:
            if kwargs.get(key) is not None:
                kwargs[key] = np.asarray(kwargs[key])[train]
    parts = partition_indices(X_arr, Y_arr, partition, num_clients, seed=seed, **kwargs)
    return FederatedDataset(clients=[(X_arr[idx], Y_arr[idx]) for idx in parts], test=test, name=name)
