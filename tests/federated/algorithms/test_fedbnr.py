"""FedBNR: phase 2 equals the pooled BLR, the ledger's sizes, FedAvg phase 1 against a centralized oracle,
knowledge distillation, bad input."""

from __future__ import annotations

import gpflow
import numpy as np
import pytest
import tensorflow as tf
from gpflow.keras import tf_keras

from gpflow_fed.data import FederatedDataset
from gpflow_fed.federated import LocalRuntime, Protection, RunOptions, run
from gpflow_fed.federated.algorithms import FedBNR
from gpflow_fed.federated.algorithms.distillation import distillation_loss, mean_client_gram
from gpflow_fed.kernels import URK
from gpflow_fed.models import BayesianLinearRegression

#: the plain, readable messages these tests check (the secure default masks them)
PLAIN = Protection(secure_aggregation=False)

RNG = np.random.default_rng(3)
X = RNG.uniform(-5, 5, size=(90, 1))
Y = np.sin(X) + 0.3 * RNG.normal(size=X.shape)


def _dataset(sizes=(20, 30, 40)) -> FederatedDataset:
    cuts = np.cumsum((0,) + tuple(sizes))
    return FederatedDataset([(X[a:b], Y[a:b]) for a, b in zip(cuts[:-1], cuts[1:])], test=(X, Y))


@pytest.mark.usefixtures("nearest_rounding")  # compared to the pooled model to 1e-7: rounding to nearest
@pytest.mark.parametrize("protocol", ["statistics", "two_step"])
def test_rounds_zero_equals_pooled_blr(protocol: str) -> None:
    net = tf_keras.Sequential([tf_keras.layers.Dense(4, activation="tanh")])
    kernel = URK(1, num_samples=25, seed=5, feature_extractor=net)
    dataset = _dataset()
    result = run(FedBNR(kernel, noise_variance=0.2, prior_variance=1.5, rounds=0, protocol=protocol), dataset)
    pooled = BayesianLinearRegression(dataset.pooled(), kernel, noise_variance=0.2, prior_variance=1.5)
    X_new = np.linspace(-6, 6, 13)[:, None]
    for a, b in zip(result.model.predict_f(X_new, full_cov=True), pooled.predict_f(X_new, full_cov=True)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-8)
    np.testing.assert_allclose(
        result.model.log_marginal_likelihood().numpy(), pooled.log_marginal_likelihood().numpy(), atol=1e-8
    )


def test_ledger_sizes_are_L_by_L_and_L_independent_of_client_sizes() -> None:
    L = 2 * 12
    shapes = []
    for sizes in [(10, 10, 70), (30, 30, 30)]:
        algorithm = FedBNR(URK(1, num_samples=12, seed=0), rounds=1, local_steps=1, compile=False)
        result = run(algorithm, _dataset(sizes), protection=PLAIN)
        up = result.ledger.select(direction="up", phase="scatter")
        assert len(up) == 3
        for entry in up:
            by_name = dict(zip(entry.names, entry.shapes))
            assert by_name == {"phi_t_phi": (L, L), "phi_t_y": (L, 1), "y_t_y": (1,), "num_data": ()}
        shapes.append(
            [(e.shapes, e.nbytes) for e in up]
            + [(e.shapes, e.nbytes) for e in result.ledger.select(direction="up", phase="kernel")]
        )
    assert shapes[0] == shapes[1]


def test_two_step_ledger() -> None:
    result = run(FedBNR(URK(1, num_samples=8), rounds=0, protocol="two_step"), _dataset(), protection=PLAIN)
    up = result.ledger.select(direction="up", phase="weights")
    assert [dict(zip(e.names, e.shapes)) for e in up] == [{"w_mean": (16, 1)}] * 3
    down = result.ledger.select(direction="down", phase="weights")
    assert [dict(zip(e.names, e.shapes)) for e in down] == [{"a_inverse": (16, 16)}] * 3


