"""The Flower app of gpflow-fed: its components and the keys of its run config, with their defaults.

What :func:`~.deploy.write_app` writes into an app's ``pyproject.toml`` and what the ServerApp
(:func:`~.server_app.make_server_app`) reads. Nothing here imports TensorFlow or Flower, so the server's command
(``gpflow-fed flower server``) writes its app and starts its processes without either.
"""

from __future__ import annotations

from typing import Any, Dict

from ...engine.options import RunOptions
from ...protection.request import Protection

__all__ = ["CLIENT_APP", "FIT_FACTORY", "SERVER_APP", "TABLE_APP", "run_config_defaults"]

#: the ServerApp of a Flower deployment of any registered algorithm
SERVER_APP = "gpflow_fed.federated.runtimes.flower.server_app:app"
#: the ServerApp of a table run (``gpflow-fed flower server``): the runtime's ServerApp with fit's job and model saving
TABLE_APP = "gpflow_fed.fitting.flower:server_app"
#: the ClientApp: one party
CLIENT_APP = "gpflow_fed.federated.runtimes.flower.client_app:app"
#: the registered name of :func:`gpflow_fed.fitting.flower.fit_method`, the algorithm factory of a table run
FIT_FACTORY = "gpflow-fed:fit"


def run_config_defaults() -> Dict[str, Any]:
    """Every run-config key the ServerApp (:func:`~.server_app.make_server_app`) reads besides ``algorithm``, with
    the value that means its default. :func:`~.deploy.write_app` writes them all into an app, so that ``flwr run
    --run-config "k=v ..."`` may set any of them (Flower refuses to override a key the app lacks). The protection
    request is the default :class:`~gpflow_fed.federated.Protection` (secure aggregation)."""
    return {
        "seed": 0,
        "num-clients": 0,  # 0: the SuperNodes connected when the run starts
        "wait": 120.0,  # seconds to wait for num-clients SuperNodes
        "standardize": False,
        "output": "",
        "save": "",
        "test-data": "",
        # the run options (timeout: seconds a party may take per request, 0: no limit; checkpoint-dir "": none)
        **RunOptions().to_config(),
        **Protection().to_config(),
    }
