"""PVI's result model under GPflow's idioms (issue 18 items 1–2) and PVI with q(Z) end to end through the ledger.

The result is a FederatedDPOSVGP whose prediction goes through ``posterior()``: after Scipy or an ``assign`` its
predictions equal those of a model freshly built from the new values (the former compiled cache served the old
factors), and it can be deep-copied and frozen after predicting."""

import copy

import gpflow
import numpy as np
import pytest

from gpflow_fed.data import FederatedDataset
from gpflow_fed.federated import LocalRuntime, RunOptions, run
from gpflow_fed.federated.algorithms import PVI
from gpflow_fed.inducing_variables import GaussianInducingPoints, NaturalFactor, PseudoObservations
from gpflow_fed.models import FederatedDPOSVGP
from gpflow_fed.posteriors import LogNormalHyperparameters

Z = np.linspace(-2, 2, 6)[:, None]
XT = np.linspace(-2.5, 2.5, 9)[:, None]


@pytest.fixture(scope="module")
def dataset():
    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, (60, 1))
    Y = np.sin(3 * X) + 0.1 * rng.standard_normal((60, 1))
    return FederatedDataset([(X[i::3], Y[i::3]) for i in range(3)], test=(X[:10], Y[:10]))


def _conjugate_result(dataset, param):
    """Fixed Z and β, Gaussian likelihood: the exact (deterministic) PVI solution."""
    kernel, lik = gpflow.kernels.SquaredExponential(lengthscales=0.5), gpflow.likelihoods.Gaussian(0.01)
    alg = PVI(kernel, Z, lik, param, rounds=3, learn_inducing="fixed", learn_hyperparameters=False, pseudo_fraction=1.0)
    return run(alg, dataset).model


def _fresh(model):
    """A new model built from ``model``'s current values (no object shared)."""
    values = {k: v.numpy() for k, v in gpflow.utilities.parameter_dict(model).items()}
    kernel = gpflow.kernels.SquaredExponential(
        lengthscales=values[".kernel.lengthscales"], variance=values[".kernel.variance"]
    )
    lik = gpflow.likelihoods.Gaussian(values[".likelihood.variance"])
    if isinstance(model.pseudo, NaturalFactor):
        pseudo = NaturalFactor(values[".pseudo.eta"], values[".pseudo.Lam"], Z=values.get(".pseudo.Z"))
    else:
        pseudo = PseudoObservations(
            values[".pseudo.V"], values[".pseudo.m"], values[".pseudo.S_diag"], Z=values.get(".pseudo.Z")
        )
    q_Z = None if model.q_Z is None else GaussianInducingPoints(values[".q_Z.Z_mean"], values[".q_Z.Z_var"])
    q_beta = None
    if model.q_beta is not None:
        q_beta = LogNormalHyperparameters(values[".q_beta.mean"], values[".q_beta.var"], model.input_dim)
    return FederatedDPOSVGP(
        kernel,
        lik,
        pseudo,
        q_Z,
        q_beta,
        alpha=model.alpha,
        num_predict_samples=model.num_predict_samples,
        jitter=model.jitter,
    )


