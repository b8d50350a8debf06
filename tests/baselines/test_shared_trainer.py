"""The baselines' per-client training is compiled once, whatever the number of clients (no retracing)."""

import logging

import gpflow
import numpy as np
import tensorflow as tf

from gpflow_fed.baselines import fgp, local_only_sgpr
from gpflow_fed.baselines.shared_trainer import SharedAdamTrainer
from gpflow_fed.data import FederatedDataset


def _six_clients() -> FederatedDataset:
    rng = np.random.default_rng(1)
    clients = []
    for k in range(6):
        X = rng.uniform(-3, 3, (8 + k, 1))  # different N_k: the loop must not retrace per shape
        clients.append((X, np.sin(X) + 0.1 * rng.normal(size=X.shape)))
    return FederatedDataset(clients, test=clients[0])


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_six_clients_trace_once_and_warn_nothing() -> None:
    dataset = _six_clients()
    kernel, Z = gpflow.kernels.SquaredExponential(), np.linspace(-3, 3, 4)[:, None]
    records = _Records()
    tf.get_logger().addHandler(records)
    try:
        local_only_sgpr(dataset, kernel, Z, 0.1, steps=2, learning_rate=0.1)
        fgp(dataset, kernel, 0.1, rounds=2, local_steps=2, learning_rate=0.1)
    finally:
        tf.get_logger().removeHandler(records)
    assert not [m for m in records.messages if "retracing" in m]


def test_trainer_traces_once_and_keeps_state_per_call() -> None:
    dataset = _six_clients()
    trainer = SharedAdamTrainer(
        lambda data: gpflow.models.GPR(data, kernel=gpflow.kernels.SquaredExponential(), noise_variance=0.1),
        1, 1, learning_rate=0.1, steps=3,
    )  # fmt: skip
    start = trainer.initial_values()
    results = [trainer.train(X, Y, start, trainer.initial_adam()) for X, Y in dataset.clients]
    assert trainer.tracing_count() == 1
    assert all(int(adam.iterations) == 3 for _, adam in results)  # Adam's step count, from a fresh state each time
    first, again = results[0][0], trainer.train(*dataset.clients[0], start, trainer.initial_adam())[0]
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)  # the scratch model's previous client leaves no trace
    assert not np.allclose(results[0][0][0], results[1][0][0])
