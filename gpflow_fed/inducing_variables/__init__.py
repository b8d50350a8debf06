"""Inducing variables: DPO pseudo-observations and a Gaussian distribution over inducing inputs."""

from .gaussian_inducing_points import GaussianInducingPoints
from .pseudo_observations import PseudoObservations

__all__ = ["GaussianInducingPoints", "PseudoObservations"]