def test_single_client_fedavg_equals_centralized_adam() -> None:
    """With one client, R rounds of S local steps are R·S Adam steps on −log p(y)/N (the client keeps its optimizer)."""
    kernel = URK(1, num_samples=10, seed=1)
    data = (X[:30], Y[:30])
    algorithm = FedBNR(kernel, 0.5, 1.0, rounds=3, local_steps=4, learning_rate=0.05)
    result = run(algorithm, FederatedDataset([data]), protection=PLAIN)  # one party: nothing to mask with
    central = BayesianLinearRegression(data, gpflow.utilities.deepcopy(kernel), 0.5, 1.0)
    optimizer = tf_keras.optimizers.Adam(learning_rate=0.05)
    for _ in range(12):
        optimizer.minimize(lambda: -central.log_marginal_likelihood() / 30.0, central.trainable_variables)
    np.testing.assert_allclose(
        result.model.kernel.feature_map.lengthscales.numpy(), central.kernel.feature_map.lengthscales.numpy(), rtol=1e-9
    )
    np.testing.assert_allclose(result.model.likelihood.variance.numpy(), central.likelihood.variance.numpy(), rtol=1e-9)
    np.testing.assert_allclose(result.model.prior_variance.numpy(), central.prior_variance.numpy(), rtol=1e-9)
    assert (
        result.history[-1]["neg_log_marginal_likelihood_per_point"]
        < result.history[0]["neg_log_marginal_likelihood_per_point"]
    )


def test_fedavg_is_the_size_weighted_mean_of_client_values() -> None:
    kernel = URK(1, num_samples=10, seed=1)
    algo = FedBNR(kernel, rounds=1, local_steps=2, learning_rate=0.05, compile=False)
    result = run(algo, _dataset(), runtime=LocalRuntime(options=RunOptions(keep_payloads=True)), protection=PLAIN)
    ups = [m for m in result.ledger.messages if m.phase == "kernel" and m.sender != "server"]
    key = "likelihood.variance"
    expected = sum(m.weight * m[key] for m in ups) / sum(m.weight for m in ups)
    np.testing.assert_allclose(result.state.values[key], expected, rtol=1e-12)


def test_distillation_loss_eq_3_4_and_kd_run() -> None:
    X_kd, Y_kd = X[::6], Y[::6]
    kernels = [URK(1, num_samples=10, seed=2, feature_map_options={"lengthscales": ls}) for ls in (0.5, 2.0)]
    target = mean_client_gram(kernels, tf.constant(X_kd))
    np.testing.assert_allclose(target.numpy(), 0.5 * (kernels[0].K(X_kd) + kernels[1].K(X_kd)).numpy(), rtol=1e-12)
    server = BayesianLinearRegression((X_kd, Y_kd), URK(1, num_samples=10, seed=2), 0.3)
    expected = -server.log_marginal_likelihood().numpy() / len(X_kd) + 2.0 * np.mean(
        (server.kernel.K(X_kd).numpy() - target.numpy()) ** 2
    )
    np.testing.assert_allclose(distillation_loss(server, target, 2.0).numpy(), expected, rtol=1e-12)

    algo = FedBNR(
        URK(1, num_samples=10, seed=2),
        rounds=2,
        local_steps=3,
        aggregation="kd",
        distillation_data=(X_kd, Y_kd),
        alpha=1.0,
        kd_steps=5,
        learning_rate=0.05,
        compile=False,
    )
    result = run(algo, _dataset(), runtime=LocalRuntime(options=RunOptions(keep_payloads=True)))
    ups = [m for m in result.ledger.messages if m.phase == "kernel" and m.round == 1 and m.sender != "server"]
    fedavg = sum(m.weight * m["kernel.feature_map.lengthscales"] for m in ups) / sum(m.weight for m in ups)
    assert not np.allclose(result.state.values["kernel.feature_map.lengthscales"], fedavg)  # the server distilled
    assert np.isfinite(result.metrics["test_rmse"])


