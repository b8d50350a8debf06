"""The federated core: messages, ledger, sampling, reduction, shared state, LocalRuntime and run()."""

import gpflow
import numpy as np
import pytest

from gpflow_fed.federated import (
    ClientUpdateError,
    CommunicationLedger,
    LocalRuntime,
    Message,
    Protection,
    RunOptions,
    SharedState,
    num_sampled_clients,
    reduce_messages,
    run,
    sample_clients,
)

from tests.federated.helpers import FederatedMean

#: plain sums: these tests check exact values and plain messages (the secure default's fixed point differs by 2⁻³²
#: per client and entry, and a sampled FederatedMean repeats its broadcast, which a masking client answers once)
PLAIN = Protection(secure_aggregation=False)


def test_message_is_frozen_and_copies_arrays():
    source = np.arange(3.0)
    message = Message(sender="client_0", round=0, phase="train", arrays={"a": source}, weight=2)
    source[0] = 99.0
    assert message["a"][0] == 0.0
    with pytest.raises(ValueError):
        message["a"][1] = 5.0
    with pytest.raises(TypeError):
        message.arrays["b"] = np.zeros(1)  # type: ignore[index]
    assert message.nbytes == 3 * 8 + 8


@pytest.mark.parametrize("weight", [-1.0, float("nan"), float("inf")])
def test_message_rejects_bad_weight(weight):
    with pytest.raises(ValueError, match="weight"):
        Message(sender="c", round=0, phase="p", arrays={}, weight=weight)


def test_ledger_records_and_filters():
    ledger = CommunicationLedger(keep_payloads=True)
    ledger.record(Message("server", 0, "train", {"w": np.zeros((2, 3))}), "client_0", "train")
    ledger.record(
        Message("client_0", 0, "train", {"w": np.zeros((2, 3)), "b": np.zeros(4, np.float32)}), "server", "final"
    )
    down, up = ledger.entries
    assert down.direction == "down" and up.direction == "up"
    assert up.names == ("w", "b") and up.shapes == ((2, 3), (4,)) and up.dtypes == ("float64", "float32")
    assert ledger.total_bytes(direction="up") == 48 + 16 + 8
    assert ledger.total_bytes() == (48 + 8) + (48 + 16 + 8)
    assert ledger.total_bytes(purpose="train") == 56
    assert len(ledger.messages) == 2
    with pytest.raises(ValueError):
        ledger.select(direction="sideways")
    with pytest.raises(ValueError):
        ledger.total_bytes(direction="sideways")


def test_ledger_running_totals_match_the_entries_after_extend():
    ledger = CommunicationLedger()
    ledger.record(Message("client_1", 3, "train", {"a": np.zeros(5)}), "server", "train")
    resumed = CommunicationLedger()
    resumed.extend(ledger.entries)
    resumed.record(Message("server", 4, "train", {"a": np.zeros(2)}), "client_1", "train")
    for direction in ("up", "down", None):
        expected = sum(e.nbytes for e in resumed.select(direction=direction))
        assert resumed.total_bytes(direction=direction) == expected
    assert resumed.total_bytes(direction="up", round=4) == 0 and resumed.total_bytes(round=3) == 40 + 8


@pytest.mark.parametrize("K, rho, expected", [(10, 0.3, 3), (10, 0.25, 3), (5, 0.01, 1), (7, 1.0, 7), (3, 0.5, 2)])
def test_number_of_sampled_clients(K, rho, expected):
    assert num_sampled_clients(K, rho) == expected


@pytest.mark.parametrize("rho", [0.0, -0.5, 1.5, float("nan")])
def test_client_fraction_outside_unit_interval_is_rejected(rho):
    with pytest.raises(ValueError, match="client_fraction"):
        num_sampled_clients(4, rho)


def test_sample_clients_is_seeded_and_distinct():
    ids = [f"client_{k}" for k in range(10)]
    a = sample_clients(ids, 0.4, np.random.default_rng(3))
    b = sample_clients(ids, 0.4, np.random.default_rng(3))
    assert a == b and len(set(a)) == 4 and a == sorted(a, key=ids.index)


def _messages():
    return [
        Message("client_0", 1, "p", {"a": np.array([1.0, 2.0])}, weight=1, metrics={"loss": 1.0}),
        Message("client_1", 1, "p", {"a": np.array([3.0, 6.0])}, weight=3, metrics={"loss": 2.0}),
    ]


