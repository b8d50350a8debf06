"""The Flower ServerApp's transport: one stage's requests over a Flower ``Grid``, raw responses back.

Each request becomes a Flower ``train`` message to the client's SuperNode (:mod:`.records` encodes it); a reply
becomes a :class:`~gpflow_fed.federated.protocol.transport.Response`. A Flower error reply, no reply within
``timeout`` or a
reply that is not a gpflow-fed response is a :class:`Response` with its fault. Nothing else happens here: the phase
owner screens, protects, reduces and records. Every request also names its job (:func:`~.records.job_to_config`):
the moments exchange or the training, with the moments the parties standardise their rows with.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from flwr.app import Message as FlowerMessage
from flwr.app import MessageType
from flwr.serverapp import Grid

from ...protocol.algorithm import FederationInfo
from ...protocol.transport import Request, Response, Transport
from .records import JOB, TRAIN_JOB, job_to_config, recorddict_to_response, request_context, request_to_recorddict

__all__ = ["GridTransport"]


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

    def send(self, requests: Mapping[str, Request]) -> Dict[str, Response]:
        outgoing = []
        group = ""
        for cid, request in requests.items():
            group = f"{request.purpose}/{request.message.round}/{request.message.phase}/{request.stage}"
            content = request_to_recorddict(request, self.info)
            content[JOB] = job_to_config(self.job, self.standardizer)
            outgoing.append(self.grid.create_message(content, MessageType.TRAIN, self.node_of[cid], group))
        self.messages_sent += len(outgoing)
        self.stages += 1
        self.groups.append(group)
        client_of = {n: c for c, n in self.node_of.items()}
        received: Dict[str, FlowerMessage] = {}
        for incoming in self.grid.send_and_receive(outgoing, timeout=self.timeout):
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
