"""Random basis functions ``z_ω(x) = g(ω, x)`` of the Unifying Random Kernel (thesis §3.1.1).

A feature map owns two things:

* a *base draw* of ``m`` random vectors ω, made once with ``tf.random.stateless_*`` from an explicit seed, so
  every party that knows the seed rebuilds the same ω (nothing is shipped);
* the function ``g``: ``(ω: [m, Q], F: [N, D_f]) → [N, m, d]``, d features per sample.

Maps whose ω is continuous accept a *distribution shifter* h (a ``tf_keras`` model ``[m, Q] → [m, Q]``)
applied to the base draw, ω = h(ω₀), which lets a kernel learn its spectral distribution (§3.1.2).

The maps (ω's distribution; g(ω, x); the kernel recovered as m → ∞):

* Fourier, Gaussian: ω ~ N(0, I) / ℓ; ``[cos ωᵀx, sin ωᵀx]``; SE (Thm 3).
* Fourier, Student: ω ~ t_{2ν}(0, I/ℓ²); ``[cos ωᵀx, sin ωᵀx]``; Matérn-ν (Thm 3).
* exponential: ω ~ N(0, I); ``exp(ωᵀx)``; ``exp(‖x+x'‖²/2)`` (Thm 4).
* polynomial: ω ~ Multi(n, [½, 1/(2D), …]); ``Π_i x̄_i^{ω_i}`` with ``x̄ = [√(2c), √(2D) x]``; ``(xᵀx'+c)ⁿ`` (Thm 5).
* callable: ω ~ N(0, I_Q); a user function; any PSD kernel (Thm 6).
"""

from __future__ import annotations

import abc
from typing import Any, Callable

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import check_shapes
from gpflow.utilities import positive

from ..validation import integer

__all__ = [
    "CallableFeatureMap",
    "ExponentialFeatureMap",
    "FeatureMap",
    "FourierFeatureMap",
    "PolynomialFeatureMap",
    "make_feature_map",
]

_STREAM_NORMAL, _STREAM_GAMMA, _STREAM_CATEGORICAL = 0, 1, 2


def _seed(seed: int, stream: int) -> tf.Tensor:
    return tf.constant([int(seed), stream], dtype=tf.int64)


class FeatureMap(gpflow.Module, abc.ABC):
    """The function g of a URK together with the distribution of its random weights ω."""

    supports_shifter: bool = True
    """Whether ω is continuous, so that a distribution shifter h may transform it."""

    @abc.abstractmethod
    def omega_dim(self, input_dim: int) -> int:
        """Q, the size of one ω for inputs (extracted features) of size ``input_dim``."""

    @abc.abstractmethod
    def output_dim(self) -> int:
        """d, the number of features g returns per sample."""

    @abc.abstractmethod
    def sample_base(self, num_samples: int, input_dim: int, seed: int) -> tf.Tensor:
        """The base draw ω₀ ``[m, Q]`` (stateless in ``seed``), before any shifter or scaling."""

    def transform_omega(self, omega: tf.Tensor) -> tf.Tensor:
        """Map the (possibly shifted) base draw to the ω that g uses (e.g. divide by lengthscales)."""
        return omega

    @abc.abstractmethod
    def __call__(self, omega: tf.Tensor, F: tf.Tensor) -> tf.Tensor:
        """``g(ω, F)``: ``[m, Q] × [N, D_f] → [N, m, d]``."""


