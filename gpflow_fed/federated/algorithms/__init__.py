"""Federated algorithms (each an :class:`~gpflow_fed.federated.Algorithm`)."""

from .fedavg_nn import FedAvgNN, FedAvgNNState, NetworkMean, NeuralRegression
from .fedbnr import FedBNR, FedBNRState, fedbnr_shared_state
from .fedbnr_ablations import ABLATIONS, fedbnr_ablation, last_layers, learn_kernels
from .fsgp import FSGP, FSGPState, initial_inducing_inputs
from .inducing_inputs import inducing_from_public, inducing_grid
from .personalised_gp import PersonalisedGP, PersonalisedGPState, PersonalisedGPs
from .pvi import PVI, PVIState
from .recycle import Recycle

__all__: list = ["Recycle", "FedBNR", "FedBNRState", "fedbnr_shared_state", "ABLATIONS", "fedbnr_ablation", "last_layers", "learn_kernels", "PVI", "PVIState", "FSGP", "FSGPState", "initial_inducing_inputs", "inducing_grid", "inducing_from_public", "FedAvgNN", "FedAvgNNState", "NetworkMean", "NeuralRegression", "PersonalisedGP", "PersonalisedGPState", "PersonalisedGPs"]
