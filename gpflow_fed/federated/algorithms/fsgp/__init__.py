"""FSGP (Guo et al.): federated sparse GP regression — the algorithm, the client statistics and the shared worker."""

from .algorithm import FSGP, FSGPState
from .worker import SGPRClientWorker, initial_inducing_inputs

__all__ = ["FSGP", "FSGPState", "SGPRClientWorker", "initial_inducing_inputs"]