def test_reduce_sum_mean_collect():
    s = reduce_messages(_messages(), "sum")
    np.testing.assert_allclose(s["a"], [4.0, 8.0])
    assert s.total_weight == 4 and s.senders == ("client_0", "client_1") and s.messages is None
    assert s.metrics["loss"] == pytest.approx((1 * 1 + 3 * 2) / 4)
    m = reduce_messages(_messages(), "mean")
    np.testing.assert_allclose(m["a"], [(1 + 9) / 4, (2 + 18) / 4])
    c = reduce_messages(_messages(), "collect")
    assert c.arrays == {} and len(c.messages) == 2


def test_reduce_rejects_malformed_payloads():
    good = _messages()[0]
    wrong_shape = Message("client_9", 1, "p", {"a": np.zeros(3)})
    with pytest.raises(ValueError, match="client_9"):
        reduce_messages([good, wrong_shape], "sum")
    wrong_names = Message("client_8", 1, "p", {"b": np.zeros(2)})
    with pytest.raises(ValueError, match="client_8"):
        reduce_messages([good, wrong_names], "sum")
    with pytest.raises(ValueError, match="aggregation"):
        reduce_messages([good], "median")
    with pytest.raises(ValueError, match="empty"):
        reduce_messages([], "sum")


def _sgpr(seed=0):
    rng = np.random.default_rng(seed)
    X, Y = rng.normal(size=(20, 2)), rng.normal(size=(20, 1))
    return gpflow.models.SGPR(
        (X, Y), gpflow.kernels.SquaredExponential(lengthscales=[1.0, 2.0]), X[:4].copy(), noise_variance=0.3
    )


@pytest.mark.parametrize("space", ["constrained", "unconstrained"])
def test_shared_state_round_trip(space):
    a, b = _sgpr(0), _sgpr(1)
    shared = SharedState.from_module(a, space=space)
    assert set(shared.keys) == {"kernel.variance", "kernel.lengthscales", "likelihood.variance", "inducing_variable.Z"}
    b.kernel.lengthscales.assign([3.0, 4.0])
    shared.assign(a, shared.read(b))
    np.testing.assert_allclose(a.kernel.lengthscales.numpy(), [3.0, 4.0])
    np.testing.assert_allclose(a.inducing_variable.Z.numpy(), b.inducing_variable.Z.numpy())
    np.testing.assert_allclose(
        a.elbo().numpy(),
        gpflow.models.SGPR(a.data, b.kernel, b.inducing_variable.Z, noise_variance=b.likelihood.variance)
        .elbo()
        .numpy(),
    )
    values = shared.read(b)
    if space == "unconstrained":
        np.testing.assert_allclose(values["likelihood.variance"], b.likelihood.variance.unconstrained_variable.numpy())
    else:
        np.testing.assert_allclose(values["likelihood.variance"], 0.3)


def test_shared_state_assign_is_all_or_nothing():
    model = _sgpr()
    shared = SharedState.from_module(model, space="constrained")
    values = shared.read(model)
    before = shared.read(model)
    values["kernel.lengthscales"] = np.array([5.0, 5.0])
    values["likelihood.variance"] = np.array(-1.0)  # outside the support: nothing may be assigned
    with pytest.raises(ValueError, match="likelihood.variance"):
        shared.assign(model, values)
    for k, v in shared.read(model).items():
        np.testing.assert_array_equal(v, before[k])
    with pytest.raises(KeyError, match="missing"):
        shared.assign(model, {"kernel.variance": np.array(1.0)})
    bad_shape = dict(before, **{"inducing_variable.Z": np.zeros((3, 2))})
    with pytest.raises(ValueError, match="shape"):
        shared.assign(model, bad_shape)


def test_shared_state_keras_layer_weights_under_one_key():
    from gpflow.keras import tf_keras

    module = gpflow.Module()
    module.net = tf_keras.Sequential([tf_keras.layers.Dense(3, dtype=gpflow.default_float())])
    module.net.build((None, 2))
    shared = SharedState({"net": "net"})
    values = shared.read(module)
    assert sorted(values) == ["net/0", "net/1"] and values["net/0"].shape == (2, 3)
    shared.assign(module, {"net/0": np.ones((2, 3)), "net/1": np.zeros(3)})
    np.testing.assert_array_equal(module.net.weights[0].numpy(), np.ones((2, 3)))


