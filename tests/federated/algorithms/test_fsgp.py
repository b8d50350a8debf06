"""FSGP: exactness against pooled SGPR, FedAvg semantics, sampling, tracing, faults and bad input."""

import gpflow
import numpy as np
import pytest
from gpflow.keras import tf_keras

from gpflow_fed.data import FederatedDataset
from gpflow_fed.federated import RunOptions, Protection, ClientUpdateError, LocalRuntime, run
from gpflow_fed.federated.algorithms import FSGP, initial_inducing_inputs


def _dataset(sizes=(20, 35, 45), D=2, P=1, seed=0, test=True):
    rng = np.random.default_rng(seed)
    N = sum(sizes)
    X = rng.uniform(-3, 3, (N, D))
    Y = np.sin(X[:, :1]) * np.cos(X[:, -1:]) + 0.1 * rng.normal(size=(N, P))
    cuts = np.cumsum((0,) + tuple(sizes))
    clients = [(X[a:b], Y[a:b]) for a, b in zip(cuts, cuts[1:])]
    return FederatedDataset(clients, test=(X[:15], Y[:15]) if test else None)


def _kernel(D=2):
    return gpflow.kernels.SquaredExponential(variance=1.0, lengthscales=[1.0] * D)


def _Z(M=8, D=2, seed=1):
    return np.random.default_rng(seed).uniform(-3, 3, (M, D))


def _pooled_sgpr(dataset, kernel, Z, noise):
    return gpflow.models.SGPR(dataset.pooled(), gpflow.utilities.deepcopy(kernel), Z.copy(), noise_variance=noise)


@pytest.mark.usefixtures("nearest_rounding")  # runs compared to the last digits: rounding to nearest
@pytest.mark.parametrize("P", [1, 2])
def test_rounds_zero_equals_pooled_sgpr(P):
    dataset = _dataset(P=P)
    kernel, Z = _kernel(), _Z()
    result = run(FSGP(kernel, Z, 0.1, rounds=0, local_steps=3, learning_rate=0.1), dataset)
    oracle = _pooled_sgpr(dataset, kernel, Z, 0.1)
    Xs = np.random.default_rng(7).uniform(-4, 4, (11, 2))
    for full_cov in (False, True):
        for ours, ref in zip(result.model.predict_f(Xs, full_cov=full_cov), oracle.predict_f(Xs, full_cov=full_cov)):
            np.testing.assert_allclose(ours.numpy(), ref.numpy(), rtol=1e-8, atol=0)
    for ours, ref in zip(result.model.predict_y(Xs), oracle.predict_y(Xs)):
        np.testing.assert_allclose(ours.numpy(), ref.numpy(), rtol=1e-8, atol=0)
    np.testing.assert_allclose(result.model.elbo().numpy(), oracle.elbo().numpy(), rtol=1e-10)
    assert result.state.bound == pytest.approx(oracle.elbo().numpy() / dataset.num_data, rel=1e-10)


@pytest.mark.parametrize("P", [1, 2])
def test_exact_mode_equals_pooled_adam(P):
    dataset = _dataset(P=P)
    kernel, Z, rounds, lr = _kernel(), _Z(), 4, 0.05
    algorithm = FSGP(kernel, Z, 0.2, rounds=rounds, local_steps=1, learning_rate=lr, mode="exact")
    result = run(algorithm, dataset)
    assert all(c == {"statistics": 1, "gradient": 1} for c in algorithm.tracing_counts().values())
    oracle = _pooled_sgpr(dataset, kernel, Z, 0.2)
    optimizer = tf_keras.optimizers.Adam(learning_rate=lr)
    losses = []
    for _ in range(rounds):
        losses.append(-oracle.training_loss().numpy() / dataset.num_data)
        optimizer.minimize(lambda: oracle.training_loss() / dataset.num_data, oracle.trainable_variables)
    ours = gpflow.utilities.read_values(result.model)
    ref = gpflow.utilities.read_values(oracle)
    for key in (".kernel.variance", ".kernel.lengthscales", ".likelihood.variance", ".inducing_variable.Z"):
        np.testing.assert_allclose(ours[key], ref[key], rtol=1e-6, atol=1e-9)
        assert not np.allclose(ref[key], gpflow.utilities.read_values(_pooled_sgpr(dataset, kernel, Z, 0.2))[key])
    np.testing.assert_allclose([h["bound"] for h in result.history], losses, rtol=1e-9)
    Xs = dataset.test[0]
    np.testing.assert_allclose(result.model.predict_f(Xs)[0].numpy(), oracle.predict_f(Xs)[0].numpy(), rtol=1e-6)


