"""The client's side of every protection: one encoder per client, holding the client's policy and its keys.

Every runtime hands a protected stage to the party's :class:`ClientEncoder` (through its
:class:`~gpflow_fed.federated.engine.endpoint.ClientEndpoint`), in process or inside a Flower ClientApp:

1. **prepare** (with the update): the client checks the server's request against its own
   :class:`~gpflow_fed.federated.protection.policy.ClientPolicy`, then clips (DP), caps and applies the weight
   (``"mean"``). The payload stays with the client; the server gets its layout only (names and shapes), or, with DP
   alone, the clipped message;
2. **the secure-aggregation protocol** (:mod:`.secagg`, drop-out recovery included): once per run its keys and
   the Shamir shares of its self-mask seed; per exchange its masked encoding, for a cohort the client checks
   itself (it is in it, it has at least the client's own minimum, the exchange is the one it prepared, it has not
   answered this exchange before), then what the unmasking of that exchange needs. The encoding is made there, for
   the n members of the cohort the client verified: fixed point at its own policy's ``fractional_bits`` within the
   range of n (:class:`~.wire.FixedPoint`), or distributed DP's message
   (:meth:`~.distributed_dp.DistributedDP.encode_counted`).

**The range is the client's, and data never makes it refuse.** Fixed-point bits come from the client's policy, the range
from them and the number of members of the cohort it masks over (``⌊(2^63 − 1)/n⌋`` codes: n such codes never wrap
modulo 2^64), never from a cohort size the server claims. A value beyond the range is clipped to it (saturated) and
counted; the count is one more entry of the masked payload (:data:`~.wire.SATURATED_KEY`), so the server learns the
cohort's total only, and warns on it. Without DP a non-finite entry is one of them (NaN encoded as 0, ±inf clipped to
±R, each counted), so no value of the payload makes the client refuse. A request's ``fractional_bits`` must name the
client's own f: more bits would shrink the client's range (a saturation threshold of the server's choosing), fewer would
coarsen the rounding; either is refused for the request's own value. Without DP each entry is ``2^f x`` plus the party's
own Gaussian of :data:`DITHER_CODES` codes, rounded at random without bias (:meth:`~.wire.FixedPoint.encode`, the OS's
randomness): rounding to nearest made a sum a staircase of each party's values, and random rounding alone an error
whose variance depended on their fine digits (issue 43); the sum's error beyond the exact one is that noise alone. A
clipped sum swept over a scale the server broadcasts still gives each party's values (issue 43, the clip leak), so
where the phase's algorithm bounds every entry of the reply from public numbers (``Algorithm.payload_bound``: the
broadcast and the party's
:class:`~gpflow_fed.federated.protocol.domain.DataDomain`, passed to :meth:`ClientEncoder.prepare`), nothing is clipped:
a bound beyond the range of the members verified is refused when encoding, a value beyond its bound raises
``ValueError`` (the endpoint's :data:`DATA_FAULT`), a metric without a bound is not sent. Under DP the range holds the
clipped payload (checked on public numbers: ``C``, ``B C``, distributed DP's ``Δ̃ + T``), so nothing that depends on the
data is ever saturated there: the clipping is DP's, inside its sensitivity, and the count depends only on public weights
(central DP) or on truncated noise (distributed DP). Under DP a non-finite reply is refused by the party's endpoint
instead (:data:`DATA_FAULT`, one bit per run: a count of non-finite entries would be a release outside the accounting);
a caller of :meth:`~ClientEncoder.prepare` without that check gets them encoded as 0 before the clip, not counted.

A client masks answers to **one broadcast over one cohort and one masking graph**: whatever round or purpose the
server names, a broadcast (what its phase computes, ``Algorithm.computation``, and its content:
:func:`~.wire.broadcast_digest`) it has answered before is answered again only for the same cohort, over the same
masking graph, unmasked with the same drop-outs, and never under distributed DP. So a server cannot sum one answer
over two cohorts (or two sets of survivors, or two graphs whose
groups of survivors differ) and difference them, nor average fresh distributed-DP noise away by asking again. The
cohort and the drop-outs are recorded as the :func:`~.identity.members_digest` of their party ids, never as the
request's bitmap, which indexes the roster of one setup: a new ``advertise`` (another run id: a Flower run's second
job, say) makes a new protocol client with fresh keys, and the record holds across it (a server that re-ran setup
with the roster "everyone but k" would otherwise get the same bitmap for a different cohort in every round). The
graph is recorded as the digest of its edges, which the setup's run id, the cohort and the degree determine: a new
setup draws a new Harary order, so the same broadcast is not answered again under another run id or degree (save
where both graphs join every pair, ``d ≥ K − 1``), and a retry within one setup is. Otherwise a server that re-ran
setup, grinding run ids until the honest survivors split into groups, learnt other groups' sums from each setup and
solved for every input, with no more colluders than the ``h − 1`` the masking withstands (issue 43, sixth round). An
``advertise`` the new protocol client refuses (a malformed run id) leaves the current setup as it was. Its answers to
one phase and purpose come in increasing rounds (one ``"final"`` answer per phase), so the number of releases it makes
is bounded by its algorithm's schedule, which it checks itself (:meth:`~ClientEncoder.refusal`: its own algorithm's
exchanges, at most its policy's ``max_rounds``, before its policy's own refusals). Every refusal of this
encoder depends on what the server already knows (the request, the cohort, the payload's layout, the party's budget and
past answers), never on a value. The party's
endpoint still stops a reply its own checks fail (under DP) or an update that raised (a refusal that may depend on the
data: :data:`DATA_FAULT`, :data:`UPDATE_FAULT`), so both rules are also kept *before* the update is computed: each
protected exchange is claimed (:meth:`~ClientEncoder.claim`: increasing rounds per phase and purpose, whatever the
broadcast), and a broadcast is encoded under **one request** (protection, cohort size, aggregation and the runtime's
context: :func:`~.wire.request_view`). Such a refusal is in the same words whichever check, and the client then refuses
every later protected exchange of the run (:meth:`ClientEncoder.stop`): one such bit per client and run. An error
while encoding the kept payload at ``masked_input`` (distributed DP's rounding, say) is answered the same way: the
words of :data:`DATA_FAULT`, the payload dropped, then the stop.

Under a DP budget (``ClientPolicy.budget``) the client also keeps its own zCDP ledger (:mod:`.budget`): before it
encodes a distributed-DP answer it reserves the answer's ρ in the ledger (a file shared by the party's runs, locked,
written and synced before the answer leaves), and refuses when the total would pass its budget, or when the ledger is
missing or corrupt. That refusal depends on the request, the payload's layout and the party's past answers, never on
its data.

What leaves the client is what :meth:`ClientEncoder.prepare` (layout or clipped message) and :meth:`respond`
return; nothing else.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import logging
from typing import TYPE_CHECKING, Any, Callable, Dict, FrozenSet, Mapping, NamedTuple, Optional, Tuple, cast

import numpy as np

from ..protocol.messages import Message
from .budget import LedgerRefusal, MemoryLedger, Spend, open_ledger
from .distributed_dp import DistributedDP, NoiseSource, release_rho
from .dp import DifferentialPrivacy, clip_payload
from .identity import PartyIdentity, members_digest
from .masking import Exchange, length_prefixed, masking_graph
from .policy import ClientPolicy
from .request import Protection
from .secagg import SecAggClient, is_round
from .wire import METRIC_PREFIX, SATURATED_KEY, WEIGHT_KEY, FixedPoint, code_limit, count_code

if TYPE_CHECKING:
    from ..protocol.algorithm import Algorithm
    from ..protocol.transport import Request

__all__ = [
    "ClientEncoder",
    "DATA_FAULT",
    "UPDATE_FAULT",
    "EncoderRefusal",
]

LOG = logging.getLogger(__name__)

#: what a client says when its update for a protected phase raises (UPDATE_FAULT), or its reply fails its own checks
#: (DATA_FAULT): the same words whichever error or check, so that the refusal is one bit (details stay in its log)
UPDATE_FAULT = (
    "its update for a protected phase raised an error (its message stays in the client's log); it answers no "
    "protected exchange again in this run"
)
DATA_FAULT = (
    "its reply to a protected phase failed the client's own checks (a value NaN or inf, or beyond ±1e150: which is "
    "not said); it answers no protected exchange again in this run"
)


#: the domain of :func:`_graph_digest`
_GRAPH_RECORD_DOMAIN = b"gpflow-fed/encoder/masking-graph/v1"
#: the purpose and phase of the exchange :func:`_graph_record` draws the graph of (the graph reads neither)
_GRAPH_RECORD_PURPOSE = "masking-graph"


def _without_dropped(request: Mapping[str, Any]) -> Dict[str, Any]:
    """``request`` without its ``"dropped"`` field: the exchange alone, whose cohort the protocol client decodes."""
    return {k: v for k, v in request.items() if k != "dropped"}


def _graph_digest(request: Mapping[str, Any], cohort: FrozenSet[str], view: bytes) -> bytes:
    """SHA-256 of the masking graph a ``masked_input`` request masks over (:func:`~.masking.masking_graph` of the
    exchange it names, with its degree): its edges, sorted, each end length-prefixed, after a domain tag. The graph is
    determined by the setup's run id, the cohort's ids and the degree, so another setup (a new ``advertise``) or
    another degree gives another graph, save where both join every pair (``d ≥ K − 1``). Called once the protocol
    client has parsed the request (:meth:`ClientEncoder._cohort_ids`): its fields have their types. ``view`` does not
    enter the graph."""
    return _graph_record(request["run_id"], cohort, int(request["degree"]))


@functools.lru_cache(maxsize=32)
def _graph_record(run_id: bytes, cohort: FrozenSet[str], degree: int) -> bytes:
    """:func:`_graph_digest`'s value, a public function of public values computed once per process: the K clients of
    a simulation share it (each computing it, ``O(K d)``, made a round at K = 1,000 ``O(K² d)``)."""
    exchange = Exchange(run_id, _GRAPH_RECORD_PURPOSE, 0, _GRAPH_RECORD_PURPOSE, tuple(sorted(cohort)))
    graph = masking_graph(exchange, degree)
    edges = sorted((a, b) for a, neighbours in graph.items() for b in neighbours if a < b)
    parts = [length_prefixed(_GRAPH_RECORD_DOMAIN)]
    parts.extend(length_prefixed(a.encode("utf-8")) + length_prefixed(b.encode("utf-8")) for a, b in edges)
    return hashlib.sha256(b"".join(parts)).digest()


def _check_covers(arrays: Mapping[str, np.ndarray], bound: Mapping[str, float]) -> None:
    """:raises RuntimeError: an array without a bound (the algorithm's ``payload_bound`` does not cover its reply)."""
    missing = sorted(set(arrays) - set(bound))
    if missing:
        raise RuntimeError(f"the algorithm's payload bound names no bound for the reply's {missing}")


def _within_bound(
    arrays: Mapping[str, np.ndarray],
    metrics: Mapping[str, float],
    bound: Mapping[str, float],
    scale: float,
    weight: float,
) -> float:
    """The largest ``|entry|`` a bounded payload may encode, after checking every value against its bound: each value
    (before weighting) within its bound, and encoded at most its bound times ``scale`` (an array: the weight of a
    ``"mean"``, 1 otherwise) or ``|weight|`` (a metric: every metric is encoded weighted); the weight entry itself.

    :raises EncoderRefusal: a bound that is not finite (public numbers, before any value is read).
    :raises ValueError: a value not finite or beyond its bound (a relative 1e-9 of round-off allowed): the data left
        the domain the bound was computed for, or the computation failed; the caller stops (module docstring).
    :raises RuntimeError: an array without a bound (the algorithm's ``payload_bound`` does not cover its reply).
    """
    _check_covers(arrays, bound)
    entries = [*((n, a, scale) for n, a in arrays.items()), *((n, v, abs(float(weight))) for n, v in metrics.items())]
    if not all(np.isfinite(float(bound[n])) for n, _, _ in entries):  # before any value is looked at: public numbers
        raise EncoderRefusal("no finite bound of its payload for this broadcast; refused")
    limit = abs(float(weight))
    for name, value, factor in entries:
        allowed = float(bound[name])
        with np.errstate(invalid="ignore"):  # NaN compares False: refused too
            within = bool(np.all(np.abs(np.asarray(value, np.float64)) <= allowed * (1.0 + 1e-9)))
        if not within:
            raise ValueError(f"a value of {name!r} is beyond the bound its algorithm states for this broadcast")
        with np.errstate(over="ignore"):
            limit = max(limit, allowed * factor)
    return limit


class EncoderRefusal(ValueError):
    """The client refuses a protected stage (its policy, a cohort it does not accept, a repeated exchange)."""


class _Kept(NamedTuple):
    """What :meth:`ClientEncoder.prepare` keeps for an exchange until it masks: the payload in payload units
    (``float64``: the phase's arrays, clipped and weighted, with the weight and metric entries of a fixed-point sum),
    the request it answers, the broadcast's digest, the phase's aggregation and, where its algorithm bounds the
    payload from public numbers (``Algorithm.payload_bound``), the largest ``|entry|`` that bound allows."""

    message: Message
    request: Protection
    broadcast: bytes
    aggregation: str
    limit: Optional[float] = None


#: σ, in codes, of the Gaussian a party adds to a fixed-point payload before rounding it at random
#: (:meth:`~.wire.FixedPoint.encode`: the rounding error's law then does not depend on the payload's fine digits),
#: for entries below 2^53 codes (:func:`dither_codes` widens it above)
DITHER_CODES = 4.0
#: codes a bounded payload keeps free below the range for that Gaussian (16σ: beyond it with probability < 1e-57)
DITHER_MARGIN = 64.0


def float_spread(top: float) -> float:
    """How many codes apart float64 numbers of magnitude up to ``top`` codes may be: ``max(1, spacing(top))``.

    Above 2^53 codes a float64 holds only multiples of its spacing (16 codes at 2^56, 512 at 2^61): a party's own
    value there is a multiple of that spacing, and a Gaussian of 4 codes added in float64 is rounded away. A masked
    sum then showed a party's float lattice (``total mod 256`` told the binade of the smallest party's entry, and a
    server that swept the kernel variance read FSGP's statistics to 2e-16: issue 43, an eighteenth attacker).
    """
    return max(1.0, float(np.spacing(np.float64(abs(top)))))


def dither_codes(top: float) -> float:
    """σ, in codes, of the Gaussian a party adds to entries of magnitude at most ``top`` codes, a public number
    (:func:`_dither_top`): :data:`DITHER_CODES` times :func:`float_spread`, so σ is at least 4 spacings of
    every float the entry may be and the error's law depends on where the value sits on its float lattice only
    through terms ``e^{−2π²·16}`` (1e-137), as on the integer lattice. In payload units: ``4·2^-f`` below 2^53 codes,
    about ``top·2^-f·9e-16`` above."""
    return DITHER_CODES * float_spread(top)


#: the least variance, in grid steps², of a party's distributed-DP share: the share is added after the rounding,
#: whose variance φ(1 − φ) ≤ 1/4 depends on the payload's fine digits; against 2^20 a server needs of the order of
#: (4·2^20)² ≈ 10^13 draws to read it (a nineteenth attacker read three parties' statistics to 1e-5 in 600 exchanges
#: of a request with noise multiplier 6e-7 and a share variance just above 1/4)
MIN_SHARE_VARIANCE = float(2**20)


def _dither_top(kept: _Kept, fixed: FixedPoint) -> float:
    """The largest ``|code|`` an entry of ``kept`` may take, from public numbers, for :func:`dither_codes`: the
    payload's bound; under central DP the clip (times the weight cap for a mean) or the weight entry, whichever is
    larger; at most the range. 0 for a phase with neither: it keeps 4 codes, since its values reach the range only
    where they clip, which already shows them (the clip leak of the threat model), and a wider Gaussian would cost
    every such sum ~1e-6 at f = 32."""
    tops = [] if kept.limit is None else [kept.limit]
    dp = kept.request.dp
    if isinstance(dp, DifferentialPrivacy) and kept.request.noised(kept.message.phase, kept.aggregation):
        cap = dp.weight_bound if kept.aggregation == "mean" else 1.0
        weight = abs(float(np.asarray(kept.message.arrays.get(WEIGHT_KEY, [0.0])).ravel()[0]))
        tops.append(max(dp.clip_norm * cap, weight))
    return min(float(fixed.limit), min(tops) * fixed.scale) if tops else 0.0


class ClientEncoder:
    """One client's protection: its policy, its per-run keys, and what it has prepared and answered.

    :param client_id: the client's id (the sender of its messages).
    :param policy: the client's own :class:`ClientPolicy`.
    :param sizes: the registered sizes of the federation's clients (public), for the small-cohort rule.
    :param identity: the party's :class:`~.identity.PartyIdentity` (its signing key and the roster it holds), or
        None: the unauthenticated mode (a semi-honest server only). Kept beside the policy, not in it (a policy is a
        value to compare and print; a signing key is a secret); like the policy, the party's own configuration,
        given again to :meth:`from_state`, never saved in the state.
    :raises ValueError: an identity whose roster does not hold ``client_id`` under its key.
    """

    #: **Tests only.** True: the fixed point rounds to nearest, so a protected sum is a deterministic function of the
    #: payloads (tests that compare runtimes bit for bit). A server that scales a payload continuously then reads every
    #: client's entries from where the sum steps (:meth:`~.wire.FixedPoint.encode`): never set it in a deployment.
    INSECURE_NEAREST_ROUNDING: bool = False

    def __init__(
        self,
        client_id: str,
        policy: ClientPolicy,
        sizes: Optional[Mapping[str, int]] = None,
        identity: Optional[PartyIdentity] = None,
    ) -> None:
        if not isinstance(policy, ClientPolicy):
            raise TypeError(f"policy must be a ClientPolicy, got {type(policy).__name__}")
        if identity is not None:
            if not isinstance(identity, PartyIdentity):
                raise TypeError(f"identity must be a PartyIdentity or None, got {type(identity).__name__}")
            identity.check_party(client_id)
        self.client_id = client_id
        self.policy = policy
        self.identity = identity
        self._run_id: Optional[bytes] = None
        self._secagg: Optional[SecAggClient] = None
        self._prepared: Dict[Tuple[str, int, str], _Kept] = {}
        #: per broadcast (:func:`~.wire.broadcast_digest`) this client has sent a masked input for: the
        #: :func:`~.identity.members_digest` of the cohort's party ids and of the drop-outs' ids of its unmasking (b""
        #: before it), with :attr:`_graphs` 128 bytes per answer however large K. Ids, never bitmaps: a bitmap indexes
        #: the roster of one setup, so after another setup (another roster) the same bytes name other parties, and
        #: the record holds across the setups of the run. Per exchange, its broadcast; per (purpose, phase), the last
        #: round answered
        self._answered: Dict[bytes, Tuple[bytes, bytes]] = {}
        #: per broadcast masked, the :func:`_graph_digest` of the masking graph it was masked over (the setup's run id,
        #: the cohort and the degree): a repeat over another graph, whose groups of survivors differ, is refused
        #: (issue 43, sixth round); absent in a state saved before it: no record, the next masking records it
        self._graphs: Dict[bytes, bytes] = {}
        self._broadcasts: Dict[Tuple[str, int, str], bytes] = {}
        #: per exchange prepared or last masked, the client's :func:`~.wire.request_view` (bound into its pads)
        self._request_views: Dict[Tuple[str, int, str], bytes] = {}
        self._last_round: Dict[Tuple[str, str], int] = {}
        #: per broadcast this client has encoded (or refused for its range), the request view it did so under
        self._encoded_views: Dict[bytes, bytes] = {}
        #: per (purpose, phase), the last round of a protected update this client computed (:meth:`claim`)
        self._claimed: Dict[Tuple[str, str], int] = {}
        #: True once a protected update raised or its reply failed the client's own checks (:meth:`stop`)
        self.stopped = False
        self._noise = NoiseSource()  # distributed DP's shares: the OS's randomness
        self.sizes: Mapping[str, int] = sizes if sizes is not None else {}  # read only
        #: per exchange (purpose, round, phase), the least total data a summed group must hold (small-cohort rule)
        self._min_data: Dict[Tuple[str, int, str], int] = {}
        #: per exchange prepared, the cohort size its request named (bound into its view): the cohort it masks over may
        #: not have more members (the encoding's range comes from the members it verifies, never from this size)
        self._cohort_sizes: Dict[Tuple[str, int, str], int] = {}
        #: per phase, the largest DP noise multiplier this client has answered it under in this run (never lowered)
        self._noise_seen: Dict[str, float] = {}
        #: per exchange under distributed DP, the honest-client count its noise shares assume (the fewest survivors
        #: it unmasks a sum over)
        self._honest: Dict[Tuple[str, int, str], int] = {}
        #: the party's DP ledger under a budget (:mod:`.budget`): its file (the policy's path) or, without one, in
        #: memory for this encoder's life; None without a budget
        self.ledger = open_ledger(policy.ledger, policy.budget)

    # --- the update ----------------------------------------------------------------------------------
    def refusal(
        self,
        request: Protection,
        phase: str,
        aggregation: str,
        update: Optional[Tuple["Algorithm[Any]", "Request"]] = None,
    ) -> str:
        """Why this client refuses to answer ``phase`` under ``request``, or ``""`` when it may: its schedule and its
        policy, decided here only (:meth:`~gpflow_fed.federated.engine.endpoint.ClientEndpoint.admit` asks before the
        update is computed, :meth:`prepare` again before anything is encoded).

        :param request: the protection the server asks for.
        :param aggregation: the phase's aggregation, as the client's own algorithm has it.
        :param update: the client's algorithm and the server's update request (its endpoint's check): first whether the
            request is one of its own algorithm's exchanges. The client reads a phase's aggregation from its own
            algorithm (a server that relabels a sum as ``"collect"`` would get the payload in plain), and answers only
            its algorithm's phases: ``phases(round)`` for ``0 ≤ round < rounds`` in training, ``final_phases()`` for
            ``0 ≤ round ≤ rounds`` in a final or evaluation exchange, where ``rounds`` is at most its own policy's
            ``max_rounds`` (a Flower party builds its algorithm from the run config the server writes; its cap is its
            own). Then its policy's refusal (:meth:`~.policy.ClientPolicy.refusal`).
        """
        if update is not None:
            algorithm, asked = update
            down, cap, named = asked.message, self.policy.max_rounds, asked.config.get("aggregation")
            rounds = algorithm.rounds if cap is None else min(algorithm.rounds, cap)
            if named != aggregation:
                return (
                    f"phase {down.phase!r}: the server asked for aggregation {named!r}, but this client's algorithm "
                    f"aggregates it as {aggregation!r}; refused (nothing of the payload was sent)"
                )
            if asked.purpose == "train":
                scheduled = 0 <= down.round < rounds and down.phase in algorithm.phases(down.round)
            else:
                scheduled = asked.purpose in ("final", "evaluate") and 0 <= down.round <= rounds
                scheduled = scheduled and down.phase in algorithm.final_phases()
            if not scheduled:
                return (
                    f"phase {down.phase!r} of round {down.round} ({asked.purpose!r}) is not an exchange of this "
                    f"client's algorithm ({algorithm.rounds} rounds"
                    + ("" if cap is None else f", at most {cap} by its own policy")
                    + "); refused"
                )
        return self.policy.refusal(request, phase, aggregation)

    def claim(self, purpose: str, round: int, phase: str) -> None:
        """Record a protected update's exchange *before* anything that depends on the client's data is checked
        (its reply's faults, its encoding's range): a refusal is an answer too, so a server gets one per exchange of
        the client's schedule, in increasing rounds per (purpose, phase) and one ``"final"`` update per phase,
        whatever broadcast it sends (module docstring).

        :raises EncoderRefusal: an exchange that does not follow the last one claimed, or any exchange after
            :meth:`stop`.
        """
        self._check_not_stopped()
        last = self._claimed.get((purpose, phase))
        if last is not None and (purpose == "final" or round <= last):
            raise EncoderRefusal(
                f"secure aggregation: {self.client_id!r} computed a protected {purpose!r} update of phase {phase!r} "
                f"at round {last}; round {round} does not follow it; refused"
            )
        self._claimed[(purpose, phase)] = int(round)

    def stop(self) -> None:
        """After a protected update raised or its reply failed the client's own checks (a refusal that may depend on
        the data), refuse every later protected exchange of the run: a server that steers a value over a check
        (scaling FSGP's adjoints, shrinking the fixed-point range) learns one bit per client and run, not one per
        exchange (module docstring)."""
        self.stopped = True

    def _check_not_stopped(self) -> None:
        """Refuse once :meth:`stop` was called (the same words whatever stopped it)."""
        if self.stopped:
            raise EncoderRefusal(
                f"secure aggregation: {self.client_id!r} refuses: an earlier protected update or reply of this run "
                "failed, and it answers no protected exchange again in this run"
            )

    def prepare(
        self,
        message: Message,
        request: Protection,
        aggregation: str,
        cohort_size: int,
        purpose: str,
        min_data: Optional[int] = None,
        broadcast: bytes = b"",
        view: bytes = b"",
        bound: Optional[Mapping[str, float]] = None,
    ) -> Message:
        """The client's protected answer to an update: clipped and weighted (DP), kept for masking (secure aggregation).

        With secure aggregation the payload is kept here until the ``masked_input`` stage (:meth:`respond`), which
        encodes it for the cohort the client verified, and the returned message holds zeros in its layout (only its
        names and shapes may leave the client; :data:`~.wire.SATURATED_KEY` included); with DP alone the clipped
        message is returned, which the client sends.

        :param cohort_size: the cohort size the request names: bound into the request's view, and the most members
            the client masks over for it; never its range.
        :param min_data: the least total data a summed group must hold for the payload not to determine its rows
            (``Algorithm.min_cohort_data``); checked on the cohort and on every group unmasking reveals.
        :param broadcast: the :func:`~.wire.broadcast_digest` of the request this answers (one masked answer each).
        :param view: the :func:`~.wire.request_view` of the request this answers, bound into the pads of its masking.
        :param bound: per name of the message's arrays and metrics, the largest ``|value|`` its algorithm allows for
            the broadcast and the party's domain (``Algorithm.payload_bound``; public numbers only), or None. With a
            bound and secure aggregation without DP, nothing is clipped: a metric without a bound is not sent, and the
            encoding refuses a range below the bound (:meth:`_encode`).
        :raises ValueError: a value beyond its bound, or not finite (the endpoint's :data:`DATA_FAULT`, then the
            stop: a value no in-domain data give, so the same rule as an update that raised).
        :raises EncoderRefusal: the request is below the client's policy, or names other ``fractional_bits`` than
            the client's (module docstring): reasons in the request, never in the payload's values.
        """
        refusal = self.refusal(request, message.phase, aggregation)
        if refusal:
            raise EncoderRefusal(refusal)
        if request.secure is not None:
            self._check_one_view(broadcast, view, message.phase)
        self._check_noise(request, message.phase, aggregation)
        self._check_budget(message, request, aggregation, purpose)
        if min_data is not None and self.policy.protect_small_cohorts:
            self._min_data[(purpose, message.round, message.phase)] = int(min_data)
        arrays = {k: np.asarray(v, dtype=np.float64) for k, v in message.arrays.items()}
        noised = request.noised(message.phase, aggregation)
        if request.dp is not None and noised:
            arrays = self._finite(arrays, message.phase)
            if bound is not None:
                self._check_clip_never_binds(arrays, bound, request, message.phase)
        distributed = request.distributed
        if distributed is not None and noised:
            self._check_share(distributed, sum(int(np.size(v)) for v in arrays.values()))
            self._honest[(purpose, message.round, message.phase)] = int(distributed.honest_clients)
            # equal weights (the server divides a "mean" by the survivors); metrics dropped
            kept = Message(message.sender, message.round, message.phase, arrays, weight=0.0)
            return self._keep(_Kept(kept, request, broadcast, aggregation), purpose, view, cohort_size)
        weight = message.weight
        metrics = dict(message.metrics)
        dp = request.dp
        if dp is not None and noised:
            with np.errstate(over="ignore"):  # a norm beyond float64 clips the payload to 0
                arrays, _ = clip_payload(arrays, dp.clip_norm)
            if aggregation == "mean":
                weight = min(weight, cast(DifferentialPrivacy, dp).weight_bound)  # distributed DP returned above
            metrics = {}
        if request.secure is None:
            return Message(message.sender, message.round, message.phase, arrays, weight=weight)
        bits = request.secure.fractional_bits
        if bits != self.policy.fractional_bits:
            raise EncoderRefusal(
                f"secure aggregation: {self.client_id!r} encodes in fixed point with {self.policy.fractional_bits} "
                f"fractional bits (its own policy); the request names {bits} (more would shrink its range, fewer "
                "coarsen its rounding); refused"
            )
        limit = None
        if bound is not None and not noised:
            metrics = {k: v for k, v in metrics.items() if k in bound}  # an unbounded metric is not sent
            limit = _within_bound(arrays, metrics, bound, abs(weight) if aggregation == "mean" else 1.0, weight)
        if aggregation == "mean":
            with np.errstate(over="ignore", invalid="ignore"):  # ±inf, or beyond float64: saturated when encoded
                arrays = {k: weight * v for k, v in arrays.items()}
        arrays[WEIGHT_KEY] = np.array([weight], dtype=np.float64)
        arrays.update({METRIC_PREFIX + k: np.array([weight * v], dtype=np.float64) for k, v in metrics.items()})
        kept = Message(message.sender, message.round, message.phase, arrays, weight=0.0)
        return self._keep(_Kept(kept, request, broadcast, aggregation, limit), purpose, view, cohort_size)

    def _check_clip_never_binds(
        self, arrays: Mapping[str, np.ndarray], bound: Mapping[str, float], request: Protection, phase: str
    ) -> None:
        """Under DP, a bounded payload (``Algorithm.payload_bound``) is clipped at the request's ``clip_norm`` only
        under noise the client trusts (:mod:`.policy`: its own distributed-DP share at its floor > 0, or central DP's
        with ``trust_server_noise``); otherwise the clip norm must be at least the payload's public L2 bound
        ``√(Σ_name bound² · size)``, so the clip never binds. A clip that binds without such noise is the clip leak
        again: a server sweeping ``clip_norm`` (or the payload's scale) reads each party's payload from the kinks of
        the masked sums (issue 43, a thirteenth attacker: 2.4e-9 with noise multiplier 1e-300). Public numbers only.
        """
        distributed = request.distributed
        if (self.policy.min_noise_multiplier > 0) if distributed is not None else self.policy.trust_server_noise:
            return
        dp = distributed if distributed is not None else request.dp
        assert dp is not None
        _check_covers(arrays, bound)
        with np.errstate(over="ignore", invalid="ignore"):
            norm = float(np.sqrt(sum(float(bound[n]) ** 2 * np.size(a) for n, a in arrays.items())))
        if not dp.clip_norm >= norm * (1.0 + 1e-9):  # a NaN bound refuses too
            raise EncoderRefusal(
                f"secure aggregation: {self.client_id!r} refuses: phase {phase!r} under a DP clip norm of "
                f"{dp.clip_norm:.3g}, below the {norm:.3g} its payload may reach for this broadcast, with noise it "
                "does not add itself at its own floor (a clip that binds would let the server read its payload; its "
                "policy's min_noise_multiplier, or trust_server_noise for a server it trusts, allows it)"
            )

    def _finite(self, arrays: Dict[str, np.ndarray], phase: str) -> Dict[str, np.ndarray]:
        """Under DP, a non-finite value is encoded as 0 before the clip (a change of the payload that the clip's
        sensitivity covers), and not counted: a count would be a release outside the accounting. Noted in the
        client's own log only."""
        bad = sum(int(np.count_nonzero(~np.isfinite(v))) for v in arrays.values())
        if not bad:
            return arrays
        LOG.warning("client %s: phase %r: %d non-finite value(s) encoded as 0 under DP", self.client_id, phase, bad)
        return {k: np.where(np.isfinite(v), v, 0.0) for k, v in arrays.items()}

    def _keep(self, kept: _Kept, purpose: str, view: bytes, cohort_size: int) -> Message:
        """Keep ``kept`` for its ``masked_input`` stage; the layout that leaves the client: zeros of each entry's
        shape, and the saturation count's."""
        prepared = kept.message
        key = (purpose, prepared.round, prepared.phase)
        self._prepared = {key: kept}  # one exchange at a time
        self._cohort_sizes = {key: int(cohort_size)}
        self._request_views = {k: v for k, v in self._request_views.items() if k in self._broadcasts}
        self._request_views[key] = view
        layout = {name: np.zeros(np.shape(value), dtype=np.uint64) for name, value in prepared.arrays.items()}
        layout[SATURATED_KEY] = np.zeros(1, dtype=np.uint64)
        return Message(prepared.sender, prepared.round, prepared.phase, layout, weight=0.0)

    def _encode(self, kept: _Kept, members: int) -> np.ndarray:
        """The codes of a kept payload for a sum over the ``members`` of the cohort this client verified, in the
        order of the layout's sorted names (:data:`~.wire.SATURATED_KEY` included): fixed point at the policy's
        ``fractional_bits`` within the range of ``members`` (:class:`~.wire.FixedPoint`: a value beyond it
        saturates), or distributed DP's message (:meth:`~.distributed_dp.DistributedDP.encode_counted`: its noise
        truncated).

        :raises EncoderRefusal: a range too small for what the request's DP may send, for ``members``: public
            numbers only (the request, the layout, the cohort), never a value. Anything else it raises may depend on
            the payload (:meth:`_encode_guarded`).
        """
        request, arrays, phase = kept.request, kept.message.arrays, kept.message.phase
        names = sorted(arrays)
        codes: Dict[str, np.ndarray] = {}
        distributed = request.distributed
        if distributed is not None and request.noised(phase, kept.aggregation):
            flat = np.concatenate([np.asarray(arrays[n], dtype=np.float64).ravel() for n in names])
            try:
                distributed.check_range(flat.size, members)
            except ValueError as exc:  # the settings, the layout and the cohort: nothing of the payload's values
                raise EncoderRefusal(f"secure aggregation: {self.client_id!r} refuses: {exc}") from None
            with np.errstate(over="ignore"):  # a norm beyond float64 clips the payload to 0
                # whatever this raises may depend on the payload: :meth:`_encode_guarded` answers it with DATA_FAULT
                message, saturated = distributed.encode_counted(flat, members, rng=self._noise)
            offset = 0
            for n in names:
                size = int(np.size(arrays[n]))
                codes[n] = message[offset : offset + size].view(np.uint64)
                offset += size
        else:
            fixed = FixedPoint(self.policy.fractional_bits, members)
            self._check_dp_range(kept, fixed)
            self._check_bounded_range(kept, fixed)
            saturated = 0
            top = _dither_top(kept, fixed)
            for n in names:
                codes[n], count = fixed.encode(arrays[n], uniform=self._rounding(), dither=dither_codes(top))
                saturated += count
        entries = sum(int(c.size) for c in codes.values())
        if entries > code_limit(members):  # the count of n members must not wrap either (a layout of ~2^63/n)
            raise EncoderRefusal(
                f"secure aggregation: {self.client_id!r} refuses: a payload of {entries} entries is too large to count "
                f"its saturated entries over {members} members"
            )
        codes[SATURATED_KEY] = count_code(saturated)
        return np.concatenate([codes[n].ravel() for n in sorted(codes)]).astype(np.uint64)

    def _rounding(self) -> Optional[Callable[[int], np.ndarray]]:
        """The fixed point's draws: the OS's (:class:`~.distributed_dp.NoiseSource`), for a Gaussian of
        :data:`DITHER_CODES` and unbiased randomized rounding (:meth:`~.wire.FixedPoint.encode`); None (round to
        nearest, no Gaussian) only under :attr:`INSECURE_NEAREST_ROUNDING`."""
        return None if self.INSECURE_NEAREST_ROUNDING else self._noise.uniform

    def _check_share(self, distributed: DistributedDP, dimension: int) -> None:
        """A distributed-DP share of variance below :data:`MIN_SHARE_VARIANCE` grid steps² is refused (public
        numbers: the request and the payload's size)."""
        try:
            share = float(distributed.share_variance(max(dimension, 1)))
        except ValueError as exc:
            raise EncoderRefusal(f"secure aggregation: {self.client_id!r} refuses: {exc}") from None
        if share < MIN_SHARE_VARIANCE:
            raise EncoderRefusal(
                f"secure aggregation: {self.client_id!r} refuses distributed DP whose share has variance {share:.3g} "
                f"grid steps², below {MIN_SHARE_VARIANCE:g}: that noise would not hide the variance of its own "
                "rounding, φ(1 − φ), which reads the payload's fine digits (a larger noise multiplier or a finer "
                "granularity)"
            )

    def _check_dp_range(self, kept: _Kept, fixed: FixedPoint) -> None:
        """Under central DP the range must hold the clipped payload, ``C`` (``"sum"``) or ``B C`` (``"mean"``, weights
        capped at B), and 16σ of the party's Gaussian above it (:func:`dither_codes`), so that no value the clip
        bounds is saturated (the count stays a function of the public weights) and the clipping is DP's alone. Public
        numbers only."""
        dp = kept.request.dp
        if not isinstance(dp, DifferentialPrivacy) or not kept.request.noised(kept.message.phase, kept.aggregation):
            return
        bound = dp.clip_norm * (dp.weight_bound if kept.aggregation == "mean" else 1.0)
        margin = DITHER_MARGIN * float_spread(_dither_top(kept, fixed)) / fixed.scale
        if fixed.range - margin < bound * (1.0 + 1e-9):
            raise EncoderRefusal(
                f"secure aggregation: {self.client_id!r} refuses: over {fixed.members} members its fixed point "
                f"({fixed.fractional_bits} fractional bits) holds |value| ≤ {fixed.range:.3g}, below the {bound:.3g} "
                "a clipped DP payload may reach (a smaller cohort, or fewer fractional bits in its policy)"
            )

    def _check_bounded_range(self, kept: _Kept, fixed: FixedPoint) -> None:
        """A payload its algorithm bounds (``Algorithm.payload_bound``) is encoded only within the range of the
        members it is summed over, so no value is ever clipped: the refusal depends on the bound (the broadcast and
        the party's domain) and the cohort, never on a value."""
        if kept.limit is None:
            return
        margin = DITHER_MARGIN * float_spread(min(float(fixed.limit), kept.limit * fixed.scale))  # 16σ (dither_codes)
        if fixed.range - margin / fixed.scale < kept.limit * (1.0 + 1e-9):
            raise EncoderRefusal(
                f"secure aggregation: {self.client_id!r} refuses: over {fixed.members} members its fixed point "
                f"({fixed.fractional_bits} fractional bits) holds |value| ≤ {fixed.range:.3g}, below the "
                f"{kept.limit:.3g} phase {kept.message.phase!r} may reach for this broadcast (a smaller scale in the "
                "broadcast, a smaller cohort, or fewer fractional bits in its policy)"
            )

    def _check_noise(self, request: Protection, phase: str, aggregation: str) -> None:
        """Within a run, a phase's DP never goes down (:mod:`.policy`): a request without DP, or with less noise,
        after an answer under noise multiplier z is refused (a server that differences a noised answer and a
        later one with little noise gets the payload back). Only the noise the client adds itself counts: central
        DP, which the server adds, counts as none (a switch from distributed to central DP is a downgrade)."""
        noise = request.client_noise(phase, aggregation)
        seen = self._noise_seen.get(phase, 0.0)
        if noise < seen:
            raise EncoderRefusal(
                f"secure aggregation: {self.client_id!r} answered phase {phase!r} under DP noise multiplier {seen:g} "
                f"in this run; a request with {noise:g} is refused"
            )
        self._noise_seen[phase] = max(seen, noise)

    def _check_budget(self, message: Message, request: Protection, aggregation: str, purpose: str) -> None:
        """Under a DP budget, reserve this distributed-DP answer's ρ in the party's ledger before anything that
        depends on its data is encoded (:mod:`.budget`); refuse when the total would pass the budget or the ledger is
        missing or corrupt. Only the payload's layout (its dimension) and the request enter the ρ."""
        distributed = request.distributed
        budget = self.policy.budget
        if (
            self.ledger is None
            or budget is None
            or distributed is None
            or not request.noised(message.phase, aggregation)
        ):
            return  # without distributed DP a budgeted policy has refused already (ClientPolicy.refusal)
        dimension = sum(int(np.size(v)) for v in message.arrays.values())
        rho = release_rho(distributed, dimension) if dimension else 0.0
        run = "" if self._run_id is None else self._run_id.hex()
        spend = Spend(run, str(purpose), int(message.round), str(message.phase), float(rho))
        try:
            self.ledger.reserve(spend, budget, repr(self.client_id))
        except LedgerRefusal as refusal:
            raise EncoderRefusal(str(refusal)) from None

    def _check_one_view(self, broadcast: bytes, view: bytes, phase: str) -> None:
        """One request view per broadcast, recorded *before* encoding (module docstring): whether a payload fits
        the fixed-point range a request names is itself an answer, so a server cannot re-ask with other ranges."""
        before = self._encoded_views.setdefault(broadcast, view)
        if before != view:
            raise EncoderRefusal(
                f"secure aggregation: {self.client_id!r} has encoded this broadcast of phase {phase!r} under another "
                "request (protection, cohort size, aggregation or context); refused"
            )

    def _check_once(
        self, key: Tuple[str, int, str], broadcast: bytes, cohort: Any, graph: bytes, distributed: bool
    ) -> None:
        """One cohort and one masking graph per broadcast, no repeat under distributed DP, increasing rounds per
        (purpose, phase) (module docstring). The graph is pinned as well as the cohort and the drop-outs: each new
        setup draws a new Harary order, so a server that re-ran setup and asked the same broadcast again would learn
        the sums of other groups of survivors each time, and solve for every input from a few of them (issue 43,
        sixth round). The words are the same whichever of the cohort or the graph differs."""
        purpose, round, phase = key
        before = self._answered.get(broadcast)
        pinned = self._graphs.get(broadcast, graph)  # a state saved without the record: none
        if before is not None and (distributed or before[0] != cohort or pinned != graph):
            raise EncoderRefusal(
                f"secure aggregation: {self.client_id!r} has masked an answer to this broadcast of phase {phase!r} "
                + (
                    "already (distributed DP: one release per broadcast)"
                    if distributed
                    else "for another cohort or masking graph (another setup or degree)"
                )
                + "; refused"
            )
        last = self._last_round.get((purpose, phase))
        if last is not None and (purpose == "final" or round <= last):
            raise EncoderRefusal(
                f"secure aggregation: {self.client_id!r} answered {purpose!r} phase {phase!r} at round {last}; "
                f"round {round} does not follow it; refused"
            )

    # --- the secure-aggregation protocol ---------------------------------------------------------------
    def respond(self, stage: str, request: Mapping[str, Any]) -> Dict[str, Any]:
        """This client's answer to one stage of the secure-aggregation protocol (:mod:`.secagg`).

        ``advertise`` starts the run's protocol client (fresh keys from the OS; the client's own ``min_cohort``,
        ``masking_degree`` and ``max_colluders`` from its policy, never from a request);
        ``masked_input`` encodes the payload :meth:`prepare` kept for the exchange the request names, for the members
        of the cohort the request shows (which the protocol client verifies), and masks it, once.

        :raises EncoderRefusal: no setup for this run, no kept payload for the exchange, a cohort it does not mask
            over for it, or a range too small for the request's DP over that cohort.
        :raises SecAggRefused: the protocol client refuses (its policy, a cohort it does not accept, a replay).
        """
        if stage == "advertise":
            run_id = request.get("run_id") if isinstance(request, Mapping) else None
            if self._secagg is None or run_id != self._run_id:
                # a new setup (another run id): fresh keys, and this encoder's records kept (by party ids, so they
                # hold whichever roster the new setup has: one cohort, one graph and one drop-out set per broadcast).
                # The new protocol client answers the advertise first: a refused one (a malformed run id) leaves the
                # current setup, its keys, shares and signed sets, as they were
                fresh = SecAggClient(
                    self.client_id,
                    min_cohort=self.policy.min_cohort,
                    min_degree=self.policy.masking_degree,
                    max_colluders=self.policy.max_colluders,
                    **self._credentials(),
                )
                advertised = fresh.respond(stage, request)
                self._secagg, self._run_id = fresh, cast(bytes, run_id)  # the protocol client checked it: bytes
                return advertised
        if self._secagg is None:
            raise EncoderRefusal(f"secure aggregation: {self.client_id!r} has no setup for this run")
        codes = None
        key: Optional[Tuple[Any, Any, Any]] = None  # the request's values: wrong types find nothing
        pin: Optional[Tuple[bytes, bytes]] = None
        if stage in ("masked_input", "consistency", "unmask"):
            self._check_round(request)
        if stage in ("masked_input", "unmask"):
            self._check_groups(request)
        if stage == "unmask":
            pin = self._check_dropouts(request)
            self._check_survivors(request)
        if stage == "masked_input":
            self._check_not_stopped()
            key = (request.get("purpose"), request.get("round"), request.get("phase"))
            kept = self._prepared.get(key)
            if kept is None:
                raise EncoderRefusal(
                    f"secure aggregation: {self.client_id!r} prepared no payload for round {key[1]}, phase {key[2]!r}"
                )
            cohort_ids = self._cohort_ids(request)  # the cohort it verifies (never fewer: drop-outs named here)
            members = len(cohort_ids)
            self._check_members(key, members)
            distributed = kept.request.distributed is not None
            cohort = members_digest(cohort_ids)  # cached per process: a public value of a public set
            graph = _graph_digest(request, cohort_ids, self._request_views.get(key, b""))  # the view masked under
            self._check_once((str(key[0]), int(key[1]), str(key[2])), kept.broadcast, cohort, graph, distributed)
            codes = self._encode_guarded(key, kept, members)
        asked: Any = (request.get("purpose"), request.get("round"), request.get("phase"))  # wrong types find nothing
        view = self._request_views.get(asked, b"") if stage in ("masked_input", "unmask") else b""
        answer = self._secagg.respond(stage, request, codes, view)
        if key is not None:
            broadcast = self._prepared.pop(key).broadcast
            self._answered.setdefault(broadcast, (cohort, b""))
            self._graphs.setdefault(broadcast, graph)
            self._broadcasts = {(str(key[0]), int(key[1]), str(key[2])): broadcast}  # one exchange at a time
            self._request_views = {(str(key[0]), int(key[1]), str(key[2])): view}
            self._last_round[(str(key[0]), str(key[2]))] = int(key[1])
        if pin is not None:  # pinned once the protocol client has checked the unmask and answered it
            broadcast, shown = pin
            self._answered[broadcast] = (self._answered[broadcast][0], shown)
        return answer

    def _check_round(self, request: Mapping[str, Any]) -> None:
        """A protocol request's round is a plain Python ``int`` in ``[0, 2^63 − 1]`` (:func:`~.secagg.is_round`: the
        non-negative 64-bit signed range the protocol's digests encode; the wire carries Python ints): any other
        value or type (a bool, a numpy integer, a negative or wider int) is refused like any malformed request, on
        the request's value only, before a digest could raise ``OverflowError`` (issue 43)."""
        round = request.get("round") if isinstance(request, Mapping) else None
        if not is_round(round):
            raise EncoderRefusal(
                f"secure aggregation: {self.client_id!r} refuses: round {repr(round)[:40]} is not a plain int ≥ 0, "
                "or is outside the 64-bit signed range"
            )

    def _cohort_ids(self, request: Mapping[str, Any]) -> FrozenSet[str]:
        """The party ids of the cohort a request names, as the protocol client decodes its bitmap over the roster of
        the current setup (checked against the run; a ``"dropped"`` field is not part of the cohort)."""
        assert self._secagg is not None
        return frozenset().union(*self._secagg.survivor_groups(_without_dropped(request)))

    def _encode_guarded(self, key: Tuple[Any, Any, Any], kept: _Kept, members: int) -> np.ndarray:
        """:meth:`_encode`, where anything but a refusal on public numbers (:class:`EncoderRefusal`) is a failure that
        may depend on the client's data (distributed DP's rounding, say): the client drops the kept payload, stops
        (:meth:`stop`: one bit per run) and refuses in the words of :data:`DATA_FAULT`; details go to its log only."""
        try:
            return self._encode(kept, members)
        except EncoderRefusal:
            raise
        except Exception as exc:  # noqa: BLE001 - a data-dependent failure: one generic refusal, then stop
            LOG.warning("client %s: encoding raised %s: %s", self.client_id, type(exc).__name__, exc)
            self._prepared.pop(key, None)
            self.stop()
            raise EncoderRefusal(DATA_FAULT) from None

    def _credentials(self) -> Dict[str, Any]:
        """The protocol client's ``identity`` and ``roster`` (none in the unauthenticated mode)."""
        if self.identity is None:
            return {}
        return {"identity": self.identity.signing_key, "roster": self.identity.roster}

    def _check_dropouts(self, request: Mapping[str, Any]) -> Optional[Tuple[bytes, bytes]]:
        """A broadcast answered again is unmasked with the drop-outs of its first unmasking (module docstring), as
        party ids (the roster may differ between setups). Returns what to pin once the protocol client has answered
        (the broadcast and the drop-outs' :func:`~.identity.members_digest`), or None for an exchange not masked."""
        key: Tuple[Any, Any, Any] = (request.get("purpose"), request.get("round"), request.get("phase"))
        broadcast = self._broadcasts.get(key)  # the request's values: wrong types find nothing
        if broadcast is None or self._secagg is None:
            return None
        dropped = self._answered[broadcast][1]
        if not isinstance(request.get("dropped"), bytes):
            raise EncoderRefusal("secure aggregation: an unmask request without its drop-outs")
        survivors = frozenset().union(*self._secagg.survivor_groups(request))
        shown = members_digest(self._cohort_ids(request) - survivors)
        if dropped and shown != dropped:
            raise EncoderRefusal(
                f"secure aggregation: {self.client_id!r} refuses: this broadcast was unmasked before with other "
                "drop-outs"
            )
        return broadcast, shown

    def _check_members(self, key: Tuple[Any, Any, Any], members: int) -> None:
        """The cohort a client masks over fits its request: at most the cohort size the request named (fault
        screening may leave fewer), and under distributed DP at least the honest-client count its noise share assumes
        (a server that told every client 8 and masked over 2 would release a sum carrying 2 noise shares of 8). Both
        are the server's own statements; the encoding's range comes from ``members`` alone."""
        told, honest = self._cohort_sizes.get(key, 0), self._honest.get(key, 0)
        if members > told or members < honest:
            raise EncoderRefusal(
                f"secure aggregation: {self.client_id!r} was asked for a cohort of {told}"
                + (f" assuming {honest} honest clients" if honest else "")
                + f" but is asked to mask over {members}; refused"
            )

    def _check_survivors(self, request: Mapping[str, Any]) -> None:
        """Under distributed DP a sum is unmasked only if every group of honest survivors whose sum the server can
        learn holds at least the honest-client count ``H`` the noise shares assume: with fewer it carries less noise
        than the accountant reports (a server that declares live clients dropped would get a sum noised for 2 clients,
        not 10). Counting survivors is not enough: the drop-outs and colluding survivors can cut the masking graph, so
        the count is :meth:`~.secagg.SecAggClient.honest_floor` with ``c`` colluders (issue 43, S1), and ``c`` is the
        client's own (:meth:`_colluders`), never lowered by the server's word: a request whose ``H`` exceeds the
        ``m − c`` honest members the client assumes of a cohort of ``m`` is refused."""
        key: Tuple[Any, Any, Any] = (request.get("purpose"), request.get("round"), request.get("phase"))
        needed = self._honest.get(key)  # the request's values: wrong types find nothing
        if needed is None or self._secagg is None:
            return
        members = len(self._cohort_ids(request))
        c = self._colluders(request, members, int(needed))
        if needed > members - c:
            raise EncoderRefusal(  # the floor check below would refuse too (floor ≤ m − c): said for what it is
                f"secure aggregation: {self.client_id!r} refuses: with the {c} colluders it assumes itself, at most "
                f"{members - c} of the cohort of {members} are honest, below the {needed} honest clients its "
                "distributed-DP noise assumes (the request assumes more than the client does)"
            )
        floor = self._secagg.honest_floor(request, c)
        if floor < needed:
            raise EncoderRefusal(
                f"secure aggregation: {self.client_id!r} refuses: unmasking could reveal the sum of a group of "
                f"{floor} honest survivor(s), below the {needed} honest clients its distributed-DP noise assumes"
            )

    def _colluders(self, request: Mapping[str, Any], members: int, needed: int) -> int:
        """``c``, the cohort members the client assumes side with the server when it checks an unmasking under
        distributed DP, from its own policy only (issue 43): its ``max_colluders`` (None: the ``h − 1`` the masking
        withstands, :meth:`~.secagg.SecAggClient.masking_colluders`), lowered to the request's ``m − H`` only when
        its policy caps ``H`` itself (``honest_clients``, checked in :meth:`refusal`), so never below its own
        ``m − honest_clients``. With ``honest_clients=None`` (any) the server's ``H`` does not lower ``c``: a request
        for ``H = m`` would otherwise make ``c = 0`` and the check vacuous."""
        assert self._secagg is not None
        own = self.policy.max_colluders
        if own is None:
            own = self._secagg.masking_colluders(request)
        if self.policy.honest_clients is None:
            return int(own)
        return min(int(own), max(members - needed, 0))

    def _check_groups(self, request: Mapping[str, Any]) -> None:
        """The small-cohort rule: every group whose sum the server would learn holds enough data."""
        key: Tuple[Any, Any, Any] = (request.get("purpose"), request.get("round"), request.get("phase"))
        needed = self._min_data.get(key)
        if needed is None or self._secagg is None:
            return
        for group in self._secagg.survivor_groups(request):
            held = sum(int(self.sizes.get(c, 0)) for c in group)
            if held < needed:
                raise EncoderRefusal(
                    f"secure aggregation: {self.client_id!r} refuses: the sum over a group of {len(group)} client(s) "
                    f"holding {held} points would determine their rows (this phase needs ≥ {needed})"
                )

    # --- the client's own state between messages (a Flower ClientApp restarts for each one) -------------
    def to_state(self) -> bytes:
        """Everything this encoder holds, as bytes for the client's *in-memory* state only (Flower's
        ``Context.state``, which the SuperNode keeps): its protocol client's secrets, what it prepared."""
        header = {
            "client_id": self.client_id,
            "run_id": None if self._run_id is None else self._run_id.hex(),
            "secagg": [] if self._secagg is None else sorted(self._secagg.to_state()),
            "sizes": {cid: int(n) for cid, n in self.sizes.items()},
            "min_data": [[k[0], int(k[1]), k[2], v] for k, v in self._min_data.items()],
            "answered": [[d.hex(), c.hex(), x.hex()] for d, (c, x) in self._answered.items()],
            "graphs": [[d.hex(), g.hex()] for d, g in self._graphs.items()],
            "broadcasts": [[k[0], int(k[1]), k[2], d.hex()] for k, d in self._broadcasts.items()],
            "request_views": [[k[0], int(k[1]), k[2], v.hex()] for k, v in self._request_views.items()],
            "last_round": [[p, f, int(r)] for (p, f), r in self._last_round.items()],
            "encoded_views": [[d.hex(), v.hex()] for d, v in self._encoded_views.items()],
            "claimed": [[p, f, int(r)] for (p, f), r in self._claimed.items()],
            "noise_seen": {f: float(z) for f, z in self._noise_seen.items()},
            "honest": [[k[0], int(k[1]), k[2], int(v)] for k, v in self._honest.items()],
            "cohort_sizes": [[k[0], int(k[1]), k[2], int(v)] for k, v in self._cohort_sizes.items()],
            "stopped": self.stopped,
            "ledger": self.ledger.entries if isinstance(self.ledger, MemoryLedger) else [],
            "prepared": [
                {
                    "purpose": key[0],
                    "round": int(key[1]),
                    "phase": key[2],
                    "names": sorted(kept.message.arrays),
                    "request": kept.request.to_config(),
                    "broadcast": kept.broadcast.hex(),
                    "aggregation": kept.aggregation,
                    "limit": kept.limit,
                }
                for key, kept in self._prepared.items()
            ],
        }
        arrays = {
            f"p{i}/{name}": np.asarray(kept.message.arrays[name])
            for i, kept in enumerate(self._prepared.values())
            for name in sorted(kept.message.arrays)
        }
        if self._secagg is not None:
            arrays.update({f"s/{k}": np.frombuffer(v, np.uint8) for k, v in self._secagg.to_state().items()})
        buffer = io.BytesIO()
        np.savez(buffer, header=np.frombuffer(json.dumps(header).encode("utf-8"), np.uint8), **arrays)
        return buffer.getvalue()

    @classmethod
    def from_state(
        cls, client_id: str, policy: ClientPolicy, state: bytes, identity: Optional[PartyIdentity] = None
    ) -> "ClientEncoder":
        """The encoder :meth:`to_state` saved, for ``client_id`` under ``policy`` and ``identity`` (neither is ever
        part of the saved state: both come from the client's own configuration; a protocol client saved under
        another roster, or without one, is refused).

        :raises ValueError: a state of another client, or malformed.
        """
        with np.load(io.BytesIO(state), allow_pickle=False) as npz:
            header = json.loads(npz["header"].tobytes().decode("utf-8"))
            if header.get("client_id") != client_id:
                raise ValueError(f"the saved encoder state belongs to {header.get('client_id')!r}, not {client_id!r}")
            encoder = cls(client_id, policy, {str(k): int(v) for k, v in header.get("sizes", {}).items()}, identity)
            encoder._min_data = {(str(p), int(r), str(f)): int(v) for p, r, f, v in header.get("min_data", [])}
            encoder._answered = {
                bytes.fromhex(d): (bytes.fromhex(c), bytes.fromhex(x)) for d, c, x in header.get("answered", [])
            }
            # a state saved before the graph record holds none: the next masking of a broadcast records it
            encoder._graphs = {bytes.fromhex(d): bytes.fromhex(g) for d, g in header.get("graphs", [])}
            encoder._broadcasts = {
                (str(p), int(r), str(f)): bytes.fromhex(d) for p, r, f, d in header.get("broadcasts", [])
            }
            encoder._request_views = {
                (str(p), int(r), str(f)): bytes.fromhex(v) for p, r, f, v in header.get("request_views", [])
            }
            encoder._last_round = {(str(p), str(f)): int(r) for p, f, r in header.get("last_round", [])}
            encoder._encoded_views = {bytes.fromhex(d): bytes.fromhex(v) for d, v in header.get("encoded_views", [])}
            encoder._claimed = {(str(p), str(f)): int(r) for p, f, r in header.get("claimed", [])}
            encoder._noise_seen = {str(f): float(z) for f, z in header.get("noise_seen", {}).items()}
            encoder._honest = {(str(p), int(r), str(f)): int(v) for p, r, f, v in header.get("honest", [])}
            encoder._cohort_sizes = {(str(p), int(r), str(f)): int(v) for p, r, f, v in header.get("cohort_sizes", [])}
            encoder.stopped = bool(header.get("stopped", False))
            if isinstance(encoder.ledger, MemoryLedger):  # a ledger file is read from the file, never the state
                encoder.ledger = MemoryLedger(header.get("ledger", []))
            if header["run_id"] is not None:
                encoder._run_id = bytes.fromhex(header["run_id"])
            if header["secagg"]:
                encoder._secagg = SecAggClient.from_state(
                    {k: npz[f"s/{k}"].tobytes() for k in header["secagg"]}, **encoder._credentials()
                )
                # the policy is the party's own configuration, never the saved state's
                encoder._secagg.min_cohort = policy.min_cohort
                encoder._secagg.min_degree = policy.masking_degree
                encoder._secagg.max_colluders = policy.max_colluders
            for i, kept in enumerate(header["prepared"]):
                arrays = {name: npz[f"p{i}/{name}"] for name in kept["names"]}
                message = Message(client_id, int(kept["round"]), str(kept["phase"]), arrays, weight=0.0)
                key = (str(kept["purpose"]), int(kept["round"]), str(kept["phase"]))
                broadcast = bytes.fromhex(str(kept.get("broadcast", "")))
                request = Protection.from_config(kept["request"])
                limit = kept.get("limit")
                encoder._prepared[key] = _Kept(
                    message, request, broadcast, str(kept["aggregation"]), None if limit is None else float(limit)
                )
        return encoder
