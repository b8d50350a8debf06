"""The one local-training component: clients taking turns on one compiled worker, each with its own Adam state,
equal clients with private ``tf_keras`` optimizers; one trace serves every client size; the state survives a
checkpoint; a deep copy of an algorithm builds its own worker."""

import copy
import json
import threading

import gpflow
import numpy as np
import pytest
import tensorflow as tf
from gpflow.keras import tf_keras

from gpflow_fed.data import FederatedDataset
from gpflow_fed.federated import run
from gpflow_fed.federated.algorithms import PersonalisedGP
from gpflow_fed.federated.engine.checkpoint import decode_tree, encode_tree
from gpflow_fed.training.adam import AdamState, CompiledAdam, SharedWorker, adam_steps, per_point_loss

RNG = np.random.default_rng(0)
CLIENTS = [(X, np.sin(X) + 0.1 * RNG.normal(size=X.shape)) for X in (RNG.uniform(-3, 3, (n, 1)) for n in (6, 9, 13))]


def _sgpr(X: np.ndarray, Y: np.ndarray) -> gpflow.models.SGPR:
    Z = np.linspace(-2, 2, 3)[:, None]
    return gpflow.models.SGPR((X, Y), gpflow.kernels.SquaredExponential(), Z, noise_variance=0.1)


def _worker(compile: bool = True):
    worker = _sgpr(*CLIENTS[0])
    return worker, CompiledAdam(worker.trainable_variables, lambda X, Y: per_point_loss(worker, X, Y), 0.05, compile)


@pytest.mark.parametrize("compile", [True, False])
def test_clients_taking_turns_equal_clients_with_private_adam(compile: bool) -> None:
    worker, trainer = _worker(compile)
    states = [trainer.initial_state() for _ in CLIENTS]
    values = [[v.numpy() for v in worker.trainable_variables] for _ in CLIENTS]
    private = [(_sgpr(X, Y), tf_keras.optimizers.Adam(learning_rate=0.05)) for X, Y in CLIENTS]
    for _ in range(2):  # two rounds; the clients interleave on the one worker
        for k, (X, Y) in enumerate(CLIENTS):
            for variable, value in zip(worker.trainable_variables, values[k]):
                variable.assign(value)
            losses, states[k] = trainer.fit(3, states[k], X, Y)
            values[k] = [v.numpy() for v in worker.trainable_variables]
            model, optimizer = private[k]
            expected = []
            for _ in range(3):
                expected.append(float(model.training_loss()) / X.shape[0])  # each loss is taken before its update
                optimizer.minimize(lambda: model.training_loss() / X.shape[0], model.trainable_variables)
            np.testing.assert_allclose(losses, expected, rtol=1e-10)
            for value, variable in zip(values[k], model.trainable_variables):
                np.testing.assert_allclose(value, variable.numpy(), rtol=1e-9, atol=1e-12)
    assert [int(s.iterations) for s in states] == [6, 6, 6]
    assert trainer.tracing_count() == (1 if compile else 0)  # clients of 6, 9 and 13 points: one trace


def test_adam_state_survives_a_checkpoint_and_training_resumes_identically() -> None:
    worker, trainer = _worker()
    X, Y = CLIENTS[1]
    _, state = trainer.fit(4, trainer.initial_state(), X, Y)
    arrays: dict = {}
    node = json.loads(json.dumps(encode_tree({"adam": state}, arrays)))  # what run.json and arrays.npz hold
    restored = decode_tree(node, arrays)["adam"]
    assert isinstance(restored, AdamState) and restored.iterations.dtype == np.int64
    start = [v.numpy() for v in worker.trainable_variables]
    results = []
    for adam in (state, restored):
        for variable, value in zip(worker.trainable_variables, start):
            variable.assign(value)
        losses, new = trainer.fit(2, adam, X, Y)
        results.append([losses, new.iterations, *new.moments, *(v.numpy() for v in worker.trainable_variables)])
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


def test_adam_steps_returns_the_loss_before_each_update_and_calls_after_step() -> None:
    x = tf.Variable(0.0, dtype=tf.float64)
    counter = tf.Variable(0, dtype=tf.int64)
    optimizer = tf_keras.optimizers.SGD(learning_rate=0.25)
    optimizer.build([x])
    steps = tf.function(
        lambda n: adam_steps(lambda: (x - 3.0) ** 2, [x], optimizer, n, lambda: counter.assign_add(1)), autograph=False
    )
    losses = steps(tf.constant(3)).numpy()
    np.testing.assert_array_equal(losses, [9.0, 1.5**2, 0.75**2])  # x: 0 → 1.5 → 2.25 → 2.625
    assert float(x.numpy()) == 2.625
    assert int(counter.numpy()) == 3


def test_bad_input_is_refused() -> None:
    worker, trainer = _worker()
    X, Y = CLIENTS[0]
    state = trainer.initial_state()
    with pytest.raises(ValueError, match="needs at least one trainable variable"):
        CompiledAdam([], lambda: tf.constant(0.0), 0.1)
    for steps in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="num_steps must be a positive integer"):
            trainer.fit(steps, state, X, Y)
    with pytest.raises(ValueError, match="Adam moments have shapes"):
        trainer.fit(1, AdamState(state.iterations, state.moments[:-1]), X, Y)
    with pytest.raises(TypeError, match="expected an AdamState"):
        trainer.fit(1, [state.iterations, *state.moments], X, Y)


class _Owner:
    def __init__(self) -> None:
        self.builds = 0
        self.worker = SharedWorker(self._build)

    def _build(self, size: int = 1) -> list:
        self.builds += 1
        return [self, size]


def test_shared_worker_is_built_once_used_under_its_lock_and_rebuilt_by_a_deep_copy() -> None:
    owner = _Owner()
    assert owner.builds == 0
    first = owner.worker.get(2)
    assert owner.worker.get(5) is first and first == [owner, 2] and owner.builds == 1
    taken = []
    with owner.worker.use() as used:
        thread = threading.Thread(target=lambda: taken.append(owner.worker.lock.acquire(blocking=False)))
        thread.start()
        thread.join()
    assert used is first and taken == [False]  # another thread waits while a client uses the worker
    clone = copy.deepcopy(owner)
    assert clone.worker.get()[0] is clone and clone.builds == 2  # built again, for the copy
    assert owner.worker.get() is first and owner.builds == 1


@pytest.mark.usefixtures("nearest_rounding")  # runs compared to the last digits: rounding to nearest
def test_an_algorithm_copied_after_a_run_runs_as_the_original() -> None:
    dataset = FederatedDataset(CLIENTS)
    algorithm = PersonalisedGP(
        gpflow.kernels.SquaredExponential(),
        np.linspace(-2, 2, 3)[:, None],
        0.1,
        rounds=2,
        local_steps=2,
        learning_rate=0.05,
    )
    run(algorithm, dataset, seed=1)  # builds the worker
    clone = copy.deepcopy(algorithm)  # the worker and its Keras Adam are rebuilt for the copy, not copied
    again, copied = run(algorithm, dataset, seed=1), run(clone, dataset, seed=1)
    assert clone._worker.get()[0] is not algorithm._worker.get()[0]
    for key, value in again.state.values.items():
        np.testing.assert_array_equal(copied.state.values[key], value)
