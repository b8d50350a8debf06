"""Client faults: a client that raises, times out, or answers with NaN or wrongly shaped payloads.

Under :class:`FaultPolicy` ``on_error="raise"`` (the default) the first fault stops the run with a
:class:`~gpflow_fed.federated.ClientUpdateError` naming the client; under ``"exclude"`` the faulty client is
left out of the round (and of the round's later phases), the reason is logged and recorded in the round's
history, and the round goes on if at least ``min_clients`` clients answered well.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union, cast

import numpy as np

from ...validation import config_option, dataclass_from_config, dataclass_to_config, integer
from .messages import Message

logger = logging.getLogger("gpflow_fed.federated")

ON_ERROR = ("raise", "exclude")


class ClientUpdateError(RuntimeError):
    """A client's update failed; the server state was not changed by the failed phase."""

    def __init__(self, client_id: str, round: int, phase: str, cause: BaseException) -> None:
        super().__init__(
            f"client {client_id!r} failed in round {round}, phase {phase!r}: {type(cause).__name__}: {cause}"
        )
        self.client_id = client_id
        self.round = round
        self.phase = phase
        self.cause = cause


class RoundFailedError(RuntimeError):
    """Fewer than ``min_clients`` clients answered a phase well; the server state was not changed."""


@dataclass(frozen=True)
class FaultPolicy:
    """How a runtime treats faulty clients.

    :param on_error: ``"raise"`` stops at the first fault; ``"exclude"`` drops the client from the round.
    :param min_clients: the fewest good answers a phase needs (else :class:`RoundFailedError`).
    :param timeout: seconds a client may take for one update; a later answer is discarded as a time-out
        (an in-process client cannot be pre-empted, so its work is finished and then ignored). A Flower server
        also stops waiting for a stage's replies after it (the run config's ``timeout``).

    As a config (:meth:`to_config`, :meth:`from_config`; the keys of a Flower run config and of the command line's
    ``--on-error``, ``--min-clients``, ``--timeout``): ``on-error``, ``min-clients``, ``timeout`` (``0.0``: None).
    """

    on_error: str = field(
        default="raise",
        metadata=config_option(
            "choice",
            "a faulty client: 'raise' stops the run naming it, 'exclude' leaves it out of the round",
            choices=ON_ERROR,
        ),
    )
    min_clients: int = field(
        default=1,
        metadata=config_option("int", "the fewest good answers a phase needs, else the round fails", minimum=1),
    )
    timeout: Optional[float] = field(
        default=None,
        metadata=config_option(
            "seconds", "seconds a client may take to answer one request; a later answer is a fault (default: none)"
        ),
    )

    def __post_init__(self) -> None:
        if self.on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {self.on_error!r}")
        integer(self.min_clients, "min_clients", minimum=1)
        if self.timeout is not None and not (self.timeout > 0):
            raise ValueError(f"timeout must be positive seconds or None, got {self.timeout!r}")

    def to_config(self) -> Dict[str, Any]:
        """``{"on-error": str, "min-clients": int, "timeout": float}``, None written as ``0.0``
        (:func:`~gpflow_fed.validation.dataclass_to_config`)."""
        return dataclass_to_config(self)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "FaultPolicy":
        """The policy a config describes (:meth:`to_config`'s keys; a missing key is the default, other keys are
        ignored; see :func:`~gpflow_fed.validation.dataclass_from_config`).

        :raises ValueError: a value of the wrong kind or out of range, naming its key.
        """
        return dataclass_from_config(cls, config)


#: the largest magnitude a payload value may have: the server sums replies and squares sums (Adam's second moment),
#: and (1e150)² is still far inside float64's range; anything larger could only overflow the server's arithmetic
OVERFLOW_BOUND = 1e150


def reply_fault(reply: object, client_id: str, broadcast: Union[Message, _Down]) -> Optional[str]:
    """Why a single reply is unusable (:func:`envelope_fault`, then :func:`value_fault`), or None. The reason never
    carries a value of the reply."""
    envelope = envelope_fault(reply, client_id, broadcast)
    return envelope if envelope is not None else value_fault(cast(Message, reply))


def envelope_fault(reply: object, client_id: str, broadcast: Union[Message, _Down]) -> Optional[str]:
    """Why a reply is not an answer to ``broadcast`` from ``client_id`` (wrong type, sender, round or phase), or
    None: what the algorithm returned, not what the data hold."""
    if not isinstance(reply, Message):
        return f"returned {type(reply).__name__}, not a Message"
    if reply.sender != client_id:
        return f"reply claims sender {reply.sender!r}"
    if (reply.round, reply.phase) != (broadcast.round, broadcast.phase):
        return f"reply is for round {reply.round}, phase {reply.phase!r}"
    return None


