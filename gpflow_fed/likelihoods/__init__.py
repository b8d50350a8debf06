"""Likelihoods of gpflow-fed."""

from .heterogeneous import HeterogeneousLikelihood

__all__ = ["HeterogeneousLikelihood"]
