"""DPOPosterior: the sparse-GP posterior whose q(u) is the prior times DPO pseudo-likelihood factors.

Paper: *Federated Learning of Sparse Gaussian Processes* (the PVI paper of the docs guide 'PVI').

Registered through ``gpflow.posteriors.get_posterior_class`` for :class:`PseudoObservations` (and the CPO
:class:`NaturalFactor`), so
``gpflow.conditionals.conditional`` and the stock ``SVGP.predict_f`` route to it; ``prior_kl`` is registered
too, so a stock ``gpflow.models.SVGP`` with a :class:`PseudoObservations` inducing variable optimises the
DPO-parameterised ELBO (its own ``q_mu``/``q_sqrt`` are then unused: q(u) is fixed by ``(V, m, S)``).
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple, Union, cast

import gpflow
import tensorflow as tf
from check_shapes import check_shapes
from gpflow.base import MeanAndVariance
from gpflow.config import default_jitter
from gpflow.posteriors import IndependentPosteriorSingleOutput, PrecomputeCacheType, PrecomputedValue

from ..inducing_variables import NaturalFactor, PseudoObservations
from .whitened import assemble_whitened, whitened_prior_kl


UFactor = Union[PseudoObservations, NaturalFactor]
"""A u-factor: anything with ``whitened_terms(kernel, Z, L)`` (DPO pseudo-observations or a CPO natural factor)."""


@check_shapes(
    "Z: [batch..., M, D]", "return[0]: [batch..., M, M]", "return[1]: [batch..., M, 1]", "return[2]: [batch..., M, M]"
)
def dpo_whitened_posterior(
    kernel: Callable, Z: tf.Tensor, factors: Union[UFactor, Sequence[UFactor]], jitter: Optional[object] = None
) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """``(L, μ_w, L_B)`` of q(u | Z) ∝ p(u | Z) Π_j t_j(u) at the inducing inputs ``Z``.

    Paper eqs. (12), (22), (25) in a stable whitened form (``w = L⁻¹u``, see :mod:`~gpflow_fed.posteriors.whitened`):
    for DPO ``P = L⁻¹ K_ZV``, ``B = I + P S⁻¹ Pᵀ``, ``μ_w = B⁻¹ P S⁻¹ m``; then ``q(u) = N(L μ_w, L B⁻¹ Lᵀ)``.
    ``kernel`` is a GPflow kernel or a :class:`~gpflow_fed.posteriors.hyperparameters.SampledSquaredExponential`;
    a leading sample dimension of ``Z`` (and of the kernel's hyperparameters) gives one posterior per sample.
    """
    L = jittered_cholesky(kernel, Z, jitter)
    return (L, *factor_posterior(kernel, Z, L, factors))


@check_shapes("Z: [batch..., M, D]", "return: [batch..., M, M]")
def jittered_cholesky(kernel: Callable, Z: tf.Tensor, jitter: Optional[object] = None) -> tf.Tensor:
    """``chol(K_ZZ + εI)``; use the same ε for q and its cavity within one step, or their KL picks up
    spurious terms."""
    jitter = default_jitter() if jitter is None else jitter
    return tf.linalg.cholesky(kernel(Z) + jitter * tf.eye(tf.shape(Z)[-2], dtype=Z.dtype))


@check_shapes(
    "Z: [batch..., M, D]", "L: [batch..., M, M]", "return[0]: [batch..., M, 1]", "return[1]: [batch..., M, M]"
)
def factor_posterior(
    kernel: Callable, Z: tf.Tensor, L: tf.Tensor, factors: Union[UFactor, Sequence[UFactor]]
) -> Tuple[tf.Tensor, tf.Tensor]:
    """``(μ_w, L_B)`` of the whitened q(w) from the prior and ``factors`` at ``Z`` with ``L = chol K_ZZ``."""
    # a list or tuple is the Sequence case, anything else one factor
    factors = [cast(UFactor, factors)] if not isinstance(factors, (list, tuple)) else factors
    terms = [f.whitened_terms(kernel, Z, L) for f in factors]
    return assemble_whitened(terms, tf.shape(Z)[-2], Z.dtype)


class DPOPosterior(IndependentPosteriorSingleOutput):
    """Predictive ``f* | data`` for q(u) assembled from the prior and a :class:`PseudoObservations` factor.

    With ``α = K_ZZ⁻¹ μ_u = L⁻ᵀ μ_w`` and ``Q⁻¹ = K_ZZ⁻¹ − K_ZZ⁻¹ Σ_u K_ZZ⁻¹ = L⁻ᵀ(I − B⁻¹)L⁻¹``, the
    prediction is GPflow's ``mean = K_{*Z} α``, ``cov = K_** − K_{*Z} Q⁻¹ K_{Z*}`` (the sparse-GP predictive of
    the PVI paper §6 at one (Z, β)).

    The constructor keeps GPflow's positional signature (``create_posterior`` and ``conditional()`` call it
    so); ``q_mu``/``q_sqrt`` are accepted for that reason and not used, because q(u) is determined by the
    pseudo-observations (or the :class:`NaturalFactor`). ``jitter`` (default GPflow's) is added to K_ZZ.
    """

    def __init__(
        self,
        kernel: gpflow.kernels.Kernel,
        inducing_variable: UFactor,
        q_mu: Optional[tf.Tensor] = None,
        q_sqrt: Optional[tf.Tensor] = None,
        whiten: bool = True,
        mean_function: Optional[gpflow.mean_functions.MeanFunction] = None,
        *,
        precompute_cache: Optional[PrecomputeCacheType] = None,
        jitter: Optional[float] = None,
    ) -> None:
        if not isinstance(inducing_variable, (PseudoObservations, NaturalFactor)):
            raise TypeError(
                "DPOPosterior needs a PseudoObservations or NaturalFactor inducing variable, "
                f"got {type(inducing_variable).__name__}"
            )
        gpflow.posteriors.AbstractPosterior.__init__(self, kernel, inducing_variable, mean_function=mean_function)
        self.whiten = whiten
        self.jitter = jitter
        if precompute_cache is not None:
            self.update_cache(precompute_cache)

    def q_u(self) -> Tuple[tf.Tensor, tf.Tensor]:
        """``(μ_u [M, 1], Σ_u [M, M])`` of q(u | Z) (paper eq. 22 with eq. 25, computed in whitened form)."""
        L, mu_w, LB = dpo_whitened_posterior(self.kernel, self.X_data.inducing_inputs, self.X_data, self.jitter)
        LLBinvT = tf.linalg.adjoint(tf.linalg.triangular_solve(LB, tf.linalg.adjoint(L), lower=True))
        return tf.matmul(L, mu_w), tf.matmul(LLBinvT, LLBinvT, transpose_b=True)

    def _precompute(self) -> Tuple[PrecomputedValue, ...]:
        L, mu_w, LB = dpo_whitened_posterior(self.kernel, self.X_data.inducing_inputs, self.X_data, self.jitter)
        alpha = tf.linalg.triangular_solve(L, mu_w, lower=True, adjoint=True)
        Linv = tf.linalg.triangular_solve(L, tf.eye(tf.shape(L)[0], dtype=L.dtype), lower=True)
        W = tf.linalg.triangular_solve(LB, Linv, lower=True)
        Qinv = tf.matmul(Linv, Linv, transpose_a=True) - tf.matmul(W, W, transpose_a=True)
        return PrecomputedValue(alpha, (False, False)), PrecomputedValue(Qinv[None], (False, False, False))

    def _conditional_fused(
        self, Xnew: tf.Tensor, full_cov: bool = False, full_output_cov: bool = False
    ) -> MeanAndVariance:
        cache = tuple(c.value for c in self._precompute())
        return self._conditional_with_precompute(cache, Xnew, full_cov=full_cov, full_output_cov=full_output_cov)


@gpflow.posteriors.get_posterior_class.register(gpflow.kernels.Kernel, (PseudoObservations, NaturalFactor))
def _get_dpo_posterior_class(kernel: gpflow.kernels.Kernel, inducing_variable: UFactor) -> type:
    return DPOPosterior


@gpflow.kullback_leiblers.prior_kl.register((PseudoObservations, NaturalFactor), gpflow.kernels.Kernel, object, object)
def _prior_kl_pseudo_observations(
    inducing_variable: UFactor, kernel: gpflow.kernels.Kernel, q_mu: object, q_sqrt: object, whiten: bool = False
) -> tf.Tensor:
    """KL[q(u) ‖ p(u)] for the DPO q(u); whitening makes it independent of K_ZZ (the u-KL of paper eq. 13)."""
    _, mu_w, LB = dpo_whitened_posterior(kernel, inducing_variable.inducing_inputs, inducing_variable)
    return whitened_prior_kl(mu_w, LB)
