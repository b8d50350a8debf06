"""Inducing variables: DPO pseudo-observations, CPO natural factors, and a Gaussian distribution over inducing inputs."""

from .gaussian_inducing_points import GaussianInducingPoints
from .natural_factor import NaturalFactor
from .pseudo_observations import S_FLOOR, PseudoObservations

__all__ = ["GaussianInducingPoints", "NaturalFactor", "PseudoObservations", "S_FLOOR"]
