"""The server's reduction seam (docs guide "The federated core"): encode on the client, reduce on the server.

Every exchange ends in ``update(state, Σ_k payload_k)``. :class:`Aggregator` is the one place where that
sum is protected, in this order::

    client k:  a_k ──clip to C (DP)──▶ ā_k ──×w̄_k ("mean")──▶ ──fixed point + pairwise masks──▶ y_k
    server:    Σ_k y_k (masks cancel) ──decode──▶ Σ_k w̄_k ā_k ──+ N(0, σ²) (DP)──▶ ÷ Σ_k w̄_k ("mean")

Only ``"sum"`` and ``"mean"`` phases can be protected; a ``"collect"`` phase needs each client's message,
so asking for secure aggregation or DP on an algorithm with one raises ``ValueError`` before the run.

Secure aggregation (:mod:`~gpflow_fed.federated.protection.masking`): each client holds an X25519 key pair drawn
from the operating system, so pairwise pads come from key agreement, which the server cannot derive from
anything it knows (the code, the run's seed, every public key and every masked message). Pads are bound to the
exchange (an OS-random run id, purpose, round, phase and cohort), so a replayed message does not cancel, and
:meth:`Aggregator.reduce` refuses messages whose header names another exchange. Clients that fail (raise,
time out, send NaN or wrongly shaped payloads, claim a wrong weight) are excluded *before* masking: the runtime
first collects which clients have a valid payload, then those clients mask against exactly that cohort, which
must have at least ``SecureAggregation.min_cohort`` (≥ 2) members. A client that vanished after masking would
leave its pads in the sum; :meth:`Aggregator.reduce` refuses such a sum with ``ValueError`` (recovering from it
needs the secret-sharing layer of Bonawitz et al.; the Flower runtime has it, through Flower's SecAgg+:
:mod:`gpflow_fed.federated.runtimes.flower_secagg`). Not covered: a server that substitutes public keys (an
active attacker), and what the total itself reveals.

Robust aggregation (:class:`~gpflow_fed.federated.protection.RobustAggregation`) replaces the weighted mean of
``"mean"`` phases by a coordinate-wise weighted median or trimmed mean, so a few malicious clients cannot drag
the average; it needs each client's payload, so it does not combine with secure aggregation or DP. ``"sum"``
phases (sufficient statistics) cannot be made robust this way: every client's statistic is a different,
legitimate term of the sum, and no order statistic of the terms is the sum; the server can only check what
it knows of the total (e.g. FSGP checks its shape, weights and Σ N_k against the registered sizes).

DP (see :mod:`gpflow_fed.federated.protection.dp`) is *central*: the server adds the noise, so the (ε, δ) protects what
is released (the model, the history, the server state) against everyone but the aggregator itself. Client
metrics are not clipped or noised, so they are dropped from DP messages; under secure aggregation they are
masked and only their weighted mean is revealed.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import warnings
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import gpflow
import numpy as np

from .protection.dp import DifferentialPrivacy, DPUtilityWarning, PrivacyAccountant, clip_payload, utility_warning
from .protection.masking import Exchange, MaskingKeys, SecureAggregation, check_senders, mask
from ..randomness import new_run_id
from .protection.robust import RobustAggregation
from .algorithm import AGGREGATIONS, Aggregate, Algorithm, ReplySpec
from .faults import ClientUpdateError, FaultPolicy, RoundFailedError, screen
from .ledger import Channel
from .messages import SERVER, Message
from .transport import Broadcast, SecureSum, Transport

__all__ = ["Aggregator", "ExchangeContext", "reduce_messages"]

WEIGHT_KEY = "secagg/weight"
METRIC_PREFIX = "secagg/metric/"


@dataclass(frozen=True)
class ExchangeContext:
    """What identifies one exchange: secure-aggregation pads and DP noise are bound to it.

    :param run_id: the run's identifier, fresh from the OS per run (:meth:`Aggregator.start`).
    :param purpose: ``"train"``, ``"evaluate"`` or ``"final"`` (the ledger's purposes).
    :param round: the round number.
    :param phase: the phase name.
    :param aggregation: the phase's aggregation.
    :param cohort: the clients whose messages are summed, in a fixed order.
    """

    run_id: bytes
    purpose: str
    round: int
    phase: str
    aggregation: str
    cohort: Tuple[str, ...]

    @property
    def tag(self) -> Tuple[object, ...]:
        return (self.purpose, self.round, self.phase)

    @cached_property
    def exchange(self) -> Exchange:
        """The masking :class:`~gpflow_fed.federated.protection.Exchange` of this context."""
        return Exchange(self.run_id, self.purpose, self.round, self.phase, tuple(self.cohort))


def reduce_messages(messages: Sequence[Message], aggregation: str) -> Aggregate:
    """Reduce client messages of one phase by the given aggregation (``sum``, ``mean`` or ``collect``).

    :raises ValueError: for an unknown aggregation, no messages, or messages with different array names
        or shapes (a malformed payload is reported with its sender).
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    if not messages:
        raise ValueError("cannot aggregate an empty round: no client answered")
    first = messages[0]
    names = tuple(first.arrays)
    for m in messages[1:]:
        if tuple(m.arrays) != names:
            raise ValueError(f"message from {m.sender} has arrays {tuple(m.arrays)}, expected {names}")
        for n in names:
            if m.arrays[n].shape != first.arrays[n].shape:
                raise ValueError(
                    f"message from {m.sender}: array {n!r} has shape {m.arrays[n].shape}, "
                    f"expected {first.arrays[n].shape}"
                )
    total_weight = float(sum(m.weight for m in messages))
    metrics = {}
    for k in sorted({k for m in messages for k in m.metrics}):
        reporting = [m for m in messages if k in m.metrics]
        weights = np.array([m.weight for m in reporting])
        weights = weights if weights.sum() > 0 else np.ones(len(reporting))
        metrics[k] = float(np.dot(weights, [m.metrics[k] for m in reporting]) / weights.sum())
    arrays: Dict[str, np.ndarray] = {}
    if aggregation in ("sum", "mean"):
        for n in names:
            if aggregation == "sum":
                arrays[n] = np.sum([m.arrays[n] for m in messages], axis=0)
            else:
                if total_weight <= 0:
                    raise ValueError("a 'mean' aggregation needs a positive total weight")
                arrays[n] = np.sum([m.weight * m.arrays[n] for m in messages], axis=0) / total_weight
    return Aggregate(
        round=first.round,
        phase=first.phase,
        arrays=arrays,
        total_weight=total_weight,
        senders=tuple(m.sender for m in messages),
        metrics=metrics,
        messages=tuple(messages) if aggregation == "collect" else None,
    )


def _insecure_rng(seed: int, *context: object) -> np.random.Generator:
    """A generator derived from an explicit insecure seed and a context (tests only; see DifferentialPrivacy)."""
    digest = hashlib.sha256("\x1f".join(str(c) for c in (int(seed), *context)).encode("utf-8")).digest()
    return np.random.default_rng(np.frombuffer(digest, dtype=np.uint32).tolist())


class Aggregator:
    """Client-side encoding and server-side reduction of one phase's messages.

    :param secure: ``True`` or a :class:`~gpflow_fed.federated.SecureAggregation` for pairwise masking.
    :param dp: a :class:`~gpflow_fed.federated.DifferentialPrivacy` for clipping and Gaussian noise.
    :param robust: a :class:`~gpflow_fed.federated.RobustAggregation` for ``"mean"`` phases (not with the other two).

    With none of them, :meth:`reduce` is :func:`~gpflow_fed.federated.reduce_messages` and :meth:`encode` the
    identity.
    """

    def __init__(
        self,
        secure: Union[bool, SecureAggregation, None] = None,
        dp: Optional[DifferentialPrivacy] = None,
        robust: Optional[RobustAggregation] = None,
    ) -> None:
        if secure is True:
            secure = SecureAggregation()
        if secure is not None and secure is not False and not isinstance(secure, SecureAggregation):
            raise TypeError(f"secure_aggregation must be a bool or SecureAggregation, got {type(secure).__name__}")
        if dp is not None and not isinstance(dp, DifferentialPrivacy):
            raise TypeError(f"differential_privacy must be a DifferentialPrivacy, got {type(dp).__name__}")
        if robust is not None and not isinstance(robust, RobustAggregation):
            raise TypeError(f"robust must be a RobustAggregation, got {type(robust).__name__}")
        self.secure: Optional[SecureAggregation] = secure or None
        self.dp = dp
        self.robust = robust
        if robust is not None and (self.secure is not None or dp is not None):
            raise ValueError(
                "robust aggregation needs each client's payload, which secure aggregation hides and DP's "
                "sensitivity analysis does not cover; use RobustAggregation without secure_aggregation and "
                "differential_privacy"
            )
        self.start()

    def start(self, run_id: Optional[bytes] = None, server_secret: Optional[bytes] = None) -> None:
        """Begin a run: no client keys yet, a fresh run id and a fresh server secret, both from the OS.

        The run id is public (it binds every pad to this run); the server secret never leaves the server and
        seeds the DP noise and DP client sampling (:meth:`noise_rng`, :meth:`sampling_rng`). Processes that
        are together the server (``MultiWorkerMirroredStrategy``) pass the chief's values, so they agree.
        """
        self.run_id = new_run_id() if run_id is None else bytes(run_id)
        self.server_secret = secrets.token_bytes(32) if server_secret is None else bytes(server_secret)
        self._keys: Dict[str, MaskingKeys] = {}
        self._graphs: Dict[ExchangeContext, Dict[str, Tuple[str, ...]]] = {}
        self._warned: set = set()

    def _secret_rng(self, *context: object) -> np.random.Generator:
        label = "\x1f".join(str(c) for c in context).encode("utf-8")
        digest = hmac.new(self.server_secret, label, hashlib.sha256).digest()
        return np.random.default_rng(np.frombuffer(digest, dtype=np.uint32).tolist())

    @property
    def active(self) -> bool:
        """Whether any protection is on."""
        return self.secure is not None or self.dp is not None or self.robust is not None

    def context(self, purpose: str, round: int, phase: str, aggregation: str, cohort: Sequence[str]) -> ExchangeContext:
        """The :class:`ExchangeContext` of one exchange of this run."""
        return ExchangeContext(self.run_id, purpose, round, phase, aggregation, tuple(cohort))

    def check_cohort(self, context: ExchangeContext) -> None:
        """A protected phase's cohort must have ``SecureAggregation.min_cohort`` members before anyone masks.

        :raises RoundFailedError: naming the setting (nothing has been sent: no client's plain encoding leaves it).
        """
        if self.secure is None or not self.protects(context.phase, context.aggregation):
            return
        try:
            self.secure.check_cohort(context.cohort)
        except ValueError as exc:
            raise RoundFailedError(f"round {context.round}, phase {context.phase!r}: {exc}") from None

    # --- client keys (client side: in-process runtimes hold each client's keys here) -----------------
    def keys(self, client_id: str) -> MaskingKeys:
        """Client ``client_id``'s X25519 keys for this run (made from the OS on first use, never saved)."""
        if client_id not in self._keys:
            self._keys[client_id] = MaskingKeys()
        return self._keys[client_id]

    def public_keys(self, client_ids: Sequence[str]) -> Dict[str, bytes]:
        """The public keys the server relays (32 bytes each)."""
        return {c: self.keys(c).public_bytes for c in client_ids}

    def noised(self, phase: str, aggregation: str) -> bool:
        """Whether DP clips and noises the sums of ``phase``."""
        return self.dp is not None and aggregation in ("sum", "mean") and self.dp.applies(phase)

    def protects(self, phase: str, aggregation: str) -> bool:
        """Whether messages of ``phase`` are encoded and reduced by this aggregator (else: plain sums)."""
        return aggregation in ("sum", "mean") and (self.secure is not None or self.noised(phase, aggregation))

    def check(self, algorithm: Algorithm) -> None:
        """Before the run: no protected ``"collect"`` phase, and DP's ``phases`` exist in ``algorithm``.

        :raises ValueError: naming the phase and the fix.
        """
        if not self.active:
            return
        phases = set(algorithm.final_phases())
        for r in range(algorithm.rounds):
            phases.update(algorithm.phases(r))
        if self.dp is not None and self.dp.phases is not None:
            unknown = sorted(set(self.dp.phases) - phases)
            if unknown:
                raise ValueError(
                    f"{algorithm.name}: DifferentialPrivacy(phases=...) names {unknown}, which this run never "
                    f"executes; its phases are {sorted(phases)}"
                )
        collected = sorted(
            p
            for p in phases
            if algorithm.aggregation(p) == "collect" and (self.secure is not None or (self.dp and self.dp.applies(p)))
        )
        if collected:
            what = " and ".join(
                n for n, on in (("secure aggregation", self.secure), ("differential privacy", self.dp)) if on
            )
            raise ValueError(
                f"{algorithm.name}: {what} protects only 'sum' and 'mean' phases, but phase(s) {collected} "
                "collect each client's message; run this algorithm without them"
            )

    # --- client side ---------------------------------------------------------------------------------
    def prepare(self, message: Message, aggregation: str, cohort_size: int) -> Message:
        """Client-side steps that can fail, before the cohort is fixed: clip (DP), weight, fixed point.

        The result stays on the client; only :meth:`mask`'s output is sent.

        :raises ValueError: a payload outside the fixed-point range (see :class:`SecureAggregation`).
        """
        if not self.protects(message.phase, aggregation):
            return message
        arrays = {k: np.asarray(v, dtype=np.float64) for k, v in message.arrays.items()}
        weight = message.weight
        metrics = dict(message.metrics)
        if self.dp is not None and self.noised(message.phase, aggregation):
            arrays, _ = clip_payload(arrays, self.dp.clip_norm)
            if aggregation == "mean":
                weight = min(weight, self.dp.weight_bound)
            metrics = {}
        if self.secure is None:
            return Message(message.sender, message.round, message.phase, arrays, weight=weight)
        if aggregation == "mean":
            arrays = {k: weight * v for k, v in arrays.items()}
        arrays[WEIGHT_KEY] = np.array([weight])
        arrays.update({METRIC_PREFIX + k: np.array([weight * v]) for k, v in metrics.items()})
        encoded = {k: self.secure.encode(k, v, cohort_size) for k, v in arrays.items()}
        return Message(message.sender, message.round, message.phase, encoded, weight=0.0)

    def mask(
        self, prepared: Message, context: ExchangeContext, public_keys: Optional[Mapping[str, bytes]] = None
    ) -> Message:
        """What the client sends: its prepared message plus its pads with its neighbours in the masking graph.

        :param public_keys: the neighbours' public keys as the server relays them (default: this process's).
        """
        if self.secure is None or not self.protects(context.phase, context.aggregation):
            return prepared
        graph = self._graphs.get(context)
        if graph is None:
            self._graphs = {context: self.secure.graph(context.exchange)}  # one exchange at a time
            graph = self._graphs[context]
        neighbours = graph[prepared.sender]
        keys = self.public_keys(neighbours) if public_keys is None else public_keys
        masked = mask(self.keys(prepared.sender), prepared.sender, prepared.arrays, context.exchange, keys, neighbours)
        return Message(prepared.sender, prepared.round, prepared.phase, masked, weight=0.0)

    def encode(self, message: Message, context: ExchangeContext) -> Message:
        """:meth:`prepare` then :meth:`mask`: what client ``message.sender`` sends instead of ``message``."""
        return self.mask(self.prepare(message, context.aggregation, len(context.cohort)), context)

    # --- server side ---------------------------------------------------------------------------------
    def noise_rng(self, context: ExchangeContext) -> np.random.Generator:
        """The server's noise generator for one exchange, from the run's OS-random server secret.

        Only with ``DifferentialPrivacy(insecure_noise_seed=s)`` (tests) is it derived from ``s`` and the
        exchange, so that runtimes can be compared on the same noise.
        """
        assert self.dp is not None
        if self.dp.insecure_noise_seed is None:
            return self._secret_rng("dp-noise", *context.tag)
        return _insecure_rng(self.dp.insecure_noise_seed, "dp-noise", *context.tag)

    def sampling_rng(self, seeded: np.random.Generator) -> np.random.Generator:
        """The generator of client sampling: ``seeded`` (from the public run seed) unless DP is on.

        Under DP, privacy amplification by sampling holds only if nobody can predict the sample, so the
        sample is drawn from the operating system's randomness (or from ``insecure_noise_seed``, in tests).
        """
        if self.dp is None:
            return seeded
        if self.dp.insecure_noise_seed is None:
            return self._secret_rng("dp-sampling")
        return _insecure_rng(self.dp.insecure_noise_seed, "dp-sampling")

    def reduce(self, messages: Sequence[Message], context: ExchangeContext) -> Aggregate:
        """The server's view of one phase: plain, masked-and-summed, and/or noised.

        :raises ValueError: a protected phase whose senders are not exactly the cohort (masks would not
            cancel), or messages whose array names or shapes differ.
        """
        stale = [m.sender for m in messages if (m.round, m.phase) != (context.round, context.phase)]
        if stale:
            raise ValueError(
                f"round {context.round}, phase {context.phase!r}: messages from {stale} belong to another exchange "
                "(a replayed or stale message); refused"
            )
        if self.robust is not None and context.aggregation == "mean":
            plain = reduce_messages(messages, "sum")  # checks names and shapes; metrics
            arrays = self.robust.reduce([m.arrays for m in messages], [m.weight for m in messages])
            dtype = gpflow.default_float()
            return replace(plain, arrays={k: np.asarray(v, dtype=dtype) for k, v in arrays.items()})
        if not self.protects(context.phase, context.aggregation):
            return reduce_messages(messages, context.aggregation)
        check_senders([m.sender for m in messages], context.exchange)
        plain = reduce_messages(messages, "sum")  # checks names and shapes
        if self.secure is not None:
            return self.finish(plain.arrays, context)
        if context.aggregation == "mean":
            sums = {k: np.sum([m.weight * m.arrays[k] for m in messages], axis=0) for k in plain.arrays}
        else:
            sums = dict(plain.arrays)
        return self.finish(sums, context, total_weight=plain.total_weight, metrics=plain.metrics)

    def finish(
        self,
        sums: Mapping[str, np.ndarray],
        context: ExchangeContext,
        *,
        total_weight: float = 0.0,
        metrics: Optional[Mapping[str, float]] = None,
    ) -> Aggregate:
        """The server's aggregate of a protected phase from the cohort's summed payloads, however summed.

        :param sums: with secure aggregation, ``Σ_k y_k mod 2^64`` per array name (``uint64``; equal to the
            sum of the fixed-point encodings, weight and metric entries included); without it, the clipped
            sums ``Σ_k ā_k`` (``"sum"``) or ``Σ_k w̄_k ā_k`` (``"mean"``).
        :param context: the exchange; ``context.cohort`` are the senders.
        :param total_weight: ``Σ_k w̄_k`` (without secure aggregation; with it, it is decoded from ``sums``).
        :param metrics: the weighted means of the client metrics (without secure aggregation).
        :return: decoded, noised (DP) and, for ``"mean"``, divided by the total weight.
        :raises ValueError: a ``"mean"`` phase with a non-positive total weight.
        """
        out: Dict[str, np.ndarray]
        means: Dict[str, float] = {}
        std = 0.0
        if self.secure is not None:
            out = {k: self.secure.decode(v) for k, v in sums.items()}
            total_weight = float(out.pop(WEIGHT_KEY)[0])
            for key in [k for k in out if k.startswith(METRIC_PREFIX)]:
                value = float(out.pop(key)[0])
                if total_weight > 0:
                    means[key[len(METRIC_PREFIX) :]] = value / total_weight
        else:
            out = {k: np.asarray(v, dtype=np.float64) for k, v in sums.items()}
            means = dict(metrics or {})
        if self.dp is not None and self.noised(context.phase, context.aggregation):
            rng = self.noise_rng(context)
            std = self.dp.noise_std(context.aggregation)
            out = {k: v + rng.normal(0.0, std, size=np.shape(v)) for k, v in sorted(out.items())}
            text = utility_warning(context.phase, out, std)
            if text and context.phase not in self._warned:  # once per phase and run
                self._warned.add(context.phase)
                warnings.warn(text, DPUtilityWarning, stacklevel=2)
        if context.aggregation == "mean":
            if total_weight <= 0:
                raise ValueError("a 'mean' aggregation needs a positive total weight")
            out = {k: v / total_weight for k, v in out.items()}
            std /= total_weight
        dtype = gpflow.default_float()
        return Aggregate(
            round=context.round,
            phase=context.phase,
            arrays={k: np.asarray(v, dtype=dtype) for k, v in out.items()},
            total_weight=total_weight,
            senders=tuple(context.cohort),
            metrics=means,
            noised=self.noised(context.phase, context.aggregation),
            noise_std=float(std),
        )

    # --- one phase, on every runtime ----------------------------------------------------------------
    def aggregate(
        self,
        transport: Transport,
        broadcast: Broadcast,
        cohort: Sequence[str],
        *,
        channel: Channel,
        faults: FaultPolicy,
        spec: Optional[ReplySpec] = None,
    ) -> Tuple[Aggregate, Dict[str, str]]:
        """One phase from the server's side, whatever the transport: the only place a reply is recorded,
        screened, protected and reduced.

        ``transport.exchange`` delivers ``broadcast`` to ``cohort``; every message that crossed is recorded in
        ``channel``'s ledger (in cohort order: the broadcast, then the reply); faulty replies stop the run or
        are excluded under ``faults``, and the rest are checked against ``spec`` and ``faults.min_clients``
        (:func:`~gpflow_fed.federated.faults.screen`). A protected phase then fixes its cohort
        (:meth:`check_cohort`), has it sent masked (``transport.masked``), and is reduced like any other by
        :meth:`reduce` (or, after the transport's own secure summation, by :meth:`finish`).

        :return: the server's aggregate and ``{client: reason}`` of the excluded clients.
        :raises ClientUpdateError: a faulty reply under ``FaultPolicy(on_error="raise")``.
        :raises RoundFailedError: fewer than ``faults.min_clients`` good replies, or a cohort too small to mask.
        """
        down, purpose = broadcast.message, broadcast.purpose
        where = (down.round, down.phase)
        replies = transport.exchange(broadcast, cohort)
        well_formed: List[Message] = []
        excluded: Dict[str, str] = {}
        for cid in cohort:
            channel.send(down, cid, purpose)
            reply = replies[cid]
            if reply.message is not None and not broadcast.protected:
                channel.send(reply.message, SERVER, purpose)
            if reply.fault is None:
                well_formed.append(reply.message)
                continue
            if faults.on_error == "raise":
                raise ClientUpdateError(cid, *where, reply.error or ValueError(reply.fault)) from reply.error
            excluded[cid] = reply.fault
        good = screen(faults, *where, cohort, well_formed, excluded, spec)
        context = self.context(purpose, *where, broadcast.aggregation, good)
        if not broadcast.protected:
            return self.reduce([replies[cid].message for cid in good], context), excluded
        self.check_cohort(context)
        masked = transport.masked(context, {cid: replies[cid] for cid in good})
        if not isinstance(masked, SecureSum):
            return self.reduce([channel.send(masked[cid], SERVER, purpose) for cid in good], context), excluded
        for cid, reason in masked.dropped.items():
            if faults.on_error == "raise":
                raise ClientUpdateError(cid, *where, RuntimeError(reason))
            excluded[cid] = reason
        if len(masked.survivors) < faults.min_clients:
            raise RoundFailedError(
                f"round {down.round}, phase {down.phase!r}: {len(masked.survivors)} clients finished the secure "
                f"summation, fewer than min_clients={faults.min_clients}"
            )
        return self.finish(masked.sums, replace(context, cohort=tuple(masked.survivors))), excluded

    def accountant(self) -> Optional[PrivacyAccountant]:
        """A fresh accountant for a run (None without DP)."""
        return PrivacyAccountant(self.dp) if self.dp is not None else None
