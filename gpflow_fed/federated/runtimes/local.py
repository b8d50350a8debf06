"""LocalRuntime: every client in one process; the reference behaviour of every algorithm."""

from __future__ import annotations

from typing import Dict, Mapping

from ..protocol.transport import Request, Response
from .base import InProcessRuntime

__all__ = ["LocalRuntime"]


class LocalRuntime(InProcessRuntime):
    """Runs an :class:`Algorithm` with all clients in this process, one after the other.

    ``run(algorithm, dataset, runtime=LocalRuntime(), options=RunOptions(...), protection=Protection(...))``; the run's
    options and protection are described there (:class:`~gpflow_fed.federated.RunOptions`,
    :class:`~gpflow_fed.federated.Protection`).

    :param options: default options of its runs.
    :param protection: default protection request of its runs.
    :param client_policy: the policy of every in-process client (default: what the run asks; see
        :class:`~gpflow_fed.federated.runtimes.base.InProcessRuntime`).
    """

    def send(self, requests: Mapping[str, Request]) -> Dict[str, Response]:
        """Each client answers in turn, in this process."""
        return {cid: self.endpoints[cid].handle(request) for cid, request in requests.items()}