def test_run_sums_reach_the_exact_answer_and_ledger_counts(dataset):
    result = run(
        FederatedMean(rounds=2),
        dataset,
        runtime=LocalRuntime(options=RunOptions(keep_payloads=True)),
        seed=0,
        protection=PLAIN,
    )
    pooled = dataset.pooled()[1].mean()
    assert result.state["mean"] == pytest.approx(pooled, rel=1e-12)
    assert [h["round"] for h in result.history] == [0, 1] and all(h["clients"] == 4 for h in result.history)
    # every uplink message: sum_y (8 B) + n (8 B) + weight (8 B) + 1 metric (8 B)
    assert {e.nbytes for e in result.ledger.select(direction="up")} == {32}
    assert result.history[0]["bytes_up"] == 4 * 32 and result.history[0]["bytes_down"] == 4 * (8 + 8)
    expected_local = sum(n * Y.mean() for n, (_, Y) in zip(dataset.client_sizes, dataset.clients)) / dataset.num_data
    assert result.history[0]["local_mean"] == pytest.approx(expected_local)
    assert set(result.metrics) == {"test_rmse", "test_mae", "test_nlpd"}
    assert result.model.predict_y(dataset.test[0])[0].numpy()[0, 0] == pytest.approx(pooled)


def test_client_sampling_is_deterministic_per_seed(dataset):
    a = run(FederatedMean(rounds=5, client_fraction=0.5), dataset, seed=7, protection=PLAIN)
    b = run(FederatedMean(rounds=5, client_fraction=0.5), dataset, seed=7, protection=PLAIN)
    c = run(FederatedMean(rounds=5, client_fraction=0.5), dataset, seed=8, protection=PLAIN)
    assert a.state["seen"] == b.state["seen"]
    assert all(len(s) == 2 for s in a.state["seen"])
    assert a.state["seen"] != c.state["seen"]


def test_failing_client_is_named_and_state_is_unchanged(dataset):
    class FailsInRoundOne(FederatedMean):
        server_updates = 0

        def client_update(self, client, broadcast):
            if client.id == "client_2" and broadcast.round == 1:
                raise RuntimeError("disk on fire")
            return super().client_update(client, broadcast)

        def server_update(self, state, aggregate):
            self.server_updates += 1
            return super().server_update(state, aggregate)

    snapshots, bound = [], []

    def monitor(round, *, history, state, algorithm):
        snapshots.append((dict(state), state))
        bound.append(algorithm)  # the run's own copy

    algorithm = FailsInRoundOne(rounds=3)
    with pytest.raises(ClientUpdateError, match="client_2.*round 1.*disk on fire") as info:
        run(algorithm, dataset, monitor=monitor, protection=PLAIN)
    assert info.value.client_id == "client_2" and isinstance(info.value.cause, RuntimeError)
    # round 0 completed; round 1 reached no server update and left round 0's state as it was
    assert bound[0].server_updates == 1 and len(snapshots) == 1
    assert algorithm.server_updates == 0  # the user's object is configuration: untouched
    copy, state = snapshots[0]
    assert state == copy and state["mean"] == pytest.approx(dataset.pooled()[1].mean(), rel=1e-12)


def test_evaluation_traffic_is_tagged(dataset):
    class WithFinal(FederatedMean):
        def final_phases(self):
            return ("stats",)

    result = run(WithFinal(rounds=3), dataset, runtime=LocalRuntime(options=RunOptions(eval_every=1)), protection=PLAIN)
    assert {e.purpose for e in result.ledger} == {"train", "evaluate", "final"}
    # rounds 0 and 1 are evaluated; round 2's evaluation is the final exchange, asked once
    assert len(result.ledger.select(purpose="evaluate", direction="up")) == 2 * 4
    assert len(result.ledger.select(purpose="final", direction="up")) == 4
    assert all("test_rmse" in h for h in result.history)


def test_monitor_is_called_every_round(dataset):
    calls = []
    run(FederatedMean(rounds=3), dataset, monitor=lambda step, **kw: calls.append((step, len(kw["history"]))))
    assert calls == [(0, 1), (1, 2), (2, 3)]


def test_run_rejects_wrong_types(dataset):
    with pytest.raises(TypeError, match="Algorithm"):
        run(object(), dataset)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="FederatedDataset"):
        run(FederatedMean(rounds=1), [(np.zeros((2, 1)), np.zeros((2, 1)))])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seed"):
        run(FederatedMean(rounds=1), dataset, seed=-1)
    with pytest.raises(ValueError, match="rounds"):
        FederatedMean(rounds=-1)
    with pytest.raises(ValueError, match="eval_every"):
        LocalRuntime(options=RunOptions(eval_every=-2))
