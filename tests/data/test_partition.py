"""Partitioners: every split covers each training index exactly once; the skews they promise; bad input."""

import itertools

import numpy as np
import pytest

from gpflow_fed.data import (
    PARTITIONS,
    FederatedDataset,
    group_partition,
    iid_partition,
    make_federated,
    most_correlated_feature,
    partition_indices,
    random_size_partition,
    size_imbalance,
    sorted_chunk_partition,
    spatial_partition,
    holdout_split,
    split_indices,
)


def assert_exact_cover(parts, num_data, num_clients):
    assert len(parts) == num_clients
    assert all(len(p) > 0 for p in parts)
    assert all(np.all(np.diff(p) > 0) for p in parts)  # sorted, no repeats within a client
    merged = np.sort(np.concatenate(parts))
    np.testing.assert_array_equal(merged, np.arange(num_data))


def _random_problem(rng):
    N = int(rng.integers(2, 300))
    K = int(rng.integers(1, min(N, 12) + 1))
    D = int(rng.integers(1, 4))
    X = rng.normal(size=(N, D))
    Y = X @ rng.normal(size=(D, 1)) + 0.1 * rng.normal(size=(N, 1))
    return N, K, X, Y


@pytest.mark.parametrize("trial", range(40))
def test_every_partition_covers_each_index_once(trial):
    rng = np.random.default_rng(trial)
    N, K, X, Y = _random_problem(rng)
    seed = int(rng.integers(1000))
    assert_exact_cover(iid_partition(N, K, seed=seed), N, K)
    assert_exact_cover(random_size_partition(N, K, seed=seed), N, K)
    assert_exact_cover(random_size_partition(N, K, seed=seed, concentration=0.3), N, K)
    if 2 * K <= N:
        assert_exact_cover(sorted_chunk_partition(X, Y, K, seed=seed), N, K)
    assert_exact_cover(spatial_partition(X, K, seed=seed), N, K)
    groups = rng.integers(0, K + 3, size=N).astype(str)
    num_groups = len(np.unique(groups))
    assert_exact_cover(group_partition(groups), N, num_groups)
    assert_exact_cover(group_partition(groups, min(K, num_groups)), N, min(K, num_groups))


def test_iid_sizes_and_determinism():
    parts = iid_partition(103, 10, seed=4)
    assert sorted(len(p) for p in parts) == [10] * 7 + [11] * 3
    assert all(np.array_equal(a, b) for a, b in zip(parts, iid_partition(103, 10, seed=4)))
    assert not all(np.array_equal(a, b) for a, b in zip(parts, iid_partition(103, 10, seed=5)))


@pytest.mark.parametrize("N, K, imbalance", [(500, 5, 59), (4900, 10, 634), (10000, 10, 1299), (7, 2, 3), (30, 3, 0)])
def test_random_sizes_hit_the_papers_imbalance(N, K, imbalance):
    for seed in range(5):
        parts = random_size_partition(N, K, seed=seed, imbalance=imbalance)
        assert_exact_cover(parts, N, K)
        assert size_imbalance(parts) == imbalance


def test_imbalance_is_reached_exactly_when_any_split_reaches_it():
    # oracle: every composition of N into K positive parts, by brute force
    for N in range(2, 13):
        for K in range(1, min(N, 4) + 1):
            achievable = {
                max(parts) - min(parts) for parts in itertools.product(range(1, N + 1), repeat=K) if sum(parts) == N
            }
            for imbalance in range(N):
                if imbalance in achievable:
                    parts = random_size_partition(N, K, seed=N + K + imbalance, imbalance=imbalance)
                    assert_exact_cover(parts, N, K)
                    assert size_imbalance(parts) == imbalance
                else:
                    with pytest.raises(ValueError, match="cannot split"):
                        random_size_partition(N, K, imbalance=imbalance)


def test_random_sizes_min_size_and_infeasible_imbalance():
    for seed in range(10):
        parts = random_size_partition(100, 8, seed=seed, min_size=10)
        assert min(len(p) for p in parts) >= 10
    with pytest.raises(ValueError, match="max − min = 3"):
        random_size_partition(8, 2, imbalance=3)  # sizes a and a + 3 cannot sum to 8
    with pytest.raises(ValueError, match="min_size"):
        random_size_partition(10, 4, min_size=3)
    with pytest.raises(ValueError, match="concentration"):
        random_size_partition(10, 2, concentration=0.0)
    assert size_imbalance([np.arange(3), np.arange(10)]) == 7


