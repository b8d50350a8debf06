"""LocalRuntime: every client in one process; the reference behaviour of every algorithm."""

from __future__ import annotations

import time
from typing import Dict, List, Mapping, Optional, Union

from ...validation import integer
from ..engine.endpoint import Admitted, ClientEndpoint, fault_response
from ..engine.options import RunOptions
from ..protection.policy import ClientPolicy
from ..protection.request import Protection
from ..protocol.messages import Message
from ..protocol.transport import UPDATE, Request, Response
from .base import InProcessRuntime

__all__ = ["DEFAULT_BATCH_MEMORY", "DEFAULT_MIN_BATCH", "LocalRuntime"]

#: the default bytes one batched computation of a cohort may use (a larger cohort is processed in chunks); FSGP at
#: M = 20, N_k = 10: about 1,600 clients a chunk (``BatchedSGPRWorker.bytes_per_client``)
DEFAULT_BATCH_MEMORY = 64 * 2**20
#: the default smallest cohort whose updates are computed together: below it, tracing the batched computation (a few
#: seconds once per run) costs more than the per-client calls it saves over a run's rounds
DEFAULT_MIN_BATCH = 32


class LocalRuntime(InProcessRuntime):
    """Runs an :class:`Algorithm` with all clients in this process.

    ``run(algorithm, dataset, runtime=LocalRuntime(), options=RunOptions(...), protection=Protection(...))``; the run's
    options and protection are described there (:class:`~gpflow_fed.federated.RunOptions`,
    :class:`~gpflow_fed.federated.Protection`).

    **Batched clients.** Where the algorithm declares a batched form of a phase (``Algorithm.batched``, e.g. all of
    FSGP's phases), the updates of a cohort of at least ``min_batch`` clients are computed in one call
    (``Algorithm.client_updates``: one compiled computation over the clients' stacked data per size bucket and memory
    chunk) instead of one ``client_update`` per client. Only the computation is shared: each client still admits the
    request on its own (its schedule, its policy's refusals, the claim of a masked exchange), its own slice of the
    output goes through its own answer (envelope, small-cohort rule, value and weight checks, DP clipping and
    encoding, secure aggregation) and the ledger records its messages, exactly as on the per-client path; the results
    equal that path's to round-off. A client's ``seconds`` (``FaultPolicy.timeout``) is then the batch's time divided
    by the clients it computed.

    :param options: default options of its runs.
    :param protection: default protection request of its runs.
    :param client_policy: the policy of every in-process client (default: what the run asks; see
        :class:`~gpflow_fed.federated.runtimes.base.InProcessRuntime`).
    :param batched: compute a cohort's updates together where the algorithm supports it (default ``True``);
        ``False`` forces one ``Algorithm.client_update`` per client, e.g. to debug one client's update.
    :param batch_memory: bytes one batched computation may use (default 64 MiB); a cohort that needs more is
        processed in chunks, never refused.
    :param min_batch: the smallest cohort computed together (default 32); a smaller one is asked client by client,
        as its few per-client calls cost less than tracing the batched computation.
    :raises TypeError: ``batched`` not a bool; :raises ValueError: ``batch_memory`` or ``min_batch`` not a positive
        integer.
    """

    def __init__(
        self,
        *,
        options: Optional[RunOptions] = None,
        protection: Optional[Protection] = None,
        client_policy: Optional[ClientPolicy] = None,
        batched: bool = True,
        batch_memory: int = DEFAULT_BATCH_MEMORY,
        min_batch: int = DEFAULT_MIN_BATCH,
    ) -> None:
        super().__init__(options=options, protection=protection, client_policy=client_policy)
        if not isinstance(batched, bool):
            raise TypeError(f"LocalRuntime: batched must be True or False, got {batched!r}")
        self.batched = batched
        self.batch_memory = integer(batch_memory, "LocalRuntime: batch_memory", minimum=1)
        self.min_batch = integer(min_batch, "LocalRuntime: min_batch", minimum=1)

    def send(self, requests: Mapping[str, Request]) -> Dict[str, Response]:
        """Each client answers in this process: an update request shared by a cohort of at least ``min_batch`` clients
        whose algorithm batches its phase in one batched computation, every other request by each client in turn."""
        batches: Dict[int, List[str]] = {}
        if self.batched:
            for cid, request in requests.items():
                if request.stage == UPDATE:
                    batches.setdefault(id(request), []).append(cid)
        responses: Dict[str, Response] = {}
        for cids in batches.values():
            endpoint = self.endpoints[cids[0]]
            if len(cids) >= self.min_batch and endpoint.algorithm.batched(requests[cids[0]].message.phase):
                responses.update(self._batch({cid: self.endpoints[cid] for cid in cids}, requests[cids[0]]))
        for cid, request in requests.items():
            if cid not in responses:
                responses[cid] = self.endpoints[cid].handle(request)
        return {cid: responses[cid] for cid in requests}

    def _batch(self, endpoints: Mapping[str, ClientEndpoint], request: Request) -> Dict[str, Response]:
        """One update request to a cohort: each client admits it, the admitted clients' updates are computed together
        (``Algorithm.client_updates``), and each client answers with its own update."""
        responses: Dict[str, Response] = {}
        admitted: Dict[str, Admitted] = {}
        for cid, endpoint in endpoints.items():
            try:
                checked = endpoint.admit(request)
            except Exception as exc:  # noqa: BLE001 - a client-side failure is a fault, as in ClientEndpoint.handle
                responses[cid] = fault_response(exc)
                continue
            if isinstance(checked, Response):
                responses[cid] = checked
            else:
                admitted[cid] = checked
        if not admitted:
            return responses
        groups: Dict[int, List[str]] = {}  # one computation per algorithm object (in process: the run's one)
        for cid in admitted:
            groups.setdefault(id(endpoints[cid].algorithm), []).append(cid)
        for cids in groups.values():
            algorithm = endpoints[cids[0]].algorithm
            broadcast = admitted[cids[0]].broadcast
            started = time.perf_counter()
            try:
                outcomes: List[Union[Message, Exception]] = algorithm.client_updates(
                    [endpoints[cid].client for cid in cids], broadcast, self.batch_memory
                )
                if len(outcomes) != len(cids):
                    raise RuntimeError(f"client_updates returned {len(outcomes)} updates for {len(cids)} clients")
            except Exception as exc:  # noqa: BLE001 - the batch failed: every client's update failed with it
                outcomes = [exc] * len(cids)
            elapsed = (time.perf_counter() - started) / len(cids)
            for cid, outcome in zip(cids, outcomes):
                try:
                    responses[cid] = endpoints[cid].answer(admitted[cid], outcome, elapsed)
                except Exception as exc:  # noqa: BLE001 - as in ClientEndpoint.handle
                    responses[cid] = fault_response(exc)
        return responses