def test_bad_input() -> None:
    kernel = URK(1, num_samples=5)
    with pytest.raises(ValueError, match="distillation_data"):
        FedBNR(kernel, aggregation="kd")
    with pytest.raises(ValueError, match="alpha"):
        FedBNR(kernel, aggregation="kd", distillation_data=(X, Y), alpha=-1.0)
    with pytest.raises(ValueError, match="noise_variance"):
        FedBNR(kernel, noise_variance=0.0)
    with pytest.raises(ValueError, match="prior_variance"):
        FedBNR(kernel, prior_variance=-2.0)
    with pytest.raises(ValueError, match="aggregation"):
        FedBNR(kernel, aggregation="median")
    with pytest.raises(TypeError, match="URK"):
        FedBNR(gpflow.kernels.SquaredExponential())
    with pytest.raises(ValueError, match="input columns"):
        FedBNR(kernel, aggregation="kd", distillation_data=(np.ones((3, 2)), np.ones((3, 1))))
    with pytest.raises(ValueError, match="input_dim"):
        run(FedBNR(URK(2, num_samples=5), rounds=0), _dataset())


def _deep_kernel(seed: int = 0) -> URK:
    from gpflow_fed.kernels import deep_urk

    return deep_urk(1, hidden=(6,), feature_dim=2, num_samples=8, seed=seed)


@pytest.mark.parametrize(
    "aggregation", ["fedavg", pytest.param("kd", marks=pytest.mark.slow)]
)  # kd: also test_kd_target...
@pytest.mark.usefixtures("nearest_rounding")  # runs compared to the last digits: rounding to nearest
def test_compiled_equals_eager_and_traces_once(aggregation: str) -> None:
    """The compiled local and server loops (one tf.function for every client, data as arguments) take the same
    steps as the eager loop, and are traced once although the clients have different sizes."""
    kd = dict(distillation_data=(X[::5], Y[::5]), kd_steps=3) if aggregation == "kd" else {}
    results, algos = [], []
    for compile in (True, False):
        algo = FedBNR(
            _deep_kernel(),
            0.5,
            1.0,
            rounds=2,
            local_steps=3,
            learning_rate=0.05,
            aggregation=aggregation,
            compile=compile,
            **kd,
        )
        results.append(run(algo, _dataset((20, 30, 40))))
        algos.append(results[-1].algorithm)  # the run's own bound copy holds the compiled workers
    for key, value in results[0].state.values.items():
        np.testing.assert_allclose(value, results[1].state.values[key], rtol=1e-10, atol=1e-10, err_msg=key)
    for a, b in zip(results[0].model.predict_y(X), results[1].model.predict_y(X)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-10, atol=1e-10)
    assert algos[0]._worker.get().trainer.tracing_count() == 1
    if aggregation == "kd":
        assert algos[0]._kd.get().trainer.tracing_count() == 1


def test_kd_target_is_the_mean_client_gram() -> None:
    """The server's distillation target, computed on its worker kernel, is mean_client_gram of the client kernels."""
    X_kd = X[::6]
    algo = FedBNR(
        URK(1, num_samples=10, seed=2),
        rounds=1,
        local_steps=2,
        aggregation="kd",
        distillation_data=(X_kd, Y[::6]),
        kd_steps=1,
        learning_rate=0.05,
    )
    result = run(algo, _dataset(), runtime=LocalRuntime(options=RunOptions(keep_payloads=True)))
    ups = [m for m in result.ledger.messages if m.phase == "kernel" and m.sender != "server"]
    kernels = []
    for m in ups:
        model = BayesianLinearRegression((X[:1], Y[:1]), URK(1, num_samples=10, seed=2))
        algo.shared.assign(model, dict(m.arrays))
        kernels.append(model.kernel)
    target = mean_client_gram(kernels, tf.constant(X_kd))
    server = BayesianLinearRegression((X_kd, Y[::6]), URK(1, num_samples=10, seed=2))
    mean = {k: sum(m.weight * m[k] for m in ups) / sum(m.weight for m in ups) for k in ups[0].arrays}
    algo.shared.assign(server, mean)
    optimizer = tf_keras.optimizers.Adam(learning_rate=0.05)
    optimizer.minimize(lambda: distillation_loss(server, target, 1.0), server.trainable_variables)
    for key, value in algo.shared.read(server).items():
        np.testing.assert_allclose(result.state.values[key], value, rtol=1e-10, err_msg=key)


