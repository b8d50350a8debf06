"""Attack: read a single-row client's (x, y) back from the FSGP statistics it would send.

With ``N_k = 1`` the statistics are ``(c cᵀ, c y, y², k(x, x), 1)``, ``c = k(Z, x)``: Theorem 1's rotation
``(C Q, Qᵀ y)`` is only ``Q = ±1``, so ``|y| = √(y²)``, the sign of y follows from ``c y`` (``c > 0`` for a
squared-exponential kernel), ``c = (c y) / y``, and x solves the linear system ``log c_m − log c_1 =
(‖z_1 − x‖² − ‖z_m − x‖²) / (2ℓ²)``. FSGP therefore refuses such a client before any message is sent.
"""

import gpflow
import numpy as np
import pytest
import tensorflow as tf

from gpflow_fed.data import FederatedDataset
from gpflow_fed.federated import LocalRuntime, RunOptions, run
from gpflow_fed.federated.algorithms import FSGP
from gpflow_fed.federated.algorithms.fsgp.statistics import sgpr_statistics

M, D = 6, 2
LENGTHSCALE = 0.9


def _reconstruct(stats, Z: np.ndarray) -> "tuple[np.ndarray, float]":
    """The server's attack on one client's unwhitened statistics (needs only Z and ℓ, which it broadcasts)."""
    y = float(np.sqrt(stats.y_squared_sum.numpy()))
    c_times_y = stats.kuf_y.numpy()[:, 0]
    y = y if np.sum(c_times_y) > 0 else -y
    log_c = np.log(c_times_y / y)
    # log c_m − log c_1 = [(‖z_1‖² − ‖z_m‖²)/2 + (z_m − z_1)·x] / ℓ²
    A = (Z[1:] - Z[0]) / LENGTHSCALE**2
    b = (log_c[1:] - log_c[0]) - (np.sum(Z[0] ** 2) - np.sum(Z[1:] ** 2, axis=1)) / (2 * LENGTHSCALE**2)
    x, *_ = np.linalg.lstsq(A, b, rcond=None)
    return x, y


def _setting():
    rng = np.random.default_rng(3)
    Z = rng.uniform(-1.5, 1.5, (M, D))
    kernel = gpflow.kernels.SquaredExponential(variance=1.3, lengthscales=LENGTHSCALE)
    return rng, Z, kernel


def test_one_row_statistics_reveal_the_row_exactly() -> None:
    """The attack is real (so the refusal below is needed): a single (x, y) is recovered to round-off."""
    rng, Z, kernel = _setting()
    x, y = rng.uniform(-1, 1, (1, D)), np.array([[-0.37]])
    stats = sgpr_statistics(kernel, gpflow.inducing_variables.InducingPoints(Z), tf.constant(x), tf.constant(y))
    x_hat, y_hat = _reconstruct(stats, Z)
    np.testing.assert_allclose(x_hat, x[0], atol=1e-8)
    assert y_hat == pytest.approx(y[0, 0], abs=1e-12)
    # with two rows the same attack does not return either row
    X2, Y2 = rng.uniform(-1, 1, (2, D)), np.array([[0.5], [0.2]])
    x2_hat, _ = _reconstruct(
        sgpr_statistics(kernel, gpflow.inducing_variables.InducingPoints(Z), tf.constant(X2), tf.constant(Y2)), Z
    )
    assert min(np.max(np.abs(x2_hat - row)) for row in X2) > 1e-3


@pytest.mark.parametrize("mode", ["fedavg", "exact"])
def test_fsgp_refuses_a_single_row_client(mode: str) -> None:
    rng, Z, kernel = _setting()
    clients = [(rng.uniform(-1, 1, (n, D)), rng.normal(size=(n, 1))) for n in (20, 1, 15)]
    algorithm = FSGP(kernel, Z, 0.1, rounds=1, local_steps=1, learning_rate=0.1, mode=mode)
    runtime = LocalRuntime(options=RunOptions(keep_payloads=True))
    with pytest.raises(ValueError, match=r"client\(s\) \[1\] .*single data point.*Theorem 1 needs N_k > 1"):
        run(algorithm, FederatedDataset(clients), runtime=runtime)
    # two rows are accepted
    clients[1] = (rng.uniform(-1, 1, (2, D)), rng.normal(size=(2, 1)))
    result = run(algorithm, FederatedDataset(clients), runtime=LocalRuntime())
    assert np.isfinite(result.model.predict_f(np.zeros((1, D)))[0].numpy()).all()
