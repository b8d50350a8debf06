"""FSGP privacy through the ledger: sizes independent of N_k, no data row in any payload, Theorem 1."""

import gpflow
import numpy as np
import pytest
import tensorflow as tf

from gpflow_fed.data import FederatedDataset
from gpflow_fed.federated import LocalRuntime, Protection, RunOptions, run
from gpflow_fed.federated.algorithms import FSGP
from gpflow_fed.federated.algorithms.fsgp.statistics import sgpr_statistics, statistics_from_cross_covariance

# One pytest-xdist worker (setup.cfg's --dist loadgroup): the runs of the module fixture are trained once.
pytestmark = pytest.mark.xdist_group("test_fsgp_privacy")

#: the plain, readable messages these tests check (the secure default masks them)
PLAIN = Protection(secure_aggregation=False)

M, D = 6, 2


def _dataset(sizes, seed):
    rng = np.random.default_rng(seed)
    clients = []
    for n in sizes:
        X = rng.uniform(-2, 2, (n, D))
        clients.append((X, np.sin(X[:, :1]) + 0.1 * rng.normal(size=(n, 1))))
    return FederatedDataset(clients)


def _run(dataset, mode):
    Z = np.linspace(-1.5, 1.5, M * D).reshape(M, D)  # not a data row
    algorithm = FSGP(
        gpflow.kernels.SquaredExponential(lengthscales=[1.0] * D),
        Z,
        0.1,
        rounds=2,
        local_steps=2,
        learning_rate=0.1,
        mode=mode,
    )
    return run(algorithm, dataset, runtime=LocalRuntime(options=RunOptions(keep_payloads=True)), protection=PLAIN)


def _layout(ledger):
    return [(e.round, e.phase, e.purpose, e.sender, e.receiver, e.names, e.shapes, e.nbytes) for e in ledger]


@pytest.fixture(scope="module", params=["fedavg", "exact"])
def runs(request):
    small, large = _dataset((9, 14), seed=0), _dataset((40, 73), seed=1)
    return request.param, (small, _run(small, request.param)), (large, _run(large, request.param))


def test_message_sizes_depend_on_m_and_d_never_on_n(runs):
    mode, (_, small), (_, large) = runs
    assert _layout(small.ledger) == _layout(large.ledger)
    up_predict = small.ledger.select(direction="up", phase="predict")
    assert {e.shapes for e in up_predict} == {((M, M), (M, 1), (), (), ())}
    params = M * D + D + 2  # Z, lengthscales, kernel variance, noise variance
    train_phases = ("train",) if mode == "fedavg" else ("gradient",)
    for entry in small.ledger.select(direction="up"):
        if entry.phase in train_phases:
            assert sum(int(np.prod(s)) for s in entry.shapes) == params


def test_no_row_of_x_or_y_appears_in_any_payload(runs):
    _, (dataset, small), (large_dataset, large) = runs
    for data, result in ((dataset, small), (large_dataset, large)):
        private = set()
        for X, Y in data.clients:
            private.update(X.ravel().tolist())
            private.update(Y.ravel().tolist())
        assert len(result.ledger.messages) == len(result.ledger)
        for message in result.ledger.messages:
            for name, array in message.arrays.items():
                leaked = private.intersection(np.asarray(array, float).ravel().tolist())
                assert not leaked, f"{message.sender} {message.phase} {name} carries private values {leaked}"
        for X, Y in data.clients:  # and no row as a contiguous block of any payload
            for message in result.ledger.messages:
                for array in message.arrays.values():
                    flat = np.asarray(array, float).ravel()
                    for row in np.concatenate([X, Y], axis=1)[:5]:
                        assert not np.any(np.isclose(flat, row[0], rtol=0, atol=1e-12))


def test_predict_message_is_the_statistics_of_cross_covariance_and_outputs(runs):
    """What client_0 sends in the final phase is exactly (C Cᵀ, C y, ‖y‖², tr Kff, N_k) at the final w
    (exact mode: the whitened (L⁻¹ C Cᵀ L⁻ᵀ, L⁻¹ C y), with L Lᵀ = Kuu at the shared w)."""
    _, (dataset, small), _ = runs
    model = small.model
    X, Y = dataset.clients[0]
    (message,) = [m for m in small.ledger.messages if m.sender == "client_0" and m.phase == "predict"]
    expected = sgpr_statistics(
        model.kernel, model.inducing_variable, tf.constant(X), tf.constant(Y), whiten=model.whitened
    )
    for name, value in expected._asdict().items():
        np.testing.assert_allclose(message[name], value.numpy(), rtol=1e-12, atol=1e-14)


def test_theorem_1_rotated_data_give_identical_messages():
    """(C Q, Qᵀ y) for an orthogonal Q is a different (C, y) pair with the same statistics (eqs. 16–17)."""
    rng = np.random.default_rng(5)
    N_k = 30
    X = rng.uniform(-2, 2, (N_k, D))
    Y = rng.normal(size=(N_k, 1))
    kernel = gpflow.kernels.SquaredExponential(variance=1.5, lengthscales=[0.8, 1.2])
    Z = gpflow.inducing_variables.InducingPoints(rng.uniform(-2, 2, (M, D)))
    C = gpflow.covariances.Kuf(Z, kernel, X).numpy()
    kdiag = kernel(X, full_cov=False).numpy()  # stationary: the same for any inputs
    Q, _ = np.linalg.qr(rng.normal(size=(N_k, N_k)))
    C_rot, Y_rot = C @ Q, Q.T @ Y
    assert np.max(np.abs(C_rot - C)) > 0.1 and np.max(np.abs(Y_rot - Y)) > 0.1
    original = statistics_from_cross_covariance(tf.constant(C), tf.constant(Y), tf.constant(kdiag))
    rotated = statistics_from_cross_covariance(tf.constant(C_rot), tf.constant(Y_rot), tf.constant(kdiag))
    for a, b in zip(original, rotated):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-10, atol=1e-12)
    # and the client's own function computes exactly these statistics from (X, Y)
    direct = sgpr_statistics(kernel, Z, tf.constant(X), tf.constant(Y))
    for a, b in zip(original, direct):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12, atol=1e-14)
