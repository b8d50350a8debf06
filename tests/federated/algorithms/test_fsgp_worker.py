"""FSGP's shared client worker: one trace for every client, and each client's Adam state stays its own."""

import gpflow
import numpy as np
import pytest
from gpflow.keras import tf_keras

from gpflow_fed.data import FederatedDataset
from gpflow_fed.federated import LocalRuntime, Message, Protection, RunOptions, run
from gpflow_fed.federated.algorithms import FSGP
from gpflow_fed.federated.algorithms.fsgp.worker import SGPRClientWorker
from gpflow_fed.training.adam import AdamState

#: the plain, readable messages these tests check (the secure default masks them)
PLAIN = Protection(secure_aggregation=False)


def _dataset(sizes=(7, 13, 20), seed=0):
    rng = np.random.default_rng(seed)
    clients = []
    for k, n in enumerate(sizes):  # heterogeneous clients, so their local parameters and moments differ
        X = rng.uniform(-3, 3, (n, 1))
        clients.append((X, (1 + k) * np.sin(2 * X) + 0.1 * rng.normal(size=(n, 1))))
    return FederatedDataset(clients)


def _private_adam_oracle(dataset, kernel, Z, noise, rounds, steps, lr):
    """FedAvg where every client owns an SGPR and a tf_keras Adam that persist across rounds (the old design)."""
    models, optimizers = [], []
    for X, Y in dataset.clients:
        model = gpflow.models.SGPR((X, Y), gpflow.utilities.deepcopy(kernel), Z.copy(), noise_variance=noise)
        optimizer = tf_keras.optimizers.Adam(learning_rate=lr)
        optimizer.build(model.trainable_variables)
        models.append(model)
        optimizers.append(optimizer)
    sizes = np.asarray(dataset.client_sizes, float)
    weights = sizes / sizes.sum()
    w = [v.numpy() for v in models[0].trainable_variables]
    for _ in range(rounds):
        local = []
        for model, optimizer, n in zip(models, optimizers, sizes):
            for v, value in zip(model.trainable_variables, w):
                v.assign(value)
            for _ in range(steps):
                optimizer.minimize(lambda: model.training_loss() / n, model.trainable_variables)
            local.append([v.numpy() for v in model.trainable_variables])
        w = [sum(a * values[i] for a, values in zip(weights, local)) for i in range(len(w))]
    return models[0], w


def test_multi_round_fedavg_equals_clients_with_private_persistent_adam():
    dataset = _dataset()
    kernel, Z, rounds, steps, lr = gpflow.kernels.SquaredExponential(), np.linspace(-2.5, 2.5, 5)[:, None], 3, 4, 0.05
    algorithm = FSGP(kernel, Z, 0.1, rounds=rounds, local_steps=steps, learning_rate=lr)
    result = run(algorithm, dataset, protection=Protection(secure_aggregation=False))  # exact: plain sums
    template, expected = _private_adam_oracle(dataset, kernel, Z, 0.1, rounds, steps, lr)
    paths = {id(p.unconstrained_variable): path for path, p in gpflow.utilities.parameter_dict(template).items()}
    for variable, value in zip(template.trainable_variables, expected):
        key = paths[id(variable)].lstrip(".")
        np.testing.assert_allclose(result.state.params[key], value, rtol=1e-9, atol=1e-12)
    # one trace serves clients of 7, 13 and 20 points over every round and the final phase
    assert result.algorithm.worker.tracing_counts() == {"train": 1, "statistics": 1, "gradient": 0}
    assert result.algorithm.tracing_counts() == {f"client_{k}": {"train": 1} for k in range(3)}


class KeepClients(FSGP):
    """FSGP that keeps a handle on its clients, to inspect their own state after the run."""

    def setup_client(self, client, info):
        super().setup_client(client, info)
        self.clients = getattr(self, "clients", {})
        self.clients[client.id] = client


