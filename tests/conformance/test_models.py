"""GPflow conformance of every public model (issue 18): the GPflow machinery users drive models with works
on them exactly as on GPflow's own models."""

import copy

import gpflow
import numpy as np
import pytest
import tensorflow as tf
from scipy.stats import norm

from gpflow.models.training_mixins import ExternalDataTrainingLossMixin

from .cases import XS, YS, D, X, Y


def _predict(model, full_cov=False):
    return [t.numpy() for t in model.predict_f(XS, full_cov=full_cov)]


def _loss(model):
    """The model's training loss as a closure (models trained on external data get the conformance data)."""
    if isinstance(model, ExternalDataTrainingLossMixin):
        return model.training_loss_closure((X, Y), compile=False)
    return model.training_loss


def _assert_same(a, b, rtol=1e-10, atol=1e-12):
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)


def test_print_summary(case, capsys):
    model = case.build(case.value)
    gpflow.utilities.print_summary(model)
    out = capsys.readouterr().out
    assert case.path.lstrip(".").split(".")[0] in out and type(model).__name__ in out


def test_read_values_multiple_assign_round_trip(case):
    model, other = case.build(case.value), case.build(case.changed)
    values = gpflow.utilities.read_values(other)
    assert case.path in values
    gpflow.utilities.multiple_assign(model, values)
    for key, value in gpflow.utilities.read_values(model).items():
        np.testing.assert_allclose(value, values[key], rtol=1e-12)
    _assert_same(_predict(model), _predict(other))


@pytest.mark.parametrize("predicted", [False, True], ids=["before-predicting", "after-predicting"])
def test_deepcopy_and_freeze(case, predicted):
    model = case.build(case.value)
    if predicted:
        model.predict_f(XS)
    expected = _predict(model)
    for duplicate in (copy.deepcopy(model), gpflow.utilities.deepcopy(model), gpflow.utilities.freeze(model)):
        _assert_same(_predict(duplicate), expected)


def test_checkpoint_restores_the_parameters(case, tmp_path):
    model = case.build(case.value)
    expected = _predict(model)
    checkpoint = tf.train.Checkpoint(model=model)
    saved = checkpoint.write(str(tmp_path / "ckpt"))
    gpflow.utilities.multiple_assign(model, {case.path: np.asarray(case.changed)})
    assert not np.allclose(_predict(model)[1], expected[1])
    checkpoint.read(saved).assert_consumed()
    _assert_same(_predict(model), expected)


def test_saved_model_with_a_compiled_predict(case, tmp_path):
    model = case.build(case.value)
    model.compiled_predict_f = tf.function(
        lambda Xnew: model.predict_f(Xnew, full_cov=False),
        input_signature=[tf.TensorSpec(shape=[None, D], dtype=gpflow.default_float())],
    )
    expected = _predict(model)
    tf.saved_model.save(model, str(tmp_path / "saved"))
    loaded = tf.saved_model.load(str(tmp_path / "saved"))
    _assert_same([t.numpy() for t in loaded.compiled_predict_f(XS)], expected)


def test_scipy_on_trainable_variables(case):
    model = case.build(case.value)
    loss = _loss(model)
    before = float(loss())
    result = gpflow.optimizers.Scipy().minimize(loss, model.trainable_variables, options=dict(maxiter=5))
    after = float(loss())
    assert np.isfinite(after) and after < before and np.isclose(after, result.fun)
    assert all(np.all(np.isfinite(t)) for t in _predict(model))


def test_predictions_follow_a_parameter_change(case):
    """After predicting (eager and compiled), a changed parameter gives a freshly built model's predictions."""
    model = case.build(case.value)
    compiled = tf.function(model.predict_f)
    model.predict_f(XS)
    compiled(XS)
    gpflow.utilities.multiple_assign(model, {case.path: np.asarray(case.changed)})
    fresh = _predict(case.build(case.changed))
    _assert_same(_predict(model), fresh)
    _assert_same([t.numpy() for t in compiled(XS)], fresh)


def test_full_cov_diagonal_equals_marginals(case):
    model = case.build(case.value)
    mean, var = _predict(model)
    mean_full, cov = _predict(model, full_cov=True)
    assert cov.shape == (var.shape[1], len(XS), len(XS))
    _assert_same([mean_full, np.stack([np.diag(c) for c in cov], axis=1)], [mean, var])
    np.testing.assert_allclose(cov, np.swapaxes(cov, 1, 2), rtol=1e-10, atol=1e-12)


def test_predict_y_and_log_density_agree_with_predict_f(case):
    """Independent oracle for Gaussian likelihoods: y* ~ N(μ_f, σ²_f + σ²) and its log density."""
    model = case.build(case.value)
    mean, var = _predict(model)
    noise = float(model.likelihood.variance.numpy())
    _assert_same([t.numpy() for t in model.predict_y(XS)], [mean, var + noise])
    Y = np.tile(YS, (1, mean.shape[1]))
    expected = norm.logpdf(Y, mean, np.sqrt(var + noise)).sum(axis=1)
    np.testing.assert_allclose(model.predict_log_density((XS, Y)).numpy(), expected, rtol=1e-10)


def test_compiled_equals_eager(case):
    model = case.build(case.value)
    _assert_same([t.numpy() for t in tf.function(model.predict_f)(XS)], _predict(model))
    loss = _loss(model)
    np.testing.assert_allclose(tf.function(loss)().numpy(), loss().numpy(), rtol=1e-10)


def test_gradients_are_finite(case):
    model = case.build(case.value)
    assert model.trainable_variables
    with tf.GradientTape() as tape:
        loss = _loss(model)()
    grads = tape.gradient(loss, model.trainable_variables)
    assert all(g is not None and np.all(np.isfinite(g.numpy())) for g in grads)


def test_full_output_cov_is_supported_or_not_implemented_like_gpflow(case):
    """Issue 18 item 7: ``full_output_cov=True`` either raises ``NotImplementedError`` (as GPflow's GPR/SGPR)
    or returns ``[N, P, P]`` output covariances whose diagonals are the marginals (as GPflow's SVGP)."""
    model = case.build(case.value)
    mean, var = _predict(model)
    try:
        mean_full, cov = (t.numpy() for t in model.predict_f(XS, full_output_cov=True))
    except NotImplementedError as exc:
        assert "full_output_cov" in str(exc)
        return
    assert cov.shape == (len(XS), var.shape[1], var.shape[1])
    _assert_same([mean_full, np.diagonal(cov, axis1=1, axis2=2)], [mean, var])
