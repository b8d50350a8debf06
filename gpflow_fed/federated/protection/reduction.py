"""The server's reduction of one phase: plain, robust, or the decoding and noising of a protected sum.

Every exchange ends in ``update(state, Σ_k payload_k)``. :class:`Reducer` is the server's side of that sum, and only
that: it holds the run's public id and the server's OS-random secret, and turns what the clients sent into the
phase's :class:`~gpflow_fed.federated.Aggregate`::

    client k (ClientEncoder):  a_k ──clip to C (DP)──▶ ā_k ──×w̄_k ("mean")──▶ ──fixed point + masks──▶ y_k
    server   (Reducer):        Σ_k y_k (masks cancel) ──decode──▶ Σ_k w̄_k ā_k ──+ N(0, σ²) (DP)──▶ ÷ Σ_k w̄_k

DP is *central* here: the server adds the noise, so the (ε, δ) protects what is released (the model, the history,
the server state) against everyone but the aggregator itself. Robust aggregation replaces the weighted mean of
``"mean"`` phases by a coordinate-wise weighted median or trimmed mean.

**Saturation.** Each client encodes within its own fixed-point range and clips (saturates) a value beyond it,
adding the number it clipped to its masked payload (:mod:`.wire`). The server decodes the cohort's total only: a
non-zero total is warned about (:class:`FixedPointSaturationWarning`, once per phase and run, and logged for every
exchange) and recorded per exchange (:attr:`Reducer.saturated`; a run's history carries it as ``"saturated"``).
Under DP it can only count clipped public weights (central DP) or truncated noise (distributed DP).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import warnings
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Dict, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ..protocol.algorithm import AGGREGATIONS, Aggregate
from ..protocol.faults import RoundFailedError
from ..protocol.messages import Message
from .distributed_dp import DistributedDP, DistributedPrivacyAccountant
from .dp import DifferentialPrivacy, DPUtilityWarning, PrivacyAccountant, utility_warning
from .masking import Exchange, check_senders
from ...randomness import new_run_id
from .request import Protection
from .wire import METRIC_PREFIX, SATURATED_KEY, WEIGHT_KEY, decode_count, decode_fixed_point

__all__ = ["ExchangeContext", "FixedPointSaturationWarning", "Reducer", "reduce_messages"]

LOG = logging.getLogger(__name__)


class FixedPointSaturationWarning(UserWarning):
    """Clients clipped values of a masked sum to their fixed-point range (module docstring): the sum is biased there."""


@dataclass(frozen=True)
class ExchangeContext:
    """What identifies one exchange: secure-aggregation pads and DP noise are bound to it.

    :param run_id: the run's identifier, fresh from the OS per run (:meth:`Reducer.start`).
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
        """The masking :class:`~gpflow_fed.federated.protection.masking.Exchange` of this context."""
        return Exchange(self.run_id, self.purpose, self.round, self.phase, tuple(self.cohort))