class FourierFeatureMap(FeatureMap):
    """Random Fourier features ``g(ω, x) = [cos ωᵀx, sin ωᵀx]`` (thesis eq. 2.28, Theorem 3).

    With ``spectral="gaussian"``, ω ~ N(0, I/ℓ²) and ``E[gᵀg'] = exp(−‖x − x'‖²/(2ℓ²))``: the squared
    exponential kernel. With ``spectral="student_t"``, ω = z·√(ν/u)/ℓ, z ~ N(0, I), u ~ Gamma(ν, 1), i.e. a
    multivariate Student-t with 2ν degrees of freedom, whose Fourier transform is the Matérn-ν kernel.

    :param lengthscales: ℓ (scalar or one per input dimension), a positive trainable parameter.
    :param spectral: ``"gaussian"`` or ``"student_t"``.
    :param nu: ν for ``"student_t"`` (0.5, 1.5, 2.5 give Matern12/32/52).
    """

    def __init__(self, lengthscales: Any = 1.0, spectral: str = "gaussian", nu: float = 1.5) -> None:
        super().__init__()
        if spectral not in ("gaussian", "student_t"):
            raise ValueError(f"spectral must be 'gaussian' or 'student_t', got {spectral!r}")
        if not np.all(np.asarray(lengthscales, dtype=float) > 0):
            raise ValueError(f"lengthscales must be positive, got {lengthscales!r}")
        if not (isinstance(nu, (int, float)) and nu > 0):
            raise ValueError(f"nu must be a positive number, got {nu!r}")
        self.lengthscales = gpflow.Parameter(lengthscales, transform=positive())
        self.spectral = spectral
        self.nu = float(nu)

    def omega_dim(self, input_dim: int) -> int:
        return input_dim

    def output_dim(self) -> int:
        return 2

    def sample_base(self, num_samples: int, input_dim: int, seed: int) -> tf.Tensor:
        dtype = gpflow.default_float()
        z = tf.random.stateless_normal([num_samples, input_dim], seed=_seed(seed, _STREAM_NORMAL), dtype=dtype)
        if self.spectral == "gaussian":
            return z
        u = tf.random.stateless_gamma([num_samples, 1], seed=_seed(seed, _STREAM_GAMMA), alpha=self.nu, dtype=dtype)
        return z * tf.sqrt(tf.cast(self.nu, dtype) / u)

    def transform_omega(self, omega: tf.Tensor) -> tf.Tensor:
        return omega / self.lengthscales

    @check_shapes("omega: [M, Q]", "F: [N, Q]", "return: [N, M, 2]")
    def __call__(self, omega: tf.Tensor, F: tf.Tensor) -> tf.Tensor:
        proj = tf.linalg.matmul(F, omega, transpose_b=True)
        return tf.stack([tf.cos(proj), tf.sin(proj)], axis=-1)


class ExponentialFeatureMap(FeatureMap):
    """``g(ω, x) = exp(ωᵀx)`` with ω ~ N(0, I): ``E[gᵀg'] = exp(‖x + x'‖²/2)`` (Theorem 4), a non-stationary
    kernel with infinitely many features."""

    def omega_dim(self, input_dim: int) -> int:
        return input_dim

    def output_dim(self) -> int:
        return 1

    def sample_base(self, num_samples: int, input_dim: int, seed: int) -> tf.Tensor:
        return tf.random.stateless_normal(
            [num_samples, input_dim], seed=_seed(seed, _STREAM_NORMAL), dtype=gpflow.default_float()
        )

    @check_shapes("omega: [M, Q]", "F: [N, Q]", "return: [N, M, 1]")
    def __call__(self, omega: tf.Tensor, F: tf.Tensor) -> tf.Tensor:
        return tf.exp(tf.linalg.matmul(F, omega, transpose_b=True))[..., None]


class PolynomialFeatureMap(FeatureMap):
    """The multinomial map of Theorem 5: ω ~ Multinomial(n, p) with ``p = [½, 1/(2D), …, 1/(2D)]``,
    ``x̄ = [√(2c), √(2D)·x]`` and ``g(ω, x) = Π_i x̄_i^{ω_i}``, so ``E[gᵀg'] = (xᵀx' + c)ⁿ``.

    :param degree: n (a positive integer; not trainable).
    :param offset: c ≥ 0, a trainable parameter.
    """

    supports_shifter = False

    def __init__(self, degree: int = 2, offset: float = 1.0) -> None:
        super().__init__()
        self.degree = integer(degree, "polynomial degree", minimum=1)
        if not offset > 0:
            raise ValueError(f"polynomial offset c must be positive, got {offset!r}")
        self.offset = gpflow.Parameter(offset, transform=positive())

    def omega_dim(self, input_dim: int) -> int:
        return input_dim + 1

    def output_dim(self) -> int:
        return 1

    def sample_base(self, num_samples: int, input_dim: int, seed: int) -> tf.Tensor:
        probs = np.concatenate([[0.5], np.full(input_dim, 0.5 / input_dim)])
        logits = tf.constant(np.log(probs)[None, :], dtype=gpflow.default_float())
        draws = tf.random.stateless_categorical(
            tf.tile(logits, [num_samples, 1]), self.degree, seed=_seed(seed, _STREAM_CATEGORICAL)
        )  # [m, n] category of each of the n trials
        counts = tf.reduce_sum(tf.one_hot(draws, input_dim + 1, dtype=gpflow.default_float()), axis=1)
        return counts  # [m, D + 1]

    @check_shapes("omega: [M, Q]", "F: [N, D]", "return: [N, M, 1]")
    def __call__(self, omega: tf.Tensor, F: tf.Tensor) -> tf.Tensor:
        input_dim = tf.cast(tf.shape(F)[1], F.dtype)
        bias = tf.fill([tf.shape(F)[0], 1], tf.sqrt(2.0 * tf.cast(self.offset, F.dtype)))
        x_bar = tf.concat([bias, tf.sqrt(2.0 * input_dim) * F], axis=1)  # [N, D + 1]
        powers = tf.pow(x_bar[:, None, :], omega[None, :, :])  # integer exponents: signs are exact
        return tf.reduce_prod(powers, axis=-1)[..., None]