def value_fault(reply: Message) -> Optional[str]:
    """Why a reply's values are unusable (non-finite, or beyond :data:`OVERFLOW_BOUND`), or None: on a protected
    phase this depends on the client's data, so the client sends only that its checks failed
    (:data:`~.protection.encoder.DATA_FAULT`)."""
    for name, array in reply.arrays.items():
        kind = array.dtype.kind  # "iu": integers (always finite), "f": floating, "c": complex
        if kind == "c" and not np.all(np.isfinite(array)):
            return f"payload {name!r} has NaN or inf values"
        if kind == "f" and array.size:
            largest = float(np.max(np.abs(array)))  # NaN if an entry is NaN, inf if one is infinite: one pass
            if not np.isfinite(largest):
                return f"payload {name!r} has NaN or inf values"
            if largest > OVERFLOW_BOUND:
                return f"payload {name!r} has values beyond ±{OVERFLOW_BOUND:g}, which would overflow the server's sums"
    if not all(np.isfinite(v) for v in reply.metrics.values()):
        return "a metric is NaN or inf"
    return None


#: the most bytes :func:`value_faults` stacks at once (one payload name of one chunk of a cohort's replies)
STACK_BYTES = 16 * 2**20


def value_faults(replies: Sequence[Message]) -> List[Optional[str]]:
    """:func:`value_fault` of every reply, in order, with the per-reply Python of a large cohort made small.

    Replies whose payloads have the same names, shapes and dtypes (a batched cohort's, typically all of them) are
    checked together: each floating payload name's arrays are stacked (in chunks of at most :data:`STACK_BYTES`) and
    one ``max |x|`` per reply flags any NaN, inf or value beyond :data:`OVERFLOW_BOUND` (one finiteness mask per chunk
    for complex payloads); the metrics of all replies are checked as one array. A flagged reply, and one whose
    payloads cannot be stacked, is then judged on its own by :func:`value_fault`, so every reason (which payload, which
    words) is exactly the per-reply one, and an unflagged reply is one :func:`value_fault` would pass.
    """
    count = len(replies)
    suspect = np.zeros(count, dtype=bool)
    layouts: Dict[Tuple[Any, ...], List[int]] = {}  # (name, shape, dtype) of each payload, in order → the replies
    for i, reply in enumerate(replies):
        try:
            layout = tuple((name, array.shape, array.dtype) for name, array in reply.arrays.items())
        except AttributeError:  # not arrays: judged on its own
            suspect[i] = True
            continue
        layouts.setdefault(layout, []).append(i)
    for layout, members in layouts.items():
        for name, shape, dtype in layout:
            if dtype.kind not in "fc":  # integers and booleans are always finite and within range
                continue
            size = int(np.prod(shape, dtype=np.int64))
            if size == 0:  # value_fault skips an empty payload
                continue
            rows = max(1, STACK_BYTES // (size * dtype.itemsize))
            for start in range(0, len(members), rows):
                chunk = members[start : start + rows]
                stacked = np.stack([replies[i].arrays[name] for i in chunk]).reshape(len(chunk), size)
                if dtype.kind == "c":
                    bad = ~np.isfinite(stacked).all(axis=1)
                else:  # NaN and inf fail ``<=`` as value_fault's ``not isfinite``, a finite value past the bound too
                    bad = ~(np.abs(stacked).max(axis=1) <= OVERFLOW_BOUND)
                if bad.any():
                    suspect[np.asarray(chunk)[bad]] = True
    sizes = [0 if suspect[i] else len(reply.metrics) for i, reply in enumerate(replies)]
    total = sum(sizes)
    if total:
        try:
            metrics = np.fromiter(
                (v for i, reply in enumerate(replies) if sizes[i] for v in reply.metrics.values()), float, total
            )
        except (TypeError, ValueError):  # a metric that is not a real number: every reply with metrics on its own
            suspect[np.asarray(sizes) > 0] = True
        else:
            bad = ~np.isfinite(metrics)
            if bad.any():
                suspect[np.repeat(np.arange(count), sizes)[bad]] = True
    return [value_fault(replies[i]) if suspect[i] else None for i in range(count)]


def weight_fault(reply: Message, expected: Optional[float], size: int) -> Optional[str]:
    """Why ``reply``'s weight is refused, or None.

    :param expected: :meth:`~gpflow_fed.federated.Algorithm.expected_weight` for the client (None: any
        weight up to ``size``).
    :param size: the number of data points the client registered.
    """
    if expected is not None and not abs(reply.weight - expected) <= 1e-12 * abs(expected):  # np.isclose, scalar
        return f"claims weight {reply.weight:g}; the server expects {expected:g} for its {size} registered points"
    if reply.weight > size:
        return f"claims weight {reply.weight:g}, more than its {size} registered data points"
    return None


def _signature_text(signature: Mapping[str, Tuple[Optional[int], ...]]) -> str:
    return ", ".join(f"{n}{['*' if d is None else d for d in s]}" for n, s in signature.items())


def spec_faults(replies: Sequence[Any], spec: Optional[Mapping[str, Tuple[Optional[int], ...]]]) -> Dict[str, str]:
    """Replies whose array names or shapes differ from what the server expects, as ``{sender: reason}``.

    :param replies: objects with ``sender`` and ``arrays`` (messages, or their descriptions).
    :param spec: the algorithm's :meth:`~gpflow_fed.federated.Algorithm.reply_spec` (``None`` in a dimension
        matches any size). Without one, a *strict* majority of the replies is the expectation.
    :raises RoundFailedError: no spec, replies that differ, and no strict majority: the server cannot tell the
        malformed replies from the honest ones, so it refuses to guess.
    """
    # the aggregator's own entries of a prepared message (secure aggregation's weight and metrics) are its business;
    # a signature is kept as its (name, shape) pairs in order, so the replies of one layout share one verdict
    signatures: Dict[str, Tuple[Tuple[str, Tuple[int, ...]], ...]] = {
        m.sender: tuple((n, tuple(a.shape)) for n, a in m.arrays.items() if not n.startswith("secagg/"))
        for m in replies
    }
    if not signatures:
        return {}
    declared = spec is not None
    if spec is None:
        counts: Counter[Tuple[Tuple[str, Tuple[int, ...]], ...]] = Counter()
        for signature, times in Counter(signatures.values()).items():  # sorted once per kind, not once per reply
            counts[tuple(sorted(signature))] += times
        best, count = counts.most_common(1)[0]
        if count * 2 <= len(signatures) and len(counts) > 1:
            raise RoundFailedError(
                f"the replies' array shapes differ ({len(counts)} kinds among {len(signatures)} clients) and no strict "
                "majority shows which are malformed; declare Algorithm.reply_spec so the server checks each reply "
                "against its own expectation"
            )
        spec = dict(best)
    expected = _signature_text(spec)
    verdicts: Dict[Tuple[Any, ...], Optional[str]] = {}  # (signature, dtypes) → the reason, or None
    names = set(spec)
    faults: Dict[str, str] = {}
    for m in replies:
        signature = signatures[m.sender]
        # the dtypes matter only to a reply with every declared name (the shapes' verdict comes first)
        dtypes = tuple(np.asarray(m.arrays[n]).dtype for n in spec) if declared and names <= m.arrays.keys() else ()
        key = (signature, dtypes)
        if key not in verdicts:
            verdicts[key] = _spec_fault(dict(signature), spec, expected, dict(zip(spec, dtypes)) if declared else None)
        verdict = verdicts[key]
        if verdict is not None:
            faults[m.sender] = verdict
    return faults


def _spec_fault(
    sig: Mapping[str, Tuple[int, ...]],
    spec: Mapping[str, Tuple[Optional[int], ...]],
    expected: str,
    kinds: Optional[Mapping[str, np.dtype]],
) -> Optional[str]:
    """:func:`spec_faults`' verdict on one signature: the shapes against ``spec``, then (a declared spec) the dtypes."""
    ok = set(sig) == set(spec) and all(
        len(sig[n]) == len(spec[n]) and all(e is None or e == d for e, d in zip(spec[n], sig[n])) for n in spec
    )
    if not ok:
        return f"payload shapes differ from the server's expectation ({expected}): sent {_signature_text(sig)}"
    if kinds is not None:
        odd = {n: str(d) for n, d in kinds.items() if d.kind not in "biuf"}
        if odd:
            return f"payload dtypes {odd} are not real numbers, which the server expects"
    return None


def log_exclusions(round: int, phase: str, excluded: Mapping[str, str]) -> None:
    for client_id, reason in excluded.items():
        logger.warning("round %d, phase %r: excluded %s: %s", round, phase, client_id, reason)


def _shape_only(shape: Sequence[int]) -> np.ndarray:
    """A read-only ``uint64`` array of ``shape`` that holds no memory (a zero-stride view): a layout's stand-in."""
    view = np.lib.stride_tricks.as_strided(np.zeros(1, np.uint64), tuple(int(d) for d in shape), (0,) * len(shape))
    view.flags.writeable = False
    return view


@dataclass(frozen=True)
class _Layout:
    """A protected reply's layout, in the shape :func:`spec_faults` reads (sender and zero-sized arrays)."""

    sender: str
    arrays: Mapping[str, np.ndarray]


def screen(
    faults: FaultPolicy,
    round: int,
    phase: str,
    cohort: Sequence[str],
    responses: Mapping[str, Any],
    *,
    spec: Optional[Mapping[str, Tuple[Optional[int], ...]]] = None,
    expected_weight: Optional[Mapping[str, Optional[float]]] = None,
    sizes: Optional[Mapping[str, int]] = None,
    verify: Optional[Callable[[Sequence[Message]], Sequence[Optional[str]]]] = None,
) -> Tuple[List[str], Dict[str, str]]:
    """The one place a phase's replies are judged and the fault policy applied.

    Each client's :class:`~gpflow_fed.federated.protocol.transport.Response` is a fault if the transport or the
    client says so (it raised, refused, did not answer), if it came too late (``faults.timeout``, from the client's
    own timing), if its message is malformed (:func:`reply_fault`; the values of all the cohort's replies checked at
    once, :func:`value_faults`) or claims another weight than the server expects
    (:func:`weight_fault`, for replies the server can read), or if its array names or shapes (or, for a protected
    reply, its layout) differ from ``spec`` (:func:`spec_faults`). Then ``on_error="raise"`` raises for the first
    faulty client in cohort order, and ``"exclude"`` logs every exclusion and checks ``min_clients``.

    :param cohort: the clients asked, in order; ``responses`` has one entry for each.
    :param spec: :meth:`Algorithm.reply_spec` of the phase.
    :param expected_weight: ``{client: weight the server expects}`` for the replies it can read (None: any weight up
        to the client's registered size); omitted, weights are not checked (protected replies hide them).
    :param sizes: the clients' registered sizes (with ``expected_weight``).
    :param verify: ``verify(messages)``: the algorithm's own check of the readable replies that pass the others, one
        verdict each in order (``Algorithm.check_replies``).
    :return: the clients whose replies are aggregated (in cohort order) and ``{client: reason}`` of the others.
    :raises ClientUpdateError: the first fault under ``on_error="raise"``.
    :raises RoundFailedError: fewer than ``min_clients`` good replies.
    """
    down = _Down(round, phase)
    excluded: Dict[str, str] = {}
    errors: Dict[str, Optional[BaseException]] = {}
    readable: List[Any] = []
    # first each response's own faults (transport, time-out, envelope), then the values of every reply that passed
    # them at once (value_faults: the same reasons as reply_fault's, without a Python loop over a cohort's arrays)
    early: Dict[str, Optional[str]] = {}
    layouts: Dict[str, _Layout] = {}
    answered: List[str] = []  # the clients whose message passed its envelope check, in cohort order
    for cid in cohort:
        response = responses[cid]
        fault = response.fault
        if fault is None and faults.timeout is not None and response.seconds is not None:
            if response.seconds > faults.timeout:
                fault = f"timed out ({response.seconds:.3g} s > {faults.timeout} s)"
        if fault is None and response.layout is not None:
            layouts[cid] = _Layout(cid, {str(n): _shape_only(shape) for n, shape in response.layout.items()})
        elif fault is None:
            fault = envelope_fault(response.message, cid, down)
            if fault is None:
                answered.append(cid)
        early[cid] = fault
    values = dict(zip(answered, value_faults([responses[cid].message for cid in answered])))
    for cid in cohort:
        response = responses[cid]
        fault = early[cid]
        if cid in layouts:
            readable.append(layouts[cid])
        elif cid in values:
            fault = values[cid]
            if fault is None and expected_weight is not None and sizes is not None:
                fault = weight_fault(response.message, expected_weight.get(cid), sizes[cid])
            if fault is None:
                readable.append(response.message)
        if fault is not None:
            excluded[cid] = fault
            errors[cid] = response.error
    for cid, reason in spec_faults(readable, spec).items():
        excluded[cid] = reason
    checked = [m for m in readable if isinstance(m, Message) and m.sender not in excluded]
    if verify is not None and checked:
        for message, verdict in zip(checked, verify(checked), strict=True):
            if verdict is not None:
                excluded[message.sender] = verdict
    if excluded and faults.on_error == "raise":
        cid = next(c for c in cohort if c in excluded)
        cause = errors.get(cid) or ValueError(excluded[cid])
        raise ClientUpdateError(cid, round, phase, cause) from cause
    good = [cid for cid in cohort if cid not in excluded]
    log_exclusions(round, phase, excluded)
    if len(good) < faults.min_clients:
        raise RoundFailedError(
            f"round {round}, phase {phase!r}: {len(good)} of {len(cohort)} clients answered well, "
            f"fewer than min_clients={faults.min_clients}; excluded: {excluded}"
        )
    return good, excluded


@dataclass(frozen=True)
class _Down:
    """What :func:`reply_fault` reads of the server's broadcast: its round and phase."""

    round: int
    phase: str
