"""FSGP synthetic datasets 1 and 2 (eq. 18, 19): sizes, grids, latent functions and noise levels."""

import gpflow
import numpy as np
import pytest

from gpflow_fed.data import fsgp_latent_1, fsgp_latent_2, fsgp_synthetic_1, fsgp_synthetic_2


def test_synthetic_1_matches_eq_18():
    data = fsgp_synthetic_1(seed=3)
    X, Y, X_test, Y_test = data
    assert X.shape == (500, 1) and Y.shape == (500, 1)
    assert X_test.shape == (300, 1) and Y_test.shape == (300, 1)
    for array in (X, Y, X_test, Y_test):
        assert array.dtype == gpflow.default_float()
    np.testing.assert_allclose(X[:, 0], -10 + 20 * np.arange(500) / 499, rtol=0, atol=1e-12)
    np.testing.assert_allclose(X_test[:, 0], -10 + 20 * np.arange(300) / 299, rtol=0, atol=1e-12)
    np.testing.assert_allclose(data.F_train, 3 * np.sin(2 * np.pi * X / 20), rtol=0, atol=1e-12)
    np.testing.assert_allclose(data.F_test, 3 * np.sin(2 * np.pi * X_test / 20), rtol=0, atol=1e-12)
    assert data.noise_std == 0.5
    residual = np.concatenate([Y - data.F_train, Y_test - data.F_test])
    # 800 N(0, 0.5²) draws: the sample std lies within ±10% of 0.5 with overwhelming probability.
    assert abs(residual.std() - 0.5) < 0.05 and abs(residual.mean()) < 0.06


def test_synthetic_2_matches_eq_19():
    data = fsgp_synthetic_2(seed=0)
    X, Y, X_test, Y_test = data
    assert X.shape == (4900, 2) and Y.shape == (4900, 1)
    assert X_test.shape == (900, 2) and Y_test.shape == (900, 1)
    axis = np.linspace(-25, 25, 70)
    assert sorted(set(np.round(X[:, 0], 10))) == pytest.approx(axis) and len({tuple(r) for r in X}) == 4900
    assert sorted(set(np.round(X_test[:, 1], 10))) == pytest.approx(np.linspace(-25, 25, 30))
    np.testing.assert_allclose(data.F_train[:, 0], 2.5 * np.sin(2 * np.pi * X.sum(1) / 90), rtol=0, atol=1e-12)
    residual = Y - data.F_train
    assert data.noise_std == 0.4 and abs(residual.std() - 0.4) < 0.02


def test_seeded_and_latents():
    a, b, c = fsgp_synthetic_1(seed=1), fsgp_synthetic_1(seed=1), fsgp_synthetic_1(seed=2)
    np.testing.assert_array_equal(a.Y_train, b.Y_train)
    assert not np.allclose(a.Y_train, c.Y_train)
    assert fsgp_latent_1(np.array([[5.0]]))[0, 0] == pytest.approx(3.0)
    assert fsgp_latent_2(np.array([[10.0, 12.5]]))[0, 0] == pytest.approx(2.5)  # 2π·22.5/90 = π/2
    small = fsgp_synthetic_2(grid_train=5, grid_test=3)
    assert small.X_train.shape == (25, 2) and small.X_test.shape == (9, 2)


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda: fsgp_synthetic_1(num_train=1), ValueError),
        (lambda: fsgp_synthetic_1(num_test=2.5), TypeError),
        (lambda: fsgp_synthetic_2(grid_train=0), ValueError),
    ],
)
def test_bad_sizes(call, error):
    with pytest.raises(error, match="num_train|num_test|grid_train"):
        call()


def test_recyclable_segments_match_the_spec():
    from gpflow_fed.data import recyclable_latent, recyclable_segments

    x = np.array([[0.0], [0.25], [1.0]])
    # f(0) = 4.5 cos(1.5π) − 3 sin(0.3π); f(0.25) = 4.5 cos(2π) − 3 sin(1.375π); f_b adds 3x − 7.5
    expected = np.array([[-3 * np.sin(0.3 * np.pi)], [4.5 - 3 * np.sin(1.375 * np.pi)], [-3 * np.sin(4.6 * np.pi)]])
    np.testing.assert_allclose(recyclable_latent(x), expected, atol=1e-12)
    np.testing.assert_allclose(recyclable_latent(x, bias=True), expected + 3 * x - 7.5, atol=1e-12)

    data = recyclable_segments(seed=0)  # experiment (i): K = 5 on [0, 5.5], N_k = 500, f_b, 400 test points
    assert len(data.tasks) == 5
    for t, ((X, Y), F) in enumerate(zip(data.tasks, data.latents)):
        assert X.shape == Y.shape == (500, 1)
        assert np.all(np.diff(X[:, 0]) >= 0) and 1.1 * t <= X.min() and X.max() <= 1.1 * (t + 1)
        np.testing.assert_allclose(F, recyclable_latent(X, bias=True), atol=1e-12)
    residual = np.concatenate([Y - F for (_, Y), F in zip(data.tasks, data.latents)])
    assert abs(residual.std() - 2.0) < 0.1  # noise sd 2 over 2500 draws
    np.testing.assert_allclose(data.X_test[:, 0], np.linspace(-0.5, 6.0, 400), atol=1e-12)
    fed = data.federated()
    assert fed.num_clients == 5 and fed.num_data == 2500 and fed.test[0].shape == (400, 1)

    overlapping = recyclable_segments(50, 40, (0.0, 5.0), bias=False, replicas=2, seed=1)
    assert len(overlapping.tasks) == 100  # replica-major: tasks t and 50 + t share a segment
    assert overlapping.tasks[7][0].min() >= 0.7 and overlapping.tasks[57][0].max() <= 0.8
    with pytest.raises(ValueError, match="interval"):
        recyclable_segments(interval=(1.0, 1.0))
    with pytest.raises(ValueError, match="noise_std"):
        recyclable_segments(noise_std=-1.0)