def test_sorted_chunks_follow_the_most_correlated_feature():
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(200, 3))
    Y = 5 * X[:, 1:2] + 0.01 * rng.normal(size=(200, 1))
    assert most_correlated_feature(X, Y) == 1
    parts = sorted_chunk_partition(X, Y, 4, seed=1)
    ranks = np.argsort(np.argsort(X[:, 1]))  # rank of each row along the sorting feature
    for part in parts:
        chunk_ids = np.unique(ranks[part] // 25)  # 8 chunks of 25 sorted rows
        assert len(chunk_ids) == 2 and len(part) == 50
    # a client's rows are contiguous in the sorted order within each of its two chunks: strong feature skew
    spans = [np.ptp(X[p, 1]) for p in parts]
    assert min(spans) < 0.5
    forced = sorted_chunk_partition(X, Y, 4, seed=1, feature=0, chunks_per_client=1)
    assert all(np.ptp(np.argsort(np.argsort(X[:, 0]))[p]) == 49 for p in forced)


def test_group_partition_merges_whole_groups():
    groups = np.array(["a"] * 5 + ["b"] * 3 + ["c"] * 2 + ["d"] * 2)
    parts = group_partition(groups)
    assert [list(groups[p][:1]) for p in parts] == [["a"], ["b"], ["c"], ["d"]]
    merged = group_partition(groups, 2)
    # largest first to the smallest client: a → 0, b → 1, c → 1, d → 0 ... sizes 7 and 5
    assert sorted(len(p) for p in merged) == [5, 7]
    for part in merged:
        for g in np.unique(groups[part]):
            assert np.sum(groups[part] == g) == np.sum(groups == g)
    with pytest.raises(ValueError, match="4 distinct groups"):
        group_partition(groups, 5)


def test_spatial_partition_finds_separated_regions():
    rng = np.random.default_rng(2)
    centres = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    coords = np.concatenate([c + rng.normal(scale=0.5, size=(30, 2)) for c in centres])
    parts = spatial_partition(coords, 3, seed=7)
    truth = [set(range(0, 30)), set(range(60, 90)), set(range(30, 60))]  # ordered by first coordinate
    assert sorted(map(tuple, map(sorted, map(set, parts)))) == sorted(map(tuple, map(sorted, truth)))
    again = spatial_partition(coords, 3, seed=7)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    with pytest.raises(ValueError, match="distinct coordinates"):
        spatial_partition(np.zeros((5, 2)), 2)


@pytest.mark.parametrize("seed", range(5))
def test_spatial_partition_is_a_converged_k_means(seed):
    rng = np.random.default_rng(seed)
    coords = rng.uniform(size=(200, 2))
    parts = spatial_partition(coords, 6, seed=seed)
    centres = np.stack([coords[p].mean(axis=0) for p in parts])
    dist2 = ((coords[:, None, :] - centres[None]) ** 2).sum(-1)
    for k, part in enumerate(parts):  # every point is at least as close to its own centre as to any other
        assert np.all(dist2[part, k] <= dist2[part].min(axis=1) + 1e-12)
    assert np.all(np.diff(centres[:, 0]) >= 0)  # clients ordered by the first coordinate of their centre


def test_holdout_split_and_split_indices():
    X = np.arange(20.0)[:, None]
    Y = 2 * X
    X_tr, Y_tr, X_te, Y_te = holdout_split(X, Y, test_fraction=0.25, seed=3)
    assert X_tr.shape == (15, 1) and X_te.shape == (5, 1)
    np.testing.assert_array_equal(np.sort(np.concatenate([X_tr, X_te])[:, 0]), X[:, 0])
    np.testing.assert_array_equal(Y_te, 2 * X_te)
    train, test = split_indices(3, 0.01)
    assert len(train) == 2 and len(test) == 1
    for bad in (0.0, 1.0, -0.2, "0.5"):
        with pytest.raises(ValueError, match="test_fraction"):
            split_indices(10, bad)


def test_make_federated_with_test_fraction_and_groups():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 2))
    Y = X[:, :1] ** 2
    groups = np.repeat(np.array(["u", "v", "w"]), 40)
    fed = make_federated(X, Y, partition="group", groups=groups, test_fraction=0.25, seed=1, name="g")
    assert isinstance(fed, FederatedDataset) and fed.num_clients == 3 and fed.name == "g"
    assert fed.num_data == 90 and fed.test[0].shape == (30, 2)
    X_all = np.concatenate([fed.pooled()[0], fed.test[0]])
    assert sorted(map(tuple, X_all)) == sorted(map(tuple, X))
    for Xk, Yk in fed.clients:  # each client holds exactly the training rows of one group
        rows = [int(np.flatnonzero((X == x).all(1))[0]) for x in Xk]
        assert len(set(groups[rows])) == 1
        np.testing.assert_array_equal(Yk, Y[rows])


@pytest.mark.parametrize("partition", sorted(PARTITIONS))
def test_make_federated_every_partition(partition):
    rng = np.random.default_rng(1)
    X, Y = rng.normal(size=(60, 2)), rng.normal(size=(60, 1))
    kw = {"groups": np.arange(60) % 4} if partition == "group" else {}
    fed = make_federated(X, Y, partition=partition, num_clients=4, test=(X[:5], Y[:5]), seed=2, **kw)
    assert fed.num_clients == 4 and fed.num_data == 60 and fed.test[0].shape == (5, 2)
    assert sorted(map(tuple, fed.pooled()[0])) == sorted(map(tuple, X))


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(partition="dirichlet", num_clients=2), ValueError, "valid partitions"),
        (dict(partition="iid", num_clients=0), ValueError, "at least 1"),
        (dict(partition="iid", num_clients=11), ValueError, "exceeds the number of data points"),
        (dict(partition="iid", num_clients=2.0), TypeError, "integer"),
        (dict(partition="iid"), ValueError, "needs num_clients"),
        (dict(partition="group", num_clients=2), ValueError, "needs groups"),
        (dict(partition="group", groups=[1, 2]), ValueError, "groups has 2 rows"),
        (
            dict(partition="iid", num_clients=2, test_fraction=0.2, test=(np.zeros((1, 1)), np.zeros((1, 1)))),
            ValueError,
            "not both",
        ),
        (dict(partition="sorted_chunks", num_clients=6), ValueError, "chunks exceed"),
        (dict(partition="iid", num_clients=2, colour="red"), TypeError, "colour"),
    ],
)
def test_make_federated_bad_arguments(kwargs, error, match):
    X, Y = np.arange(10.0)[:, None], np.arange(10.0)
    with pytest.raises(error, match=match):
        make_federated(X, Y, **kwargs)


def test_partition_indices_rejects_bad_data():
    with pytest.raises(ValueError, match="NaN"):
        make_federated(np.array([[np.nan], [1.0]]), np.zeros(2), num_clients=1)
    with pytest.raises(ValueError, match="feature"):
        partition_indices(np.zeros((10, 2)), np.zeros((10, 1)), "sorted_chunks", 2, feature=2)