def test_fedavg_averages_unconstrained_parameters_weighted_by_size():
    """One round, every client: w = Σ N_k w_k / N in GPflow's unconstrained space (as documented)."""
    base = _dataset(sizes=(15, 40))
    # heterogeneous clients (one with 4x the output scale), so local parameters diverge visibly
    dataset = FederatedDataset([(X, Y * s) for (X, Y), s in zip(base.clients, (1.0, 4.0))])
    kernel, Z, steps, lr = _kernel(), _Z(M=6), 3, 0.3
    algorithm = FSGP(kernel, Z, 0.1, rounds=1, local_steps=steps, learning_rate=lr)
    result = run(algorithm, dataset)
    sizes = np.asarray(dataset.client_sizes, float)
    locals_, gaps = [], []
    for X, Y in dataset.clients:
        model = gpflow.models.SGPR((X, Y), gpflow.utilities.deepcopy(kernel), Z.copy(), noise_variance=0.1)
        optimizer = tf_keras.optimizers.Adam(learning_rate=lr)
        for _ in range(steps):
            optimizer.minimize(lambda: model.training_loss() / X.shape[0], model.trainable_variables)
        locals_.append(model)
    for path, key in (("kernel.lengthscales", ".kernel.lengthscales"), ("likelihood.variance", ".likelihood.variance")):
        unconstrained = [
            gpflow.utilities.deepcopy(m).__getattribute__(path.split(".")[0]).__getattribute__(path.split(".")[1])
            for m in locals_
        ]
        expected_u = sum(w * p.unconstrained_variable.numpy() for w, p in zip(sizes / sizes.sum(), unconstrained))
        np.testing.assert_allclose(result.state.params[path], expected_u, rtol=1e-9)
        constrained_mean = sum(w * p.numpy() for w, p in zip(sizes / sizes.sum(), unconstrained))
        ours = gpflow.utilities.read_values(result.model)[key]
        gaps.append(np.max(np.abs(ours - constrained_mean)))
    assert max(gaps) > 1e-3  # constrained averaging would give visibly different values
    Zs = sum(w * m.inducing_variable.Z.numpy() for w, m in zip(sizes / sizes.sum(), locals_))
    np.testing.assert_allclose(result.model.inducing_variable.Z.numpy(), Zs, rtol=1e-9)
    expected_bound = sum(w * m.elbo().numpy() / n for w, m, n in zip(sizes / sizes.sum(), locals_, sizes))
    assert result.history[0]["local_bound"] == pytest.approx(expected_bound, rel=1e-9)


def test_client_sampling_no_retracing_and_progress():
    dataset = _dataset(sizes=(10, 12, 14, 16))
    algorithm = FSGP(_kernel(), _Z(M=5), 0.1, rounds=5, local_steps=3, learning_rate=0.1, client_fraction=0.3)
    options, plain = RunOptions(keep_payloads=True), Protection(secure_aggregation=False)
    result = run(algorithm, dataset, options=options, protection=plain, seed=3)
    assert [h["clients"] for h in result.history] == [2] * 5  # max(ceil(4 * 0.3), 1)
    for r in range(5):
        assert len(result.ledger.select(direction="up", round=r, phase="train")) == 2
    assert len(result.ledger.select(direction="up", phase="predict")) == 4
    initial = _pooled_sgpr(dataset, _kernel(), _Z(M=5), 0.1).elbo().numpy() / dataset.num_data
    assert result.state.bound > initial + 0.05
    counts = result.algorithm.tracing_counts()
    assert set(counts) == {f"client_{k}" for k in range(4)}
    assert all(set(c) == {"train"} and c["train"] <= 1 for c in counts.values())  # traced once, never again
    assert sum(c["train"] for c in counts.values()) >= 2


def test_initial_inducing_inputs_is_a_subset_and_checks_m():
    X = np.random.default_rng(0).normal(size=(20, 3))
    Z = initial_inducing_inputs(X, 5, seed=2)
    assert Z.shape == (5, 3) and all(any(np.array_equal(z, x) for x in X) for z in Z)
    assert len({tuple(z) for z in Z}) == 5
    with pytest.raises(ValueError, match="exceeds the number of inputs"):
        initial_inducing_inputs(X, 21)
    with pytest.raises(ValueError, match="positive integer"):
        initial_inducing_inputs(X, 0)


