"""FGP: FedAvg semantics against hand-trained GPRs, the rBCM committee, the ledger, protections, resume, bad input."""

import logging
import warnings

import gpflow
import numpy as np
import pytest
import tensorflow as tf
from gpflow.keras import tf_keras

from gpflow_fed.baselines import ExpertCommittee, combine_experts
from gpflow_fed.data import FederatedDataset
from gpflow_fed.federated import RunOptions, Protection, DifferentialPrivacy, DistributeRuntime, LocalRuntime, run
from gpflow_fed.federated.algorithms import FGP, FGPState
from gpflow_fed.federated.engine.checkpoint import latest_checkpoint

from tests.federated.helpers import Stop, stop_after

#: the plain, readable messages these tests check (the secure default masks them)
PLAIN = Protection(secure_aggregation=False)

PARAMS = ("kernel.lengthscales", "kernel.variance", "likelihood.variance")  # wire keys: attribute paths


def _dataset(sizes=(20, 30), D=1, seed=0):
    rng = np.random.default_rng(seed)
    clients = []
    for n in sizes:
        X = rng.uniform(-3, 3, (n, D))
        clients.append((X, np.sin(X[:, :1]) + 0.1 * rng.normal(size=(n, 1))))
    X_test = rng.uniform(-3, 3, (10, D))
    return FederatedDataset(clients, test=(X_test, np.sin(X_test[:, :1])))


def _kernel(D=1):
    return gpflow.kernels.SquaredExponential(lengthscales=[1.0] * D)


def _unconstrained(model, path):
    return gpflow.utilities.parameter_dict(model)["." + path].unconstrained_variable.numpy()


def _adam(model, steps, lr):
    optimizer = tf_keras.optimizers.Adam(learning_rate=lr)
    n = model.data[0].shape[0]
    for _ in range(steps):
        optimizer.minimize(lambda: model.training_loss() / n, model.trainable_variables)


def test_one_round_is_fedavg_of_exact_gp_likelihoods_and_predicts_by_rbcm():
    """One round with every client: (θ, σ²) = N_k-weighted mean of locally trained unconstrained values; the
    model is the rBCM of every client's GPR at those values."""
    dataset = _dataset()
    result = run(FGP(_kernel(), 0.1, rounds=1, local_steps=3, learning_rate=0.1), dataset)
    assert isinstance(result.model, ExpertCommittee) and result.model.rule == "rbcm"
    assert result.state.experts == ("client_0", "client_1")
    sizes = np.asarray(dataset.client_sizes, float)
    locals_ = []
    for X, Y in dataset.clients:
        model = gpflow.models.GPR((X, Y), _kernel(), noise_variance=0.1)
        _adam(model, 3, 0.1)
        locals_.append(model)
    for path in PARAMS:
        expected = np.dot(sizes / sizes.sum(), [_unconstrained(m, path) for m in locals_])
        np.testing.assert_allclose(result.state.params[path], expected, rtol=1e-9)
        for expert in result.model.experts:
            np.testing.assert_array_equal(_unconstrained(expert, path), result.state.params[path])
    oracles = [gpflow.models.GPR((X, Y), _kernel(), noise_variance=0.1) for X, Y in dataset.clients]
    for oracle in oracles:
        for path in PARAMS:
            gpflow.utilities.parameter_dict(oracle)["." + path].unconstrained_variable.assign(result.state.params[path])
    Xs = np.linspace(-4, 4, 9)[:, None]
    means, variances = zip(*(o.predict_f(Xs) for o in oracles))
    prior = oracles[0].kernel(Xs, full_cov=False)[:, None]
    expected = combine_experts(tf.stack(means), tf.stack(variances), "rbcm", prior)
    for ours, ref in zip(result.model.predict_f(Xs), expected):
        np.testing.assert_allclose(ours.numpy(), ref.numpy(), rtol=1e-12)
    assert result.metrics["test_rmse"] < 0.3


