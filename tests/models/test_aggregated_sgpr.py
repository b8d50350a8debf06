"""AggregatedSGPR: predictions and bound from summed statistics equal gpflow SGPR on the pooled data."""

import gpflow
import numpy as np
import pytest
import tensorflow as tf

from gpflow_fed.federated.algorithms.fsgp.statistics import sgpr_statistics
from gpflow_fed.models import AggregatedSGPR

RTOL = 1e-8


@pytest.fixture(name="problem")
def _problem():
    rng = np.random.default_rng(3)
    X = rng.uniform(-2, 2, (90, 2))
    Y = np.concatenate([np.sin(2 * X[:, :1]) * X[:, 1:], np.cos(X[:, :1])], axis=1) + 0.1 * rng.normal(size=(90, 2))
    Z = rng.uniform(-2, 2, (12, 2))
    kernel = gpflow.kernels.Matern52(variance=1.3, lengthscales=[0.7, 1.1])
    return X, Y, Z, kernel


def _aggregated(X, Y, Z, kernel, noise, chunks=(0, 25, 60, 90), with_bound=True, whiten=False):
    iv = gpflow.inducing_variables.InducingPoints(Z)
    parts = [
        sgpr_statistics(kernel, iv, tf.constant(X[a:b]), tf.constant(Y[a:b]), whiten=whiten)
        for a, b in zip(chunks, chunks[1:])
    ]
    total = {k: sum(getattr(p, k).numpy() for p in parts) for k in parts[0]._fields}
    extra = dict(num_data=total["num_data"], y_squared_sum=total["y_squared_sum"], trace_kff=total["trace_kff"])
    return AggregatedSGPR(
        gpflow.utilities.deepcopy(kernel),
        Z,
        noise,
        total["kuf_kfu"],
        total["kuf_y"],
        whitened=whiten,
        **(extra if with_bound else {}),
    )


def _close(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=RTOL, atol=0)


@pytest.mark.parametrize("whiten", [False, True])
def test_matches_pooled_sgpr(problem, whiten):
    X, Y, Z, kernel = problem
    model = _aggregated(X, Y, Z, kernel, 0.05, whiten=whiten)
    oracle = gpflow.models.SGPR((X, Y), gpflow.utilities.deepcopy(kernel), Z, noise_variance=0.05)
    Xs = np.random.default_rng(4).uniform(-3, 3, (15, 2))
    for full_cov in (False, True):
        for ours, ref in zip(model.predict_f(Xs, full_cov=full_cov), oracle.predict_f(Xs, full_cov=full_cov)):
            assert ours.shape == ref.shape
            _close(ours, ref)
    for ours, ref in zip(model.predict_y(Xs), oracle.predict_y(Xs)):
        _close(ours, ref)
    Ys = np.random.default_rng(5).normal(size=(15, 2))
    _close(model.predict_log_density((Xs, Ys)), oracle.predict_log_density((Xs, Ys)))
    _close(model.elbo(), oracle.elbo())
    _close(model.training_loss(), oracle.training_loss())


def test_bound_gradients_match_sgpr_at_fixed_statistics(problem):
    """∂ELBO/∂σ² through the aggregated form equals SGPR's (σ² does not enter the statistics)."""
    X, Y, Z, kernel = problem
    model = _aggregated(X, Y, Z, kernel, 0.05)
    oracle = gpflow.models.SGPR((X, Y), gpflow.utilities.deepcopy(kernel), Z, noise_variance=0.05)
    grads = []
    for m in (model, oracle):
        with tf.GradientTape() as tape:
            loss = m.training_loss()
        grads.append(tape.gradient(loss, m.likelihood.variance.unconstrained_variable).numpy())
    _close(grads[0], grads[1])


def test_predicts_without_bound_statistics_but_elbo_says_what_is_missing(problem):
    X, Y, Z, kernel = problem
    model = _aggregated(X, Y, Z, kernel, 0.05, with_bound=False)
    assert not model.has_bound_statistics
    assert model.predict_f(X[:3])[0].shape == (3, 2)
    with pytest.raises(ValueError, match="num_data, y_squared_sum and trace_kff"):
        model.elbo()


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(kuf_kfu=np.eye(5)), "kuf_kfu has shape"),
        (dict(kuf_y=np.zeros((5, 1))), "kuf_y has 5 rows"),
        (dict(kuf_kfu=np.triu(np.ones((12, 12)))), "symmetric"),
        (dict(kuf_y=np.full((12, 1), np.nan)), "NaN or inf"),
        (dict(kuf_y=np.zeros(12)), "rank 2"),
        (dict(noise_variance=0.0), "noise_variance must be positive"),
        (dict(num_data=10.0), "give all of num_data"),
    ],
)
def test_bad_input(problem, change, message):
    _, _, Z, kernel = problem
    args = dict(kuf_kfu=np.eye(12), kuf_y=np.zeros((12, 1)), noise_variance=0.1)
    args.update(change)
    extra = {"num_data": args.pop("num_data")} if "num_data" in args else {}
    with pytest.raises(ValueError, match=message):
        AggregatedSGPR(kernel, Z, args["noise_variance"], args["kuf_kfu"], args["kuf_y"], **extra)