class _FailingFSGP(FSGP):
    """Fails on one client in one round and phase, after other clients already answered."""

    def __init__(self, *args, fail=("client_1", 1, "train"), **kwargs):
        super().__init__(*args, **kwargs)
        self.fail = fail

    def client_update(self, client, broadcast):
        if (client.id, broadcast.round, broadcast.phase) == self.fail:
            raise FloatingPointError("injected failure")
        return super().client_update(client, broadcast)


@pytest.mark.parametrize("mode, phase", [("fedavg", "train"), ("exact", "gradient")])
def test_failing_client_is_named_and_global_state_unchanged(mode, phase):
    dataset = _dataset()
    snapshots = []

    bound = []

    def monitor(round, *, history, state, algorithm):
        snapshots.append({k: np.array(v) for k, v in state.params.items()})
        snapshots.append(state)
        bound.append(algorithm)  # the run's own copy

    algorithm = _FailingFSGP(
        _kernel(), _Z(), 0.1, rounds=3, local_steps=2, learning_rate=0.1, mode=mode, fail=("client_1", 1, phase)
    )
    with pytest.raises(ClientUpdateError, match="client_1") as info:
        run(algorithm, dataset, monitor=monitor)
    assert info.value.client_id == "client_1" and info.value.round == 1 and info.value.phase == phase
    copy, state = snapshots[0], snapshots[1]
    assert len(snapshots) == 2  # only round 0 completed
    for key, value in copy.items():
        np.testing.assert_array_equal(state.params[key], value)
    if mode == "exact":  # the server's model and Adam took no step for the failed round
        assert int(state.server_adam[0]) == 1
        server_values = bound[0]._shared.read(bound[0]._server_model)
        for key, value in copy.items():
            np.testing.assert_array_equal(server_values[key], value)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(learning_rate=-0.1), ValueError, "learning_rate must be positive"),
        (dict(learning_rate=0.0), ValueError, "learning_rate must be positive"),
        (dict(learning_rate="fast"), TypeError, "learning_rate must be a number"),
        (dict(rounds=-1), ValueError, "rounds must be a non-negative integer"),
        (dict(local_steps=0), ValueError, "local_steps must be a positive integer"),
        (dict(client_fraction=0.0), ValueError, "client_fraction must lie in"),
        (dict(client_fraction=1.5), ValueError, "client_fraction must lie in"),
        (dict(mode="async"), ValueError, "mode must be one of"),
        (dict(mode="exact", client_fraction=0.5), ValueError, "use client_fraction=1.0"),
        (dict(noise_variance=-1.0), ValueError, "noise_variance must be positive"),
        (dict(noise_variance=1e-6), ValueError, "must exceed GPflow's Gaussian-likelihood floor 1e-06"),
        (dict(client_fraction=True), TypeError, "client_fraction must be a number, not a bool"),
        (dict(kernel="rbf"), TypeError, "gpflow.kernels.Kernel"),
        (dict(inducing_variable=np.zeros(4)), ValueError, r"\[M, D\]"),
        (dict(inducing_variable=np.full((3, 2), np.nan)), ValueError, "NaN or inf"),
    ],
)
def test_constructor_rejects_bad_arguments(kwargs, error, message):
    args = dict(
        kernel=_kernel(), inducing_variable=_Z(), noise_variance=0.1, rounds=2, local_steps=2, learning_rate=0.1
    )
    args.update(kwargs)
    with pytest.raises(error, match=message):
        FSGP(**args)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(inducing_variable=np.zeros((101, 2))), "exceed the N = 100"),
        (dict(inducing_variable=np.zeros((5, 3))), "dimension 3 but the data have D = 2"),
        (dict(kernel=gpflow.kernels.SquaredExponential(lengthscales=[1.0, 1.0, 1.0])), "3 ARD lengthscales"),
    ],
)
def test_validation_before_any_training(kwargs, message):
    args = dict(
        kernel=_kernel(), inducing_variable=_Z(), noise_variance=0.1, rounds=2, local_steps=2, learning_rate=0.1
    )
    args.update(kwargs)
    algorithm = FSGP(**args)
    with pytest.raises(ValueError, match=message):
        run(algorithm, _dataset())
    assert algorithm.tracing_counts() == {}  # no client was set up


