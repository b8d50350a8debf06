"""GPflow's kernel checks on every URK variant (issue 18): symmetry, PSD, K_diag, batch shapes, active_dims,
sums and products, and the module machinery (deepcopy, freeze, read_values, Checkpoint, compiled = eager)."""

import copy

import gpflow
import numpy as np
import pytest
import tensorflow as tf
from gpflow.keras import tf_keras

from gpflow_fed.kernels import URK

D = 2
RNG = np.random.default_rng(7)
X = RNG.uniform(-1, 1, (9, D))
X2 = RNG.uniform(-1, 1, (4, D))
XB = RNG.uniform(-1, 1, (3, 5, D))


def _extractor():
    return tf_keras.Sequential([tf_keras.layers.Dense(3, activation="tanh", dtype=gpflow.default_float())])


def _shifter():
    return tf_keras.Sequential([tf_keras.layers.Dense(D, dtype=gpflow.default_float())])


VARIANTS = {
    "fourier": lambda **kw: URK(D, 12, seed=1, feature_map_options={"lengthscales": [0.6, 0.9]}, **kw),
    "fourier-student-t": lambda **kw: URK(
        D, 12, seed=1, feature_map_options={"spectral": "student_t", "nu": 1.5}, **kw
    ),
    "fourier-m-scaling": lambda **kw: URK(D, 12, seed=1, scaling="m", **kw),
    "exponential": lambda **kw: URK(D, 12, feature_map="exponential", seed=1, **kw),
    "polynomial": lambda **kw: URK(
        D, 12, feature_map="polynomial", seed=1, feature_map_options={"degree": 2, "offset": 0.5}, **kw
    ),
    "deep": lambda **kw: URK(D, 12, seed=1, feature_extractor=_extractor(), **kw),
    "shifted": lambda **kw: URK(D, 12, seed=1, distribution_shifter=_shifter(), **kw),
}


@pytest.fixture(params=sorted(VARIANTS))
def make(request):
    def build(**kw):
        tf_keras.utils.set_random_seed(0)  # identical network weights on every construction
        return VARIANTS[request.param](**kw)

    return build


def test_symmetric_psd_and_diagonal(make):
    kernel = make()
    K = kernel(X).numpy()
    np.testing.assert_allclose(K, K.T, rtol=1e-12, atol=1e-14)
    assert np.linalg.eigvalsh(K).min() >= -1e-10 * np.abs(K).max()
    np.testing.assert_allclose(kernel(X, full_cov=False).numpy(), np.diag(K), rtol=1e-12)
    np.testing.assert_allclose(kernel(X, X).numpy(), K, rtol=1e-12)
    np.testing.assert_allclose(kernel(X, X2).numpy(), kernel(X2, X).numpy().T, rtol=1e-12)
    phi = kernel.features(X).numpy()
    np.testing.assert_allclose(phi @ phi.T, K, rtol=1e-12)


def test_batch_shapes_like_stock_kernels(make):
    kernel, stock = make(), gpflow.kernels.SquaredExponential()
    for args in [(XB,), (XB, X2), (X, XB), (XB, XB)]:
        assert kernel(*args).shape == stock(*args).shape
    assert kernel(XB, full_cov=False).shape == stock(XB, full_cov=False).shape
    np.testing.assert_allclose(kernel(XB, X2).numpy()[1], kernel(XB[1], X2).numpy(), rtol=1e-12)


def test_active_dims(make):
    """A URK on column 1 of [N, 3] inputs equals the same kernel on that column alone."""
    full = np.concatenate([X[:, :1], X[:, 1:2], X[:, :1] ** 2], axis=1)
    on_column = URK(1, 12, seed=1, active_dims=[1])
    alone = URK(1, 12, seed=1)
    np.testing.assert_allclose(on_column(full).numpy(), alone(X[:, 1:2]).numpy(), rtol=1e-12)
    kernel = make(active_dims=[0, 2])
    np.testing.assert_allclose(kernel(full).numpy(), make()(full[:, [0, 2]]).numpy(), rtol=1e-12)


def test_sums_and_products(make):
    kernel, other = make(), gpflow.kernels.Matern32(lengthscales=0.5)
    K, K_other = kernel(X).numpy(), other(X).numpy()
    np.testing.assert_allclose((kernel + other)(X).numpy(), K + K_other, rtol=1e-12)
    np.testing.assert_allclose((kernel * other)(X).numpy(), K * K_other, rtol=1e-12)
    np.testing.assert_allclose((kernel + other)(X, full_cov=False).numpy(), np.diag(K + K_other), rtol=1e-12)
    gpr = gpflow.models.GPR((X, np.sin(X[:, :1])), kernel * other, noise_variance=0.1)
    assert np.isfinite(gpr.log_marginal_likelihood().numpy())


def test_module_machinery(make, tmp_path):
    kernel = make()
    expected = kernel(X).numpy()
    for duplicate in (copy.deepcopy(kernel), gpflow.utilities.deepcopy(kernel), gpflow.utilities.freeze(kernel)):
        np.testing.assert_allclose(duplicate(X).numpy(), expected, rtol=1e-12)
    values = gpflow.utilities.read_values(kernel)
    assert ".variance" in values
    checkpoint = tf.train.Checkpoint(kernel=kernel)
    saved = checkpoint.write(str(tmp_path / "ckpt"))
    kernel.variance.assign(3.0)
    np.testing.assert_allclose(kernel(X).numpy(), 3.0 * expected, rtol=1e-12)
    checkpoint.read(saved).assert_consumed()
    np.testing.assert_allclose(kernel(X).numpy(), expected, rtol=1e-12)
    other = make()
    other.variance.assign(2.0)
    gpflow.utilities.multiple_assign(other, values)
    np.testing.assert_allclose(other(X).numpy(), expected, rtol=1e-12)


def test_compiled_equals_eager_and_gradients_are_finite(make):
    kernel = make()
    np.testing.assert_allclose(tf.function(kernel.K)(X, X2).numpy(), kernel.K(X, X2).numpy(), rtol=1e-12)
    gpr = gpflow.models.GPR((X, np.cos(X[:, :1])), kernel, noise_variance=0.1)
    with tf.GradientTape() as tape:
        loss = gpr.training_loss()
    grads = tape.gradient(loss, gpr.trainable_variables)
    assert len(grads) >= 2 and all(g is not None and np.all(np.isfinite(g.numpy())) for g in grads)
