"""The Flower ServerApp's transport: one stage's requests over a Flower ``Grid``, raw responses back.

Each request becomes a Flower ``train`` message to the client's SuperNode (:mod:`.records` encodes it); a reply
becomes a :class:`~gpflow_fed.federated.protocol.transport.Response`. A Flower error reply, no reply within
``timeout`` or a
reply that is not a gpflow-fed response is a :class:`Response` with its fault. Nothing else happens here: the phase
owner screens, protects, reduces and records. Every request also names its job (:func:`~.records.job_to_config`):
the moments exchange or the training, with the moments the parties standardise their rows with.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Mapping, Optional, Sequence

from flwr.app import Message as FlowerMessage
from flwr.app import MessageType, RecordDict
from flwr.serverapp import Grid

from ...protocol.algorithm import FederationInfo
from ...protocol.transport import Request, Response, Transport
from .records import JOB, TRAIN_JOB, job_to_config, recorddict_to_response, request_context, request_to_recorddict

__all__ = ["POLL", "GridTransport", "exchange", "instruction"]

#: seconds between the ServerApp's pulls of a stage's replies (Flower's ``Grid.send_and_receive`` waits 3 s)
POLL = 0.1


def instruction(content: RecordDict, message_type: str, dst_node_id: int, group_id: str) -> FlowerMessage:
    """A message from the ServerApp to one SuperNode, made with Flower 1.41's ``Message`` constructor (its
    ``Grid.create_message`` is deprecated); the grid fills in the run and message ids when it pushes it."""
    return FlowerMessage(content, int(dst_node_id), message_type, group_id=group_id)


def exchange(
    grid: Grid, messages: Sequence[FlowerMessage], timeout: Optional[float] = None, poll: float = POLL
) -> List[FlowerMessage]:
    """Push ``messages`` and pull their replies every ``poll`` seconds until every one has answered or ``timeout``
    seconds have passed (None: no limit): Flower's ``Grid.send_and_receive``, which pulls every 3 s, with a shorter
    wait (each pull is one small request to the SuperLink), so a stage ends when its last reply arrives.

    :raises ValueError: a ``poll`` that is not positive.
    """
    if not poll > 0:
        raise ValueError(f"poll must be positive seconds, got {poll!r}")
    waiting = {mid for mid in grid.push_messages(messages) if mid}  # a message not pushed has no id: no reply
    deadline = None if timeout is None else time.monotonic() + timeout
    replies: List[FlowerMessage] = []
    while waiting:
        pulled = list(grid.pull_messages(waiting))
        replies.extend(pulled)
        waiting -= {reply.metadata.reply_to_message_id for reply in pulled}
        if not waiting or deadline is not None and time.monotonic() >= deadline:
            break
        time.sleep(poll)
    return replies


class GridTransport(Transport):
    """Requests to SuperNodes and their responses (module docstring).

    :param grid: the Flower ``Grid`` of the run.
    :param node_of: ``{client id: node id}`` from the server's discovery.
    :param info: the federation, sent with every request so that each party binds its algorithm to it.
    :param timeout: seconds to wait for one stage's replies (None: no limit).
    :param job: the job every request belongs to (:data:`~.records.JOBS`).
    :param standardizer: for a ``"train"`` job on standardised data, the agreed moments (a
        :class:`~gpflow_fed.data.Standardizer`), sent with every request.
    """

    def __init__(
        self,
        grid: Grid,
        node_of: Mapping[str, int],
        info: FederationInfo,
        timeout: Optional[float] = None,
        *,
        job: str = TRAIN_JOB,
        standardizer: Optional[Any] = None,
    ) -> None:
        self.grid = grid
        self.node_of = dict(node_of)
        self.info = info
        self.timeout = timeout
        job_to_config(job, standardizer)  # an unknown job is refused here, before any message
        self.job, self.standardizer = job, standardizer
        self.context = request_context(info, job, standardizer)
        #: Flower messages sent and stages run, for the loopback benchmark's "exchanges per round"
        self.messages_sent = 0
        self.stages = 0
        #: each stage's group name ``purpose/round/phase/stage``, in order (one Flower exchange each)
        self.groups: List[str] = []
        #: each stage's seconds, from its first message pushed to its last reply pulled (in :attr:`groups`' order)
        self.seconds: List[float] = []

    def send(self, requests: Mapping[str, Request]) -> Dict[str, Response]:
        outgoing = []
        group = ""
        for cid, request in requests.items():
            group = f"{request.purpose}/{request.message.round}/{request.message.phase}/{request.stage}"
            content = request_to_recorddict(request, self.info)
            content[JOB] = job_to_config(self.job, self.standardizer)
            outgoing.append(instruction(content, MessageType.TRAIN, self.node_of[cid], group))
        self.messages_sent += len(outgoing)
        self.stages += 1
        self.groups.append(group)
        client_of = {n: c for c, n in self.node_of.items()}
        received: Dict[str, FlowerMessage] = {}
        started = time.perf_counter()
        answers = exchange(self.grid, outgoing, self.timeout)
        self.seconds.append(time.perf_counter() - started)
        for incoming in answers:
            sender = client_of.get(int(incoming.metadata.src_node_id))
            # a reply from a node not asked, or a second one: ignored
            if sender is not None and sender in requests and sender not in received:
                received[sender] = incoming
        responses: Dict[str, Response] = {}
        for cid in requests:
            reply = received.get(cid)
            if reply is None:
                responses[cid] = Response(fault=f"no reply within {self.timeout} s")
            elif reply.has_error():
                reason = f"raised on its SuperNode: {reply.error.reason}"
                responses[cid] = Response(fault=reason, error=RuntimeError(reason))
            else:
                try:
                    responses[cid] = recorddict_to_response(reply.content)
                except (ValueError, TypeError, KeyError) as exc:
                    reason = f"sent a malformed reply: {exc}"
                    responses[cid] = Response(fault=reason, error=ValueError(reason))
        return responses
