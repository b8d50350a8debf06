"""Deprecated location of :func:`read_npz`; it lives in :mod:`gpflow_fed.models.serialization`."""

from .serialization import read_npz

__all__ = ["read_npz"]
