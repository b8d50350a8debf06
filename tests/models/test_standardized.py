"""StandardizedModel: a model trained on standardised data, used with raw inputs and the target's units."""

import copy

import gpflow
import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

from gpflow_fed.data import Standardizer
from gpflow_fed.models import StandardizedModel

RNG = np.random.default_rng(0)
X_RAW = RNG.uniform(1900, 2000, (30, 2))
Y_RAW = np.c_[300 + 0.5 * (X_RAW[:, :1] - 1950) + 2 * RNG.normal(size=(30, 1)), 7 + RNG.normal(size=(30, 1))]
SCALER = Standardizer.from_data(X_RAW, Y_RAW)


def _model():
    Xs, Ys = SCALER.transform(X_RAW, Y_RAW)
    inner = gpflow.models.GPR((Xs, Ys), gpflow.kernels.SquaredExponential(lengthscales=[1.0, 1.0]), noise_variance=0.1)
    return inner, StandardizedModel(inner, SCALER)


X_NEW = np.array([[1910.0, 1950.0], [1985.5, 1999.0], [2010.0, 1900.0]])


def test_predictions_are_the_inner_ones_mapped_to_the_units():
    inner, model = _model()
    for name in ("predict_f", "predict_y"):
        m_in, v_in = (t.numpy() for t in getattr(inner, name)(SCALER.transform(X_NEW)))
        mean, var = (t.numpy() for t in getattr(model, name)(X_NEW))
        np.testing.assert_allclose(mean, SCALER.Y_mean + SCALER.Y_std * m_in, rtol=1e-13)
        np.testing.assert_allclose(var, SCALER.Y_std**2 * v_in, rtol=1e-13)
    _, cov = model.predict_f(X_NEW, full_cov=True)  # [P, N, N]
    _, cov_in = inner.predict_f(SCALER.transform(X_NEW), full_cov=True)
    np.testing.assert_allclose(cov.numpy(), (SCALER.Y_std**2)[:, None, None] * cov_in.numpy(), rtol=1e-13)


def test_log_density_includes_the_jacobian():
    """log p(y | x) in the target's units is the density of N(mean, var) of predict_y, summed over outputs."""
    _, model = _model()
    Y_new = np.array([[280.0, 6.0], [320.0, 8.5], [350.0, 7.0]])
    mean, var = (t.numpy() for t in model.predict_y(X_NEW))
    expected = stats.norm(mean, np.sqrt(var)).logpdf(Y_new).sum(axis=1)
    np.testing.assert_allclose(model.predict_log_density((X_NEW, Y_new)).numpy(), expected, rtol=1e-12)


def test_gpflow_idioms(tmp_path):
    inner, model = _model()
    before = model.training_loss().numpy()
    gpflow.optimizers.Scipy().minimize(model.training_loss, model.trainable_variables, options=dict(maxiter=5))
    assert model.training_loss().numpy() < before  # trains the inner model (standardised objective)
    twin = gpflow.utilities.deepcopy(model)
    for a, b in zip(twin.predict_y(X_NEW), model.predict_y(X_NEW)):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    frozen = gpflow.utilities.freeze(model)
    np.testing.assert_array_equal(frozen.predict_y(X_NEW)[0].numpy(), model.predict_y(X_NEW)[0].numpy())
    assert not {v.ref() for v in [model.X_mean, model.Y_std]} & {v.ref() for v in model.trainable_variables}
    # the moments are part of a checkpoint
    other = StandardizedModel(copy.deepcopy(inner), Standardizer(np.zeros(2), np.ones(2), np.zeros(2), np.ones(2)))
    path = tf.train.Checkpoint(model=model).write(str(tmp_path / "ckpt"))
    tf.train.Checkpoint(model=other).read(path).assert_existing_objects_matched()
    np.testing.assert_array_equal(other.Y_std.numpy(), SCALER.Y_std)
    np.testing.assert_allclose(other.predict_y(X_NEW)[0].numpy(), model.predict_y(X_NEW)[0].numpy(), rtol=1e-12)
    np.testing.assert_array_equal(model.standardizer.X_std, SCALER.X_std)


@pytest.mark.parametrize(
    "args, error, match",
    [
        (("not a model", SCALER), TypeError, "wraps a gpflow.models.GPModel"),
        ((None, Standardizer(np.zeros(2), np.zeros(2), np.zeros(2), np.ones(2))), ValueError, "X_std must be finite"),
        ((None, Standardizer(np.zeros(2), np.ones(2), np.zeros(2), np.array([1.0, np.nan]))), ValueError, "Y_std"),
    ],
)
def test_bad_arguments(args, error, match):
    inner, _ = _model()
    with pytest.raises(error, match=match):
        StandardizedModel(inner if args[0] is None else args[0], args[1])
