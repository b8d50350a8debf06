"""Federated standardisation equals pooled standardisation, from per-client summaries of fixed size."""

import numpy as np
import pytest

from gpflow_fed.data import FederatedDataset, Standardizer, client_moments, combine_moments


def _dataset(seed=0):
    rng = np.random.default_rng(seed)
    sizes = [3, 50, 17, 1]
    clients = [
        (rng.normal(5.0 + k, 1 + k, size=(n, 2)), rng.normal(-3.0, 0.1 + k, size=(n, 1))) for k, n in enumerate(sizes)
    ]
    return FederatedDataset(clients=clients, test=(rng.normal(size=(6, 2)), rng.normal(size=(6, 1))), name="s")


def test_moments_match_the_pooled_mean_and_std():
    data = _dataset()
    X, Y = data.pooled()
    mean, std = combine_moments([client_moments(Xk) for Xk, _ in data.clients])
    np.testing.assert_allclose(mean, X.mean(axis=0), rtol=1e-13)
    np.testing.assert_allclose(std, X.std(axis=0), rtol=1e-13)
    n, m, s = client_moments(data.clients[1][0])
    assert n == 50 and m.shape == (2,) and s.shape == (2,)  # 2L + 1 numbers, whatever N_k


def test_large_offset_is_numerically_stable():
    rng = np.random.default_rng(1)
    parts = [1e8 + rng.normal(size=(n, 1)) for n in (10, 20, 30)]
    _, std = combine_moments([client_moments(p) for p in parts])
    np.testing.assert_allclose(std, np.concatenate(parts).std(axis=0), rtol=1e-9)


def test_standardized_dataset_and_inverse_maps():
    data = _dataset()
    scaled, scaler = data.standardized()
    assert isinstance(scaler, Standardizer) and scaled.client_sizes == data.client_sizes and scaled.name == "s"
    X, Y = scaled.pooled()
    np.testing.assert_allclose(X.mean(axis=0), 0.0, atol=1e-13)
    np.testing.assert_allclose(X.std(axis=0), 1.0, rtol=1e-13)
    np.testing.assert_allclose(Y.mean(axis=0), 0.0, atol=1e-13)
    np.testing.assert_allclose(Y.std(axis=0), 1.0, rtol=1e-13)
    X0, Y0 = data.pooled()
    np.testing.assert_allclose(scaled.test[0], (data.test[0] - X0.mean(0)) / X0.std(0), rtol=1e-12)
    mean, var = scaler.inverse_transform(scaled.test[1], np.ones((6, 1)))
    np.testing.assert_allclose(mean, data.test[1], rtol=1e-12)
    np.testing.assert_allclose(var, np.full((6, 1), Y0.var()), rtol=1e-12)


def test_constant_column_is_left_unscaled():
    data = FederatedDataset(clients=[(np.ones((3, 1)), np.arange(3.0)), (np.ones((2, 1)), np.arange(2.0))])
    scaled, scaler = data.standardized()
    assert scaler.X_std[0] == 1.0 and np.all(scaled.pooled()[0] == 0.0)
    with pytest.raises(ValueError, match="at least one client"):
        combine_moments([])


def test_transform_and_inverse_transform():
    scaler = Standardizer(
        X_mean=np.array([1.0, 2.0]), X_std=np.array([2.0, 4.0]), Y_mean=np.array([10.0]), Y_std=np.array([3.0])
    )
    X, Y = np.array([[3.0, 6.0]]), np.array([[16.0]])
    np.testing.assert_allclose(scaler.transform(X), [[1.0, 1.0]])
    X_s, Y_s = scaler.transform(X, Y)
    np.testing.assert_allclose(Y_s, [[2.0]])
    np.testing.assert_allclose(scaler.inverse_transform(Y_s), Y)
    mean, var = scaler.inverse_transform(Y_s, np.array([[0.5]]))
    np.testing.assert_allclose(var, [[4.5]])
    with pytest.raises(ValueError, match=r"X must have shape \[N, 2\]"):
        scaler.transform(np.ones((3, 1)))


def test_holdout_split_keeps_pairs_together():
    from gpflow_fed.data import holdout_split

    X, Y = np.arange(20.0).reshape(10, 2), np.arange(10.0)[:, None]
    X_tr, Y_tr, X_te, Y_te = holdout_split(X, Y, test_fraction=0.3, seed=1)
    assert X_tr.shape == (7, 2) and Y_te.shape == (3, 1)
    np.testing.assert_allclose(X_tr[:, 0] / 2, Y_tr[:, 0])  # pairs stay together
    np.testing.assert_allclose(X_te[:, 0] / 2, Y_te[:, 0])


def test_from_data_is_the_column_statistics_of_arrays_in_one_place():
    X, Y = _dataset().pooled()
    X = np.concatenate([X, np.full((X.shape[0], 1), 4.0)], axis=1)  # a constant column stays unscaled
    scaler = Standardizer.from_data(X, Y)
    np.testing.assert_array_equal(scaler.X_mean, X.mean(0))
    np.testing.assert_array_equal(scaler.X_std, [*X[:, :2].std(0), 1.0])
    np.testing.assert_array_equal(scaler.transform(X, Y)[1], (Y - Y.mean(0)) / Y.std(0))
    with pytest.raises(Exception, match="Y"):
        Standardizer.from_data(X, Y[:-1])
