"""Federated algorithms (each an :class:`~gpflow_fed.federated.Algorithm`)."""

from .fedbnr import FedBNR, FedBNRState, fedbnr_shared_state
from .fsgp import FSGP, FSGPState, initial_inducing_inputs
from .inducing_inputs import inducing_from_public, inducing_grid
from .pvi import PVI, PVIState
from .recycle import Recycle

__all__: list = ["Recycle", "FedBNR", "FedBNRState", "fedbnr_shared_state", "PVI", "PVIState", "FSGP", "FSGPState", "initial_inducing_inputs", "inducing_grid", "inducing_from_public"]
