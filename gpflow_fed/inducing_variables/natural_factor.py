"""NaturalFactor: a Gaussian factor t(u) = exp(ηᵀu − ½ uᵀΛu) over the inducing outputs u = f(Z).

This is the coupled (CPO) u-factor of PVI for sparse GPs (*Federated Learning of Sparse Gaussian Processes*,
§5.1; docs guide 'PVI'): its natural parameters are tied to the
inducing inputs, so, unlike :class:`~gpflow_fed.inducing_variables.PseudoObservations`, it does not change when Z
moves. Λ may be singular (a sum of clients' factors, or one client's data projected on u), so it is kept in
natural parameters and never inverted.
"""

from __future__ import annotations

from typing import Callable, Optional, Tuple

import gpflow
import tensorflow as tf
from check_shapes import Shape, check_shapes

from .pseudo_observations import as_float_array


class NaturalFactor(gpflow.inducing_variables.InducingVariables):
    """The factor ``(η [M, 1], Λ [M, M])`` over u = f(Z) at inducing inputs ``Z [M, D]``.

    ``η`` and ``Λ`` are non-trainable parameters (they come from a federation; Λ must stay positive
    semi-definite, which an unconstrained optimiser would not respect).

    :raises ValueError: non-finite values, mismatched shapes or a non-symmetric Λ.
    """

    def __init__(self, eta: object, Lam: object, Z: Optional[object] = None, *, name: Optional[str] = None):
        super().__init__(name=name)
        eta_arr = as_float_array(eta, "eta", (1, 2)).reshape(-1, 1)
        Lam_arr = as_float_array(Lam, "Lam", (2,))
        M = eta_arr.shape[0]
        if Lam_arr.shape != (M, M):
            raise ValueError(f"Lam must be [M, M] with M = {M} (the length of eta), got shape {Lam_arr.shape}")
        if abs(Lam_arr - Lam_arr.T).max() > 1e-8 * max(1.0, abs(Lam_arr).max()):
            raise ValueError("Lam is not symmetric; pass a symmetric [M, M] precision")
        self.eta = gpflow.Parameter(eta_arr, trainable=False, name="eta")
        self.Lam = gpflow.Parameter(Lam_arr, trainable=False, name="Lam")
        self.Z = None
        if Z is not None:
            Z_arr = as_float_array(Z, "Z", (2,))
            if Z_arr.shape[0] != M:
                raise ValueError(f"Z has {Z_arr.shape[0]} rows but eta has M = {M}")
            self.Z = gpflow.Parameter(Z_arr, name="Z")

    @property
    def inducing_inputs(self) -> tf.Tensor:
        """Z ``[M, D]`` (required for point-Z use; with a q(Z) the sampled Z is passed in)."""
        if self.Z is None:
            raise ValueError("this NaturalFactor has no inducing inputs Z; give Z or use it with a q(Z)")
        return tf.convert_to_tensor(self.Z)

    @property
    def num_inducing(self) -> tf.Tensor:
        return tf.shape(self.eta)[0]

    @property
    def shape(self) -> Shape:
        Z = self.inducing_inputs
        return (Z.shape[0], Z.shape[1], 1)

    @check_shapes(
        "Z: [batch..., M, D]", "L: [batch..., M, M]", "return[0]: [batch..., M, M]", "return[1]: [batch..., M, 1]"
    )
    def whitened_terms(self, kernel: Callable, Z: tf.Tensor, L: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
        """``(Lᵀ Λ L, Lᵀ η)``: the factor in the whitened coordinates ``u = L w`` (design matrix ``H = L``;
        see :mod:`gpflow_fed.posteriors.whitened`)."""
        return natural_whitened_terms(L, tf.convert_to_tensor(self.eta), tf.convert_to_tensor(self.Lam))


@check_shapes(
    "L: [batch..., M, M]", "eta: [M, 1]", "Lam: [M, M]", "return[0]: [batch..., M, M]", "return[1]: [batch..., M, 1]"
)
def natural_whitened_terms(L: tf.Tensor, eta: tf.Tensor, Lam: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
    """``(Lᵀ Λ L, Lᵀ η)`` for natural parameters ``(η, Λ)`` over u = L w."""
    return tf.matmul(tf.matmul(L, Lam, transpose_a=True), L), tf.matmul(L, eta, transpose_a=True)
