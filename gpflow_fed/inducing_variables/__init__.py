"""Inducing variables: DPO pseudo-observations, CPO natural factors, and a Gaussian distribution over inducing
inputs."""

from .gaussian_inducing_points import GaussianInducingPoints
from .natural_factor import NaturalFactor
from .pseudo_observations import S_FLOOR, PseudoObservations

__all__ = ["GaussianInducingPoints", "NaturalFactor", "PseudoObservations", "S_FLOOR"]

# GPflow dispatches (Kuu/Kuf, posterior class, prior_kl) for these types live in covariances/posteriors; load
# them with the types, since ``import gpflow_fed`` no longer imports every submodule eagerly.
from ..covariances import kuus_kufs  # noqa: E402,F401
from ..posteriors import dpo_posterior  # noqa: E402,F401