def test_each_client_keeps_its_own_adam_state_and_a_failed_update_leaves_it_alone(monkeypatch):
    dataset = _dataset()
    steps = 3
    algorithm = KeepClients(
        gpflow.kernels.SquaredExponential(),
        np.linspace(-2, 2, 4)[:, None],
        0.1,
        rounds=4,
        local_steps=steps,
        learning_rate=0.1,
        client_fraction=0.34,
    )
    result = run(algorithm, dataset, seed=1, protection=PLAIN)  # the up-messages counted per client
    algorithm = result.algorithm  # the run's own bound copy (Algorithm.bind) holds its clients
    asked = {cid: len(result.ledger.select(direction="up", phase="train", sender=cid)) for cid in algorithm.clients}
    assert sum(asked.values()) == 2 * 4 and len(set(asked.values())) > 1  # ⌈3 · 0.34⌉ = 2 a round, unequally
    for cid, client in algorithm.clients.items():
        assert int(client.state["adam"].iterations) == steps * asked[cid]  # its own step count, nobody else's
    trained = [
        np.concatenate([np.ravel(m) for m in c.state["adam"].moments])
        for cid, c in algorithm.clients.items()
        if asked[cid] > 0
    ]
    assert len(trained) >= 2 and not np.allclose(trained[0], trained[1])

    client = next(c for cid, c in algorithm.clients.items() if asked[cid] > 0)
    before = [np.array(a) for a in (client.state["adam"].iterations, *client.state["adam"].moments)]
    worker = algorithm.worker

    def diverging(X, Y, values, adam):
        new_values, new_adam, _ = SGPRClientWorker.train(worker, X, Y, values, adam)
        return new_values, new_adam, float("nan")

    monkeypatch.setattr(worker, "train", diverging)
    down = Message(sender="server", round=9, phase="train", arrays=dict(result.state.params), weight=0.0)
    with pytest.raises(FloatingPointError, match="local bound became nan"):
        algorithm.client_update(client, down)
    after = client.state["adam"]
    for a, b in zip((after.iterations, *after.moments), before):
        np.testing.assert_array_equal(a, b)


def test_worker_rejects_values_of_the_wrong_shape():
    worker = SGPRClientWorker(
        gpflow.kernels.SquaredExponential(),
        gpflow.inducing_variables.InducingPoints(np.zeros((3, 1))),
        0.1,
        1,
        ["inducing_variable.Z", "kernel.lengthscales", "kernel.variance", "likelihood.variance"],
        0.1,
        2,
        False,
    )
    X, Y = np.zeros((4, 1)), np.zeros((4, 1))
    values = [np.zeros((3, 1)), np.zeros(()), np.zeros(()), np.zeros(())]
    adam = worker.initial_adam_state()
    assert adam.iterations == 0 and sum(m.size for m in adam.moments) == 2 * (3 + 1 + 1 + 1)
    with pytest.raises(ValueError, match=r"shape \(2, 1\), expected \(3, 1\)"):
        worker.statistics(X, Y, [np.zeros((2, 1))] + values[1:])
    with pytest.raises(ValueError, match="expected 4 shared values"):
        worker.statistics(X, Y, values[:3])
    with pytest.raises(ValueError, match="Adam moments have shapes"):
        worker.train(X, Y, values, AdamState(adam.iterations, (np.zeros(3),)))
    with pytest.raises(TypeError, match="expected an AdamState"):
        worker.train(X, Y, values, {"step": adam.iterations, "moments": adam.moments})


def test_whitened_prediction_statistics_match_and_have_a_public_bound():
    dataset = _dataset()
    Z = np.linspace(-2.5, 2.5, 6)[:, None]
    kernel = gpflow.kernels.SquaredExponential(variance=1.7)
    results = {
        whiten: run(
            FSGP(kernel, Z, 0.1, rounds=1, local_steps=2, learning_rate=0.05, whiten=whiten),
            dataset,
            runtime=LocalRuntime(options=RunOptions(keep_payloads=True)),
            protection=PLAIN,
        )
        for whiten in (False, True)
    }
    Xs = np.linspace(-3, 3, 9)[:, None]
    for a, b in zip(
        results[False].model.predict_f(Xs, full_cov=True), results[True].model.predict_f(Xs, full_cov=True)
    ):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-7, atol=1e-9)
    variance = float(results[True].model.kernel.variance.numpy())
    messages = [m for m in results[True].ledger.messages if m.phase == "predict" and m.sender != "server"]
    assert len(messages) == 3
    for m in messages:  # tr(A_k A_kᵀ) = Σ_n q(x_n, x_n) ≤ Σ_n k(x_n, x_n) = N_k σ_f²: a clip norm without the data
        trace = float(np.trace(m["kuf_kfu"]))
        assert 0.5 * m["num_data"] * variance < trace <= m["num_data"] * variance
        assert np.linalg.norm(m["kuf_kfu"]) <= trace
    with pytest.raises(TypeError, match="whiten must be True, False or None"):
        FSGP(kernel, Z, 0.1, rounds=1, local_steps=2, learning_rate=0.05, whiten="yes")
