"""A deep kernel ``k(f(x), f(x'))``: a stock GPflow kernel on the output of a ``tf_keras`` feature extractor.

This is the leftmost architecture of the thesis' Fig. 3.1 (standard deep kernel learning) and the shared
kernel of the pFedGP-style baseline (:mod:`gpflow_fed.federated.algorithms.personalised_gp`).
"""

from __future__ import annotations

from typing import Optional

import gpflow
import tensorflow as tf
from check_shapes import inherit_check_shapes
from gpflow.keras import tf_keras

__all__ = ["DeepKernel"]


class DeepKernel(gpflow.kernels.Kernel):
    """``k(x, x') = k_base(f(x), f(x'))`` with f a ``tf_keras`` model whose output is cast to
    ``gpflow.default_float()``.

    :param base_kernel: any GPflow kernel acting on the extracted features ``[N, D_f]``.
    :param feature_extractor: ``[N, D] → [N, D_f]``.
    :param input_dim: D, used to check the extractor's output (rank 2, floating) before any training.
    """

    def __init__(
        self,
        base_kernel: gpflow.kernels.Kernel,
        feature_extractor: tf_keras.Model,
        input_dim: int,
        name: Optional[str] = None,
    ) -> None:
        super().__init__(name=name)
        if not isinstance(base_kernel, gpflow.kernels.Kernel):
            raise TypeError(f"base_kernel must be a gpflow kernel, got {type(base_kernel).__name__}")
        if not callable(feature_extractor):
            raise TypeError(f"feature_extractor must be a tf_keras model, got {type(feature_extractor).__name__}")
        out = tf.convert_to_tensor(feature_extractor(tf.zeros([1, int(input_dim)], dtype=gpflow.default_float())))
        if not out.dtype.is_floating:
            raise TypeError(f"feature_extractor must output floats, got dtype {out.dtype.name}")
        if out.shape.rank != 2:
            raise ValueError(f"feature_extractor must output [N, D_f] (rank 2), got shape {out.shape}")
        self.base_kernel = base_kernel
        self.feature_extractor = feature_extractor
        self.input_dim = int(input_dim)

    def _extract(self, X: tf.Tensor) -> tf.Tensor:
        return tf.cast(self.feature_extractor(X), gpflow.default_float())

    @inherit_check_shapes
    def K(self, X: tf.Tensor, X2: Optional[tf.Tensor] = None) -> tf.Tensor:
        return self.base_kernel.K(self._extract(X), None if X2 is None else self._extract(X2))

    @inherit_check_shapes
    def K_diag(self, X: tf.Tensor) -> tf.Tensor:
        return self.base_kernel.K_diag(self._extract(X))
