"""PVI: exactness in the conjugate case (spec T6), sequential q = client q (T9), messages (T11), guards (T10)."""

import gpflow
import numpy as np
import pytest
import tensorflow as tf

from gpflow_fed.data import FederatedDataset
from gpflow_fed.federated import LocalRuntime, RunOptions, run
from gpflow_fed.federated.protocol.algorithm import Aggregate
from gpflow_fed.federated.algorithms import PVI
from gpflow_fed.federated.algorithms.pvi.factors import NaturalGaussian


@pytest.fixture
def dataset():
    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, (60, 1))
    Y = np.sin(3 * X) + 0.1 * rng.standard_normal((60, 1))
    return FederatedDataset([(X[i::3], Y[i::3]) for i in range(3)], test=(X[:10], Y[:10]))


Z = np.linspace(-2, 2, 6)[:, None]


@pytest.mark.parametrize("param", ["cpo", "dpo"])
def test_one_sequential_sweep_reproduces_pooled_sgpr(dataset, param):
    kernel, lik = gpflow.kernels.SquaredExponential(lengthscales=0.5), gpflow.likelihoods.Gaussian(0.01)
    alg = PVI(kernel, Z, lik, param, rounds=3, learn_inducing="fixed", learn_hyperparameters=False, pseudo_fraction=1.0)
    result = run(alg, dataset)
    sgpr = gpflow.models.SGPR(dataset.pooled(), kernel, Z, noise_variance=0.01)
    X = dataset.test[0]
    for a, b in zip(result.model.predict_f(X), sgpr.predict_f(X)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(result.model.elbo(dataset.pooled()).numpy(), sgpr.elbo().numpy(), rtol=1e-9)


def test_dpo_distribution_run_messages_and_sequential_equality(dataset):
    kernel, lik = gpflow.kernels.SquaredExponential(lengthscales=0.5), gpflow.likelihoods.Gaussian(0.05)
    alg = PVI(kernel, Z, lik, rounds=4, local_steps=30, patience=5, num_predict_samples=4)
    result = run(alg, dataset, runtime=LocalRuntime(options=RunOptions(keep_payloads=True)))
    M, D, H = 6, 1, 3
    ups = [m for m in result.ledger.messages if m.sender != "server"]
    assert [m.sender for m in ups] == ["client_0", "client_1", "client_2", "client_0"]
    for msg in ups:
        Mk = alg.num_pseudo(20)
        assert {k: v.shape for k, v in msg.arrays.items()} == {
            "dZ_nu": (M, D),
            "dZ_lam": (M, D),
            "drho_nu": (H,),
            "drho_lam": (H,),
            "V": (Mk, D),
            "m": (Mk, 1),
            "s": (Mk,),
        }
        X_k, Y_k = dataset.clients[int(msg.sender[-1])]
        assert not np.any(np.isin(msg["m"], Y_k))  # pseudo-targets are not the client's outputs
    downs = [m for m in result.ledger.messages if m.sender == "server"]
    assert downs[0]["sizes"].tolist() == [0, 0, 0] and downs[3]["sizes"].tolist() == [0, 16, 16]  # own set not sent
    mean, var = result.state.qZ.moments()
    assert np.all(var > 0) and np.isfinite(result.metrics["test_nlpd"])
    fe = [h["free_energy"] for h in result.history]
    assert all(np.isfinite(fe))
    assert result.model.predict_f(dataset.test[0])[0].shape == (10, 1)


def test_sequential_global_q_equals_client_q(dataset):
    kernel, lik = gpflow.kernels.SquaredExponential(lengthscales=0.5), gpflow.likelihoods.Gaussian(0.05)
    alg = PVI(kernel, Z, lik, rounds=2, local_steps=30, patience=5)
    from gpflow_fed.federated.runtimes.base import make_clients
    from gpflow_fed.federated import FederationInfo, reduce_messages
    from gpflow_fed.federated.protocol.messages import Message

    clients, _ = make_clients(dataset, 0)
    info = FederationInfo(tuple(c.id for c in clients), {c.id: c.num_data for c in clients}, 1, 1, 0)
    state = alg.initial_state(info)
    for r in range(2):
        c = clients[r]
        alg.setup_client(c, state)
        down = Message("server", r, "train", alg.broadcast(state, r, "train"), weight=0.0)
        reply = alg.client_update(c, down)
        state = alg.server_update(state, reduce_messages([reply], "collect"))
        mean, var = c.state["q_moments"]["Z"]
        np.testing.assert_allclose(state.qZ.moments()[0], mean, rtol=1e-9)
        np.testing.assert_allclose(state.qZ.moments()[1], var, rtol=1e-9)
        np.testing.assert_allclose(state.qrho.moments()[0], c.state["q_moments"]["rho"][0], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("initial_factors, bound", [("split", lambda v: v < 0.03), ("prior", lambda v: v > 0.1)])
def test_split_initial_factors_keep_the_first_regional_update_from_inflating_q_z(initial_factors, bound):
    """Paper Alg. 2, line 2: q⁰ = p̃(Z) p(log β) Π_k t_k⁰. With the initial q shared among the K factors, the
    first client's cavity keeps (K − 1)/K of q⁰'s precision, so inducing inputs outside its region stay where q⁰
    put them (variance ≈ 0.01); with t_k⁰ ≡ 1 its cavity is the prior N(0, 1) and they relax towards it."""
    from gpflow_fed.federated import FederationInfo, reduce_messages
    from gpflow_fed.federated.protocol.messages import Message
    from gpflow_fed.federated.runtimes.base import make_clients

    rng = np.random.default_rng(1)
    X = np.sort(rng.uniform(-2, 2, (60, 1)), axis=0)
    Y = np.sin(3 * X) + 0.1 * rng.standard_normal((60, 1))
    regional = FederatedDataset([(X[20 * i : 20 * (i + 1)], Y[20 * i : 20 * (i + 1)]) for i in range(3)])
    kernel, lik = gpflow.kernels.SquaredExponential(lengthscales=0.3), gpflow.likelihoods.Gaussian(0.05)
    alg = PVI(
        kernel, Z, lik, rounds=1, learning_rate=0.05, local_steps=300, patience=20, initial_factors=initial_factors
    )
    clients, _ = make_clients(regional, 0)
    info = FederationInfo(tuple(c.id for c in clients), {c.id: c.num_data for c in clients}, 1, 1, 0)
    state = alg.initial_state(info)
    for c in clients:
        alg.setup_client(c, state)
    for name, prior in (("tZ", NaturalGaussian.standard(Z.shape)), ("trho", NaturalGaussian.standard((3,)))):
        total = sum((c.state[name] for c in clients[1:]), clients[0].state[name]) + prior
        q0 = state.qZ if name == "tZ" else state.qrho
        np.testing.assert_allclose(total.nu, q0.nu, atol=1e-9)  # the server's q is prior × Π t_k from the start
        np.testing.assert_allclose(total.lam, q0.lam, atol=1e-9)
    down = Message("server", 0, "train", alg.broadcast(state, 0, "train"), weight=0.0)
    state = alg.server_update(state, reduce_messages([alg.client_update(clients[0], down)], "collect"))
    assert bound(float(state.qZ.moments()[1].max())), state.qZ.moments()[1].ravel()


def test_improper_synchronous_update_is_rejected(dataset):
    kernel, lik = gpflow.kernels.SquaredExponential(), gpflow.likelihoods.Gaussian(0.05)
    alg = PVI(kernel, Z, lik, schedule="synchronous", rounds=1, learn_hyperparameters=False)
    from gpflow_fed.federated.protocol.algorithm import FederationInfo
    from gpflow_fed.federated.protocol.messages import Message

    state = alg.initial_state(FederationInfo(("client_0",), {"client_0": 20}, 1, 1, 0))
    bad = Message(
        "client_0",
        0,
        "train",
        {
            "dZ_nu": np.zeros((6, 1)),
            "dZ_lam": np.full((6, 1), -2.0),
            "V": np.zeros((2, 1)),
            "m": np.zeros((2, 1)),
            "s": np.ones(2),
        },
    )
    with pytest.warns(RuntimeWarning, match="improper"):
        new = alg.server_update(state, Aggregate(0, "train", {}, 1.0, ("client_0",), messages=(bad,)))
    assert new.rejected == 1 and new.versions.tolist() == [0] and new.sets == {}
    np.testing.assert_array_equal(new.qZ.lam, state.qZ.lam)


def test_cavity_clipping_and_natural_parameters():
    q = NaturalGaussian.from_moments(np.array([1.0, 2.0]), np.array([0.5, 0.25]))
    cav, n = (q - NaturalGaussian(np.zeros(2), np.array([1.0, 5.0]))).clipped()
    assert n == 1 and cav.lam[1] == 1e-6 and cav.lam[0] == 1.0
    with pytest.raises(ValueError, match="improper"):
        NaturalGaussian(np.zeros(1), np.array([-1.0])).moments()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(damping=1.0), "damping"),
        (dict(damping=-0.1), "damping"),
        (dict(alpha=1.5), "alpha"),
        (dict(parameterisation="x"), "parameterisation"),
        (dict(learn_inducing="x"), "learn_inducing"),
        (dict(schedule="x"), "schedule"),
        (dict(max_pseudo=0), "max_pseudo"),
        (dict(init_S=1e-7), "init_S must exceed the floor"),
        (dict(initial_factors="data"), "initial_factors"),
    ],
)
def test_bad_configuration(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PVI(gpflow.kernels.SquaredExponential(), Z, gpflow.likelihoods.Gaussian(), **kwargs)


def test_bad_data_is_rejected_before_training(dataset):
    alg = PVI(gpflow.kernels.SquaredExponential(), Z, gpflow.likelihoods.Gaussian(), rounds=1)
    tiny = FederatedDataset([(np.zeros((1, 1)), np.zeros((1, 1))), (np.ones((5, 1)), np.ones((5, 1)))])
    with pytest.raises(ValueError, match="M_k"):
        run(alg, tiny)
    with pytest.raises(ValueError, match="D = 1"):
        run(alg, FederatedDataset([(np.zeros((5, 2)), np.zeros((5, 1)))]))
    with pytest.raises(TypeError, match="SquaredExponential"):
        PVI(gpflow.kernels.Matern32(), Z, gpflow.likelihoods.Gaussian())


def test_local_step_is_traced_once_across_clients_and_rounds():
    """One compiled step per own-factor shape, reused by clients with different N_k and cavity sizes."""
    rng = np.random.default_rng(1)
    sizes = [20, 21, 22]  # M_k = ⌊0.8 N_k⌋ = 16, 16, 17
    clients = [(x, np.sin(3 * x)) for x in (rng.uniform(-2, 2, (n, 1)) for n in sizes)]
    data = FederatedDataset(clients, test=clients[0])
    kernel, lik = gpflow.kernels.SquaredExponential(lengthscales=0.5), gpflow.likelihoods.Gaussian(0.05)
    alg = PVI(kernel, Z, lik, rounds=6, local_steps=25, patience=5, num_predict_samples=2)
    alg = run(alg, data).algorithm  # the run's own bound copy holds the compiled steps
    counts = {Mk: alg.local_problem(Mk).step_function("all").experimental_get_tracing_count() for Mk in (16, 17)}
    assert counts == {16: 1, 17: 1}


def _cpo_problem():
    from gpflow_fed.federated.algorithms.pvi.local import LocalProblem

    problem = LocalProblem(
        gpflow.kernels.SquaredExponential(),
        gpflow.likelihoods.Gaussian(0.1),
        1,
        learn_hyperparameters=False,
        M=3,
        num_pseudo=3,
        mode="distribution",
        param="cpo",
        alpha=0.1,
        num_samples=1,
        learning_rate=0.01,
    )
    X = np.linspace(-1, 1, 8)[:, None]
    problem.load((X, np.sin(X)), {"m": np.zeros((3, 1)), "S_raw": np.zeros((3, 3))}, seed=0, counter=0, jitter=1e-6)
    return problem


def test_cpo_factor_precision_is_bounded_by_the_floor():
    """S_k = L Lᵀ + S_FLOOR·I: a raw diagonal driven to −40 (what Adam did in directions the objective cannot see)
    still gives a factor precision of at most 1/S_FLOOR, so other clients' cavities and the server's sum keep
    their digits; an ordinary S is only shifted by the floor."""
    from gpflow_fed.inducing_variables import S_FLOOR

    problem = _cpo_problem()
    problem.own.S_raw.assign(np.diag([-40.0, 0.0, -1.0]) + np.tril(np.full((3, 3), 0.3), -1))
    Lam = problem.own_factor_arrays()["Lam"]
    assert np.linalg.eigvalsh(Lam).max() <= 1 / S_FLOOR * (1 + 1e-9)
    L = np.tril(problem.own.S_raw.numpy(), -1) + np.diag(np.exp(np.diag(problem.own.S_raw.numpy())))
    np.testing.assert_allclose(np.linalg.inv(Lam), L @ L.T + S_FLOOR * np.eye(3), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("failure", ["nan", "raise"])
def test_failed_cholesky_chunk_is_undone_and_retried_with_more_jitter(failure):
    """TF's CPU Cholesky signals an indefinite matrix by raising *or* by returning NaNs (seen on the ozone
    CPO run): both must undo the chunk and retry it with 10× the jitter, not end the client's update."""
    problem = _cpo_problem()
    real = problem.step_function("factor")
    calls = []

    def flaky(n):
        if float(problem.jitter.numpy()) < 5e-6:  # fails at the initial jitter, after moving the variables
            problem.own.m.assign_add(tf.ones_like(problem.own.m))
            problem.counter.assign_add(7)
            calls.append("failed")
            if failure == "raise":
                raise tf.errors.InvalidArgumentError(None, None, "Cholesky decomposition was not successful")
            return tf.constant([1.0, np.nan], gpflow.default_float())
        calls.append("ok")
        return real(n)

    problem._steps["factor"] = flaky
    _, steps = problem.fit("factor", max_steps=10, patience=100)
    assert calls[0] == "failed" and calls[1:] == ["ok"] and steps == 10
    np.testing.assert_allclose(float(problem.jitter.numpy()), 1e-5)
    assert int(problem.counter.numpy()) == 10  # the failed chunk's random-stream advance was undone

    reference = _cpo_problem()
    reference.jitter.assign(1e-5)
    reference.fit("factor", max_steps=10, patience=100)
    np.testing.assert_allclose(problem.own.m.numpy(), reference.own.m.numpy(), rtol=1e-12, atol=1e-14)


def test_cholesky_failing_at_the_largest_jitter_raises_and_keeps_the_factor():
    problem = _cpo_problem()
    before = problem.snapshot()

    def always_nan(n):
        problem.own.m.assign_add(tf.ones_like(problem.own.m))
        return tf.constant([np.nan], gpflow.default_float())

    problem._steps["factor"] = always_nan
    with pytest.raises(ValueError, match=r"non-finite even with jitter 1e-02 and learning rate 1\.6e-04"):
        problem.fit("factor", max_steps=10, patience=100)
    for name, value in before.items():
        np.testing.assert_array_equal(problem.snapshot()[name], value)


def test_failures_past_the_largest_jitter_halve_the_learning_rate_for_this_update_only():
    """After the jitter reaches 1e-2, a failing chunk is retried with half the learning rate; the next
    client load starts again from the configured rate."""
    problem = _cpo_problem()
    real = problem.step_function("factor")
    rates = []

    def fails_until_quarter_rate(n):
        rate = float(problem.optimizer.learning_rate.numpy())
        rates.append(rate)
        if rate > 0.3 * problem.learning_rate:
            return tf.constant([np.nan], gpflow.default_float())
        return real(n)

    problem._steps["factor"] = fails_until_quarter_rate
    _, steps = problem.fit("factor", max_steps=10, patience=100)
    assert steps == 10 and float(problem.jitter.numpy()) == pytest.approx(1e-2)
    lr = problem.learning_rate
    assert rates == pytest.approx(
        [lr] * 5 + [lr / 2, lr / 4], rel=1e-6
    )  # jitter 1e-6 → 1e-2 (5 tries), then two halvings
    problem.load((problem.X.numpy(), problem.Y.numpy()), problem.snapshot(), seed=0, counter=0, jitter=1e-6)
    assert float(problem.optimizer.learning_rate.numpy()) == pytest.approx(lr, rel=1e-6)


def test_a_synchronous_run_with_unequal_pseudo_sets_keeps_each_clients_own_shapes():
    """Clients of N_k = 6, 8, 12 points hold pseudo-sets of M_k = 3, 4 and 6 (``pseudo_fraction=0.5``): their replies
    differ in shape, which the server expects (``reply_spec`` leaves M_k free, ``check_reply`` holds each client to its
    own), so two synchronous rounds under LocalRuntime's default protection accept every reply; without a declared spec
    the three layouts have no strict majority and the round fails."""
    rng = np.random.default_rng(3)
    clients = []
    for n in (6, 8, 12):
        X = rng.uniform(-2, 2, (n, 1))
        clients.append((X, np.sin(3 * X) + 0.1 * rng.standard_normal((n, 1))))
    kernel, lik = gpflow.kernels.SquaredExponential(lengthscales=0.5), gpflow.likelihoods.Gaussian(0.05)
    alg = PVI(kernel, Z, lik, schedule="synchronous", rounds=2, damping=0.5, pseudo_fraction=0.5, local_steps=10,
              patience=3, num_predict_samples=4)  # fmt: skip
    result = run(alg, FederatedDataset(clients, test=clients[0]), runtime=LocalRuntime())
    assert [h["clients"] for h in result.history] == [3, 3]
    assert result.state.versions.tolist() == [2, 2, 2] and result.state.rejected == 0
    for cid, M_k in zip(result.state.client_ids, (3, 4, 6)):
        own = result.state.sets[cid]
        assert (own["V"].shape, own["m"].shape, own["s"].shape) == ((M_k, 1), (M_k, 1), (M_k,))


def test_reply_spec_and_check_reply_hold_each_client_to_its_own_pseudo_set():
    """The spec names every array with M_k free; a pseudo-set of another size than the sender's registered N_k gives
    is refused, and a CPO reply (no per-client size) is held to [M, 1] and the packed [M(M+1)/2]."""
    from gpflow_fed.federated.protocol.algorithm import FederationInfo
    from gpflow_fed.federated.protocol.faults import spec_faults
    from gpflow_fed.federated.protocol.messages import Message

    kernel, lik = gpflow.kernels.SquaredExponential(), gpflow.likelihoods.Gaussian(0.05)
    alg = PVI(kernel, Z, lik, schedule="synchronous", pseudo_fraction=0.5)
    state = alg.initial_state(FederationInfo(("a", "b"), {"a": 8, "b": 12}, 1, 1, 0))
    spec = alg.reply_spec(state, 0, "train")
    assert spec == {"dZ_nu": (6, 1), "dZ_lam": (6, 1), "drho_nu": (3,), "drho_lam": (3,),
                    "V": (None, 1), "m": (None, 1), "s": (None,)}  # fmt: skip

    def reply(sender, M_k, **extra):
        arrays = {"dZ_nu": np.zeros((6, 1)), "dZ_lam": np.zeros((6, 1)), "drho_nu": np.zeros(3),
                  "drho_lam": np.zeros(3), "V": np.zeros((M_k, 1)), "m": np.zeros((M_k, 1)),
                  "s": np.ones(M_k)}  # fmt: skip
        arrays.update(extra)
        return Message(sender, 0, "train", arrays, weight=8.0)

    assert spec_faults([reply("a", 4), reply("b", 6)], spec) == {}
    assert set(spec_faults([reply("a", 4), reply("b", 6, s=np.ones((6, 1)))], spec)) == {"b"}
    assert alg.check_reply(state, "train", reply("a", 4), 8) is None
    assert "M_k = 4" in alg.check_reply(state, "train", reply("a", 6), 8)
    assert alg.check_reply(state, "train", reply("a", 4, s=np.ones(5)), 8) is not None
    cpo = PVI(kernel, Z, lik, "cpo", learn_inducing="fixed", learn_hyperparameters=False)
    cpo_state = cpo.initial_state(FederationInfo(("a",), {"a": 8}, 1, 1, 0))
    assert cpo.reply_spec(cpo_state, 0, "train") == {"d_eta": (6, 1), "d_Lam": (21,)}
