"""Inducing variables: DPO pseudo-observations and a Gaussian distribution over inducing inputs."""

from .gaussian_inducing_points import GaussianInducingPoints
from .pseudo_observations import PseudoObservations

__all__ = ["GaussianInducingPoints", "PseudoObservations"]

# GPflow dispatches (Kuu/Kuf, posterior class, prior_kl) for these types live in covariances/posteriors; load
# them with the types, since ``import gpflow_fed`` no longer imports every submodule eagerly.
from .. import covariances, posteriors  # noqa: E402,F401