def test_ledger_holds_only_hyperparameters_of_sizes_independent_of_n():
    small, large = _dataset((9, 14), D=2, seed=0), _dataset((40, 73), D=2, seed=1)
    runs = [
        run(
            FGP(_kernel(2), 0.1, rounds=2, local_steps=2),
            d,
            runtime=LocalRuntime(options=RunOptions(keep_payloads=True)),
            protection=PLAIN,
        )
        for d in (small, large)
    ]
    layouts = [
        [(e.round, e.phase, e.purpose, e.sender, e.receiver, e.names, e.shapes, e.nbytes) for e in r.ledger]
        for r in runs
    ]
    assert layouts[0] == layouts[1]
    result, K, numbers = runs[0], 2, 2 + 1 + 1  # two lengthscales, the kernel variance, σ²
    for entry in result.ledger.select(phase="train"):
        assert entry.names == PARAMS and entry.shapes == ((2,), (), ()) and entry.nbytes == 8 * numbers + 8
    assert all(e.names == () and e.nbytes == 8 for e in result.ledger.select(direction="up", phase="experts"))
    assert {e.purpose for e in result.ledger.select(phase="experts")} == {"final"}
    assert result.ledger.total_bytes() == 2 * K * 2 * (8 * numbers + 8) + K * (8 * numbers + 8) + K * 8
    private = {v for X, Y in small.clients for v in np.concatenate([X, Y], axis=1).ravel().tolist()}
    for message in result.ledger.messages:
        assert message.metrics == {}
        for array in message.arrays.values():
            assert not private.intersection(np.asarray(array, float).ravel().tolist())


def test_sampled_rounds_still_give_every_client_an_expert():
    """ρ = 0.3 of 4 clients: 2 per round, but the final phase sets all 4 experts; R = 0 is the initial θ."""
    dataset = _dataset((10, 12, 14, 16))
    result = run(FGP(_kernel(), 0.1, rounds=2, local_steps=2, client_fraction=0.3), dataset, seed=3)
    assert [h["clients"] for h in result.history] == [2, 2]
    assert len(result.model.experts) == 4
    initial = run(FGP(_kernel(), 0.2, rounds=0, rule="poe"), dataset)
    assert initial.history == [] and len(initial.model.experts) == 4
    for expert, (X, Y) in zip(initial.model.experts, dataset.clients):
        oracle = gpflow.models.GPR((X, Y), _kernel(), noise_variance=0.2)
        np.testing.assert_array_equal(expert.predict_f(X)[0].numpy(), oracle.predict_f(X)[0].numpy())


def test_six_clients_trace_once_and_warn_nothing():
    rng = np.random.default_rng(1)
    clients = []
    for k in range(6):
        X = rng.uniform(-3, 3, (8 + k, 1))  # different N_k: the loop must not retrace per shape
        clients.append((X, np.sin(X) + 0.1 * rng.normal(size=X.shape)))
    messages = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    tf.get_logger().addHandler(handler)
    try:
        run(FGP(_kernel(), 0.1, rounds=2, local_steps=2), FederatedDataset(clients))
    finally:
        tf.get_logger().removeHandler(handler)
    assert not [m for m in messages if "retracing" in m]


def test_secure_aggregation_masks_the_hyperparameters_and_keeps_the_result():
    dataset = _dataset((10, 12, 14))
    plain = run(FGP(_kernel(), 0.1, rounds=2, local_steps=2), dataset, protection=Protection(secure_aggregation=False))
    secure = run(FGP(_kernel(), 0.1, rounds=2, local_steps=2), dataset, options=RunOptions(keep_payloads=True))
    for message in secure.ledger.messages:  # secure aggregation is the default: only protocol messages leave
        if message.sender != "server":
            assert message.weight == 0.0 and "/secagg/" in message.phase
    for path in PARAMS:  # fixed-point encoding with each party's Gaussian of 4 codes (5e-10 in the mean of 3)
        np.testing.assert_allclose(secure.state.params[path], plain.state.params[path], rtol=0, atol=1e-8)
    Xs = dataset.test[0]
    np.testing.assert_allclose(secure.model.predict_y(Xs)[0].numpy(), plain.model.predict_y(Xs)[0].numpy(), rtol=1e-7)


