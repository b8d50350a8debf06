"""URK: Monte Carlo recovery of the kernels of Theorems 3–5, PSD (Theorem 6), stateless seeds, GPflow models."""

from __future__ import annotations

import dataclasses

import gpflow
import numpy as np
import pytest
import tensorflow as tf
from gpflow.keras import tf_keras

from gpflow_fed.kernels import URK, DeepKernel, FourierFeatureMap

RNG = np.random.default_rng(0)
X_SMALL = RNG.uniform(-0.4, 0.4, size=(6, 2))


def _per_sample_products(kernel: URK, X: np.ndarray) -> np.ndarray:
    """u_i(x, x') = z_{ω_i}(x)ᵀ z_{ω_i}(x') for each sample i: [m, N, N]."""
    z = kernel.feature_map(kernel.omega(), kernel.extract(X)).numpy()  # [N, m, d]
    return np.einsum("aid,bid->iab", z, z)


def _check_within_error_bars(kernel: URK, X: np.ndarray, exact: np.ndarray, sigmas: float = 4.0) -> None:
    u = _per_sample_products(kernel, X)
    m = u.shape[0]
    mean, sem = u.mean(axis=0), u.std(axis=0, ddof=1) / np.sqrt(m)
    # eq. 3.2 divides by m − 1: the kernel is exactly m/(m−1) times the sample mean
    np.testing.assert_allclose(kernel.K(X).numpy(), mean * m / (m - 1), rtol=1e-12, atol=1e-12)
    assert np.all(np.abs(mean - exact) <= sigmas * sem + 1e-12), np.max(np.abs(mean - exact) / (sem + 1e-300))


@pytest.mark.parametrize("m", [10, 100, 1000, 10000])
def test_fourier_default_recovers_se_within_error_bars(m: int) -> None:
    kernel = URK(2, num_samples=m, seed=7)
    exact = gpflow.kernels.SquaredExponential(variance=1.0, lengthscales=1.0).K(X_SMALL * 5).numpy()
    _check_within_error_bars(kernel, X_SMALL * 5, exact)


def test_fourier_error_shrinks_like_one_over_sqrt_m() -> None:
    X = X_SMALL * 5
    exact = gpflow.kernels.SquaredExponential().K(X).numpy()
    errors = [np.max(np.abs(URK(2, num_samples=m, seed=3, scaling="m").K(X).numpy() - exact)) for m in (100, 10000)]
    assert errors[1] < errors[0] and errors[1] < 4 / np.sqrt(10000) * 2


def test_unbiased_scaling_and_lengthscales() -> None:
    kernel = URK(2, num_samples=20000, seed=11, scaling="m", feature_map_options={"lengthscales": [0.7, 2.0]})
    exact = gpflow.kernels.SquaredExponential(lengthscales=[0.7, 2.0]).K(X_SMALL * 4).numpy()
    u = _per_sample_products(kernel, X_SMALL * 4)
    np.testing.assert_allclose(kernel.K(X_SMALL * 4).numpy(), u.mean(axis=0), rtol=1e-12)
    sem = u.std(axis=0, ddof=1) / np.sqrt(u.shape[0])
    assert np.all(np.abs(u.mean(axis=0) - exact) <= 4 * sem + 1e-12)


@pytest.mark.parametrize(
    "nu, reference", [(0.5, gpflow.kernels.Matern12), (1.5, gpflow.kernels.Matern32), (2.5, gpflow.kernels.Matern52)]
)
def test_student_t_frequencies_recover_matern(nu: float, reference: type) -> None:
    kernel = URK(
        2, num_samples=20000, seed=5, feature_map_options={"spectral": "student_t", "nu": nu, "lengthscales": 1.3}
    )
    _check_within_error_bars(kernel, X_SMALL * 5, reference(lengthscales=1.3).K(X_SMALL * 5).numpy())


def test_exponential_map_theorem_4() -> None:
    kernel = URK(2, num_samples=20000, seed=2, feature_map="exponential")
    s = X_SMALL[:, None, :] + X_SMALL[None, :, :]
    _check_within_error_bars(kernel, X_SMALL, np.exp(0.5 * np.sum(s**2, axis=-1)))


@pytest.mark.parametrize("degree, offset", [(2, 1.0), (3, 0.5)])
def test_polynomial_map_theorem_5(degree: int, offset: float) -> None:
    kernel = URK(
        2, num_samples=40000, seed=4, feature_map="polynomial", feature_map_options={"degree": degree, "offset": offset}
    )
    exact = (X_SMALL @ X_SMALL.T + offset) ** degree
    _check_within_error_bars(kernel, X_SMALL, exact)


def test_stateless_seed_rebuilds_identical_features() -> None:
    X = RNG.normal(size=(5, 2))
    a, b, c = URK(2, 30, seed=9), URK(2, 30, seed=9), URK(2, 30, seed=10)
    np.testing.assert_array_equal(a.features(X).numpy(), b.features(X).numpy())
    assert not np.allclose(a.features(X).numpy(), c.features(X).numpy())
    copy = gpflow.utilities.deepcopy(a)
    np.testing.assert_array_equal(a.K(X).numpy(), copy.K(X).numpy())


