"""The local optimisation kit that federated algorithms and the baselines share:

* :mod:`.adam`: one compiled Adam loop on a worker shared by every client, each client with its own Adam state;
* :mod:`.state`: :class:`SharedState`, a model's shared parameters by stable key;
* :mod:`.stopping`: :class:`Plateau`, early stopping on a plateau of a monitored value.
"""

from .state import SharedState, resolve_path
from .stopping import Plateau

__all__ = ["Plateau", "SharedState", "resolve_path"]
