"""Posteriors: DPOPosterior (registered with ``gpflow.posteriors.get_posterior_class``), the DPO mixture over
q(Z) q(β), q(log β), and whitened algebra."""

from . import whitened
from .dpo_mixture import DPOMixturePosterior, mixture_moments
from .dpo_posterior import DPOPosterior, dpo_whitened_posterior
from .hyperparameters import LogNormalHyperparameters, SampledSquaredExponential

__all__ = [
    "DPOMixturePosterior",
    "DPOPosterior",
    "LogNormalHyperparameters",
    "SampledSquaredExponential",
    "dpo_whitened_posterior",
    "mixture_moments",
    "whitened",
]