def _random_constructions() -> list:
    gpflow_float = gpflow.default_float()
    net = tf_keras.Sequential([tf_keras.layers.Dense(6, activation="tanh"), tf_keras.layers.Dense(3)])
    shifter = tf_keras.Sequential([tf_keras.layers.Dense(3, activation="tanh")])
    inner = tf_keras.Sequential([tf_keras.layers.Dense(4, activation="relu", dtype=gpflow_float)])

    def replicate(omega: tf.Tensor, F: tf.Tensor) -> tf.Tensor:  # Fig. 3.2: noisy replicas of x through a net
        m = tf.shape(omega)[0]
        noisy = F[:, None, :] * (1.0 + 0.3 * omega[None, :, :])  # [N, m, D]
        out = inner(tf.reshape(noisy, [-1, 2]))
        return tf.reshape(out, [tf.shape(F)[0], m, 4])

    return [
        URK(2, 50, seed=1, feature_extractor=net, distribution_shifter=shifter),
        URK(2, 50, seed=2, feature_map="exponential"),
        URK(2, 50, seed=3, feature_map="polynomial", feature_map_options={"degree": 4}),
        URK(2, 50, seed=4, feature_map=replicate, feature_map_options={"omega_dim": 2, "output_dim": 4}),
    ]


def test_theorem_6_random_constructions_are_psd() -> None:
    X = RNG.normal(size=(40, 2))
    for kernel in _random_constructions():
        K = kernel.K(X).numpy()
        np.testing.assert_allclose(K, K.T, atol=1e-12)
        eig = np.linalg.eigvalsh(K)
        assert eig.min() >= -1e-9 * max(1.0, eig.max()), (kernel.feature_map, eig.min())
        np.testing.assert_allclose(kernel.K_diag(X).numpy(), np.diag(K), rtol=1e-10)
        assert kernel.features(X).shape == (40, kernel.num_features)


def test_float32_extractor_output_cast_to_default_float() -> None:
    net = tf_keras.Sequential([tf_keras.layers.Dense(3, dtype="float32")])
    kernel = URK(2, 10, feature_extractor=net)
    assert kernel.features(RNG.normal(size=(4, 2))).dtype == gpflow.default_float()


def test_urk_inside_stock_gpr_sgpr_svgp() -> None:
    X = RNG.uniform(-3, 3, size=(25, 1))
    Y = np.sin(X) + 0.1 * RNG.normal(size=X.shape)
    kernel = URK(1, 40, seed=0)
    gpr = gpflow.models.GPR((X, Y), kernel, noise_variance=0.1)
    sgpr = gpflow.models.SGPR((X, Y), kernel, inducing_variable=X.copy(), noise_variance=0.1)
    # Z = X: the Titsias bound's trace term vanishes and the bound equals the exact marginal likelihood, up to
    # the effect of GPflow's 1e-6 jitter on Kuu
    np.testing.assert_allclose(sgpr.elbo().numpy(), gpr.log_marginal_likelihood().numpy(), atol=1e-4)
    rng = np.random.default_rng(4)
    q = dict(q_mu=rng.normal(size=(10, 1)), q_sqrt=np.tril(0.3 * rng.normal(size=(10, 10)))[None] + 0.5 * np.eye(10))
    svgp = gpflow.models.SVGP(kernel, gpflow.likelihoods.Gaussian(0.1), X[:10].copy(), **q)
    with tf.GradientTape() as tape:
        loss = -svgp.elbo((X, Y))
    grads = tape.gradient(loss, kernel.trainable_variables)
    assert np.isfinite(loss.numpy()) and all(g is not None for g in grads)
    # oracle: K = φφᵀ, so SVGP with a linear kernel on the explicit features φ(X), φ(Z) has the same ELBO
    phi_X, phi_Z = kernel.features(X).numpy(), kernel.features(X[:10]).numpy()
    linear = gpflow.models.SVGP(gpflow.kernels.Linear(variance=1.0), gpflow.likelihoods.Gaussian(0.1), phi_Z, **q)
    np.testing.assert_allclose(-loss.numpy(), linear.elbo((phi_X, Y)).numpy(), rtol=1e-10)


def test_extractor_weights_receive_gradients() -> None:
    X = RNG.normal(size=(10, 2))
    Y = RNG.normal(size=(10, 1))
    net = tf_keras.Sequential([tf_keras.layers.Dense(4, activation="tanh")])
    kernel = URK(2, 20, feature_extractor=net, distribution_shifter=tf_keras.Sequential([tf_keras.layers.Dense(4)]))
    gpr = gpflow.models.GPR((X, Y), kernel, noise_variance=0.5)
    with tf.GradientTape() as tape:
        loss = gpr.training_loss()
    grads = tape.gradient(loss, gpr.trainable_variables)
    assert len(grads) >= 6 and all(g is not None and np.all(np.isfinite(g.numpy())) for g in grads)


