"""Federated algorithms (each an :class:`~gpflow_fed.federated.Algorithm`)."""

from .fedavg_nn import FedAvgNN, FedAvgNNState, NetworkMean, NeuralRegression
from .fedbnr import FedBNR, FedBNRState, fedbnr_shared_state
from .fgp import FGP, FGPState
from .fsgp import FSGP, FSGPState, initial_inducing_inputs
from .inducing_inputs import inducing_from_public, inducing_grid
from .moments import Moments, MomentsState
from .personalised_gp import PersonalisedGP, PersonalisedGPState, PersonalisedGPs
from .pvi import PVI, PVIState
from .recycle import Recycle

__all__: list = [
    "FGP",
    "FGPState",
    "FSGP",
    "FSGPState",
    "FedAvgNN",
    "FedAvgNNState",
    "FedBNR",
    "FedBNRState",
    "Moments",
    "MomentsState",
    "NetworkMean",
    "NeuralRegression",
    "PVI",
    "PVIState",
    "PersonalisedGP",
    "PersonalisedGPState",
    "PersonalisedGPs",
    "Recycle",
    "fedbnr_shared_state",
    "inducing_from_public",
    "inducing_grid",
    "initial_inducing_inputs",
]