@pytest.mark.usefixtures("nearest_rounding")  # runs compared to the last digits: rounding to nearest
def test_an_algorithm_can_run_again_and_start_from_a_model() -> None:
    algo = FedBNR(URK(1, num_samples=10, seed=1), 0.5, 1.0, rounds=1, local_steps=2, learning_rate=0.05)
    first, second = run(algo, _dataset()), run(algo, _dataset())
    third = run(gpflow.utilities.deepcopy(algo), _dataset())  # a copy rebuilds its compiled worker
    for key, value in first.state.values.items():
        np.testing.assert_array_equal(value, second.state.values[key])
        np.testing.assert_array_equal(value, third.state.values[key])
    trained = first.model
    algo.start_from(trained)
    zero = FedBNR(URK(1, num_samples=10, seed=1), rounds=0)
    zero.start_from(trained)
    pooled = BayesianLinearRegression(
        _dataset().pooled(), trained.kernel, trained.likelihood.variance.numpy(), trained.prior_variance.numpy()
    )
    np.testing.assert_allclose(
        run(zero, _dataset()).model.predict_f(X)[0].numpy(), pooled.predict_f(X)[0].numpy(), atol=1e-8
    )
    with pytest.raises(ValueError, match="architecture"):
        zero.start_from(BayesianLinearRegression((X, Y), _deep_kernel()))


def test_start_from_moves_a_frozen_kernel_too() -> None:
    """An algorithm built on a result model's kernel (frozen, so phase 1 shares none of it) and restarted from
    another result model, after a run built its workers, computes the pooled BLR with the *new* kernel."""
    first = run(FedBNR(_deep_kernel(1), rounds=1, local_steps=3, learning_rate=0.05), _dataset()).model
    second = run(FedBNR(_deep_kernel(1), rounds=3, local_steps=5, learning_rate=0.05), _dataset()).model
    zero = FedBNR(gpflow.utilities.deepcopy(first.kernel), rounds=0)
    run(zero, _dataset())  # the configuration's own kernel is frozen: its shared state is σ² and λ² only
    zero.start_from(second)
    pooled = BayesianLinearRegression(
        _dataset().pooled(), second.kernel, second.likelihood.variance.numpy(), second.prior_variance.numpy()
    )
    restarted = run(zero, _dataset()).model
    np.testing.assert_allclose(restarted.kernel.features(X).numpy(), second.kernel.features(X).numpy(), atol=1e-12)
    np.testing.assert_allclose(restarted.predict_f(X)[0].numpy(), pooled.predict_f(X)[0].numpy(), atol=1e-8)


@pytest.mark.parametrize("num_data", [5, 40])
def test_local_objective_primal_and_dual_equal_gpr(num_data: int) -> None:
    """The clients' objective (dual for N_c < L = 20, primal otherwise) and its gradients equal GPR's evidence
    with the kernel λ²·URK and noise σ² (−log p / N)."""
    from gpflow_fed.federated.algorithms.fedbnr import negative_log_marginal_likelihood_per_point

    data = (X[:num_data], Y[:num_data])
    model = BayesianLinearRegression(data, _deep_kernel(seed=3), 0.3, 1.7)
    gpr_kernel = gpflow.kernels.Product([model.kernel, gpflow.kernels.Constant(1.7)])
    gpflow.set_trainable(gpr_kernel.kernels[1], False)
    gpr = gpflow.models.GPR(data, gpr_kernel, noise_variance=0.3)
    variables = model.kernel.trainable_variables
    with tf.GradientTape(persistent=True) as tape:
        ours = negative_log_marginal_likelihood_per_point(model, tf.constant(data[0]), tf.constant(data[1]))
        oracle = -gpr.log_marginal_likelihood() / num_data
    np.testing.assert_allclose(ours.numpy(), oracle.numpy(), rtol=1e-10)
    for a, b in zip(tape.gradient(ours, variables), tape.gradient(oracle, variables)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-8, atol=1e-10)


