"""The Unifying Random Kernel (URK) of the FedBNR thesis, §3.1.1, as a ``gpflow.kernels.Kernel``."""

from __future__ import annotations

from typing import Any, Mapping, Optional

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import check_shapes, inherit_check_shapes
from gpflow.keras import tf_keras
from gpflow.utilities import positive

from ..validation import integer
from .feature_maps import FeatureMap, make_feature_map

__all__ = ["URK"]

SCALINGS = ("m-1", "m")


class URK(gpflow.kernels.Kernel):
    r"""Unifying Random Kernel: an explicit, finite random-feature kernel (thesis eqs. 3.1–3.2).

    With a feature extractor f, a distribution shifter h and a feature map g (see
    :mod:`gpflow_fed.kernels.feature_maps`), the features of an input x are

    .. math::
        \phi(x) = \sqrt{\sigma_f^2 / (m - 1)}\; [\,g(\omega_1, f(x)), \ldots, g(\omega_m, f(x))\,],
        \qquad \omega_i = h(\omega^0_i),

    the concatenation of m samples of ``z_ω(x) = g(ω, f(x))`` scaled as in eq. 3.2, ``L = m·d`` features, and
    ``k(x, x') = φ(x)ᵀφ(x')``. ``K`` and ``K_diag`` come from :meth:`features`, so a URK works inside stock
    ``GPR``, ``SGPR`` and ``SVGP``, and in :class:`~gpflow_fed.models.BayesianLinearRegression` (primal space).

    Expectation: eq. 3.2 divides by ``m − 1``, so ``E[URK_m] = m/(m−1)·σ_f²·k(x, x')`` with k the kernel of
    eq. 3.1 (e.g. SE for the default Fourier map, Theorem 3); it converges to ``σ_f² k`` as m → ∞.
    ``scaling="m"`` divides by m instead and is unbiased for every m.

    The base draw ω⁰ is made once with ``tf.random.stateless_*`` from ``seed``, so every client and the server
    rebuild identical features from the shared seed; only f's and h's weights and the hyperparameters train.

    :param input_dim: D, the number of input columns the kernel sees (after ``active_dims``).
    :param num_samples: m ≥ 2.
    :param feature_map: ``"fourier"`` (default, SE), ``"exponential"``, ``"polynomial"``, a
        :class:`FeatureMap`, or a callable ``g(omega: [m, Q], F: [N, D_f]) -> [N, m, d]``.
    :param feature_extractor: optional ``tf_keras`` model f: ``[N, D] → [N, D_f]`` (a deep kernel); its output
        is cast to ``gpflow.default_float()``.
    :param distribution_shifter: optional ``tf_keras`` model h: ``[m, Q] → [m, Q]`` applied to ω⁰.
    :param seed: the shared seed of the stateless draws.
    :param variance: σ_f², a positive trainable amplitude (default 1).
    :param scaling: ``"m-1"`` (eq. 3.2) or ``"m"``.
    :param feature_map_options: keyword arguments of the named map (``lengthscales``, ``spectral``, ``nu``,
        ``degree``, ``offset``; ``omega_dim`` and ``output_dim`` for a callable).
    :param active_dims: as for every GPflow kernel.
    """

    def __init__(
        self,
        input_dim: int,
        num_samples: int = 100,
        feature_map: Any = "fourier",
        feature_extractor: Optional[tf_keras.Model] = None,
        distribution_shifter: Optional[tf_keras.Model] = None,
        seed: int = 0,
        variance: float = 1.0,
        scaling: str = "m-1",
        feature_map_options: Optional[Mapping[str, Any]] = None,
        active_dims: Any = None,
        name: Optional[str] = None,
    ) -> None:
        super().__init__(active_dims=active_dims, name=name)
        self.input_dim = integer(input_dim, "input_dim (D)", minimum=1)
        self.num_samples = integer(num_samples, "num_samples (m)", minimum=2)
        seed = integer(seed, "seed", minimum=0)
        if scaling not in SCALINGS:
            raise ValueError(f"scaling must be one of {SCALINGS}, got {scaling!r}")
        if not (np.isfinite(variance) and variance > 0):
            raise ValueError(f"variance must be positive, got {variance!r}")
        self.seed = int(seed)
        self.scaling = scaling
        self.feature_map: FeatureMap = make_feature_map(feature_map, **dict(feature_map_options or {}))
        self.variance = gpflow.Parameter(variance, transform=positive())
        self.feature_extractor = feature_extractor
        self.distribution_shifter = distribution_shifter
        self.extracted_dim = self._check_extractor()
        q = self.feature_map.omega_dim(self.extracted_dim)
        self._omega_base = self.feature_map.sample_base(self.num_samples, self.extracted_dim, self.seed)
        self._check_shifter(q)
        self._check_feature_map()

    # --- validation ----------------------------------------------------------------------------------
    def _check_extractor(self) -> int:
        f = self.feature_extractor
        if f is None:
            return self.input_dim
        if not callable(f):
            raise TypeError(f"feature_extractor must be a tf_keras model (callable), got {type(f).__name__}")
        out = tf.convert_to_tensor(f(tf.zeros([1, self.input_dim], dtype=gpflow.default_float())))
        if not out.dtype.is_floating:
            raise TypeError(
                f"feature_extractor must output floats, got dtype {out.dtype.name}; end it with a float layer"
            )
        if out.shape.rank != 2:
            raise ValueError(
                f"feature_extractor must map [N, D] to [N, D_f] (rank 2), got output shape {out.shape}; "
                "add a Flatten or Dense layer at the end"
            )
        return int(out.shape[1])

    def _check_shifter(self, q: int) -> None:
        h = self.distribution_shifter
        if h is None:
            return
        if not self.feature_map.supports_shifter:
            raise ValueError(f"{type(self.feature_map).__name__} has discrete ω; it cannot take a distribution_shifter")
        if not callable(h):
            raise TypeError(f"distribution_shifter must be a tf_keras model (callable), got {type(h).__name__}")
        out = tf.convert_to_tensor(h(self._omega_base))
        if not out.dtype.is_floating:
            raise TypeError(f"distribution_shifter must output floats, got dtype {out.dtype.name}")
        if tuple(out.shape) != (self.num_samples, q):
            raise ValueError(
                f"distribution_shifter must map [m, Q] = [{self.num_samples}, {q}] to the same shape, got {out.shape}"
            )

    def _check_feature_map(self) -> None:
        """Evaluate g once on a dummy input: builds lazily created weights and checks g's output shape."""
        z = self.feature_map(self.omega(), self.extract(tf.zeros([1, self.input_dim], dtype=gpflow.default_float())))
        expected = (1, self.num_samples, self.feature_map.output_dim())
        if tuple(z.shape) != expected:
            raise ValueError(
                f"the feature map must return [N, m, d] = [1, {expected[1]}, {expected[2]}] for one input, got "
                f"{tuple(z.shape)}"
            )

    # --- features ------------------------------------------------------------------------------------
    @property
    def num_features(self) -> int:
        """L = m·d."""
        return self.num_samples * self.feature_map.output_dim()

    @property
    def dtype(self) -> tf.DType:
        """The dtype of the kernel's parameters, which its features and Gram matrices follow."""
        return self.variance.dtype

    @check_shapes("return: [M, Q]")
    def omega(self) -> tf.Tensor:
        """The random weights g uses: ω = h(ω⁰), then the map's own scaling (e.g. ω/ℓ for Fourier)."""
        omega = tf.cast(self._omega_base, self.dtype)
        if self.distribution_shifter is not None:
            omega = tf.cast(self.distribution_shifter(omega), self.dtype)
        return self.feature_map.transform_omega(omega)

    @check_shapes("X: [N, D]", "return: [N, D_f]")
    def extract(self, X: tf.Tensor) -> tf.Tensor:
        """f(X) cast to the kernel's dtype (the identity without an extractor)."""
        X = tf.convert_to_tensor(X)
        if self.feature_extractor is None:
            return tf.cast(X, self.dtype)
        return tf.cast(self.feature_extractor(X), self.dtype)

    @check_shapes("X: [batch..., N, D]", "return: [batch..., N, L]")
    def features(self, X: tf.Tensor) -> tf.Tensor:
        """φ(X), the ``[..., N, L]`` features of eq. 3.2 (``active_dims`` applied), with ``K = φ(X)φ(X')ᵀ``."""
        X, _ = self.slice(X, None)
        return self._features(X)

    def _features(self, X: tf.Tensor) -> tf.Tensor:
        """φ of ``[..., N, D]`` inputs: the leading axes are flattened for f and g, then restored."""
        X = tf.convert_to_tensor(X)
        leading = tf.shape(X)[:-1]
        z = self.feature_map(self.omega(), self.extract(tf.reshape(X, [-1, tf.shape(X)[-1]])))  # [N', m, d]
        denominator = self.num_samples - 1 if self.scaling == "m-1" else self.num_samples
        scale = tf.sqrt(self.variance / tf.cast(denominator, self.dtype))
        return scale * tf.reshape(z, tf.concat([leading, [self.num_features]], axis=0))

    @inherit_check_shapes
    def K(self, X: tf.Tensor, X2: Optional[tf.Tensor] = None) -> tf.Tensor:
        phi = self._features(X)
        if X2 is None:
            return tf.linalg.matmul(phi, phi, transpose_b=True)  # [..., N, N]
        return tf.tensordot(phi, self._features(X2), axes=[[-1], [-1]])  # [..., N, ...2, N2]

    @inherit_check_shapes
    def K_diag(self, X: tf.Tensor) -> tf.Tensor:
        return tf.reduce_sum(tf.square(self._features(X)), axis=-1)
