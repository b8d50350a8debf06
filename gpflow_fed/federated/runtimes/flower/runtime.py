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
from typing import Any, Dict, Iterable, List, Optional

import numpy as np
from flwr.app import Context, Error, RecordDict
from flwr.app import Message as FlowerMessage
from flwr.clientapp import ClientApp
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from ....data.dataset import FederatedDataset
from ...algorithm import Algorithm
from ...factories import register_algorithm_factory
from ...options import RunOptions
from ...protection.policy import ClientPolicy
from ...protection.request import Protection
from ...result import FederatedResult
from ..base import Runtime
from .client_app import _LIVE, make_client_app
from .server_app import FlowerServer

__all__ = ["FlowerRuntime", "LoopbackGrid"]

#: Flower's error code for an exception raised by a ClientApp (flwr.app.error codes)
CLIENT_APP_RAISED_EXCEPTION = 0


def _over_the_wire(content: RecordDict) -> RecordDict:
    """``content`` after Flower's protobuf encoding and decoding."""
    proto = ProtoRecordDict()
    proto.ParseFromString(recorddict_to_proto(content).SerializeToString())
    return recorddict_from_proto(proto)


class LoopbackGrid(Grid):
    """A Flower ``Grid`` whose nodes are ClientApps in this process (one :class:`Context` per node).

    :param client_app: the ClientApp every node runs.
    :param node_configs: one node config per node (node ids 1001, 1002, …).
    :param run_config: the run config every node sees.
    :param run_id: the run's id.
    """

    def __init__(
        self, client_app: ClientApp, node_configs: List[Dict[str, Any]], run_config: Dict[str, Any], run_id: int
    ) -> None:
        self._run = Run.create_empty(run_id)
        self.client_app = client_app
        self.contexts = {
            1001 + i: Context(
                run_id=run_id, node_id=1001 + i, node_config=dict(cfg), state=RecordDict(), run_config=dict(run_config)
            )
            for i, cfg in enumerate(node_configs)
        }
        self._pending: Dict[str, FlowerMessage] = {}

    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(
        self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str, ttl: Optional[float] = None
    ) -> FlowerMessage:
        return FlowerMessage(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def push_messages(self, messages: Iterable[FlowerMessage]) -> Iterable[str]:
        ids = []
        for msg in messages:
            if msg.metadata.dst_node_id not in self.contexts:
                raise ValueError(f"no node {msg.metadata.dst_node_id} in this grid (nodes: {sorted(self.contexts)})")
            msg.metadata.__dict__["_message_id"] = uuid.uuid4().hex
            msg.metadata.__dict__["_src_node_id"] = SUPERLINK_NODE_ID
            self._pending[msg.metadata.message_id] = msg
            ids.append(msg.metadata.message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[FlowerMessage]:
        replies = []
        for mid in message_ids:
            msg = self._pending.pop(mid)
            delivered = FlowerMessage(
                _over_the_wire(msg.content),
                msg.metadata.dst_node_id,
                msg.metadata.message_type,
                group_id=msg.metadata.group_id,
            )
            delivered.metadata.__dict__["_message_id"] = mid
            delivered.metadata.__dict__["_src_node_id"] = SUPERLINK_NODE_ID
            try:
                reply = self.client_app(delivered, self.contexts[msg.metadata.dst_node_id])
                reply = FlowerMessage(_over_the_wire(reply.content), reply_to=delivered)
            except Exception as exc:  # noqa: BLE001 - a SuperNode turns a ClientApp exception into an error reply
                reply = FlowerMessage(
                    Error(CLIENT_APP_RAISED_EXCEPTION, f"{type(exc).__name__}: {exc}"), reply_to=delivered
                )
            reply.metadata.__dict__["_src_node_id"] = msg.metadata.dst_node_id
            replies.append(reply)
        return replies

    def send_and_receive(
        self, messages: Iterable[FlowerMessage], *, timeout: Optional[float] = None
    ) -> Iterable[FlowerMessage]:
        return self.pull_messages(self.push_messages(messages))


@register_algorithm_factory
def algorithm_factory(run_config: Dict[str, Any]) -> Algorithm:
    """The factory :class:`FlowerRuntime` names in its run config: the run's algorithm, as every party would build
    it from the same code and settings (each party binds its own copy, ``Algorithm.bind``)."""
    return _ALGORITHMS[str(run_config["gpflow-fed-run"])]


_ALGORITHMS: Dict[str, Algorithm] = {}


class FlowerRuntime(Runtime):
    """Runs an :class:`~gpflow_fed.federated.Algorithm` through Flower's message API in this process.

    Every client of the dataset becomes a party with its own node config — its data, its index, and its policy
    (``secure-aggregation``, ``min-cohort``: by default matching the run's protection, since every party is in this
    process) — and the real ClientApp handlers; the server is a :class:`FlowerServer`. Options and protection as
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
        previous = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
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
                        }
                    )
                run_config = {
                    "algorithm": f"{__name__}:algorithm_factory",
                    "gpflow-fed-run": run_key,
                    "seed": int(seed),
                    **protection.to_config(),
                }
                grid = LoopbackGrid(make_client_app(keep_alive=True), configs, run_config, run_id)
                TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run_id, SUPERLINK_NODE_ID, 1
                result = server.run(grid, test=dataset.test, monitor=monitor)
                self.transport = server.transport
                return result
        finally:
            _ALGORITHMS.pop(run_key, None)
            for key in [k for k in _LIVE if k[0] == run_id]:
                del _LIVE[key]
            TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = previous
