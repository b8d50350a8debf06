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
from typing import Any, Mapping, Optional

import numpy as np

from ....data.dataset import FederatedDataset
from ...protocol.algorithm import Algorithm
from ...engine.options import RunOptions
from ...protection.identity import write_federation
from ...protection.policy import ClientPolicy
from ...protection.request import Protection
from ...engine.result import FederatedResult
from ..base import Runtime
from .client_app import ClientHost
from .records import TRAIN_JOB, job_algorithm
from .testing import LoopbackGrid
from .server_app import FlowerServer

__all__ = ["FlowerRuntime", "LoopbackGrid"]


class FlowerRuntime(Runtime):
    """Runs an :class:`~gpflow_fed.federated.Algorithm` through Flower's message API in this process.

    Every client of the dataset becomes a party with its own node config — its data, its index, and its policy
    (``secure-aggregation``, ``min-cohort``, ``protect-small-cohorts``: by default matching the run's protection,
    since every party is in this process) — and the real ClientApp handlers; the server is a
    :class:`FlowerServer`. Options and protection as
    for :class:`~gpflow_fed.federated.LocalRuntime` (``run(..., options=..., protection=...)``).

    :param options: default :class:`~gpflow_fed.federated.RunOptions` of its runs.
    :param protection: default :class:`~gpflow_fed.federated.Protection` request of its runs.
    :param client_policy: every party's policy (default: matching the run's protection).
    """

    def __init__(
        self,
        *,
        options: Optional[RunOptions] = None,
        protection: Optional[Protection] = None,
        client_policy: Optional[ClientPolicy] = None,
    ) -> None:
        super().__init__(options=options, protection=protection, client_policy=client_policy)
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
        run_id = int(uuid.uuid4().hex[:12], 16)

        def parties_algorithm(job: str, run_config: Mapping[str, Any]) -> Algorithm:
            """The run's algorithm for the training job, as every party would build it from the same code and
            settings (each party binds its own copy, ``Algorithm.bind``); another job's as a deployment builds it."""
            return algorithm if job == TRAIN_JOB else job_algorithm(job, run_config)

        host = ClientHost(keep_alive=True, job_algorithm=parties_algorithm)
        with tempfile.TemporaryDirectory(prefix="gpflow_fed_flower_") as tmp:
            # every party a fresh signing key and one roster of them all (parity with a deployment)
            keys, roster = write_federation(
                os.path.join(tmp, "identity"), [f"client_{k}" for k in range(dataset.num_clients)]
            )
            configs = []
            for k, (X, Y) in enumerate(dataset.clients):
                path = os.path.join(tmp, f"client_{k}.npz")
                np.savez(path, X=X, Y=Y)
                configs.append(
                    {
                        "data": path,
                        "client-index": k,
                        "state-dir": os.path.join(tmp, "state"),
                        "signing-key": keys[f"client_{k}"],
                        "roster": roster,
                        # the party's whole policy as its node config (fractional-bits and max-colluders included)
                        **policy.to_node_config(),
                        "max-rounds": policy.max_rounds or max(algorithm.rounds, 1),  # in process: its own
                    }
                )
            run_config = {
                "seed": int(seed),
                **protection.to_config(),
            }
            grid = LoopbackGrid(host.app(), configs, run_config, run_id)
            result = server.run(grid, test=dataset.test, monitor=monitor)
            self.transport = server.transport
            return result
