"""FedBNR's baselines: FedAvg/FedProx networks, pFedGP-style personalised GPs."""

from __future__ import annotations

import gpflow
import numpy as np
import pytest
from gpflow.keras import tf_keras

from gpflow_fed.data import FederatedDataset
from gpflow_fed.federated import Protection, run
from gpflow_fed.federated.algorithms import FedAvgNN, NeuralRegression, PersonalisedGP
from gpflow_fed.kernels import DeepKernel

#: the plain, readable messages these tests check (the secure default masks them)
PLAIN = Protection(secure_aggregation=False)

RNG = np.random.default_rng(5)
X = RNG.uniform(-3, 3, size=(60, 1))
Y = np.sin(2 * X) + 0.2 * RNG.normal(size=X.shape)
CLIENTS = [(X[:25], Y[:25]), (X[25:], Y[25:])]


def _network() -> tf_keras.Model:
    init = tf_keras.initializers.GlorotUniform(seed=1)
    dtype = gpflow.default_float()
    return tf_keras.Sequential(
        [
            tf_keras.layers.Dense(8, activation="tanh", kernel_initializer=init, dtype=dtype),
            tf_keras.layers.Dense(1, kernel_initializer=init, dtype=dtype),
        ]
    )


def test_fedavg_nn_one_client_equals_centralized_adam_and_noise_is_training_mse() -> None:
    algorithm = FedAvgNN(_network, rounds=2, local_steps=5, learning_rate=0.02)
    result = run(algorithm, FederatedDataset([CLIENTS[0]]), protection=PLAIN)  # one party: nothing to mask with
    central = NeuralRegression(CLIENTS[0], _network())
    optimizer = tf_keras.optimizers.Adam(learning_rate=0.02)
    for _ in range(10):
        optimizer.minimize(central.training_loss, central.mean_function.network.trainable_weights)
    np.testing.assert_allclose(result.model.predict_f(X)[0].numpy(), central.predict_f(X)[0].numpy(), atol=1e-10)
    mse = np.mean((CLIENTS[0][1] - result.model.predict_f(CLIENTS[0][0])[0].numpy()) ** 2)
    np.testing.assert_allclose(result.model.likelihood.variance.numpy(), mse, rtol=1e-10)


@pytest.mark.usefixtures("nearest_rounding")  # runs compared to the last digits: rounding to nearest
def test_fedprox_large_mu_stays_at_the_initial_network() -> None:
    start = _network()
    start(X[:1])
    fedprox = run(
        FedAvgNN(_network, rounds=2, local_steps=5, learning_rate=0.02, proximal_mu=1e8), FederatedDataset(CLIENTS)
    )
    fedavg = run(FedAvgNN(_network, rounds=2, local_steps=5, learning_rate=0.02), FederatedDataset(CLIENTS))
    initial = start(X).numpy()
    algorithm = FedAvgNN(_network, rounds=2, local_steps=5, learning_rate=0.02, proximal_mu=1e8)
    run(algorithm, FederatedDataset(CLIENTS))
    again = run(gpflow.utilities.deepcopy(algorithm), FederatedDataset(CLIENTS))  # a copy rebuilds its compiled worker
    np.testing.assert_array_equal(again.model.predict_f(X)[0].numpy(), fedprox.model.predict_f(X)[0].numpy())
    # Adam's first steps move each weight by ≈ the learning rate whatever μ is; the proximal term then pulls back
    assert np.max(np.abs(fedprox.model.predict_f(X)[0].numpy() - initial)) < np.max(
        np.abs(fedavg.model.predict_f(X)[0].numpy() - initial)
    )


def test_personalised_gp_client_models_equal_sgpr_on_their_own_data() -> None:
    net = tf_keras.Sequential([tf_keras.layers.Dense(2, activation="tanh", dtype=gpflow.default_float())])
    kernel = DeepKernel(gpflow.kernels.SquaredExponential(), net, input_dim=1)
    Z = np.linspace(-3, 3, 6)[:, None]
    result = run(
        PersonalisedGP(kernel, Z, noise_variance=0.1, rounds=2, local_steps=3, learning_rate=0.02),
        FederatedDataset(CLIENTS),
    )
    model = result.model
    X_new = np.linspace(-4, 4, 9)[:, None]
    for c, data in enumerate(CLIENTS):
        sgpr = gpflow.models.SGPR(
            data, model.kernel, model.inducing_variable.Z.numpy(), noise_variance=model.likelihood.variance.numpy()
        )
        for a, b in zip(model.predict_client(c, X_new), sgpr.predict_f(X_new)):
            np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-8)
    ups = result.ledger.select(direction="up", phase="personal")
    assert [dict(zip(e.names, e.shapes)) for e in ups] == [{"kuf_kfu": (6, 6), "kuf_y": (6, 1)}] * 2


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="proximal_mu"):
        FedAvgNN(_network, proximal_mu=-1.0)
    with pytest.raises(TypeError, match="network_factory"):
        FedAvgNN(3)
    with pytest.raises(ValueError, match="inducing_points"):
        PersonalisedGP(gpflow.kernels.SquaredExponential(), np.ones(3))
    with pytest.raises(ValueError, match="noise_variance"):
        PersonalisedGP(gpflow.kernels.SquaredExponential(), np.ones((3, 1)), noise_variance=0.0)
