"""DistributeRuntime: the clients spread over the replicas of a ``tf.distribute`` strategy; replies are all-gathered.

Every process runs the same server (the same seed gives the same client selection, broadcasts and server
updates everywhere); only the client work is divided. Client ``k`` (its index in the dataset) belongs to
replica ``k mod R`` (``placement="round_robin"``) or ``⌊k R / K⌋`` (``placement="blocks"``), for R replicas
and K clients. A process runs the clients of its own replicas, each under its replica's device
(``tf.device``), so their models and optimizers live there.

The runtime is only a transport (:class:`~gpflow_fed.federated.transport.Transport`): it delivers the
replies of every client to every process, and each process's
:meth:`~gpflow_fed.federated.aggregator.Aggregator.aggregate` records, screens, protects and reduces them
exactly as :class:`~gpflow_fed.federated.LocalRuntime`'s does. In a single process (``MirroredStrategy``)
every reply is already at hand. Across processes (``MultiWorkerMirroredStrategy``) the replies are
all-gathered with collective all-reduces (``strategy.reduce(SUM, ...)`` of per-replica values, each
replica filling its own segment of a zero vector): first each reply's header (sender, names, shapes, dtypes,
weight, metrics, fault) as JSON bytes, then the payloads as float64 words. A value travels as itself when
float64 holds it exactly (floats, bools, integers of up to 32 bits), otherwise as its bytes, four to a word
(64-bit integers such as secure aggregation's masked codes, fixed-width strings such as Recycle's JSON
model spec), so every process receives every message bit for bit.

In a phase the aggregator protects (secure aggregation, DP), the first all-gather carries only each reply's
layout; once every process has screened the same replies and fixed the cohort, each process masks its own
clients' prepared messages against it (with the cohort's public keys, which the server relays) and the
masked messages are all-gathered in turn. The DP noise comes from the chief's OS-random server secret,
which every process shares, so every process adds the same noise.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import tensorflow as tf

from ...data.dataset import FederatedDataset
from ..protection.dp import DifferentialPrivacy
from ..protection.masking import SecureAggregation
from ..protection.robust import RobustAggregation
from ..algorithm import Algorithm
from ..messages import Message
from ..aggregator import Aggregator, ExchangeContext
from ..faults import FaultPolicy
from ..transport import Broadcast, Reply
from .loop import RoundLoopRuntime

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
        "names": names,
        "shapes": [list(message.arrays[n].shape) for n in names],
        "dtypes": [str(message.arrays[n].dtype) for n in names],
        "weight": message.weight,
        "metrics": dict(message.metrics),
    }


def _message(sender: str, round: int, phase: str, header: Mapping[str, Any], words: np.ndarray) -> Message:
    """The message whose header and payload words came from another process."""
    arrays, start = {}, 0
    for name, shape, dtype in zip(header["names"], header["shapes"], header["dtypes"]):
        size = _words(shape, dtype)
        arrays[name] = _from_words(words[start : start + size], shape, dtype)
        start += size
    return Message(
        sender,
        round,
        phase,
        arrays,
        weight=float(header["weight"]),
        metrics={k: float(v) for k, v in header["metrics"].items()},
    )


def _layout(sender: str, down: Message, header: Mapping[str, Any]) -> Message:
    """A message with the names, shapes and dtypes of ``header`` and zero payloads: what the server knows of
    a reply in a protected phase, enough to screen it."""
    arrays = {n: np.zeros(s, d) for n, s, d in zip(header["names"], header["shapes"], header["dtypes"])}
    return Message(sender, down.round, down.phase, arrays, weight=0.0)


def worker_folder(strategy: tf.distribute.Strategy, directory: str) -> str:
    """``directory``, or its sub-folder ``worker-<task index>`` when ``strategy`` spans several workers."""
    resolver = getattr(strategy, "cluster_resolver", None)
    spec = resolver.cluster_spec().as_dict() if resolver is not None else {}
    if sum(len(tasks) for tasks in spec.values()) <= 1:
        return directory
    return os.path.join(directory, f"worker-{int(resolver.task_id)}")


class DistributeRuntime(RoundLoopRuntime):
    """Runs an :class:`Algorithm` with its clients spread over the replicas of a ``tf.distribute`` strategy.

    The same algorithm and seed give exactly the result of :class:`~gpflow_fed.federated.LocalRuntime`: every
    process reduces every reply, in the same order, through the same aggregator; the history, faults and ledger
    entries are the same too.

    * ``tf.distribute.MirroredStrategy(devices)``: one process, a replica per device (GPUs, or logical CPUs).
    * ``tf.distribute.MultiWorkerMirroredStrategy()``: one process per host, started with ``TF_CONFIG``;
      call :func:`~gpflow_fed.federated.run` with the same algorithm, dataset and seed in every process.
      Each process runs only its own replicas' clients (the others' data are never touched), and every
      process returns the same result (and keeps the same ledger).

    Client models are private to one replica, so they are *not* built inside ``strategy.scope()`` (mirrored
    variables would be kept identical on every replica); they are built under the replica's device, and the
    only cross-replica traffic is the explicit all-gather of the phase's replies.

    :param strategy: a ``tf.distribute.Strategy``.
    :param placement: ``"round_robin"`` (client k on replica k mod R) or ``"blocks"`` (contiguous blocks).
    :param threads: run each local replica's clients in its own thread (useful with several GPUs; the
        algorithm's ``setup_client``/``client_update`` must then be thread-safe across clients).
    :param progress: show a tqdm progress bar over rounds.
    :param keep_payloads: keep every message in the ledger.
    :param eval_every: evaluate test metrics every this many rounds (0: only at the end).
    :param faults: how faulty clients are treated (:class:`FaultPolicy`). Under ``on_error="raise"`` every
        process raises :class:`ClientUpdateError` for the first faulty client, after all have reported.
    :param secure_aggregation: as for ``LocalRuntime``: each process masks its own clients' fixed-point
        payloads against the whole cohort, and only the masked messages are all-gathered.
    :param differential_privacy: as for ``LocalRuntime``: clients clip, and every process adds the same
        Gaussian noise (drawn from the chief's OS-random server secret, never from the seed), so every process
        accounts and returns the same noised model and (ε, δ).
    :param robust: a :class:`~gpflow_fed.federated.RobustAggregation` for ``"mean"`` phases, as for
        ``LocalRuntime``.
    :param checkpoint_dir: as for ``LocalRuntime``. Under ``MultiWorkerMirroredStrategy`` each worker writes
        (and resumes from) its own sub-folder ``worker-<task index>``: the server state is the same on every
        worker, each holds only its own clients' state.
    :param checkpoint_every: rounds between checkpoints (≥ 1).
    :param resume: continue from the latest checkpoint (see ``LocalRuntime``).
    :raises TypeError: ``strategy`` is not a ``tf.distribute.Strategy``; a wrong ``secure_aggregation`` or
        ``differential_privacy`` type.
    :raises ValueError: an unknown placement, a bad ``eval_every``/``checkpoint_every``, ``resume`` without
        ``checkpoint_dir``, or (at the start of a run) protection of a ``"collect"`` phase.
    """

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        *,
        placement: str = "round_robin",
        threads: bool = False,
        progress: bool = False,
        keep_payloads: bool = False,
        eval_every: int = 0,
        faults: Optional[FaultPolicy] = None,
        secure_aggregation: Union[bool, SecureAggregation] = False,
        differential_privacy: Optional[DifferentialPrivacy] = None,
        robust: Optional[RobustAggregation] = None,
        checkpoint_dir: Optional[Union[str, os.PathLike]] = None,
        checkpoint_every: int = 1,
        resume: bool = False,
    ) -> None:
        if not isinstance(strategy, tf.distribute.Strategy):
            raise TypeError(
                f"DistributeRuntime: strategy must be a tf.distribute.Strategy (e.g. "
                f"tf.distribute.MirroredStrategy()), got {type(strategy).__name__}"
            )
        if placement not in PLACEMENTS:
            raise ValueError(f"DistributeRuntime: placement must be one of {PLACEMENTS}, got {placement!r}")
        super().__init__(
            progress=progress,
            keep_payloads=keep_payloads,
            eval_every=eval_every,
            faults=faults,
            aggregator=Aggregator(secure=secure_aggregation, dp=differential_privacy, robust=robust),
            checkpoint_dir=None if checkpoint_dir is None else worker_folder(strategy, os.fspath(checkpoint_dir)),
            checkpoint_every=checkpoint_every,
            resume=resume,
        )
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

    def prepare(self, algorithm: Algorithm, dataset: FederatedDataset) -> None:
        """Find this process's replicas and their devices, and place the clients on replicas."""
        replica_ids: List[int] = []

        def probe(context: tf.distribute.experimental.ValueContext) -> tf.Tensor:
            replica_ids.append(int(context.replica_id_in_sync_group))
            return tf.zeros([1], WIRE_DTYPE)

        self.strategy.experimental_distribute_values_from_function(probe)
        self._devices = dict(zip(replica_ids, self.strategy.extended.worker_devices))
        K = dataset.num_clients
        self._replica_of = {f"client_{k}": self.replica_of(k, K) for k in range(K)}
        if len(self._devices) != self.num_replicas:  # several processes are the server: take the chief's secrets
            mine = np.frombuffer(self.aggregator.run_id + self.aggregator.server_secret, np.uint8).astype(WIRE_DTYPE)
            agreed = self._all_reduce({0: mine} if 0 in self._devices else {}, mine.size).astype(np.uint8).tobytes()
            self.aggregator.start(agreed[: len(self.aggregator.run_id)], agreed[len(self.aggregator.run_id) :])

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
        """Every replica's JSON-able ``local[r]``, on every process (two all-reduces: lengths, then bytes).

        In a single process (every replica local, e.g. MirroredStrategy) there is nothing to gather.
        """
        R = self.num_replicas
        if len(self._devices) == R:
            return dict(local)
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

    def _all_gather_messages(
        self, local: Mapping[str, Optional[Message]], faults: Mapping[str, Optional[str]], payloads: bool
    ) -> Dict[str, Tuple[Optional[Dict[str, Any]], Optional[str], Optional[np.ndarray]]]:
        """Every process's ``{client: (header, fault, words)}``: each local message's header (None if there is
        none), its fault, and, if ``payloads``, its arrays as float64 words (two all-reduces for the headers,
        one for the payloads)."""
        per_replica: Dict[int, Dict[str, Any]] = {rid: {} for rid in self._devices}
        for cid, message in local.items():
            header = None if message is None else _header(message)
            per_replica[self._replica_of[cid]][cid] = {"header": header, "fault": faults.get(cid)}
        described = {cid: d for part in self._all_gather_json(per_replica).values() for cid, d in part.items()}
        order = [cid for cid in self._replica_of if cid in described]  # the clients' order, on every process
        sizes = {
            cid: sum(_words(sh, dt) for sh, dt in zip(d["header"]["shapes"], d["header"]["dtypes"]))
            if payloads and d["header"] is not None
            else 0
            for cid, d in described.items()
        }
        offsets = dict(zip(order, np.concatenate([[0], np.cumsum([sizes[c] for c in order])]).astype(int)))
        total_size = int(sum(sizes.values()))
        partial = {rid: np.zeros(total_size, WIRE_DTYPE) for rid in self._devices}
        for cid, message in local.items():
            if sizes[cid]:
                words = np.concatenate([_to_words(message.arrays[n]) for n in message.arrays])
                partial[self._replica_of[cid]][offsets[cid] : offsets[cid] + words.size] = words
        total = self._all_reduce(partial, total_size) if total_size else np.zeros(0, WIRE_DTYPE)
        return {
            cid: (d["header"], d["fault"], total[offsets[cid] : offsets[cid] + sizes[cid]] if sizes[cid] else None)
            for cid, d in described.items()
        }

    def _run_clients(self, broadcast: Broadcast, mine: Sequence[str], cohort_size: int) -> Dict[str, Reply]:
        """This process's clients' replies, each replica's clients under its device (optionally in threads)."""
        by_replica: Dict[int, List[str]] = {}
        for cid in mine:
            by_replica.setdefault(self._replica_of[cid], []).append(cid)

        def work(rid: int) -> Dict[str, Reply]:
            with tf.device(self._devices[rid]):
                return {cid: self.pool.ask(cid, broadcast, cohort_size, raise_now=False) for cid in by_replica[rid]}

        if self.threads and len(by_replica) > 1:
            with ThreadPoolExecutor(max_workers=len(by_replica)) as pool:
                parts = list(pool.map(work, sorted(by_replica)))
        else:
            parts = [work(rid) for rid in sorted(by_replica)]
        return {cid: reply for part in parts for cid, reply in part.items()}

    @property
    def _single_process(self) -> bool:
        return len(self._devices) == self.num_replicas

    def exchange(self, broadcast: Broadcast, cohort: Sequence[str]) -> Dict[str, Reply]:
        """This process's clients answer; every reply (of a protected phase: its layout) reaches every process."""
        mine = [cid for cid in cohort if self._replica_of[cid] in self._devices]
        replies = self._run_clients(broadcast, mine, len(cohort))
        if self._single_process:
            return replies
        gathered = self._all_gather_messages(
            {cid: r.message for cid, r in replies.items()},
            {cid: r.fault for cid, r in replies.items()},
            payloads=not broadcast.protected,
        )
        down = broadcast.message
        for cid in cohort:
            if cid in replies:
                continue
            header, fault, words = gathered[cid]
            if header is None:
                message = None
            elif broadcast.protected:
                message = _layout(cid, down, header)
            else:
                message = _message(cid, down.round, down.phase, header, words)
            error = None if fault is None else ValueError(f"{fault} (reported by another worker)")
            replies[cid] = Reply(message, fault, error)
        return replies

    def masked(self, context: ExchangeContext, replies: Mapping[str, Reply]) -> Dict[str, Message]:
        """Each process masks its own clients' prepared messages against the fixed cohort (with the cohort's
        public keys, relayed by the server); every masked message then reaches every process."""
        aggregator = self.aggregator
        mine = [cid for cid in context.cohort if replies[cid].prepared is not None]
        public_keys = None
        if aggregator.secure is not None and not self._single_process:  # the server relays the cohort's keys
            local = {
                rid: {c: aggregator.keys(c).public_bytes.hex() for c in mine if self._replica_of[c] == rid}
                for rid in self._devices
            }
            public_keys = {
                c: bytes.fromhex(h) for part in self._all_gather_json(local).values() for c, h in part.items()
            }
        sent = {cid: aggregator.mask(replies[cid].prepared, context, public_keys) for cid in mine}
        if self._single_process:
            return sent
        gathered = self._all_gather_messages(sent, {}, payloads=True)
        return {
            cid: sent[cid] if cid in sent else _message(cid, context.round, context.phase, *gathered[cid][::2])
            for cid in context.cohort
        }