def _assert_predictions_equal(a, b, data):
    for x, y in zip(a.predict_f(XT), b.predict_f(XT)):
        np.testing.assert_allclose(x.numpy(), y.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(a.predict_log_density(data).numpy(), b.predict_log_density(data).numpy(), rtol=1e-10)


@pytest.mark.parametrize("param", ["dpo", "cpo"])
def test_predictions_after_scipy_equal_a_fresh_model(dataset, param):
    """Issue 18 item 1: predictions after ``Scipy().minimize(training_loss_closure(data), trainable_variables)``
    follow the new parameters (the old model served K(Z, X) at the new values with factors at the old ones)."""
    model = _conjugate_result(dataset, param)
    data = dataset.pooled()
    before = model.predict_f(XT)[0].numpy()  # predict first: a cache built here must not survive training
    loss = model.training_loss_closure(data)
    start = float(loss().numpy())
    gpflow.optimizers.Scipy().minimize(loss, model.trainable_variables, options=dict(maxiter=15))
    assert float(loss().numpy()) < start - 1e-3
    assert np.max(np.abs(model.predict_f(XT)[0].numpy() - before)) > 1e-4  # training changed the predictions
    _assert_predictions_equal(model, _fresh(model), data)


def test_predictions_after_assigning_a_hyperparameter_of_the_mixture(dataset):
    """With q(Z) and q(log β): assigning q(β)'s mean (or the kernel's value without q(β)) moves the predictions to
    those of a model built with the new value."""
    alg = PVI(
        gpflow.kernels.SquaredExponential(lengthscales=0.5),
        Z,
        gpflow.likelihoods.Gaussian(0.05),
        rounds=2,
        local_steps=20,
        patience=5,
        num_predict_samples=5,
    )
    model = run(alg, dataset).model
    before = model.predict_f(XT)[0].numpy()
    model.q_beta.mean.assign(model.q_beta.mean.numpy() + np.array([0.5, 0.0, 0.0]))
    assert np.max(np.abs(model.predict_f(XT)[0].numpy() - before)) > 1e-3
    _assert_predictions_equal(model, _fresh(model), dataset.test)
    point = _conjugate_result(dataset, "dpo")
    point.predict_f(XT)
    point.kernel.lengthscales.assign(0.3)
    _assert_predictions_equal(point, _fresh(point), dataset.test)


def test_posterior_cache_follows_gpflow_conventions(dataset):
    """``posterior()`` (TENSOR cache) is a snapshot until ``update_cache()``, as for GPflow's SVGP."""
    alg = PVI(
        gpflow.kernels.SquaredExponential(lengthscales=0.5),
        Z,
        gpflow.likelihoods.Gaussian(0.05),
        rounds=2,
        local_steps=20,
        patience=5,
        num_predict_samples=5,
    )
    model = run(alg, dataset).model
    posterior = model.posterior()
    old = posterior.predict_f(XT)[0].numpy()
    np.testing.assert_allclose(old, model.predict_f(XT)[0].numpy(), rtol=1e-12)
    model.q_Z.Z_mean.assign(model.q_Z.Z_mean.numpy() + 0.3)
    np.testing.assert_allclose(posterior.predict_f(XT)[0].numpy(), old, rtol=1e-12)
    posterior.update_cache()
    np.testing.assert_allclose(posterior.predict_f(XT)[0].numpy(), model.predict_f(XT)[0].numpy(), rtol=1e-12)
    assert np.max(np.abs(old - model.predict_f(XT)[0].numpy())) > 1e-3


@pytest.mark.parametrize("param", ["dpo", "cpo"])
def test_deepcopy_and_freeze_after_predicting(dataset, param):
    """Issue 18 item 2: deepcopy/freeze used to fail with ``cannot pickle 'FuncGraph'`` once the model had predicted."""
    alg = PVI(
        gpflow.kernels.SquaredExponential(lengthscales=0.5),
        Z,
        gpflow.likelihoods.Gaussian(0.05),
        param,
        rounds=2,
        local_steps=20,
        patience=5,
        num_predict_samples=5,
    )
    model = run(alg, dataset).model
    model.predict_f(XT), model.predict_log_density(dataset.test)
    for other in (copy.deepcopy(model), gpflow.utilities.freeze(model)):
        _assert_predictions_equal(other, model, dataset.test)
    copied = copy.deepcopy(model)
    copied.q_beta.mean.assign(copied.q_beta.mean.numpy() + 0.5)  # the copy owns its parameters
    assert np.max(np.abs(copied.predict_f(XT)[0].numpy() - model.predict_f(XT)[0].numpy())) > 1e-3


def test_scipy_on_the_mixture_decreases_the_loss(dataset):
    """With q(Z) and q(log β) the ELBO uses fixed draws, so it is a deterministic function Scipy can minimise."""
    alg = PVI(
        gpflow.kernels.SquaredExponential(lengthscales=0.5),
        Z,
        gpflow.likelihoods.Gaussian(0.05),
        rounds=1,
        local_steps=10,
        patience=5,
        num_predict_samples=3,
    )
    model = run(alg, dataset).model
    loss = model.training_loss_closure(dataset.pooled())
    start = float(loss().numpy())
    assert float(loss().numpy()) == start
    gpflow.optimizers.Scipy().minimize(loss, model.trainable_variables, options=dict(maxiter=10))
    end = float(loss().numpy())
    assert np.isfinite(end) and end < start
    assert not any(
        "kernel" in name
        for name in gpflow.utilities.parameter_dict(model)
        if gpflow.utilities.parameter_dict(model)[name].trainable
    )  # β is q(β)'s, not the kernel's


def test_dpo_with_q_Z_through_the_ledger(dataset):
    """Message names and shapes of spec §3.5, byte counts from that table, and a client's own pseudo-set never
    sent back to it (the cavity it receives is exactly the other clients' latest sets)."""
    M, D, H, K = 6, 1, 3, 3
    alg = PVI(
        gpflow.kernels.SquaredExponential(lengthscales=0.5),
        Z,
        gpflow.likelihoods.Gaussian(0.05),
        rounds=5,
        local_steps=20,
        patience=5,
        num_predict_samples=3,
    )
    result = run(alg, dataset, runtime=LocalRuntime(options=RunOptions(keep_payloads=True)))
    Mk = alg.num_pseudo(20)
    assert Mk == 16
    train = [m for m in result.ledger.messages if m.round < 5]
    ups = [m for m in train if m.sender != "server"]
    downs = [m for m in train if m.sender == "server"]
    assert [m.sender for m in ups] == ["client_0", "client_1", "client_2", "client_0", "client_1"]
    for msg in ups:
        assert {k: v.shape for k, v in msg.arrays.items()} == {
            "dZ_nu": (M, D),
            "dZ_lam": (M, D),
            "drho_nu": (H,),
            "drho_lam": (H,),
            "V": (Mk, D),
            "m": (Mk, 1),
            "s": (Mk,),
        }
    payload = [sum(a.nbytes for a in m.arrays.values()) for m in ups]
    assert payload == [8 * (2 * M * D + 2 * H + Mk * (D + 2))] * 5  # 528 bytes of arrays: spec §3.5
    up_bytes = [e.nbytes for e in result.ledger.select(direction="up", purpose="train")]
    assert up_bytes == [528 + 8 * (1 + 3)] * 5  # plus the weight and three metrics
    latest = {}
    expected_sizes = [[0, 0, 0], [16, 0, 0], [16, 16, 0], [0, 16, 16], [16, 0, 16]]
    for r, down in enumerate(downs):
        receiver = f"client_{r % K}"
        assert down["sizes"].tolist() == expected_sizes[r]
        others = [latest[c] for c in sorted(latest) if c != receiver]
        for name in ("V", "m", "s"):
            want = np.concatenate([o[name] for o in others]) if others else np.zeros((0,) + down[name].shape[1:])
            np.testing.assert_array_equal(down[name], want)
        if receiver in latest:  # the receiver's own pseudo-inputs are not in what it receives
            own = latest[receiver]["V"]
            assert not np.any(np.all(np.isclose(down["V"][:, None, :], own[None, :, :]), axis=-1))
        floats = K + 2 * M * D + 2 * H + sum(o["V"].shape[0] for o in others) * (D + 2) + K
        assert sum(a.nbytes for a in down.arrays.values()) == 8 * floats
        up = ups[r]
        latest[up.sender] = {k: up[k] for k in ("V", "m", "s")}
    # sequential, undamped: the global q(Z) is the last client's q(Z) (spec T9), and the model uses it
    np.testing.assert_allclose(result.model.q_Z.Z_mean.numpy(), result.state.qZ.moments()[0], rtol=1e-12)
    V = result.model.pseudo.V.numpy()
    np.testing.assert_array_equal(V, np.concatenate([latest[c]["V"] for c in ("client_0", "client_1", "client_2")]))


def test_compiled_prediction_equals_eager(dataset):
    """``tf.function(model.predict_f)`` with a dynamic number of test points equals the eager prediction."""
    import tensorflow as tf

    alg = PVI(
        gpflow.kernels.SquaredExponential(lengthscales=0.5),
        Z,
        gpflow.likelihoods.Gaussian(0.05),
        rounds=1,
        local_steps=10,
        patience=5,
        num_predict_samples=3,
    )
    model = run(alg, dataset).model
    compiled = tf.function(model.predict_f, input_signature=[tf.TensorSpec([None, 1], tf.float64)])
    for a, b in zip(compiled(XT), model.predict_f(XT)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12)


def test_checkpoint_and_multiple_assign_round_trip(dataset, tmp_path):
    """GPflow's parameter round trips: ``read_values``/``multiple_assign`` and ``tf.train.Checkpoint`` restore the
    predictions of a model whose values were changed."""
    import tensorflow as tf

    alg = PVI(
        gpflow.kernels.SquaredExponential(lengthscales=0.5),
        Z,
        gpflow.likelihoods.Gaussian(0.05),
        rounds=1,
        local_steps=10,
        patience=5,
        num_predict_samples=3,
    )
    model = run(alg, dataset).model
    gpflow.utilities.print_summary(model)
    reference = model.predict_f(XT)[0].numpy()
    values = gpflow.utilities.read_values(model)
    path = tf.train.Checkpoint(model=model).write(str(tmp_path / "ckpt"))
    model.q_Z.Z_mean.assign(model.q_Z.Z_mean.numpy() + 1.0)
    assert np.max(np.abs(model.predict_f(XT)[0].numpy() - reference)) > 1e-3
    gpflow.utilities.multiple_assign(model, values)
    np.testing.assert_allclose(model.predict_f(XT)[0].numpy(), reference, rtol=1e-12)
    model.q_Z.Z_mean.assign(model.q_Z.Z_mean.numpy() + 1.0)
    tf.train.Checkpoint(model=model).read(path).assert_consumed()
    np.testing.assert_allclose(model.predict_f(XT)[0].numpy(), reference, rtol=1e-12)


def test_result_before_any_reply_is_the_prior(dataset):
    """The server's initial state gives the prior (every t_k ≡ 1): zero mean, the kernel's variance."""
    from gpflow_fed.federated.protocol.algorithm import FederationInfo

    kernel = gpflow.kernels.SquaredExponential(lengthscales=0.5, variance=1.7)
    alg = PVI(kernel, Z, gpflow.likelihoods.Gaussian(0.05), learn_inducing="fixed", learn_hyperparameters=False)
    state = alg.initial_state(FederationInfo(("client_0",), {"client_0": 20}, 1, 1, 0))
    mean, var = alg.result(state).predict_f(XT)
    np.testing.assert_allclose(mean.numpy(), 0.0, atol=1e-12)
    np.testing.assert_allclose(var.numpy(), 1.7, rtol=1e-9)