def test_concurrent_client_updates_equal_sequential_ones() -> None:
    """Clients share one worker model; its lock makes threaded runtimes give the sequential answers."""
    from concurrent.futures import ThreadPoolExecutor

    from gpflow_fed.federated.protocol.algorithm import FederationInfo
    from gpflow_fed.federated.protocol.messages import SERVER, Message
    from gpflow_fed.federated.runtimes.base import make_clients

    def answers(threaded: bool) -> list:
        algo = FedBNR(URK(1, num_samples=10, seed=4), rounds=1, local_steps=5, learning_rate=0.05, compile=False)
        dataset = _dataset((25, 30, 35))
        clients, _ = make_clients(dataset, seed=0)
        sizes = {c.id: c.num_data for c in clients}
        state = algo.initial_state(FederationInfo(tuple(sizes), sizes, 1, 1, 0))
        for c in clients:
            algo.setup_client(c, state)
        down = Message(SERVER, 0, "kernel", algo.broadcast(state, 0, "kernel"), weight=0.0)
        if not threaded:
            return [algo.client_update(c, down) for c in clients]
        with ThreadPoolExecutor(len(clients)) as pool:
            return list(pool.map(lambda c: algo.client_update(c, down), clients))

    for sequential, threaded in zip(answers(False), answers(True)):
        assert sequential.arrays.keys() == threaded.arrays.keys()
        for name in sequential.arrays:
            np.testing.assert_array_equal(sequential[name], threaded[name])


def test_noised_scatter_sums_are_repaired_with_a_noise_sized_ridge() -> None:
    """Under DP the server uses PSD(Σ ΦᵀΦ) + τI, τ = zC√(2L): the Cholesky of A never fails and the ridge shows."""
    from gpflow_fed.federated.protection.dp import DifferentialPrivacy, DPUtilityWarning

    dp = DifferentialPrivacy(
        noise_multiplier=1.0, clip_norm=60.0, phases=("scatter",), accountant="pld", insecure_noise_seed=7
    )
    dataset = _dataset()
    kernel = URK(1, num_samples=10, seed=5)
    with pytest.warns(DPUtilityWarning):  # three clients: mostly noise, and the run says so
        result = run(
            FedBNR(kernel, noise_variance=0.2, prior_variance=1.5, rounds=0),
            dataset,
            runtime=LocalRuntime(protection=Protection(differential_privacy=dp)),
        )
    used = result.state.statistics["phi_t_phi"]
    L = used.shape[0]
    tau = 1.0 * 60.0 * np.sqrt(2.0 * L)
    np.testing.assert_array_equal(used, used.T)
    assert np.linalg.eigvalsh(used).min() >= tau * (1 - 1e-9)
    exact = sum(kernel.features(x).numpy().T @ kernel.features(x).numpy() for x, _ in dataset.clients)
    assert np.abs(used - tau * np.eye(L) - exact).max() > 1.0  # noise was really added
    mean, var = result.model.predict_f(X)
    assert np.all(np.isfinite(mean.numpy())) and np.all(var.numpy() > 0)


def test_denoised_gram_checks_and_ridge() -> None:
    from gpflow_fed.federated.algorithms.postprocess import denoised_gram, project_to_psd

    noisy = np.array([[1.0, 2.0], [2.0, -3.0]])
    np.testing.assert_allclose(denoised_gram(noisy, 0.0), project_to_psd(noisy))
    np.testing.assert_allclose(denoised_gram(noisy, 0.5), project_to_psd(noisy) + 0.5 * 2.0 * np.eye(2))
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="noise_std"):
            denoised_gram(noisy, bad)
    with pytest.raises(ValueError, match="square"):
        denoised_gram(np.ones((2, 3)), 1.0)
