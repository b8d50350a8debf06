"""PVI for sparse GPs (the DPO paper): the algorithm, its factors, the local problem and the named methods."""

from .algorithm import PVI, ClientUpdate, PVIState
from .methods import METHODS, make_pvi

__all__ = ["METHODS", "PVI", "ClientUpdate", "PVIState", "make_pvi"]
