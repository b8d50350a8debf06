"""DistributeRuntime: the clients spread over the replicas of a ``tf.distribute`` strategy; sums are all-reduced.

Every process runs the same server (the same seed gives the same client selection, broadcasts and server
updates everywhere); only the client work is divided. Client ``k`` (its index in the dataset) belongs to
replica ``k mod R`` (``placement="round_robin"``) or ``⌊k R / K⌋`` (``placement="blocks"``), for R replicas
and K clients; a replica with no client contributes zeros. A process runs the clients of its own replicas,
each under its replica's device (``tf.device``), so their models and optimizers live there. One phase is
then three all-reduces (``strategy.reduce(SUM, ...)`` of per-replica values, i.e. a collective all-reduce
under ``MultiWorkerMirroredStrategy``, so every worker receives the same sums; in a single process, where
every reply is already at hand, only the third):

1. and 2. each replica's *description* of its clients' replies: names, shapes, dtypes and sizes of the
   arrays, the metric names, and the fault found (NaN, time-out, exception), as JSON bytes. With it every
   process screens faults exactly as :class:`~gpflow_fed.federated.LocalRuntime` does (wrongly shaped
   payloads against the majority, ``min_clients``) and records the same ledger entries;
3. the payload. ``"sum"``: replica r sends ``Σ_{k∈r} a_k``; ``"mean"``: ``Σ_{k∈r} w_k a_k`` and
   ``Σ_{k∈r} w_k``, and the server divides the all-reduced sums; the weight-averaged client metrics travel
   the same way. ``"collect"`` is an all-gather: each client's arrays, weight and metrics fill their own
   segment of a zero vector, so the all-reduced sum holds every message exactly.

The all-reduce carries float64 whatever ``gpflow.default_float()`` is, so payloads of any float or integer
dtype (integers below 2⁵³) arrive exactly; the aggregate is cast back to the payload's dtype. In a
``"collect"`` phase, fixed-width string arrays (numpy ``U``/``S``, e.g. Recycle's JSON model spec) travel as
their bytes, four to a float64 word, and arrive byte for byte.

Under secure aggregation or DP (``Aggregator``) a phase's replies are described by their prepared
(clipped, fixed-point) form; once every worker knows the cohort, each masks its own clients' messages
against it, the masked 64-bit codes are all-reduced as 16-bit limbs (exact), and ``Aggregator.finish``
decodes them, adds the noise every worker draws identically from the chief's OS-random server secret, and divides.
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
from ..protection.masking import SecureAggregation, from_limb_sums, to_limbs
from ..protection.robust import RobustAggregation
from ..algorithm import Aggregate, Algorithm, reduce_messages
from ..ledger import LedgerEntry
from ..messages import SERVER, Message
from ..aggregator import Aggregator
from .base import ClientUpdateError
from .faults import FaultPolicy
from .loop import Answer, FederationRun, RoundLoopRuntime, screen

__all__ = ["DistributeRuntime", "PLACEMENTS", "worker_folder"]

PLACEMENTS = ("round_robin", "blocks")
#: what the all-reduce carries: exact for float32/float64 payloads and integers below 2**53
WIRE_DTYPE = np.float64
#: masked 64-bit codes travel as 16-bit limbs: their float64 sums stay exact for up to 2**37 clients
LIMB_BITS = 16


class _Shapes:
    """A reply known only by its description (another worker's client): enough for ``spec_faults``."""

    def __init__(self, sender: str, names: Sequence[str], shapes: Sequence[Sequence[int]], dtypes: Sequence[str]) -> None:
        self.sender = sender
        self.arrays = {n: np.broadcast_to(np.zeros((), d), tuple(s)) for n, s, d in zip(names, shapes, dtypes)}


def _describe(answer: Answer, protect: bool, secure: bool) -> Dict[str, Any]:
    """The metadata of one reply that every process needs (no payload values): of the reply itself, or, in a
    phase the aggregator protects, of the client's prepared (clipped, encoded) message, which is what is sent
    (masked, with its arrays in sorted-name order, under secure aggregation)."""
    reply = answer.prepared if protect and answer.fault is None else answer.reply
    if not isinstance(reply, Message):
        return {"message": False, "fault": answer.fault}
    names = sorted(reply.arrays) if protect and secure else list(reply.arrays)
    return {
        "message": True,
        "fault": answer.fault,
        "names": names,
        "shapes": [list(reply.arrays[n].shape) for n in names],
        "dtypes": [str(reply.arrays[n].dtype) for n in names],
        "nbytes": reply.nbytes,
        "metrics": list(reply.metrics),
    }


def _words(shape: Sequence[int], dtype: str) -> int:
    """How many float64 words an array of ``shape`` and ``dtype`` fills on the wire."""
    size, kind = int(np.prod(shape, dtype=np.int64)), np.dtype(dtype).kind
    if kind in "biuf":
        return size
    if kind in "US":
        return -(-size * np.dtype(dtype).itemsize // 4)
    raise TypeError(f"DistributeRuntime carries numeric and fixed-width string arrays, not dtype {dtype}")


def _to_words(array: Any) -> np.ndarray:
    """``array`` as exact float64 words: its values if numeric, else its bytes as 32-bit integers."""
    array = np.asarray(array)
    if array.dtype.kind in "biuf":
        return array.astype(WIRE_DTYPE).ravel()
    _words(array.shape, str(array.dtype))  # rejects other dtypes
    raw = np.ascontiguousarray(array).tobytes()
    return np.frombuffer(raw + bytes(-len(raw) % 4), np.uint32).astype(WIRE_DTYPE)


def _from_words(words: np.ndarray, shape: Sequence[int], dtype: str) -> np.ndarray:
    """The inverse of :func:`_to_words`."""
    dt = np.dtype(dtype)
    if dt.kind in "biuf":
        return words.reshape(shape).astype(dt)
    raw = words.astype(np.uint32).tobytes()[: int(np.prod(shape, dtype=np.int64)) * dt.itemsize]
    return np.frombuffer(raw, dt).reshape(shape).copy()


def worker_folder(strategy: tf.distribute.Strategy, directory: str) -> str:
    """``directory``, or its sub-folder ``worker-<task index>`` when ``strategy`` spans several workers."""
    resolver = getattr(strategy, "cluster_resolver", None)
    spec = resolver.cluster_spec().as_dict() if resolver is not None else {}
    if sum(len(tasks) for tasks in spec.values()) <= 1:
        return directory
    return os.path.join(directory, f"worker-{int(resolver.task_id)}")


class DistributeRuntime(RoundLoopRuntime):
    """Runs an :class:`Algorithm` with its clients spread over the replicas of a ``tf.distribute`` strategy.

    The same algorithm and seed give the result of :class:`~gpflow_fed.federated.LocalRuntime` up to float
    round-off (the sums are added in a different order), with the same history, faults and ledger entries.

    * ``tf.distribute.MirroredStrategy(devices)``: one process, a replica per device (GPUs, or logical CPUs).
    * ``tf.distribute.MultiWorkerMirroredStrategy()``: one process per host, started with ``TF_CONFIG``;
      call :func:`~gpflow_fed.federated.run` with the same algorithm, dataset and seed in every process.
      Each process runs only its own replicas' clients (the others' data are never touched), and every
      process returns the same result. ``keep_payloads`` keeps the messages of the process's own clients;
      the ledger has every message's entry.

    Client models are private to one replica, so they are *not* built inside ``strategy.scope()`` (mirrored
    variables would be kept identical on every replica); they are built under the replica's device, and the
    only cross-replica traffic is the explicit all-reduce of the phase's sums.

    :param strategy: a ``tf.distribute.Strategy``.
    :param placement: ``"round_robin"`` (client k on replica k mod R) or ``"blocks"`` (contiguous blocks).
    :param threads: run each local replica's clients in its own thread (useful with several GPUs; the
        algorithm's ``setup_client``/``client_update`` must then be thread-safe across clients).
    :param progress: show a tqdm progress bar over rounds.
    :param keep_payloads: keep the messages (of this process's clients) in the ledger.
    :param eval_every: evaluate test metrics every this many rounds (0: only at the end).
    :param faults: how faulty clients are treated (:class:`FaultPolicy`). Under ``on_error="raise"`` every
        process raises :class:`ClientUpdateError` for the first faulty client, after all have reported.
    :param secure_aggregation: as for ``LocalRuntime``: each process masks its own clients' fixed-point
        payloads against the whole cohort, the masked codes are all-reduced as 16-bit limbs (exact modulo
        2^64) and the decoded sums equal ``LocalRuntime(secure_aggregation=True)``'s exactly.
    :param differential_privacy: as for ``LocalRuntime``: clients clip, and every process adds the same
        Gaussian noise to the all-reduced sum (drawn from the chief's OS-random server secret, never from the seed), so every process accounts and
        returns the same noised model and (ε, δ).
    :param robust: a :class:`~gpflow_fed.federated.RobustAggregation` for ``"mean"`` phases, as for
        ``LocalRuntime`` (the payloads are all-gathered, then reduced on every process).
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
            self.aggregator.start(agreed[: len(self.aggregator.run_id)], agreed[len(self.aggregator.run_id):])

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

    # --- one phase -----------------------------------------------------------------------------------
    def _run_clients(
        self, run: FederationRun, down: Message, mine: Sequence[str], cohort_size: int
    ) -> Dict[str, Answer]:
        """This process's clients' answers, each replica's clients under its device (optionally in threads)."""
        by_replica: Dict[int, List[str]] = {}
        for cid in mine:
            by_replica.setdefault(self._replica_of[cid], []).append(cid)

        def work(rid: int) -> Dict[str, Answer]:
            with tf.device(self._devices[rid]):
                return {cid: run.ask(cid, down, cohort_size, raise_now=False) for cid in by_replica[rid]}

        if self.threads and len(by_replica) > 1:
            with ThreadPoolExecutor(max_workers=len(by_replica)) as pool:
                parts = list(pool.map(work, sorted(by_replica)))
        else:
            parts = [work(rid) for rid in sorted(by_replica)]
        return {cid: answer for part in parts for cid, answer in part.items()}

    def gather(
        self, run: FederationRun, round: int, phase: str, arrays: Mapping[str, np.ndarray], selected: Sequence[str]
    ) -> Tuple[Aggregate, Dict[str, str]]:
        """Local client work, a gathered description of every reply, fault screening, then the all-reduce."""
        aggregation = run.algorithm.aggregation(phase)
        channel = run.channel
        down = Message(sender=SERVER, round=round, phase=phase, arrays=arrays, weight=0.0)
        mine = [cid for cid in selected if self._replica_of[cid] in self._devices]
        protect = run.aggregator.protects(phase, aggregation)
        answers = self._run_clients(run, down, mine, len(selected))
        local_meta: Dict[int, Dict[str, Any]] = {rid: {} for rid in self._devices}
        for cid, answer in answers.items():
            local_meta[self._replica_of[cid]][cid] = _describe(answer, protect, run.aggregator.secure is not None)
        meta = {cid: d for part in self._all_gather_json(local_meta).values() for cid, d in part.items()}

        for cid in selected:  # the ledger, in LocalRuntime's order (protected replies: once the cohort is fixed)
            channel.send(down, cid)
            if meta[cid]["message"] and not protect:
                self._record(run, cid, answers[cid].reply if cid in answers else meta[cid], round, phase)

        excluded = {cid: meta[cid]["fault"] for cid in selected if meta[cid]["fault"] is not None}
        if excluded and run.faults.on_error == "raise":
            cid = next(iter(excluded))
            cause = answers[cid].error if cid in answers else None
            reason = excluded[cid] if cid in answers else f"{excluded[cid]} (reported by another worker)"
            raise ClientUpdateError(cid, round, phase, cause or ValueError(reason)) from cause
        well_formed = [_Shapes(cid, meta[cid]["names"], meta[cid]["shapes"], meta[cid]["dtypes"]) for cid in selected if cid not in excluded]
        good = screen(
            run.faults, round, phase, selected, well_formed, excluded, run.algorithm.reply_spec(run.state, round, phase)
        )
        if aggregation == "collect":
            return self._collect(answers, meta, good, round, phase), excluded
        if aggregation == "mean" and run.aggregator.robust is not None:  # needs every payload: gather, then reduce
            messages = self._collect(answers, meta, good, round, phase).messages or ()
            context = run.aggregator.context(run.channel.purpose, round, phase, aggregation, tuple(good))
            return run.aggregator.reduce(messages, context), excluded
        if protect:
            return self._protected(run, answers, meta, good, round, phase, aggregation), excluded
        return self._reduce(answers, meta, good, round, phase, aggregation), excluded

    @staticmethod
    def _record(run: FederationRun, cid: str, sent: Union[Message, Mapping[str, Any]], round: int, phase: str) -> None:
        """The ledger entry of client ``cid``'s message: the message itself if this process holds it, else
        its description from the worker that does."""
        if isinstance(sent, Message):
            run.channel.send(sent, SERVER)
            return
        run.ledger.extend([LedgerEntry(
            round=round, phase=phase, purpose=run.channel.purpose, sender=cid, receiver=SERVER,
            names=tuple(sent["names"]), shapes=tuple(tuple(s) for s in sent["shapes"]),
            dtypes=tuple(sent["dtypes"]), nbytes=int(sent["nbytes"]),
        )])

    def _protected(
        self, run: FederationRun, answers: Mapping[str, Answer], meta: Mapping[str, Any], good: Sequence[str],
        round: int, phase: str, aggregation: str,
    ) -> Aggregate:
        """A phase under secure aggregation and/or DP: each process masks its own clients' prepared messages
        against the whole cohort, the sums are all-reduced (masked codes as 16-bit limbs, so the sum modulo
        2^64 is exact), and ``Aggregator.finish`` decodes, noises and divides, as on ``LocalRuntime``."""
        aggregator = run.aggregator
        context = aggregator.context(run.channel.purpose, round, phase, aggregation, tuple(good))
        aggregator.check_cohort(context)
        public_keys = None
        if aggregator.secure is not None:  # the server relays the cohort's public keys to every process
            local = {rid: {c: aggregator.keys(c).public_bytes.hex() for c in good if self._replica_of[c] == rid}
                     for rid in self._devices}
            public_keys = {c: bytes.fromhex(h) for part in self._all_gather_json(local).values() for c, h in part.items()}
        sent: Dict[str, Message] = {}
        for cid in good:
            if cid in answers:
                sent[cid] = aggregator.mask(answers[cid].prepared, context, public_keys)
            self._record(run, cid, sent.get(cid, meta[cid]), round, phase)
        first = meta[good[0]]
        names = list(first["names"])
        sizes = [int(np.prod(s, dtype=np.int64)) for s in first["shapes"]]
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
        n = int(offsets[-1])
        secure = run.aggregator.secure is not None
        size = len(to_limbs(np.zeros(n, np.uint64), LIMB_BITS)) if secure else n + 1

        def contribution(cid: str, out: np.ndarray) -> None:
            message = sent[cid]
            flat = np.concatenate([np.ravel(message.arrays[name]) for name in names]) if names else np.zeros(0)
            if secure:
                out += to_limbs(flat.astype(np.uint64), LIMB_BITS)
            else:
                out[:n] += message.weight * flat if aggregation == "mean" else flat
                out[n] += message.weight

        total = self._all_reduce(self._partials(good, size, contribution), size)
        flat_sum = from_limb_sums(total, LIMB_BITS) if secure else total[:n]
        sums = {name: flat_sum[offsets[i]: offsets[i + 1]].reshape(first["shapes"][i]) for i, name in enumerate(names)}
        return run.aggregator.finish(sums, context, total_weight=0.0 if secure else float(total[n]))

    def _partials(self, good: Sequence[str], size: int, contribution: Any) -> Dict[int, np.ndarray]:
        """Per local replica, the sum of its good clients' ``contribution(cid, vector)`` (zeros if none)."""
        partial = {rid: np.zeros(size, WIRE_DTYPE) for rid in self._devices}
        for cid in good:
            rid = self._replica_of[cid]
            if rid in partial:
                contribution(cid, partial[rid])
        return partial

    def _reduce(
        self, answers: Mapping[str, Answer], meta: Mapping[str, Any], good: Sequence[str], round: int, phase: str,
        aggregation: str,
    ) -> Aggregate:
        """``"sum"``/``"mean"``: all-reduce of ``[Σ a_k (or Σ w_k a_k), Σ w_k, per metric (Σ w m, Σ w, Σ m, n)]``."""
        first = meta[good[0]]
        sizes = [int(np.prod(s, dtype=np.int64)) for s in first["shapes"]]
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
        metric_keys = sorted({k for cid in good for k in meta[cid]["metrics"]})
        n_arrays = int(offsets[-1])
        size = n_arrays + 1 + 4 * len(metric_keys)

        def contribution(cid: str, out: np.ndarray) -> None:
            reply: Message = answers[cid].reply
            w = reply.weight
            for i, name in enumerate(first["names"]):
                value = np.asarray(reply.arrays[name], WIRE_DTYPE).ravel()
                out[offsets[i] : offsets[i + 1]] += w * value if aggregation == "mean" else value
            out[n_arrays] += w
            for j, key in enumerate(metric_keys):
                if key in reply.metrics:
                    m = reply.metrics[key]
                    out[n_arrays + 1 + 4 * j : n_arrays + 5 + 4 * j] += (w * m, w, m, 1.0)

        total = self._all_reduce(self._partials(good, size, contribution), size)
        total_weight = float(total[n_arrays])
        if aggregation == "mean" and total_weight <= 0:
            raise ValueError("a 'mean' aggregation needs a positive total weight")
        scale = total_weight if aggregation == "mean" else 1.0
        out_arrays = {
            name: (total[offsets[i] : offsets[i + 1]] / scale).reshape(first["shapes"][i]).astype(first["dtypes"][i])
            for i, name in enumerate(first["names"])
        }
        metrics = {}
        for j, key in enumerate(metric_keys):
            wm, w, m, n = total[n_arrays + 1 + 4 * j : n_arrays + 5 + 4 * j]
            metrics[key] = float(wm / w) if w > 0 else float(m / n)
        return Aggregate(round, phase, out_arrays, total_weight, tuple(good), metrics)

    def _collect(
        self, answers: Mapping[str, Answer], meta: Mapping[str, Any], good: Sequence[str], round: int, phase: str
    ) -> Aggregate:
        """``"collect"``: an all-gather; each good client's arrays, weight and metrics in its own segment."""
        layout: Dict[str, Tuple[int, List[int]]] = {}
        offset = 0
        for cid in good:
            sizes = [_words(s, d) for s, d in zip(meta[cid]["shapes"], meta[cid]["dtypes"])]
            sizes += [1] * (1 + len(meta[cid]["metrics"]))  # the weight, then the metrics
            layout[cid] = (offset, sizes)
            offset += sum(sizes)

        def contribution(cid: str, out: np.ndarray) -> None:
            reply: Message = answers[cid].reply
            start, _ = layout[cid]
            parts = [_to_words(reply.arrays[n]) for n in meta[cid]["names"]]
            parts.append(np.array([reply.weight], WIRE_DTYPE))
            parts.append(np.array([reply.metrics[k] for k in meta[cid]["metrics"]], WIRE_DTYPE))
            flat = np.concatenate(parts)
            out[start : start + flat.size] = flat

        total = self._all_reduce(self._partials(good, offset, contribution), offset)
        messages = []
        for cid in good:
            start, sizes = layout[cid]
            described = meta[cid]
            ends = start + np.cumsum(sizes)
            starts = ends - np.asarray(sizes)
            n = len(described["names"])
            arrays = {
                name: _from_words(total[starts[i] : ends[i]], described["shapes"][i], described["dtypes"][i])
                for i, name in enumerate(described["names"])
            }
            weight = float(total[starts[n]])
            metrics = {k: float(total[starts[n + 1 + j]]) for j, k in enumerate(described["metrics"])}
            messages.append(Message(cid, round, phase, arrays, weight=weight, metrics=metrics))
        return reduce_messages(messages, "collect")
