"""DistributeRuntime: the clients spread over the replicas of a ``tf.distribute`` strategy; replies are all-gathered.

Every process runs the same server (the same seed gives the same client selection, broadcasts and server
updates everywhere); only the client work is divided. Client ``k`` (its index in the dataset) belongs to
replica ``k mod R`` (``placement="round_robin"``) or ``⌊k R / K⌋`` (``placement="blocks"``), for R replicas
and K clients. A process runs the clients of its own replicas, each under its replica's device
(``tf.device``), so their models and optimizers live there.

The runtime is only a transport (:class:`~gpflow_fed.federated.protocol.transport.Transport`): for every stage it
delivers the responses of every client to every process, and each process's phase owner
(:class:`~gpflow_fed.federated.engine.exchange.PhaseOwner`) records, screens, protects and reduces them exactly as
:class:`~gpflow_fed.federated.LocalRuntime`'s does. In a single process (``MirroredStrategy``) every response is
already at hand. Across processes (``MultiWorkerMirroredStrategy``) the responses are all-gathered with collective
all-reduces (``strategy.reduce(SUM, ...)`` of per-replica values, each replica filling its own segment of a zero
vector): first each response's header (fault, timing, layout, and the message's names, shapes, dtypes, weight,
metrics) as JSON bytes, then the payloads as float64 words. A value travels as itself when
float64 holds it exactly (floats, bools, integers of up to 32 bits), otherwise as its bytes, four to a word
(64-bit integers such as secure aggregation's masked codes, fixed-width strings such as Recycle's JSON
model spec), so every process receives every message bit for bit.

In a protected phase a client's update response is only its layout; the later stages (public keys, masked
payloads) are all-gathered like any other response. The DP noise comes from the chief's OS-random server secret,
which every process shares, so every process adds the same noise.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf

from ...data.dataset import FederatedDataset
from ..protocol.algorithm import Algorithm
from ..protocol.messages import Message
from ..engine.options import RunOptions
from ..protection.policy import ClientPolicy
from ..protection.identity import PartyIdentity
from ..protection.reduction import Reducer
from ..protection.request import Protection
from ..protocol.transport import Request, Response
from .base import InProcessRuntime

__all__ = ["DistributeRuntime", "PLACEMENTS", "worker_folder"]

PLACEMENTS = ("round_robin", "blocks")
#: what the all-reduce carries (see :func:`_to_words` for how every payload arrives exactly)
WIRE_DTYPE = np.float64


def _exact_as_float(dtype: np.dtype) -> bool:
    """Whether float64 holds every value of ``dtype`` exactly (else its bytes travel)."""
    return dtype.kind in "bf" or (dtype.kind in "iu" and dtype.itemsize <= 4)


def _words(shape: Sequence[int], dtype: str) -> int:
    """How many float64 words an array of ``shape`` and ``dtype`` fills on the wire."""
    size, dt = int(np.prod(shape, dtype=np.int64)), np.dtype(dtype)
    if _exact_as_float(dt):
        return size
    if dt.kind in "iuUS":
        return -(-size * dt.itemsize // 4)
    raise TypeError(f"DistributeRuntime carries real numbers and fixed-width strings, not dtype {dtype}")


def _to_words(array: Any) -> np.ndarray:
    """``array`` as exact float64 words: its values if float64 holds them, else its bytes as 32-bit integers."""
    array = np.asarray(array)
    _words(array.shape, str(array.dtype))  # rejects other dtypes
    if _exact_as_float(array.dtype):
        return array.astype(WIRE_DTYPE).ravel()
    raw = np.ascontiguousarray(array).tobytes()
    return np.frombuffer(raw + bytes(-len(raw) % 4), np.uint32).astype(WIRE_DTYPE)


def _from_words(words: np.ndarray, shape: Sequence[int], dtype: str) -> np.ndarray:
    """The inverse of :func:`_to_words`."""
    dt = np.dtype(dtype)
    if _exact_as_float(dt):
        return words.reshape(shape).astype(dt)
    raw = words.astype(np.uint32).tobytes()[: int(np.prod(shape, dtype=np.int64)) * dt.itemsize]
    return np.frombuffer(raw, dt).reshape(shape).copy()


def _header(message: Message) -> Dict[str, Any]:
    """What travels of ``message`` besides its payload values."""
    names = list(message.arrays)
    return {
        "sender": message.sender,
        "round": int(message.round),
        "phase": message.phase,
        "names": names,
        "shapes": [list(message.arrays[n].shape) for n in names],
        "dtypes": [str(message.arrays[n].dtype) for n in names],
        "weight": message.weight,
        "metrics": dict(message.metrics),
    }


def _message(header: Mapping[str, Any], words: np.ndarray) -> Message:
    """The message whose header and payload words came from another process."""
    arrays, start = {}, 0
    for name, shape, dtype in zip(header["names"], header["shapes"], header["dtypes"]):
        size = _words(shape, dtype)
        arrays[name] = _from_words(words[start : start + size], shape, dtype)
        start += size
    return Message(
        header["sender"],
        int(header["round"]),
        header["phase"],
        arrays,
        weight=float(header["weight"]),
        metrics={k: float(v) for k, v in header["metrics"].items()},
    )


def worker_folder(strategy: tf.distribute.Strategy, directory: str) -> str:
    """``directory``, or its sub-folder ``worker-<task index>`` when ``strategy`` spans several workers."""
    resolver = getattr(strategy, "cluster_resolver", None)
    spec = resolver.cluster_spec().as_dict() if resolver is not None else {}
    if sum(len(tasks) for tasks in spec.values()) <= 1:
        return directory
    return os.path.join(directory, f"worker-{int(resolver.task_id)}")  # type: ignore[union-attr]  # tasks imply a resolver


class DistributeRuntime(InProcessRuntime):
    """Runs an :class:`Algorithm` with its clients spread over the replicas of a ``tf.distribute`` strategy.

    The same algorithm and seed give exactly the result of :class:`~gpflow_fed.federated.LocalRuntime`: every
    process reduces every response, in the same order, through the same phase owner; the history, faults and ledger
    entries are the same too.

    * ``tf.distribute.MirroredStrategy(devices)``: one process, a replica per device (GPUs, or logical CPUs).
    * ``tf.distribute.MultiWorkerMirroredStrategy()``: one process per host, started with ``TF_CONFIG``;
      call :func:`~gpflow_fed.federated.run` with the same algorithm, dataset and seed in every process.
      Each process runs only its own replicas' clients (the others' data are never touched), and every
      process returns the same result (and keeps the same ledger). Checkpoints go to ``worker-<task index>``
      sub-folders of ``RunOptions.checkpoint_dir``: the server state is the same on every worker, each holds
      only its own clients' state.

    Client models are private to one replica, so they are *not* built inside ``strategy.scope()`` (mirrored
    variables would be kept identical on every replica); they are built under the replica's device, and the
    only cross-replica traffic is the explicit all-gather of each stage's responses.

    :param strategy: a ``tf.distribute.Strategy``.
    :param placement: ``"round_robin"`` (client k on replica k mod R) or ``"blocks"`` (contiguous blocks).
    :param threads: run each local replica's clients in its own thread (useful with several GPUs; the
        algorithm's ``setup_client``/``client_update`` must then be thread-safe across clients).
    :param options: default :class:`~gpflow_fed.federated.RunOptions` of its runs.
    :param protection: default :class:`~gpflow_fed.federated.Protection` request of its runs.
    :param client_policy: the policy of every in-process client, as for :class:`~gpflow_fed.federated.LocalRuntime`.
    :raises TypeError: ``strategy`` is not a ``tf.distribute.Strategy``.
    :raises ValueError: an unknown placement.
    """

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        *,
        placement: str = "round_robin",
        threads: bool = False,
        options: Optional[RunOptions] = None,
        protection: Optional[Protection] = None,
        client_policy: Optional[ClientPolicy] = None,
    ) -> None:
        if not isinstance(strategy, tf.distribute.Strategy):
            raise TypeError(
                f"DistributeRuntime: strategy must be a tf.distribute.Strategy (e.g. "
                f"tf.distribute.MirroredStrategy()), got {type(strategy).__name__}"
            )
        if placement not in PLACEMENTS:
            raise ValueError(f"DistributeRuntime: placement must be one of {PLACEMENTS}, got {placement!r}")
        super().__init__(options=options, protection=protection, client_policy=client_policy)
        self.strategy = strategy
        self.placement = placement
        self.threads = bool(threads)
        self._devices: Dict[int, str] = {}
        self._replica_of: Dict[str, int] = {}

    @property
    def num_replicas(self) -> int:
        """R, the replicas in sync over all processes."""
        return int(self.strategy.num_replicas_in_sync)

    def replica_of(self, index: int, num_clients: int) -> int:
        """The replica of client ``index`` among ``num_clients``: ``k mod R`` or ``⌊k R / K⌋``."""
        if self.placement == "round_robin":
            return index % self.num_replicas
        return index * self.num_replicas // num_clients

    def options_for(self, options: RunOptions) -> RunOptions:
        """Checkpoints per worker: ``worker-<task index>`` under ``checkpoint_dir`` across several workers."""
        if options.checkpoint_dir is None:
            return options
        return replace(options, checkpoint_dir=worker_folder(self.strategy, str(options.checkpoint_dir)))

    def prepare(self, algorithm: Algorithm, dataset: FederatedDataset, reducer: Reducer) -> None:
        """Find this process's replicas and their devices, place the clients on replicas, and (across processes)
        take the chief's run id and server secret, so that every process is the same server."""
        replica_ids: List[int] = []

        def probe(context: tf.distribute.experimental.ValueContext) -> tf.Tensor:
            replica_ids.append(int(context.replica_id_in_sync_group))
            return tf.zeros([1], WIRE_DTYPE)

        self.strategy.experimental_distribute_values_from_function(probe)
        self._devices = dict(zip(replica_ids, self.strategy.extended.worker_devices))
        K = dataset.num_clients
        self._replica_of = {f"client_{k}": self.replica_of(k, K) for k in range(K)}
        if len(self._devices) != self.num_replicas:  # several processes are the server: take the chief's secrets
            mine = np.frombuffer(reducer.run_id + reducer.server_secret, np.uint8).astype(WIRE_DTYPE)
            agreed = self._all_reduce({0: mine} if 0 in self._devices else {}, mine.size).astype(np.uint8).tobytes()
            reducer.start(agreed[: len(reducer.run_id)], agreed[len(reducer.run_id) :])
            self._agree_roster()

    def _agree_roster(self) -> None:
        """Across processes, each party's signing key is made where the party answers (its replica's process), and
        the roster is agreed by summing every process's own parties' public keys (32 bytes each, zeros elsewhere):
        every party then verifies its peers against the same roster, as in one process."""
        ids = sorted(self._replica_of, key=lambda cid: int(cid.split("_")[1]))
        own = [cid for cid in ids if self._replica_of[cid] in self._devices]
        mine = np.zeros(32 * len(ids), WIRE_DTYPE)
        for cid in own:
            key = self.endpoints[cid].encoder.identity
            if key is None:
                return  # an unauthenticated run (no identities were made)
            start = 32 * ids.index(cid)
            mine[start : start + 32] = np.frombuffer(key.public_key, np.uint8)
        local = {min(self._devices): mine}
        summed = self._all_reduce(local, mine.size).astype(np.uint8).tobytes()
        roster = {cid: summed[32 * i : 32 * (i + 1)] for i, cid in enumerate(ids)}
        for cid in own:
            encoder = self.endpoints[cid].encoder
            assert encoder.identity is not None  # checked above
            encoder.identity = PartyIdentity(encoder.identity.signing_key, roster)

    # --- collectives -----------------------------------------------------------------------------------
    def _all_reduce(self, local: Mapping[int, np.ndarray], size: int) -> np.ndarray:
        """``Σ_r local[r]`` over every replica of every process (missing local replicas send zeros)."""

        def value(context: tf.distribute.experimental.ValueContext) -> tf.Tensor:
            rid = int(context.replica_id_in_sync_group)
            with tf.device(self._devices[rid]):
                return tf.constant(local.get(rid, np.zeros(size, WIRE_DTYPE)), WIRE_DTYPE)

        values = self.strategy.experimental_distribute_values_from_function(value)
        return np.asarray(self.strategy.reduce(tf.distribute.ReduceOp.SUM, values, axis=None).numpy())

    def _all_gather_json(self, local: Mapping[int, Any]) -> Dict[int, Any]:
        """Every replica's JSON-able ``local[r]``, on every process (two all-reduces: lengths, then bytes)."""
        R = self.num_replicas
        encoded = {r: np.frombuffer(json.dumps(obj).encode("utf-8"), np.uint8) for r, obj in local.items()}
        lengths_local = {}
        for r, data in encoded.items():
            lengths_local[r] = np.zeros(R, WIRE_DTYPE)
            lengths_local[r][r] = data.size
        lengths = self._all_reduce(lengths_local, R).astype(int)
        width = int(lengths.max())
        rows_local = {}
        for r, data in encoded.items():
            rows = np.zeros((R, width), WIRE_DTYPE)
            rows[r, : data.size] = data
            rows_local[r] = rows.ravel()
        rows = self._all_reduce(rows_local, R * width).reshape(R, width)
        return {r: json.loads(rows[r, : lengths[r]].astype(np.uint8).tobytes().decode("utf-8")) for r in range(R)}

    def _all_gather(self, local: Mapping[str, Response]) -> Dict[str, Response]:
        """Every process's responses, ``{client: Response}`` (two all-reduces for the headers, one for payloads)."""
        per_replica: Dict[int, Dict[str, Any]] = {rid: {} for rid in self._devices}
        for cid, response in local.items():
            message = response.message
            per_replica[self._replica_of[cid]][cid] = {
                "fault": response.fault,
                "seconds": response.seconds,
                "layout": None if response.layout is None else {n: list(s) for n, s in response.layout.items()},
                "config": dict(response.config),
                "message": None if message is None else _header(message),
            }
        described = {cid: d for part in self._all_gather_json(per_replica).values() for cid, d in part.items()}
        order = [cid for cid in self._replica_of if cid in described]  # the clients' order, on every process
        sizes = {
            cid: 0
            if d["message"] is None
            else sum(_words(s, t) for s, t in zip(d["message"]["shapes"], d["message"]["dtypes"]))
            for cid, d in described.items()
        }
        offsets = dict(zip(order, np.concatenate([[0], np.cumsum([sizes[c] for c in order])]).astype(int)))
        total_size = int(sum(sizes.values()))
        partial = {rid: np.zeros(total_size, WIRE_DTYPE) for rid in self._devices}
        for cid, response in local.items():
            if sizes[cid]:
                message = response.message
                words = np.concatenate([_to_words(message.arrays[n]) for n in message.arrays])  # type: ignore[union-attr]  # sized: a message
                partial[self._replica_of[cid]][offsets[cid] : offsets[cid] + words.size] = words
        total = self._all_reduce(partial, total_size) if total_size else np.zeros(0, WIRE_DTYPE)
        gathered: Dict[str, Response] = {}
        for cid, d in described.items():
            if cid in local:
                gathered[cid] = local[cid]
                continue
            header, message = d["message"], None
            if header is not None:
                message = _message(header, total[offsets[cid] : offsets[cid] + sizes[cid]])
            fault = d["fault"]
            layout = None if d["layout"] is None else {n: tuple(s) for n, s in d["layout"].items()}
            error = None if fault is None else ValueError(f"{fault} (reported by another worker)")
            gathered[cid] = Response(message, fault, error, d["seconds"], layout, d["config"])
        return gathered

    def _answer(self, requests: Mapping[str, Request]) -> Dict[str, Response]:
        """This process's clients' responses, each replica's clients under its device (optionally in threads)."""
        by_replica: Dict[int, List[str]] = {}
        for cid in requests:
            if self._replica_of[cid] in self._devices:
                by_replica.setdefault(self._replica_of[cid], []).append(cid)

        def work(rid: int) -> Dict[str, Response]:
            with tf.device(self._devices[rid]):
                return {cid: self.endpoints[cid].handle(requests[cid]) for cid in by_replica[rid]}

        if self.threads and len(by_replica) > 1:
            with ThreadPoolExecutor(max_workers=len(by_replica)) as pool:
                parts = list(pool.map(work, sorted(by_replica)))
        else:
            parts = [work(rid) for rid in sorted(by_replica)]
        return {cid: response for part in parts for cid, response in part.items()}

    def send(self, requests: Mapping[str, Request]) -> Dict[str, Response]:
        """This process's clients answer; every response reaches every process."""
        mine = self._answer(requests)
        if len(self._devices) == self.num_replicas:  # one process: every response is here
            return {cid: mine[cid] for cid in requests}
        gathered = self._all_gather(mine)
        return {cid: gathered[cid] for cid in requests}
