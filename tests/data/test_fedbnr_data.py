"""The FedBNR thesis' tasks: range-split clients, new clients, step function, the 8:1:1 sorted-chunk protocol."""

from __future__ import annotations

import numpy as np
import pytest

from gpflow_fed.data import fedbnr_function, fedbnr_real_task, new_client_task, step_function_data, two_range_clients
from gpflow_fed.kernels import deep_urk, distribution_shifter


def test_two_range_clients_split_at_zero() -> None:
    ds = two_range_clients(num_data=200, seed=1)
    (X0, _), (X1, _) = ds.clients
    assert ds.num_data == 200 and X0.max() <= 0 < X1.min()
    X_test, F_test = ds.test
    np.testing.assert_allclose(F_test, fedbnr_function(X_test))
    assert X_test.min() == -5 and X_test.max() == 5


def test_new_client_task() -> None:
    ds = new_client_task((5.0, 15.0), 7, seed=2)
    assert ds.num_clients == 3 and ds.client_sizes[-1] == 7
    assert ds.clients[-1][0].min() >= 5 and ds.clients[-1][0].max() <= 15
    with pytest.raises(ValueError, match="new_range"):
        new_client_task((1.0, 1.0), 3)
    with pytest.raises(ValueError, match="num_new"):
        new_client_task((0.0, 1.0), 0)


def test_step_function() -> None:
    X, Y = step_function_data(num_data=50, noise_std=0.0)
    np.testing.assert_array_equal(Y, (X > 0).astype(float))


def test_real_task_protocol() -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 3))
    Y = 3 * X[:, 1:2] + 0.1 * rng.normal(size=(200, 1))
    task = fedbnr_real_task(X, Y, 4, seed=0)
    ds = task.dataset
    assert (ds.num_data, len(ds.test[0])) == (160, 20)
    assert len(task.distillation[0]) == 16 and len(task.validation[0]) == 4
    assert task.feature == 1 and task.correlation > 0.99
    pooled_X, pooled_Y = ds.pooled()
    np.testing.assert_allclose(pooled_X.mean(0), 0, atol=1e-12)
    np.testing.assert_allclose(pooled_Y.std(0), 1, atol=1e-12)
    # sorted chunks: every client holds exactly two contiguous runs of the sorted feature
    sorted_values = np.sort(pooled_X[:, 1])
    for Xc, _ in ds.clients:
        positions = np.searchsorted(sorted_values, np.sort(Xc[:, 1]))
        assert np.count_nonzero(np.diff(positions) > 1) <= 1
    with pytest.raises(ValueError, match="kd_fraction"):
        fedbnr_real_task(X, Y, 4, kd_fraction=1.5)


def test_builders_start_at_identity_shifter() -> None:
    h = distribution_shifter(3, hidden=4)
    omega = np.random.default_rng(0).normal(size=(5, 3))
    np.testing.assert_allclose(h(omega).numpy(), omega, atol=1e-12)
    kernel = deep_urk(4, hidden=(6,), num_samples=7)
    assert kernel.features(np.zeros((2, 4))).shape == (2, 14)
