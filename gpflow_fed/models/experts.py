"""Combination rules of independent GP experts: PoE, generalised PoE, BCM and robust BCM.

Each expert e predicts ``N(μ_e, v_e)`` at the same test points; the rules combine precisions
(Deisenroth & Ng 2015, "Distributed Gaussian Processes", eqs. 10–14; the FSGP paper's FGP baseline uses the
rBCM). With ``E`` experts, prior variance ``v_**`` and weights ``β_e``:

==========  ===============================================  ================================
rule        combined precision ``v⁻¹``                        combined mean ``μ``
==========  ===============================================  ================================
``poe``     ``Σ_e v_e⁻¹``                                    ``v Σ_e v_e⁻¹ μ_e``
``gpoe``    ``Σ_e β_e v_e⁻¹``, ``β_e = 1/E``                 ``v Σ_e β_e v_e⁻¹ μ_e``
``bcm``     ``Σ_e v_e⁻¹ + (1 − E) v_**⁻¹``                   ``v Σ_e v_e⁻¹ μ_e``
``rbcm``    ``Σ_e β_e v_e⁻¹ + (1 − Σ_e β_e) v_**⁻¹``,         ``v Σ_e β_e v_e⁻¹ μ_e``
            ``β_e = ½ (log v_** − log v_e)``
==========  ===============================================  ================================

The rules act on whatever the experts predict (usually the latent ``f``; add the noise variance
afterwards for ``y``). Shapes: ``[E, N, P]`` for the experts, ``[N, P]`` (or broadcastable) for ``v_**``.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import check_shapes, inherit_check_shapes
from gpflow.models.training_mixins import InternalDataTrainingLossMixin

__all__ = ["COMBINATION_RULES", "ExpertCommittee", "combine_experts", "poe", "gpoe", "bcm", "rbcm"]

COMBINATION_RULES = ("poe", "gpoe", "bcm", "rbcm")


def _checked(means: tf.Tensor, variances: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
    dtype = gpflow.default_float()
    means = tf.convert_to_tensor(means, dtype=dtype)
    variances = tf.convert_to_tensor(variances, dtype=dtype)
    if means.shape.rank != 3 or variances.shape.rank != 3:
        raise ValueError(
            f"expert means and variances must have shape [E, N, P], got {means.shape} and {variances.shape}"
        )
    if means.shape != variances.shape:
        raise ValueError(f"expert means {means.shape} and variances {variances.shape} differ in shape")
    if means.shape[0] == 0:
        raise ValueError("need at least one expert (E ≥ 1)")
    if tf.executing_eagerly() and not bool(tf.reduce_all(variances > 0)):
        raise ValueError("expert variances must be positive")
    return means, variances


def _prior(prior_variance: tf.Tensor, shape: tf.TensorShape) -> tf.Tensor:
    prior = tf.convert_to_tensor(prior_variance, dtype=gpflow.default_float())
    try:
        prior = tf.broadcast_to(prior, shape[1:])
    except (ValueError, tf.errors.InvalidArgumentError) as exc:
        raise ValueError(f"prior variance of shape {prior.shape} does not broadcast to [N, P] = {shape[1:]}") from exc
    if tf.executing_eagerly() and not bool(tf.reduce_all(prior > 0)):
        raise ValueError("prior variance must be positive")
    return prior


@check_shapes("means: [E, N, P]", "variances: [E, N, P]", "return[0]: [N, P]", "return[1]: [N, P]")
def poe(means: tf.Tensor, variances: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
    """Product of experts: ``v⁻¹ = Σ_e v_e⁻¹``, ``μ = v Σ_e v_e⁻¹ μ_e`` (Deisenroth & Ng eq. 10)."""
    means, variances = _checked(means, variances)
    precision = tf.reduce_sum(1.0 / variances, axis=0)
    var = 1.0 / precision
    return var * tf.reduce_sum(means / variances, axis=0), var


@check_shapes("means: [E, N, P]", "variances: [E, N, P]", "return[0]: [N, P]", "return[1]: [N, P]")
def gpoe(means: tf.Tensor, variances: tf.Tensor, weights: Optional[tf.Tensor] = None) -> Tuple[tf.Tensor, tf.Tensor]:
    """Generalised PoE (Cao & Fleet 2014): ``v⁻¹ = Σ_e β_e v_e⁻¹``, ``μ = v Σ_e β_e v_e⁻¹ μ_e``.

    :param weights: ``β_e`` broadcastable to ``[E, N, P]``; default ``1/E`` (Deisenroth & Ng eq. 11), which
        keeps the combined variance as wide as a single expert's when all agree.
    """
    means, variances = _checked(means, variances)
    num_experts = tf.cast(tf.shape(means)[0], means.dtype)
    beta = (
        tf.fill(tf.shape(means), 1.0 / num_experts)
        if weights is None
        else tf.broadcast_to(tf.convert_to_tensor(weights, means.dtype), tf.shape(means))
    )
    precision = tf.reduce_sum(beta / variances, axis=0)
    var = 1.0 / precision
    return var * tf.reduce_sum(beta * means / variances, axis=0), var


@check_shapes(
    "means: [E, N, P]",
    "variances: [E, N, P]",
    "prior_variance: [broadcast N, broadcast P]",
    "return[0]: [N, P]",
    "return[1]: [N, P]",
)
def bcm(means: tf.Tensor, variances: tf.Tensor, prior_variance: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
    """Bayesian committee machine (Tresp 2000): ``v⁻¹ = Σ_e v_e⁻¹ + (1 − E) v_**⁻¹`` (Deisenroth & Ng eq. 12).

    The combined precision can become non-positive far from the data (a known BCM failure); such points
    raise no error here but give negative or infinite variances — use :func:`rbcm` instead.
    """
    means, variances = _checked(means, variances)
    prior = _prior(prior_variance, means.shape)
    num_experts = tf.cast(tf.shape(means)[0], means.dtype)
    precision = tf.reduce_sum(1.0 / variances, axis=0) + (1.0 - num_experts) / prior
    var = 1.0 / precision
    return var * tf.reduce_sum(means / variances, axis=0), var


@check_shapes(
    "means: [E, N, P]",
    "variances: [E, N, P]",
    "prior_variance: [broadcast N, broadcast P]",
    "return[0]: [N, P]",
    "return[1]: [N, P]",
)
def rbcm(means: tf.Tensor, variances: tf.Tensor, prior_variance: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
    """Robust BCM (Deisenroth & Ng 2015, eqs. 13–14), the published form with ``β_e`` in both sums:

    ``β_e = ½ (log v_** − log v_e)``, ``v⁻¹ = Σ_e β_e v_e⁻¹ + (1 − Σ_e β_e) v_**⁻¹``, ``μ = v Σ_e β_e v_e⁻¹ μ_e``.
    """
    means, variances = _checked(means, variances)
    prior = _prior(prior_variance, means.shape)
    beta = 0.5 * (tf.math.log(prior)[None] - tf.math.log(variances))
    precision = tf.reduce_sum(beta / variances, axis=0) + (1.0 - tf.reduce_sum(beta, axis=0)) / prior
    var = 1.0 / precision
    return var * tf.reduce_sum(beta * means / variances, axis=0), var


@check_shapes("means: [E, N, P]", "variances: [E, N, P]", "return[0]: [N, P]", "return[1]: [N, P]")
def combine_experts(
    means: tf.Tensor, variances: tf.Tensor, rule: str, prior_variance: Optional[tf.Tensor] = None
) -> Tuple[tf.Tensor, tf.Tensor]:
    """Combine ``E`` experts' Gaussian predictions by ``rule`` ∈ {``poe``, ``gpoe``, ``bcm``, ``rbcm``}.

    :param prior_variance: ``v_**`` (needed by ``bcm`` and ``rbcm``), broadcastable to ``[N, P]``.
    :raises ValueError: an unknown rule, a missing prior variance, or inconsistent shapes.
    """
    if rule not in COMBINATION_RULES:
        raise ValueError(f"rule must be one of {COMBINATION_RULES}, got {rule!r}")
    if rule == "poe":
        return poe(means, variances)
    if rule == "gpoe":
        return gpoe(means, variances)
    if prior_variance is None:
        raise ValueError(f"rule {rule!r} needs the prior variance v_** of the latent function")
    prior = _prior(prior_variance, tf.TensorShape(np.shape(means)))
    return (bcm if rule == "bcm" else rbcm)(means, variances, prior)


class ExpertCommittee(gpflow.models.GPModel, InternalDataTrainingLossMixin):
    """A GPflow model whose prediction combines independent GP experts by a rule of :data:`COMBINATION_RULES`.

    ``predict_f`` returns the combined marginal ``q(f*)`` (only marginals: the rules combine pointwise
    variances); ``predict_y`` adds the committee likelihood's noise. The prior variance ``v_**`` is
    ``k(x*, x*)`` of the first expert's kernel (the experts share hyperparameters in FGP).

    Privacy: predicting queries every expert at the test inputs, so each expert's owner must answer
    test-point queries with its posterior mean and variance, which are functions of its private data.

    :param experts: the expert models (anything with ``predict_f`` and a ``kernel``), e.g. one
        ``gpflow.models.GPR`` per client.
    :param rule: ``"poe"``, ``"gpoe"``, ``"bcm"`` or ``"rbcm"``.
    :param likelihood: the Gaussian likelihood added by ``predict_y`` (default: the first expert's).
    """

    def __init__(
        self,
        experts: Sequence[gpflow.models.GPModel],
        rule: str = "rbcm",
        likelihood: Optional[gpflow.likelihoods.Gaussian] = None,
    ) -> None:
        experts = list(experts)
        if not experts:
            raise ValueError("ExpertCommittee needs at least one expert")
        if rule not in COMBINATION_RULES:
            raise ValueError(f"rule must be one of {COMBINATION_RULES}, got {rule!r}")
        for e, expert in enumerate(experts):
            if not isinstance(expert, gpflow.models.GPModel):
                raise TypeError(f"expert {e} must be a gpflow.models.GPModel, got {type(expert).__name__}")
        likelihood = likelihood if likelihood is not None else experts[0].likelihood
        super().__init__(experts[0].kernel, likelihood, num_latent_gps=experts[0].num_latent_gps)
        self.experts = experts
        self.rule = rule

    @inherit_check_shapes
    def predict_f(
        self, Xnew: gpflow.base.InputData, full_cov: bool = False, full_output_cov: bool = False
    ) -> gpflow.models.model.MeanAndVariance:
        """The combined marginal predictive of the latent function (eqs. in the module table)."""
        if full_cov or full_output_cov:
            raise ValueError("ExpertCommittee combines marginal variances only; call predict_f with full_cov=False")
        predictions = [expert.predict_f(Xnew) for expert in self.experts]
        means = tf.stack([m for m, _ in predictions])
        variances = tf.stack([v for _, v in predictions])
        prior = self.experts[0].kernel(Xnew, full_cov=False)[:, None]
        return combine_experts(means, variances, self.rule, prior)

    @inherit_check_shapes
    def maximum_log_likelihood_objective(self) -> tf.Tensor:
        """``Σ_e`` of the experts' own objectives (the factorised likelihood ``Π_k p(y_k)`` for GPR experts)."""
        return tf.add_n([expert.maximum_log_likelihood_objective() for expert in self.experts])
