"""Centralized and local-only SGPR baselines against hand-rolled oracles."""

import gpflow
import numpy as np
import pytest
from gpflow.keras import tf_keras

from gpflow_fed.baselines import centralized_sgpr, local_only_sgpr
from gpflow_fed.data import FederatedDataset


@pytest.fixture(name="dataset", scope="module")
def _dataset():
    rng = np.random.default_rng(0)
    X = rng.uniform(-3, 3, (50, 1))
    Y = np.sin(X) + 0.1 * rng.normal(size=(50, 1))
    return FederatedDataset([(X[:20], Y[:20]), (X[20:], Y[20:])], test=(X[:10], Y[:10]))


def _adam(model, n, steps, lr):
    optimizer = tf_keras.optimizers.Adam(learning_rate=lr)
    for _ in range(steps):
        optimizer.minimize(lambda: model.training_loss() / n, model.trainable_variables)


def test_centralized_and_local_only_match_manual_training(dataset):
    kernel, Z = gpflow.kernels.SquaredExponential(), np.linspace(-3, 3, 5)[:, None]
    central = centralized_sgpr(dataset, kernel, Z, 0.1, steps=4, learning_rate=0.1)
    oracle = gpflow.models.SGPR(dataset.pooled(), gpflow.kernels.SquaredExponential(), Z, noise_variance=0.1)
    _adam(oracle, 50, 4, 0.1)
    np.testing.assert_allclose(central.model.predict_f(Z)[0].numpy(), oracle.predict_f(Z)[0].numpy(), rtol=1e-9)
    assert central.steps == 4 and central.seconds > 0 and set(central.metrics) >= {"test_rmse", "test_nlpd"}
    local = local_only_sgpr(dataset, kernel, Z, 0.1, steps=4, learning_rate=0.1)
    assert len(local.models) == 2 and local.steps == 8
    rmses = []
    for model, (X, Y) in zip(local.models, dataset.clients):
        own = gpflow.models.SGPR((X, Y), gpflow.kernels.SquaredExponential(), Z, noise_variance=0.1)
        _adam(own, X.shape[0], 4, 0.1)
        np.testing.assert_allclose(model.predict_f(Z)[0].numpy(), own.predict_f(Z)[0].numpy(), rtol=1e-9)
        rmses.append(np.sqrt(np.mean((own.predict_y(dataset.test[0])[0].numpy() - dataset.test[1]) ** 2)))
    assert local.metrics["test_rmse"] == pytest.approx(np.mean(rmses), rel=1e-9)


def test_sgpr_baselines_reject_bad_steps(dataset):
    with pytest.raises(ValueError, match="steps"):
        centralized_sgpr(
            dataset, gpflow.kernels.SquaredExponential(), np.zeros((2, 1)), 0.1, steps=-1, learning_rate=0.1
        )
    with pytest.raises(ValueError, match="learning_rate"):
        local_only_sgpr(dataset, gpflow.kernels.SquaredExponential(), np.zeros((2, 1)), 0.1, steps=1, learning_rate=0)
