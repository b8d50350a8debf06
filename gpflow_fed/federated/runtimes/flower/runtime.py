"""FlowerRuntime: run an algorithm through the Flower ServerApp/ClientApp adapters inside this process.

``run(algorithm, dataset, runtime=FlowerRuntime())`` is the Flower path on one machine: every client of the
dataset becomes a SuperNode-like party with its own node config (its data written to an ``.npz`` in a
temporary folder, its ``client-index``), its own copy of the algorithm, and the real
:func:`~gpflow_fed.federated.runtimes.flower.client_app.make_client_app` handlers; the server side is
:class:`~gpflow_fed.federated.runtimes.flower.server_app.FlowerServer`. Between them, :class:`LoopbackGrid`
delivers Flower messages whose contents go through Flower's protobuf serialisation (``RecordDict`` →
bytes → ``RecordDict``), so what crosses is exactly what crosses a SuperLink. A client that raises is
answered by a Flower error reply, as on a SuperNode.

Flower's own Simulation Engine needs Ray (``flwr[simulation]``), which this package does not require; for
parties on different machines use the Deployment Engine (``docs/guides/flower.md``).
"""

from __future__ import annotations

import os
import tempfile
import uuid
from typing import Any, Dict, Mapping, Optional

import numpy as np

from ....data.dataset import FederatedDataset
from ...protocol.algorithm import Algorithm
from ...engine.factories import register_algorithm_factory
from ...engine.options import RunOptions
from ...protection.policy import ClientPolicy
from ...protection.request import Protection
from ...engine.result import FederatedResult
from ..base import Runtime
from .client_app import _LIVE, make_client_app
from .testing import LoopbackGrid
from .server_app import FlowerServer

__all__ = ["FlowerRuntime", "LoopbackGrid"]


@register_algorithm_factory
def algorithm_factory(run_config: Mapping[str, Any]) -> Algorithm:
    """The factory :class:`FlowerRuntime` names in its run config: the run's algorithm, as every party would build
    it from the same code and settings (each party binds its own copy, ``Algorithm.bind``)."""
    return _ALGORITHMS[str(run_config["gpflow-fed-run"])]


_ALGORITHMS: Dict[str, Algorithm] = {}


class FlowerRuntime(Runtime):
    """Runs an :class:`~gpflow_fed.federated.Algorithm` through Flower's message API in this process.

    Every client of the dataset becomes a party with its own node config — its data, its index, and its policy
    (``secure-aggregation``, ``min-cohort``, ``protect-small-cohorts``: by default matching the run's protection,
    since every party is in this process) — and the real ClientApp handlers; the server is a
    :class:`FlowerServer`. Options and protection as
    for :class:`~gpflow_fed.federated.LocalRuntime` (``run(..., options=..., protection=...)``).

    :param client_policy: every party's policy (default: matching the run's protection).
    :param kwargs: ``options``, ``protection`` and the deprecated keyword arguments, as for ``LocalRuntime``.
    """

    def __init__(self, *, client_policy: Optional[ClientPolicy] = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if client_policy is not None and not isinstance(client_policy, ClientPolicy):
            raise TypeError(f"client_policy must be a ClientPolicy, got {type(client_policy).__name__}")
        self.client_policy = client_policy
        #: the last run's transport (its message counts)
        self.transport: Optional[Any] = None

    def execute(
        self,
        algorithm: Algorithm,
        dataset: FederatedDataset,
        *,
        options: Optional[RunOptions] = None,
        protection: Optional[Protection] = None,
        monitor: Optional[Any] = None,
        seed: int = 0,
    ) -> FederatedResult:
        if not isinstance(dataset, FederatedDataset):
            raise TypeError(f"dataset must be a FederatedDataset, got {type(dataset).__name__}")
        options = options or self.options
        protection = protection or self.protection
        policy = self.client_policy or ClientPolicy.matching(protection)
        server = FlowerServer(algorithm, seed=seed, options=options, protection=protection)
        run_key = uuid.uuid4().hex
        run_id = int(run_key[:12], 16)
        _ALGORITHMS[run_key] = algorithm
        try:
            with tempfile.TemporaryDirectory(prefix="gpflow_fed_flower_") as tmp:
                configs = []
                for k, (X, Y) in enumerate(dataset.clients):
                    path = os.path.join(tmp, f"client_{k}.npz")
                    np.savez(path, X=X, Y=Y)
                    configs.append(
                        {
                            "data": path,
                            "client-index": k,
                            "state-dir": os.path.join(tmp, "state"),
                            "secure-aggregation": policy.secure_aggregation,
                            "min-cohort": policy.min_cohort,
                            "protect-small-cohorts": policy.protect_small_cohorts,
                        }
                    )
                run_config = {
                    "algorithm": f"{__name__}:algorithm_factory",
                    "gpflow-fed-run": run_key,
                    "seed": int(seed),
                    **protection.to_config(),
                }
                grid = LoopbackGrid(make_client_app(keep_alive=True), configs, run_config, run_id)
                result = server.run(grid, test=dataset.test, monitor=monitor)
                self.transport = server.transport
                return result
        finally:
            _ALGORITHMS.pop(run_key, None)
            for key in [k for k in _LIVE if k[0] == run_id]:
                del _LIVE[key]