def reduce_messages(messages: Sequence[Message], aggregation: str) -> Aggregate:
    """Reduce client messages of one phase by the given aggregation (``sum``, ``mean`` or ``collect``).

    :raises ValueError: for an unknown aggregation, no messages, or messages with different array names, or
        with different shapes for ``sum``/``mean`` (``collect`` keeps each message as it is: its shapes may be the
        client's own, checked by ``Algorithm.check_reply``); a malformed payload is reported with its sender.
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
        for n in names if aggregation != "collect" else ():  # collected messages are read one by one
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


class Reducer:
    """The server's side of a run's protection request: its secrets, and the reduction of each phase.

    :param protection: the server's :class:`~gpflow_fed.federated.protection.request.Protection` request.
    """

    def __init__(self, protection: Protection) -> None:
        if not isinstance(protection, Protection):
            raise TypeError(f"protection must be a Protection, got {type(protection).__name__}")
        self.protection = protection
        self.start()

    def start(self, run_id: Optional[bytes] = None, server_secret: Optional[bytes] = None) -> None:
        """Begin a run: a fresh run id and a fresh server secret, both from the OS.

        The run id is public (it binds every pad to this run); the server secret never leaves the server and
        seeds the DP noise and DP client sampling (:meth:`noise_rng`, :meth:`sampling_rng`). Processes that
        are together the server (``MultiWorkerMirroredStrategy``) pass the chief's values, so they agree.
        """
        self.run_id = new_run_id() if run_id is None else bytes(run_id)
        self.server_secret = secrets.token_bytes(32) if server_secret is None else bytes(server_secret)
        self._warned: set = set()
        #: the number of values each distributed-DP phase released (its accountant's dimension)
        self.dimensions: Dict[str, int] = {}
        #: per exchange ``(purpose, round, phase)`` whose cohort saturated entries, their number (module docstring)
        self.saturated: Dict[Tuple[str, int, str], int] = {}
        self._saturation_warned: set = set()

    def saturation(self, purpose: str, round: int) -> Dict[str, int]:
        """``{phase: number of saturated entries}`` of the exchanges of ``purpose`` and ``round`` that had any."""
        return {p: n for (u, r, p), n in self.saturated.items() if (u, r) == (purpose, round)}

    def _secret_rng(self, *context: object) -> np.random.Generator:
        label = "\x1f".join(str(c) for c in context).encode("utf-8")
        digest = hmac.new(self.server_secret, label, hashlib.sha256).digest()
        return np.random.default_rng(np.frombuffer(digest, dtype=np.uint32).tolist())

    def context(self, purpose: str, round: int, phase: str, aggregation: str, cohort: Sequence[str]) -> ExchangeContext:
        """The :class:`ExchangeContext` of one exchange of this run."""
        return ExchangeContext(self.run_id, purpose, round, phase, aggregation, tuple(cohort))

    def check_cohort(self, context: ExchangeContext) -> None:
        """A masked phase's cohort must have ``SecureAggregation.min_cohort`` members before anyone masks.

        :raises RoundFailedError: naming the setting (nothing has been sent: no client's plain encoding leaves it).
        """
        secure = self.protection.secure
        if secure is None or not self.protection.protects(context.phase, context.aggregation):
            return
        try:
            secure.check_cohort(context.cohort)
        except ValueError as exc:
            alone = (
                "; to train on one party's data alone, fit a GPflow model to it directly, or run with "
                "protection=Protection(secure_aggregation=False)"
                if len(context.cohort) == 1
                else ""
            )
            raise RoundFailedError(f"round {context.round}, phase {context.phase!r}: {exc}{alone}") from None

    def noise_rng(self, context: ExchangeContext) -> np.random.Generator:
        """The server's noise generator for one exchange, from the run's OS-random server secret.

        Only with ``DifferentialPrivacy(insecure_noise_seed=s)`` (tests) is it derived from ``s`` and the
        exchange, so that runtimes can be compared on the same noise.
        """
        dp = self.protection.dp
        assert isinstance(dp, DifferentialPrivacy)
        if dp.insecure_noise_seed is None:
            return self._secret_rng("dp-noise", *context.tag)
        return _insecure_rng(dp.insecure_noise_seed, "dp-noise", *context.tag)

    def sampling_rng(self, seeded: np.random.Generator) -> np.random.Generator:
        """The generator of client sampling: ``seeded`` (from the public run seed) unless DP is on.

        Under DP, privacy amplification by sampling holds only if nobody can predict the sample, so the
        sample is drawn from the operating system's randomness (or from ``insecure_noise_seed``, in tests).
        """
        dp = self.protection.dp
        if dp is None:
            return seeded
        if not isinstance(dp, DifferentialPrivacy) or dp.insecure_noise_seed is None:
            return self._secret_rng("dp-sampling")
        return _insecure_rng(dp.insecure_noise_seed, "dp-sampling")

    def reduce(self, messages: Sequence[Message], context: ExchangeContext) -> Aggregate:
        """The aggregate of messages the server can read: plain, robust, or clipped (DP without masking).

        :raises ValueError: messages of another exchange, or whose array names or shapes differ.
        """
        stale = [m.sender for m in messages if (m.round, m.phase) != (context.round, context.phase)]
        if stale:
            raise ValueError(
                f"round {context.round}, phase {context.phase!r}: messages from {stale} belong to another exchange "
                "(a replayed or stale message); refused"
            )
        protection = self.protection
        if protection.robust is not None and context.aggregation == "mean":
            plain = reduce_messages(messages, "sum")  # checks names and shapes; metrics
            arrays = protection.robust.reduce([m.arrays for m in messages], [m.weight for m in messages])
            dtype = _default_float()
            return replace(plain, arrays={k: np.asarray(v, dtype=dtype) for k, v in arrays.items()})
        if not protection.protects(context.phase, context.aggregation):
            return reduce_messages(messages, context.aggregation)
        check_senders([m.sender for m in messages], context.exchange)
        plain = reduce_messages(messages, "sum")  # checks names and shapes
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
        masked: bool = False,
    ) -> Aggregate:
        """The server's aggregate of a protected phase from the cohort's summed payloads, however summed.

        :param sums: with ``masked``, ``Σ_k y_k mod 2^64`` per array name (``uint64``; equal to the sum of the
            encodings, weight, metric and saturation-count entries included); else the clipped sums ``Σ_k ā_k``
            (``"sum"``) or ``Σ_k w̄_k ā_k`` (``"mean"``).
        :param context: the exchange; ``context.cohort`` are the senders.
        :param total_weight: ``Σ_k w̄_k`` (unmasked; masked, it is decoded from ``sums``).
        :param metrics: the weighted means of the client metrics (unmasked).
        :return: decoded, noised (DP) and, for ``"mean"``, divided by the total weight.
        :raises ValueError: a ``"mean"`` phase with a non-positive total weight, a masked sum without its
            saturation count.
        """
        protection = self.protection
        out: Dict[str, np.ndarray]
        means: Dict[str, float] = {}
        std = 0.0
        noised = protection.noised(context.phase, context.aggregation)
        distributed = protection.distributed if noised else None
        if masked:
            sums = dict(sums)
            if SATURATED_KEY not in sums:
                raise ValueError(f"round {context.round}, phase {context.phase!r}: a masked sum without its count")
            self._saturation(context, decode_count(sums.pop(SATURATED_KEY)), distributed is not None)
        if masked and distributed is not None:  # the clients added the noise: decode only
            out = {k: distributed.decode(v) for k, v in sums.items()}
            dimension = int(sum(np.size(v) for v in out.values()))
            self.dimensions[context.phase] = dimension
            std = distributed.noise_std(dimension)
            total_weight = float(len(context.cohort))  # equal weights (see ClientEncoder)
        elif masked:
            assert protection.secure is not None
            out = {k: decode_fixed_point(v, protection.secure.fractional_bits) for k, v in sums.items()}
            total_weight = float(out.pop(WEIGHT_KEY)[0])
            for key in [k for k in out if k.startswith(METRIC_PREFIX)]:
                value = float(out.pop(key)[0])
                if total_weight > 0:
                    means[key[len(METRIC_PREFIX) :]] = value / total_weight
        else:
            out = {k: np.asarray(v, dtype=np.float64) for k, v in sums.items()}
            means = dict(metrics or {})
        if noised and distributed is None:
            assert isinstance(protection.dp, DifferentialPrivacy)
            rng = self.noise_rng(context)
            std = protection.dp.noise_std(context.aggregation)
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
        dtype = _default_float()
        return Aggregate(
            round=context.round,
            phase=context.phase,
            arrays={k: np.asarray(v, dtype=dtype) for k, v in out.items()},
            total_weight=total_weight,
            senders=tuple(context.cohort),
            metrics=means,
            noised=noised,
            noise_std=float(std),
        )

    def _saturation(self, context: ExchangeContext, count: int, distributed: bool) -> None:
        """Record and warn about a cohort's saturated entries (module docstring); nothing when there are none."""
        if not count:
            return
        self.saturated[(context.purpose, context.round, context.phase)] = count
        if distributed:
            text = (
                f"round {context.round}, phase {context.phase!r}: the clients truncated {count} distributed-DP noise "
                "draw(s) beyond 13 standard deviations (probability below 5e-37 each; see DistributedDP)"
            )
        else:
            text = (
                f"round {context.round}, phase {context.phase!r} ({context.purpose}): "
                + (
                    "1 entry of the cohort's payloads was"
                    if count == 1
                    else f"{count} entries of the cohort's payloads were"
                )
                + " beyond the clients' fixed-point range and clipped to it (saturated), so the sum is biased there; "
                "standardise the data (gpflow_fed.fit does), or lower fractional_bits in the clients' policies and in "
                "SecureAggregation together"
            )
        LOG.warning("%s", text)
        if context.phase not in self._saturation_warned:  # once per phase and run (every exchange is logged)
            self._saturation_warned.add(context.phase)
            warnings.warn(text, FixedPointSaturationWarning, stacklevel=3)

    def accountant(self) -> Optional[Union[PrivacyAccountant, DistributedPrivacyAccountant]]:
        """A fresh accountant for a run (None without DP)."""
        dp = self.protection.dp
        if isinstance(dp, DistributedDP):
            return DistributedPrivacyAccountant(dp)
        return PrivacyAccountant(dp) if dp is not None else None


def _default_float() -> type:
    """GPflow's float type, imported on use: protection imports no TensorFlow or GPflow at import time."""
    import gpflow

    return gpflow.default_float()