def test_differential_privacy_on_the_training_rounds_only():
    """As the docstring advises: DP on 'train' accounts two releases; the empty 'experts' phase is left alone."""
    dataset = _dataset((10, 12, 14))
    dp = DifferentialPrivacy(0.5, 10.0, phases=("train",), insecure_noise_seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no DPUtilityWarning: the noised hyperparameters carry signal
        result = run(
            FGP(_kernel(), 0.1, rounds=2, local_steps=2), dataset, protection=Protection(differential_privacy=dp)
        )
    assert np.isfinite(result.privacy["epsilon"]) and [np.isfinite(h["epsilon"]) for h in result.history] == [True] * 2
    assert result.history[0]["epsilon"] < result.history[1]["epsilon"] == result.privacy["epsilon"]
    assert len(result.model.experts) == 3


def test_resume_equals_uninterrupted_run(tmp_path):
    """Sampling (ρ = 0.5) and each client's own Adam moments survive the checkpoint."""
    dataset = _dataset((10, 12, 14, 16))
    make = lambda: FGP(_kernel(), 0.1, rounds=4, local_steps=2, client_fraction=0.5)  # noqa: E731
    full = run(make(), dataset, seed=5, protection=PLAIN)  # a resumed secure run redoes its key set-up
    with pytest.raises(Stop):
        run(
            make(),
            dataset,
            runtime=LocalRuntime(options=RunOptions(checkpoint_dir=tmp_path)),
            monitor=stop_after(1),
            seed=5,
            protection=PLAIN,
        )
    assert latest_checkpoint(str(tmp_path)).endswith("round-1")
    resumed = run(
        make(),
        dataset,
        runtime=LocalRuntime(options=RunOptions(checkpoint_dir=tmp_path, resume=True)),
        seed=5,
        protection=PLAIN,
    )
    for path in PARAMS:
        np.testing.assert_array_equal(resumed.state.params[path], full.state.params[path])
    assert [h["clients"] for h in resumed.history] == [h["clients"] for h in full.history]
    assert resumed.ledger.entries == full.ledger.entries
    Xs = dataset.test[0]
    np.testing.assert_array_equal(resumed.model.predict_f(Xs)[0].numpy(), full.model.predict_f(Xs)[0].numpy())


@pytest.mark.usefixtures("nearest_rounding")  # runs compared to the last digits: rounding to nearest
def test_distribute_runtime_reproduces_local_runtime():
    dataset = _dataset((10, 12, 14))
    local = run(FGP(_kernel(), 0.1, rounds=2, local_steps=2), dataset)
    runtime = DistributeRuntime(tf.distribute.OneDeviceStrategy("/cpu:0"))
    distributed = run(FGP(_kernel(), 0.1, rounds=2, local_steps=2), dataset, runtime=runtime)
    for path in PARAMS:
        np.testing.assert_allclose(distributed.state.params[path], local.state.params[path], rtol=1e-12)
    assert distributed.ledger.total_bytes() == local.ledger.total_bytes()


def test_result_needs_the_experts_in_this_process():
    algorithm = FGP(_kernel())
    with pytest.raises(ValueError, match="final 'experts' phase"):
        algorithm.result(FGPState(params={}))
    with pytest.raises(ValueError, match="outside this process"):
        algorithm.result(FGPState(params={}, experts=("client_0",)))


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(rounds=-1), ValueError, "rounds"),
        (dict(local_steps=0), ValueError, "local_steps"),
        (dict(local_steps=True), ValueError, "local_steps"),
        (dict(learning_rate=-1.0), ValueError, "learning_rate"),
        (dict(learning_rate="0.1"), TypeError, "learning_rate"),
        (dict(client_fraction=2.0), ValueError, "client_fraction"),
        (dict(rule="avg"), ValueError, "rule must be one of"),
        (dict(noise_variance=0.0), ValueError, "noise_variance"),
        (dict(noise_variance=np.inf), ValueError, "noise_variance"),
        (dict(kernel="rbf"), TypeError, "kernel"),
    ],
)
def test_constructor_rejects_bad_arguments(kwargs, error, message):
    args = dict(kernel=_kernel(), noise_variance=0.1, rounds=1, local_steps=1, learning_rate=0.1)
    args.update(kwargs)
    with pytest.raises(error, match=message):
        FGP(**args)


def test_lengthscales_of_another_dimension_are_refused():
    with pytest.raises(ValueError, match="3 ARD lengthscales but the data have D = 2"):
        run(FGP(_kernel(3), rounds=1), _dataset(D=2))