def test_kernel_type_is_checked(problem):
    _, _, Z, _ = problem
    with pytest.raises(TypeError, match="gpflow.kernels.Kernel"):
        AggregatedSGPR("rbf", Z, 0.1, np.eye(12), np.zeros((12, 1)))


def test_project_to_psd_is_the_nearest_psd_matrix_and_leaves_psd_sums_alone():
    from gpflow_fed.federated.algorithms.postprocess import project_to_psd

    rng = np.random.default_rng(3)
    C = rng.normal(size=(6, 20))
    psd = C @ C.T
    np.testing.assert_array_equal(project_to_psd(psd), 0.5 * (psd + psd.T))
    noisy = psd + rng.normal(scale=30.0, size=(6, 6))  # asymmetric and indefinite, like a DP release
    sym = 0.5 * (noisy + noisy.T)
    eigenvalues = np.linalg.eigvalsh(sym)
    assert eigenvalues.min() < 0
    projected = project_to_psd(noisy)
    np.testing.assert_array_equal(projected, projected.T)
    assert np.linalg.eigvalsh(projected).min() > -1e-10
    # Frobenius distance to the PSD cone (Higham 1988): the norm of the negative eigenvalues
    np.testing.assert_allclose(
        np.linalg.norm(sym - projected), np.linalg.norm(np.minimum(eigenvalues, 0.0)), rtol=1e-10
    )
    with pytest.raises(ValueError, match="square"):
        project_to_psd(np.ones((2, 3)))
    with pytest.raises(ValueError, match="NaN"):
        project_to_psd(np.full((2, 2), np.nan))


@pytest.mark.parametrize("whiten", [False, True])
def test_scipy_on_trainable_variables_trains_the_noise_alone_like_sgpr_with_theta_and_z_fixed(problem, whiten):
    """Issue 18 item 3: the statistics are fixed at (θ, Z), so only σ² is trainable; Scipy on every trainable
    variable then reaches the σ² that SGPR on the pooled data reaches with θ and Z fixed."""
    X, Y, Z, kernel = problem
    model = _aggregated(X, Y, Z, kernel, 0.5, whiten=whiten)
    assert [id(v) for v in model.trainable_variables] == [id(model.likelihood.variance.unconstrained_variable)]
    oracle = gpflow.models.SGPR((X, Y), gpflow.utilities.deepcopy(kernel), Z, noise_variance=0.5)
    gpflow.set_trainable(oracle.kernel, False)
    gpflow.set_trainable(oracle.inducing_variable, False)
    before = float(model.training_loss())
    for m in (model, oracle):
        gpflow.optimizers.Scipy().minimize(
            m.training_loss, m.trainable_variables, options=dict(maxiter=50), compile=False
        )
    assert np.isfinite(float(model.training_loss())) and float(model.training_loss()) < before
    np.testing.assert_allclose(model.likelihood.variance.numpy(), oracle.likelihood.variance.numpy(), rtol=1e-5)
    np.testing.assert_array_equal(model.inducing_variable.Z.numpy(), Z)
    np.testing.assert_array_equal(model.kernel.lengthscales.numpy(), kernel.lengthscales.numpy())


def test_trainability_can_be_kept_for_a_parameter_container(problem):
    """FSGP's server model keeps θ and Z trainable: the clients recompute the statistics after every change."""
    _, _, Z, kernel = problem
    model = AggregatedSGPR(
        gpflow.utilities.deepcopy(kernel), Z, 0.1, np.eye(12), np.zeros((12, 1)), freeze_statistics_parameters=False
    )
    assert len(model.trainable_variables) == 4  # variance, lengthscales, Z, σ²


def test_full_output_cov_raises_not_implemented_like_sgpr(problem):
    X, Y, Z, kernel = problem
    model = _aggregated(X, Y, Z, kernel, 0.05)
    oracle = gpflow.models.SGPR((X, Y), gpflow.utilities.deepcopy(kernel), Z, noise_variance=0.05)
    for m in (model, oracle):
        with pytest.raises(NotImplementedError, match="full_output_cov"):
            m.predict_f(X[:3], full_output_cov=True)
