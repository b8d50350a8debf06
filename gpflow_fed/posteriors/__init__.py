"""Posteriors: DPOPosterior (registered with ``gpflow.posteriors.get_posterior_class``) and whitened algebra."""

from . import whitened
from .dpo_posterior import DPOPosterior, dpo_whitened_posterior

__all__ = ["DPOPosterior", "dpo_whitened_posterior", "whitened"]