class CallableFeatureMap(FeatureMap):
    """Any g (Theorem 6: every ``p(ω)`` and g give a PSD kernel), with ω ~ N(0, I_Q).

    :param function: ``g(omega: [m, Q], F: [N, D_f]) -> [N, m, d]``. If ``function`` is itself a
        ``tf_keras`` model or a ``tf.Module``/``gpflow.Module`` its variables are tracked and train with the
        kernel (FedBNR shares a ``tf_keras`` one under the key ``"kernel.feature_map.function"``); the
        variables of a plain closure are not tracked.
    :param omega_dim: Q.
    :param output_dim: d.
    """

    def __init__(self, function: Callable[[tf.Tensor, tf.Tensor], tf.Tensor], omega_dim: int, output_dim: int) -> None:
        super().__init__()
        if not callable(function):
            raise TypeError(f"function must be callable, got {type(function).__name__}")
        self.function = function
        self._omega_dim = integer(omega_dim, "omega_dim", minimum=1)
        self._output_dim = integer(output_dim, "output_dim", minimum=1)

    def omega_dim(self, input_dim: int) -> int:
        return self._omega_dim

    def output_dim(self) -> int:
        return self._output_dim

    def sample_base(self, num_samples: int, input_dim: int, seed: int) -> tf.Tensor:
        return tf.random.stateless_normal(
            [num_samples, self._omega_dim], seed=_seed(seed, _STREAM_NORMAL), dtype=gpflow.default_float()
        )

    def __call__(self, omega: tf.Tensor, F: tf.Tensor) -> tf.Tensor:
        out = tf.convert_to_tensor(self.function(omega, F))
        if out.shape.rank != 3:
            raise ValueError(f"the feature-map function must return [N, m, d] (rank 3), got shape {out.shape}")
        if not out.dtype.is_floating:
            raise TypeError(f"the feature-map function must return floats, got {out.dtype.name}")
        return tf.cast(out, gpflow.default_float())


FEATURE_MAPS = ("fourier", "exponential", "polynomial")


def make_feature_map(feature_map: Any, **options: Any) -> FeatureMap:
    """A :class:`FeatureMap` from a name in ``("fourier", "exponential", "polynomial")``, a ``FeatureMap``
    instance, or a callable ``g(omega, F)`` (then ``omega_dim`` and ``output_dim`` are required in ``options``).

    :raises ValueError: an unknown name.
    :raises TypeError: anything else.
    """
    if isinstance(feature_map, FeatureMap):
        return feature_map
    if isinstance(feature_map, str):
        if feature_map == "fourier":
            return FourierFeatureMap(**options)
        if feature_map == "exponential":
            return ExponentialFeatureMap(**options)
        if feature_map == "polynomial":
            return PolynomialFeatureMap(**options)
        raise ValueError(f"unknown feature map {feature_map!r}; use one of {FEATURE_MAPS}, a FeatureMap or a callable")
    if callable(feature_map):
        if "omega_dim" not in options or "output_dim" not in options:
            raise ValueError("a callable feature map needs feature_map_options omega_dim=Q and output_dim=d")
        return CallableFeatureMap(feature_map, **options)
    raise TypeError(f"feature_map must be a name, a FeatureMap or a callable, got {type(feature_map).__name__}")
