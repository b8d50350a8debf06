"""Local-model training for Recyclable GPs: closed-form q_k, compiled loop reused across local models."""

import gpflow
import numpy as np
import pytest
import tensorflow as tf

from gpflow_fed.data import distributed_segments
from gpflow_fed.models import LocalSVGPTrainer, export_svgp, train_local_svgp


def _data(n, seed, classify=False):
    rng = np.random.default_rng(seed)
    X = np.sort(rng.uniform(0, 2, (n, 1)), axis=0)
    F = np.sin(3 * X)
    Y = (F > 0).astype(float) if classify else F + 0.3 * rng.standard_normal(X.shape)
    return X, Y, np.linspace(0.1, 1.9, 5)[:, None]


def _kernel():
    return gpflow.kernels.SquaredExponential(variance=1.0, lengthscales=0.5)


def test_gaussian_local_model_is_the_collapsed_optimum():
    X, Y, Z = _data(60, 0)
    model = train_local_svgp(X, Y, Z, _kernel(), gpflow.likelihoods.Gaussian(0.5), maxiter=50)
    assert model.kernel.lengthscales.numpy() != pytest.approx(0.5)  # hyperparameters were trained
    # oracle: Titsias' collapsed bound at the same (Z, θ, σ²) is max_q of the SVGP ELBO, attained by q_k
    sgpr = gpflow.models.SGPR((X, Y), model.kernel, model.inducing_variable, noise_variance=model.likelihood.variance)
    np.testing.assert_allclose(model.elbo((X, Y)).numpy(), sgpr.elbo().numpy(), rtol=1e-10)
    mu, cov = sgpr.compute_qu()
    rec = export_svgp(model)
    np.testing.assert_allclose(rec.q_mu, mu.numpy(), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(rec.q_sqrt @ rec.q_sqrt.T, cov.numpy(), rtol=1e-6, atol=1e-8)
    # S_k ⪯ K_k (spec §2.4)
    K = model.kernel(rec.Z).numpy() + gpflow.config.default_jitter() * np.eye(5)
    assert np.linalg.eigvalsh(K - rec.q_sqrt @ rec.q_sqrt.T)[0] > -1e-9
    # unwhitened output: the same posterior
    raw = train_local_svgp(X, Y, Z, _kernel(), gpflow.likelihoods.Gaussian(0.5), maxiter=50, whiten=False)
    assert not raw.whiten
    Xs = np.linspace(-0.5, 2.5, 7)[:, None]
    for a, b in zip(model.predict_f(Xs), raw.predict_f(Xs)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("classify", [False, True])
def test_trainer_reuses_one_compiled_loop_and_matches_fresh_fits(classify):
    likelihood = gpflow.likelihoods.Bernoulli(invlink=tf.sigmoid) if classify else gpflow.likelihoods.Gaussian(0.5)
    trainer = LocalSVGPTrainer(_kernel(), likelihood, maxiter=30)
    parts = [_data(n, s, classify) for n, s in ((40, 1), (55, 2), (47, 3))]
    shared = [trainer.fit(*p) for p in parts]
    ((_, slot),) = trainer._slots.items()
    loops = list(slot.optimizer.compile_cache.values())  # classification: the joint loop and the q-only one
    assert len(loops) == (2 if classify else 1)
    assert all(loop.experimental_get_tracing_count() == 1 for loop in loops)  # three N_k, one trace each
    # the last fit, after two others in the same compiled loop, equals a fit by a fresh trainer
    fresh = train_local_svgp(*parts[-1], _kernel(), likelihood, maxiter=30)
    for a, b in zip(shared[-1].trainable_variables, fresh.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-7, atol=1e-9)
    untrained = LocalSVGPTrainer(_kernel(), likelihood, maxiter=0)
    for p, m in zip(parts, shared):
        assert m.num_data == p[0].shape[0]
        assert m.elbo(p[:2]).numpy() > untrained.fit(*p).elbo(p[:2]).numpy()
    assert trainer.kernel.lengthscales.numpy() == pytest.approx(0.5)  # templates untouched


def test_non_gaussian_q_is_the_optimum_for_the_returned_hyperparameters():
    """Bernoulli local fits end with q_k optimised alone for the final (Z_k, θ_k): a further q-only L-BFGS run
    gains nothing, and q_k is inside its prior (S̃ ⪯ I, which every optimum has for a log-concave likelihood).
    The joint run alone, stopped after 30 iterations, leaves q_k short of it."""
    X, Y, Z = _data(80, 4, classify=True)
    likelihood = gpflow.likelihoods.Bernoulli(invlink=tf.sigmoid)
    joint_only = gpflow.models.SVGP(_kernel(), likelihood, gpflow.inducing_variables.InducingPoints(Z), whiten=True)
    gpflow.optimizers.Scipy().minimize(
        joint_only.training_loss_closure((X, Y)), joint_only.trainable_variables, options={"maxiter": 30}
    )
    model = train_local_svgp(X, Y, Z, _kernel(), likelihood, maxiter=30)
    gains = []
    for fitted in (joint_only, model):
        before = fitted.elbo((X, Y)).numpy()
        polished = gpflow.utilities.deepcopy(fitted)
        gpflow.set_trainable(polished.kernel, False)
        gpflow.set_trainable(polished.inducing_variable, False)
        gpflow.optimizers.Scipy().minimize(
            polished.training_loss_closure((X, Y)), polished.trainable_variables, options={"maxiter": 500}
        )
        gains.append(polished.elbo((X, Y)).numpy() - before)
    assert gains[0] > 1e-2  # the joint run alone stopped short of q's optimum
    assert gains[1] < 1e-4
    S = model.q_sqrt.numpy()[0] @ model.q_sqrt.numpy()[0].T
    assert np.linalg.eigvalsh(S).max() < 1.0


def test_bad_input():
    X, Y, Z = _data(10, 0)
    with pytest.raises(ValueError, match="maxiter"):
        LocalSVGPTrainer(maxiter=-1)
    with pytest.raises(TypeError, match="kernel"):
        LocalSVGPTrainer(kernel="rbf")
    with pytest.raises(TypeError, match="likelihood"):
        LocalSVGPTrainer(likelihood=1.0)
    with pytest.raises(ValueError, match="no data"):
        train_local_svgp(X[:0], Y[:0], Z)
    with pytest.raises(ValueError, match="NaN"):
        train_local_svgp(np.where(X > 1, np.nan, X), Y, Z)


def _collapsing_partition():
    """Partition [2.4, 2.5] of the paper's distributed 10k data (seed 0): the plain fit explains it as pure noise."""
    X, Y = distributed_segments(seed=0).clients[24]
    return X, Y, np.linspace(X.min(), X.max(), 3)[:, None]


def _linear_window():
    """A clean linear trend on a window of width 0.1: nothing in it identifies a lengthscale, the fit drifts long."""
    rng = np.random.default_rng(0)
    X = np.sort(rng.uniform(1.0, 1.1, (100, 1)), axis=0)
    return X, 20.0 * X + 0.1 * rng.standard_normal(X.shape), np.linspace(1.0, 1.1, 3)[:, None]


def _start_kernel():
    return gpflow.kernels.SquaredExponential(variance=5.0, lengthscales=0.3)


def _plain(**checks):
    return LocalSVGPTrainer(_start_kernel(), gpflow.likelihoods.Gaussian(1.0), **checks)


def test_collapsed_fit_is_refitted_with_the_initial_kernel():
    X, Y, Z = _collapsing_partition()
    plain = _plain(collapse_snr=0.0, max_lengthscale_ratio=0.0)
    collapsed = plain.fit(X, Y, Z)
    assert plain.num_refitted == 0
    assert collapsed.kernel.variance.numpy() < 1e-3 * collapsed.likelihood.variance.numpy()  # it does collapse
    trainer = _plain(max_lengthscale_ratio=0.0)  # the signal-to-noise check alone
    refit = trainer.fit(X, Y, Z)
    assert trainer.num_refitted == 1
    assert refit.kernel.variance.numpy() == pytest.approx(5.0) and refit.kernel.lengthscales.numpy() == pytest.approx(
        0.3
    )
    assert refit.likelihood.variance.numpy() == pytest.approx(4.0, rel=0.3)  # σ² still learnt
    # the collapsed model claims f ≈ 0 with ≈ 0 variance far from its window; the refitted one falls back to its prior
    far = np.array([[0.5], [4.5]])
    assert np.all(collapsed.predict_f(far)[1].numpy() < 1e-3)
    np.testing.assert_allclose(refit.predict_f(far)[1].numpy(), 5.0, rtol=1e-6)


def test_unidentifiable_lengthscale_is_refitted_with_the_initial_kernel():
    X, Y, Z = _linear_window()
    plain = _plain(collapse_snr=0.0, max_lengthscale_ratio=0.0)
    assert plain.fit(X, Y, Z).kernel.lengthscales.numpy() > 10 * 0.1  # drifted beyond 10× the window
    assert plain.num_refitted == 0
    trainer = _plain(collapse_snr=0.0)  # the lengthscale check alone
    refit = trainer.fit(X, Y, Z)
    assert trainer.num_refitted == 1
    assert refit.kernel.lengthscales.numpy() == pytest.approx(0.3)
    # a looser ratio leaves it alone
    assert _plain(collapse_snr=0.0, max_lengthscale_ratio=1e6).fit(X, Y, Z).kernel.lengthscales.numpy() > 1.0


def test_healthy_fit_is_unchanged_by_the_checks():
    parts = [_data(n, s) for n, s in ((40, 1), (55, 2))]
    checked = LocalSVGPTrainer(_kernel(), gpflow.likelihoods.Gaussian(0.5), maxiter=30)
    unchecked = LocalSVGPTrainer(
        _kernel(), gpflow.likelihoods.Gaussian(0.5), maxiter=30, collapse_snr=0, max_lengthscale_ratio=0
    )
    for p in parts:
        a, b = checked.fit(*p), unchecked.fit(*p)
        for u, v in zip(a.trainable_variables, b.trainable_variables):
            np.testing.assert_array_equal(u.numpy(), v.numpy())
    assert checked.num_refitted == 0


@pytest.mark.parametrize("name", ["collapse_snr", "max_lengthscale_ratio"])
@pytest.mark.parametrize("bad, error", [(-1e-3, ValueError), (float("nan"), ValueError), ("0.1", TypeError)])
def test_check_arguments_are_validated(name, bad, error):
    with pytest.raises(error, match=name):
        LocalSVGPTrainer(**{name: bad})
    X, Y, Z = _data(10, 0)
    with pytest.raises(error, match=name):
        train_local_svgp(X, Y, Z, **{name: bad})
