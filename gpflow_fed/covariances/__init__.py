"""Kuu/Kuf registrations into ``gpflow.covariances`` for the gpflow-fed inducing variables."""

from . import kuus_kufs

__all__ = ["kuus_kufs"]