@pytest.mark.parametrize(
    "clients, message",
    [
        ([(np.zeros((5, 2)), np.zeros((4, 1)))], "X has 5 rows but Y has 4"),
        ([(np.zeros(5), np.zeros((5, 1)))], "rank 2"),
        ([(np.full((5, 2), np.nan), np.zeros((5, 1)))], "NaN or inf"),
        ([(np.zeros((5, 2)), np.full((5, 1), np.inf))], "NaN or inf"),
        ([(np.zeros((5, 2)), np.zeros((5, 1))), (np.zeros((0, 2)), np.zeros((0, 1)))], "no data"),
        ([(np.zeros((5, 2)), np.zeros((5, 1))), (np.zeros((5, 3)), np.zeros((5, 1)))], "inconsistent input"),
        ([], "at least one client"),
    ],
)
def test_federated_dataset_rejects_bad_client_data(clients, message):
    with pytest.raises(ValueError, match=message):
        FederatedDataset(clients)


def test_exact_mode_with_a_fixed_kernel_parameter_equals_centralized_baseline():
    """Regression (CLI on CO₂): SE + Periodic with a non-trainable period, as ``make_kernel("co2")`` builds.

    The fixed period must stay out of the shared state and of the server's Adam, and the CLI's centralized
    baseline (``centralized_sgpr``: the same compiled Adam loop on ``training_loss()/N``) must be the oracle."""
    from gpflow_fed.baselines import centralized_sgpr

    dataset = _dataset(sizes=(30, 45, 25), D=1)
    seasonal = gpflow.kernels.Periodic(gpflow.kernels.SquaredExponential(lengthscales=1.0), period=0.7)
    gpflow.set_trainable(seasonal.period, False)
    kernel = gpflow.kernels.SquaredExponential(lengthscales=[1.0]) + seasonal
    Z, steps, lr = initial_inducing_inputs(dataset.pooled()[0], 10, seed=0), 12, 0.05
    algorithm = FSGP(kernel, Z, 0.1, rounds=steps, local_steps=3, learning_rate=lr, mode="exact")
    result = run(algorithm, dataset)
    assert not any("period" in key for key in result.state.params)
    central = centralized_sgpr(dataset, kernel, Z, 0.1, steps, lr)
    ours = gpflow.utilities.read_values(result.model)
    ref = gpflow.utilities.read_values(central.model)
    statistics = {".kuf_kfu", ".kuf_y", ".y_squared_sum", ".trace_kff", ".num_data"}  # the sums are variables too
    assert set(ours) == set(ref) | statistics
    np.testing.assert_allclose(ours[".kernel.kernels[1].period"], 0.7, rtol=0)
    start = gpflow.utilities.read_values(_pooled_sgpr(dataset, kernel, Z, 0.1))
    for key in ref:
        np.testing.assert_allclose(ours[key], ref[key], rtol=1e-6, atol=1e-9)
        if "period" not in key:
            assert not np.allclose(ref[key], start[key])
    Xs = dataset.test[0]
    for a, b in zip(result.model.predict_y(Xs), central.model.predict_y(Xs)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6)
    np.testing.assert_allclose(result.metrics["test_nlpd"], central.metrics["test_nlpd"], rtol=1e-6)


def test_predict_phase_projects_noised_statistics_to_psd():
    """With DP noise on the final sums, the server's Σ C Cᵀ is symmetric PSD and variances stay positive."""
    from gpflow_fed.federated.protection.dp import DifferentialPrivacy

    dataset = _dataset()
    kernel, Z = _kernel(), _Z()
    dp = DifferentialPrivacy(noise_multiplier=4.0, clip_norm=50.0, phases=("predict",), accountant="pld")
    algorithm = FSGP(kernel, Z, 0.1, rounds=1, local_steps=1, learning_rate=0.05)
    result = run(algorithm, dataset, runtime=LocalRuntime(protection=Protection(differential_privacy=dp)), seed=0)
    S = result.state.statistics["kuf_kfu"]
    np.testing.assert_array_equal(S, S.T)
    assert np.linalg.eigvalsh(S).min() >= -1e-9 * np.abs(S).max()
    _, var = result.model.predict_f(dataset.test[0])
    assert np.all(np.isfinite(var.numpy())) and np.all(var.numpy() > 0)
