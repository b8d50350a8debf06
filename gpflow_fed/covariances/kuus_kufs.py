"""Kuu / Kuf registrations for the gpflow-fed inducing variables.

Imported by :mod:`gpflow_fed.inducing_variables` after it defines the types, so the registrations are active
whenever the types are, whichever module a user imports first.
"""

from __future__ import annotations

import gpflow
import tensorflow as tf
from check_shapes import check_shapes
from gpflow import covariances
from gpflow.base import TensorLike

from ..inducing_variables import GaussianInducingPoints, NaturalFactor, PseudoObservations


@covariances.Kuu.register((PseudoObservations, NaturalFactor), gpflow.kernels.Kernel)
@check_shapes("inducing_variable: [M, D, 1]", "return: [M, M]")
def Kuu_pseudo_observations(
    inducing_variable: PseudoObservations, kernel: gpflow.kernels.Kernel, *, jitter: float = 0.0
) -> tf.Tensor:
    """``K(Z, Z) + jitter·I`` at the inducing inputs Z (u = f(Z); the pseudo-inputs V enter only the factor)."""
    Z = inducing_variable.inducing_inputs
    K = kernel(Z)
    return K + jitter * tf.eye(tf.shape(Z)[0], dtype=K.dtype)


@covariances.Kuf.register((PseudoObservations, NaturalFactor), gpflow.kernels.Kernel, TensorLike)
@check_shapes("inducing_variable: [M, D, 1]", "Xnew: [batch..., N, D]", "return: [M, batch..., N]")
def Kuf_pseudo_observations(
    inducing_variable: PseudoObservations, kernel: gpflow.kernels.Kernel, Xnew: tf.Tensor
) -> tf.Tensor:
    """``K(Z, Xnew)``."""
    return kernel(inducing_variable.inducing_inputs, Xnew)


@covariances.Kuu.register(GaussianInducingPoints, gpflow.kernels.Kernel)
@check_shapes("inducing_variable: [M, D, 1]", "return: [M, M]")
def Kuu_gaussian_inducing_points(
    inducing_variable: GaussianInducingPoints, kernel: gpflow.kernels.Kernel, *, jitter: float = 0.0
) -> tf.Tensor:
    """``K(μ_Z, μ_Z) + jitter·I`` at the mean of q(Z) (Monte Carlo over q(Z) goes through ``sample``)."""
    Z = tf.convert_to_tensor(inducing_variable.Z_mean)
    K = kernel(Z)
    return K + jitter * tf.eye(tf.shape(Z)[0], dtype=K.dtype)


@covariances.Kuf.register(GaussianInducingPoints, gpflow.kernels.Kernel, TensorLike)
@check_shapes("inducing_variable: [M, D, 1]", "Xnew: [batch..., N, D]", "return: [M, batch..., N]")
def Kuf_gaussian_inducing_points(
    inducing_variable: GaussianInducingPoints, kernel: gpflow.kernels.Kernel, Xnew: tf.Tensor
) -> tf.Tensor:
    """``K(μ_Z, Xnew)`` at the mean of q(Z)."""
    return kernel(tf.convert_to_tensor(inducing_variable.Z_mean), Xnew)