def test_deep_kernel_equals_base_kernel_on_features() -> None:
    net = tf_keras.Sequential([tf_keras.layers.Dense(3, dtype=gpflow.default_float())])
    kernel = DeepKernel(gpflow.kernels.Matern32(), net, input_dim=2)
    X = RNG.normal(size=(5, 2))
    F = net(X).numpy()
    np.testing.assert_allclose(kernel.K(X).numpy(), gpflow.kernels.Matern32().K(F).numpy(), rtol=1e-12)


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="num_samples"):
        URK(2, num_samples=1)
    with pytest.raises(ValueError, match="unknown feature map"):
        URK(2, feature_map="laplace")
    with pytest.raises(TypeError, match="feature_map"):
        URK(2, feature_map=3)
    with pytest.raises(ValueError, match="rank 2"):
        URK(2, feature_extractor=tf_keras.Sequential([tf_keras.layers.Dense(4), tf_keras.layers.Reshape((2, 2))]))
    with pytest.raises(TypeError, match="floats"):
        URK(2, feature_extractor=tf_keras.Sequential([tf_keras.layers.Lambda(lambda x: tf.cast(x, tf.int32))]))
    with pytest.raises(ValueError, match="distribution_shifter"):
        URK(2, feature_map="polynomial", distribution_shifter=tf_keras.Sequential([tf_keras.layers.Dense(3)]))
    with pytest.raises(ValueError, match="same shape"):
        URK(2, distribution_shifter=tf_keras.Sequential([tf_keras.layers.Dense(5)]))
    with pytest.raises(ValueError, match="variance"):
        URK(2, variance=0.0)
    with pytest.raises(ValueError, match="lengthscales"):
        FourierFeatureMap(lengthscales=-1.0)
    with pytest.raises(ValueError, match="omega_dim"):
        URK(2, feature_map=lambda w, f: f)
    with pytest.raises(ValueError, match="seed"):
        URK(2, seed=-1)
    fourier = lambda w, f: tf.stack([tf.cos(f @ tf.transpose(w)), tf.sin(f @ tf.transpose(w))], axis=-1)  # noqa: E731
    with pytest.raises(ValueError, match=r"\[N, m, d\]"):
        URK(2, 5, feature_map=fourier, feature_map_options={"omega_dim": 2, "output_dim": 3})


def test_callable_module_feature_map_is_tracked() -> None:
    class Scaled(gpflow.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = gpflow.Parameter(1.5)

        def __call__(self, omega: tf.Tensor, F: tf.Tensor) -> tf.Tensor:
            proj = self.scale * tf.linalg.matmul(F, omega, transpose_b=True)
            return tf.stack([tf.cos(proj), tf.sin(proj)], axis=-1)

    kernel = URK(2, 20, seed=1, feature_map=Scaled(), feature_map_options={"omega_dim": 2, "output_dim": 2})
    assert any(v is kernel.feature_map.function.scale.unconstrained_variable for v in kernel.trainable_variables)
    X = RNG.normal(size=(4, 2))
    # scale·ω with ω ~ N(0, I) is the Fourier map with lengthscale 1/scale
    reference = URK(2, 20, seed=1, feature_map_options={"lengthscales": 1 / 1.5})
    np.testing.assert_allclose(kernel.K(X).numpy(), reference.K(X).numpy(), rtol=1e-12)


@pytest.mark.parametrize("feature_map", ["fourier", "polynomial"])
def test_batch_inputs_like_stock_kernels(feature_map: str) -> None:
    """Issue 18 item 8: ``[B, N, D]`` inputs give the stacked Gram matrices, as GPflow's kernels do."""
    kernel = URK(2, 20, feature_map=feature_map, seed=1)
    X, X2 = RNG.normal(size=(3, 4, 2)), RNG.normal(size=(5, 2))
    K, K_cross, K_diag = kernel(X), kernel(X, X2), kernel(X, full_cov=False)
    assert K.shape == (3, 4, 4) and K_cross.shape == (3, 4, 5) and K_diag.shape == (3, 4)
    for b in range(3):
        np.testing.assert_allclose(K[b].numpy(), kernel(X[b]).numpy(), rtol=1e-12)
        np.testing.assert_allclose(K_cross[b].numpy(), kernel(X[b], X2).numpy(), rtol=1e-12)
        np.testing.assert_allclose(K_diag[b].numpy(), kernel(X[b], full_cov=False).numpy(), rtol=1e-12)
    stock = gpflow.kernels.SquaredExponential()
    assert kernel(X, X[:2]).shape == stock(X, X[:2]).shape == (3, 4, 2, 4)


def test_follows_its_parameters_dtype() -> None:
    """A float32 URK stays float32 when the default float is float64 at call time (it cast to the default)."""
    config = dataclasses.replace(gpflow.config.config(), float=np.float32)
    with gpflow.config.as_context(config):
        kernel = URK(1, 10, seed=0)
    X = np.linspace(0, 1, 4, dtype=np.float32)[:, None]
    assert gpflow.default_float() == np.float64
    K = kernel(X)
    assert K.dtype == tf.float32 and kernel(X, full_cov=False).dtype == tf.float32
    with gpflow.config.as_context(config):
        expected = URK(1, 10, seed=0)(X).numpy()
    np.testing.assert_array_equal(K.numpy(), expected)
