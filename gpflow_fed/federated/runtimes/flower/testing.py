"""A Flower ``Grid`` in this process: every node a ClientApp with its own ``Context``, for the in-process
:class:`~.runtime.FlowerRuntime` and for tests. Messages are built with Flower's public ``Metadata`` and go through
Flower's protobuf serialisation, so what crosses is what crosses a SuperLink.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Dict, Iterable, List, Optional

from flwr.app import Context, Error, Metadata, RecordDict
from flwr.app import Message as FlowerMessage
from flwr.clientapp import ClientApp
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from .records import recorddict_from_bytes, recorddict_to_bytes

__all__ = ["LoopbackGrid", "over_the_wire"]

#: Flower's error code for an exception raised by a ClientApp (flwr.app.error codes)
CLIENT_APP_RAISED_EXCEPTION = 0
#: a message's time to live (seconds): Flower's default
TTL = 43200.0


def over_the_wire(content: RecordDict) -> RecordDict:
    """``content`` after Flower's protobuf encoding and decoding."""
    return recorddict_from_bytes(recorddict_to_bytes(content))


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
        self.run_id = int(run_id)
        # this process is the run's ServerApp, as Flower's own in-process runs declare (flwr.simulation): Flower's
        # Message constructor reads the sender from it
        TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, int(run_id), SUPERLINK_NODE_ID
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

    def _message(
        self, content: Any, message_id: str, src: int, dst: int, message_type: str, group_id: str, reply_to: str = ""
    ) -> FlowerMessage:
        metadata = Metadata(
            run_id=self.run_id,
            message_id=message_id,
            src_node_id=src,
            dst_node_id=dst,
            reply_to_message_id=reply_to,
            group_id=group_id,
            created_at=time.time(),
            ttl=TTL,
            message_type=message_type,
        )
        # Flower's typed overloads omit metadata=, which its own make_message passes (flwr.app.message.message)
        if isinstance(content, Error):
            return FlowerMessage(error=content, metadata=metadata)  # type: ignore[call-overload]  # metadata=
        return FlowerMessage(content=content, metadata=metadata)  # type: ignore[call-overload]  # metadata=

    def create_message(
        self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str, ttl: Optional[float] = None
    ) -> FlowerMessage:
        return self._message(content, "", SUPERLINK_NODE_ID, dst_node_id, message_type, group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def push_messages(self, messages: Iterable[FlowerMessage]) -> Iterable[str]:
        ids = []
        for msg in messages:
            meta = msg.metadata
            if meta.dst_node_id not in self.contexts:
                raise ValueError(f"no node {meta.dst_node_id} in this grid (nodes: {sorted(self.contexts)})")
            mid = uuid.uuid4().hex
            self._pending[mid] = self._message(
                over_the_wire(msg.content), mid, SUPERLINK_NODE_ID, meta.dst_node_id, meta.message_type, meta.group_id
            )
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[FlowerMessage]:
        replies = []
        for mid in message_ids:
            delivered = self._pending.pop(mid)
            meta = delivered.metadata
            node = meta.dst_node_id
            try:
                answer: Any = over_the_wire(self.client_app(delivered, self.contexts[node]).content)
            except Exception as exc:  # noqa: BLE001 - a SuperNode turns a ClientApp exception into an error reply
                answer = Error(CLIENT_APP_RAISED_EXCEPTION, f"{type(exc).__name__}: {exc}")
            reply_id = uuid.uuid4().hex
            replies.append(
                self._message(answer, reply_id, node, SUPERLINK_NODE_ID, meta.message_type, meta.group_id, mid)
            )
        return replies

    def send_and_receive(
        self, messages: Iterable[FlowerMessage], *, timeout: Optional[float] = None
    ) -> Iterable[FlowerMessage]:
        return self.pull_messages(self.push_messages(messages))
