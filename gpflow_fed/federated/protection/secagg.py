"""Secure aggregation with drop-out recovery, as request/response stages over plain data (SecAgg+-style).

Protocol: the double masking of Bonawitz et al., "Practical Secure Aggregation for Privacy-Preserving Machine
Learning", CCS 2017, doi:10.1145/3133956.3133982, over the sparse graphs of Bell et al., "Secure Single-Server
Aggregation with (Poly)Logarithmic Overhead", CCS 2020, doi:10.1145/3372297.3417885; keys and shares are made
once per run and serve every exchange of the run. Pure Python and numpy, no threads and no TensorFlow: a runtime
supplies ``send(stage, {client: request}) -> {client: response or None}`` (``None``: no answer) and relays
:class:`SecAggServer`'s requests to :meth:`SecAggClient.respond`, in one process, across workers, or in a Flower
ClientApp that restarts between messages (:meth:`SecAggClient.to_state` / :meth:`SecAggClient.from_state`).

**Setup, once per run** (stages ``advertise``, ``share``, ``store``). Client ``i`` draws from the OS a masking
X25519 pair ``(s_sk_i, s_pk_i)``, an encryption pair ``(c_sk_i, c_pk_i)`` and a 32-byte self-mask seed ``b_i``,
and advertises ``(s_pk_i, c_pk_i)``. The server relays the roster (every public key) with the holder graph's
degree ``d_s`` and threshold ``t``: client ``i``'s *share holders* are its neighbours in the Harary graph
:func:`holder_graph` over the roster (default ``d_s = min(2⌈log₂K⌉, K − 1)``, ``t = ⌊d_s/2⌋ + 1``; every client
checks ``d_s/2 < t ≤ d_s``). Client ``i`` Shamir-shares ``b_i`` among its holders (:mod:`.shamir`: threshold
``t``, share ``k`` for its ``k``-th holder in sorted order) and encrypts each share to its holder (AES-GCM
under ``X25519(c_sk_i, c_pk_j)``, bound to the run, both ids and what is shared); the server relays the
ciphertexts and each holder keeps the shares it could authenticate. :class:`SetupReport` gives the bytes.

**Authenticated parties** (:mod:`.identity`). A client made with a long-term Ed25519 ``identity`` and the
``roster`` its party holds (id → signing public key, agreed out of band) also returns at ``advertise`` a signature
of (protocol tag, run id, its id, ``s_pk_i``, ``c_pk_i``); the server relays every party's signature with the keys
at ``share`` (``"signatures"``), and the client refuses the whole setup unless every party there is on its own
roster and every relayed key pair carries that party's valid signature. So a server can neither substitute its
keys for a party's (it would read the shares and strip the pads) nor invent a party (a sybil). Without a roster
(``roster=None``) a client takes the keys the server relays: a semi-honest server only.

**Masked input, per exchange** (stage ``masked_input``). The server names the exchange ``e`` (run id, purpose,
round, phase), its cohort ``U`` (eligible clients fixed after fault screening) and each client's neighbours'
``s_pk``; the caller adds its own view of the request it answers (``view``, never the server's word), so the pads of
clients shown different requests do not cancel. Client ``i`` answers only if its own policy holds: one answer per
(run, purpose, round, phase) — whatever the cohort, so a server cannot difference two cohorts' sums of one broadcast
—, a cohort of at least its own ``min_cohort`` that contains it and no client it knows was excluded, and neighbour
keys equal to the roster it saw at setup. It sends, for its ``uint64`` codes ``q_i`` (given by the caller), ids
compared as strings,

    y_i = q_i + PRG(HKDF(b_i, tag(e) ‖ i)) + Σ_{j ∈ N_e(i), j > i} PRG(s_ij(e)) − Σ_{j ∈ N_e(i), j < i} PRG(s_ij(e))

(mod 2^64), with ``N_e`` the Harary graph :func:`~.masking.masking_graph` of ``e`` over ``U`` and ``s_ij(e)``
the pad seed of :meth:`~.masking.MaskingKeys.pad_seed` (X25519, HKDF bound to the whole tag). Its reply
carries the exchange digest, so a masked input replayed from another exchange is refused.

**Consistency round, per exchange, with a roster** (stage ``consistency``; the ConsistencyCheck of Bonawitz et al.'s
protocol against an active server). Survivors ``S`` are those whose masked input arrived. The server shows each of them
``S``; a survivor signs (Ed25519, its long-term key, :func:`~.identity.consistency_message`: protocol tag, run id,
exchange digest, cohort, ``S``, its id) **at most one survivor set per exchange** (kept in its saved state, so a restart
cannot make it sign twice), only a set naming itself, for the exchange it masked in, and only if ``|S|`` meets its own
floors: its share threshold ``t``, ``min_cohort`` for every survivor group, the quorum below, and the neighbour rule
(below: ``h = ⌊d/2⌋ + 1`` of its own masking neighbours survive). The unmask then carries the signatures, and every
client, before revealing anything, verifies against **its own roster** that a quorum ``q = min(n, ⌊(n + c)/2⌋ + 1)`` of
distinct members of ``S`` signed ``S = U \\ D`` (the unmask's own drop-outs), and that ``S`` is the set it signed, if it
signed one; it reveals under that set only. Two quorums share ``2q − n ≥ c + 1`` members, so with at most ``c`` members
of the cohort colluding with the server an honest one signed both, and it signs one set: no party ``j`` is a survivor to
one honest client (its seed, its ``b`` shares) and dropped to another (pads with ``j``). ``c`` is the client's
``max_colluders`` (default :func:`default_colluders`, ``max(⌊n/3⌋, t − 1)``; the request may raise it, never lower it).
Without a roster the round is skipped: a client without one cannot tell a party's signature from one the server made (a
semi-honest server only). Cost per client and exchange: one signature and at most ``q`` verifications (≈ 160 µs each,
cached per process: an in-process run verifies each signature once), and 64 bytes per survivor that signed in its unmask
request (the server relays every signature; ``⌈K/8⌉`` more for the signers).

**Unmask** (stage ``unmask``). Survivors ``S`` are those whose masked input arrived; ``D = U \\ S``. The server
asks each survivor for its exchange's self-mask seed ``HKDF(b_i, tag(e) ‖ i)`` and the pad seed ``s_ij(e)``
with each dropped neighbour ``j``, and each dropped client (it may be back) for its pad seeds with its surviving
neighbours; if a survivor does not answer, its holders send their shares of ``b_i`` and the server rebuilds its
seed. Then ``Σ_{i∈S} y_i − Σ_{i∈S} PRG(seed_i) − (the dropped pairs' pads) = Σ_{i∈S} q_i mod 2^64`` exactly.
An honest client answers the unmask of one exchange under one view only (the same ``D`` and degree), gives its
self-mask seed only if it sent a masked input for this very exchange and is listed as a survivor, a pad seed
only for a neighbour pair with exactly one end dropped, a share of ``b_j`` only for a listed survivor ``j``
(never for a dropped one), and nothing at all unless every connected component of ``N_e`` restricted to ``S``
has at least its ``min_cohort`` members and, if it is a survivor, at least ``h`` of its own neighbours survive (a
``b`` share: at least ``h`` of ``j``'s). A client listed as dropped, or whose ``b`` was rebuilt, is excluded for
the rest of the run by the server and by every client shown that unmask request: a dropped client's input may
still reach the server late, and all its pads for that exchange are revealed, so its ``b`` must never be rebuilt.

**Neighbour rule, per exchange** (issue 43, S1). A survivor signs a survivor set and reveals anything at the unmask only
if at least ``h = ⌊d/2⌋ + 1`` (:func:`neighbour_floor`) of its own ``d`` masking neighbours in the exchange's graph
survive (``d`` the graph's degree, checked against the client's floor); without a roster a holder gives a share of
``b_j`` only under the same condition for ``j``; the server aborts first, naming the client. (A client listed as dropped
still gives its pads with surviving neighbours: its own input keeps its self-mask, whose ``b`` is never rebuilt for a
dropped client.) Why: a survivor ``v``'s input falls out exactly when the server holds ``seed_v(e)`` and every pad of
``v``. It has the pads with the dropped (``v`` gives them) and with colluders (their keys), and no pad between two
honest survivors (no party gives one), so every surviving neighbour of ``v`` must collude: ``h`` colluders among ``v``'s
neighbours. Without the rule one colluder sufficed (the other ``d − 1`` neighbours declared dropped). A server can grind
run ids and cohorts until ``h`` colluders neighbour a victim and declare the other ``d − h`` dropped, so ``h`` suffice:
the bound is tight. In general it learns the sum of each connected component of ``N_e`` over the honest survivors
``S \\ C``; each member of such a group keeps ``≥ h`` surviving neighbours, all in the group or colluders, so a group
holds ``≥ h + 1 − c`` honest members, and all ``|S| − c`` of them when ``|D| + c < d`` (``d``-connectivity;
:func:`honest_group_floor`). The rule needs every honest client to see one ``D`` (the consistency round, against at most
``c`` colluders), so the claim for inputs is: fewer than ``min(h, c + 1)`` colluders in a cohort learn no single input,
whatever the server grinds. With the defaults (``d = default_degree(n) ≤ d_s``, so ``h ≤ t ≤ c + 1``) that is fewer than
``h``: 4, 5, 6, 8, 11 for n = 8, 16, 32, 100, 1000, while the consistency round's default ``c`` is 3, 5, 10, 33, 333:
``c`` colluders cannot show honest clients different survivor sets, but from ``h`` on they can isolate a victim. That
``c`` isolate nobody would take ``d ≥ 2c + 1`` (7, 11, 21, 67, 667): a degree ``O(n)``, which gives up the sparse graph,
so the default degree stays; a party that assumes ``c ≥ h`` colluders sets its own ``masking_degree ≥ 2c + 1`` (the
server must then ask for it). The price is availability: real drop-outs of more than ``d − h`` of one survivor's
neighbours abort the sum. With a random fraction of a cohort dropped at the default degree, share of exchanges aborted:
10 %: 0 for n ≤ 100, 0.007 for n = 1000; 20 %: 0 (n = 16), 0.12 (32), 0.24 (100), 0.57 (1000); 30 %: over 0.9. Under
distributed DP a group's sum carries its members' noise shares only: the check against the honest-client count the noise
assumes is :func:`honest_group_floor` (:meth:`SecAggClient.honest_floor`), not ``|S| − c``, which the drop-outs and
colluders can split.

Why the masking key is not Shamir-shared (unlike the single-exchange protocols): with one sharing per run,
rebuilding ``s_sk_j`` of a client that drops in exchange 2 gives every pad ``j`` used in exchange 1, where the
server already holds ``y_j`` and ``j``'s revealed self-mask seed, so ``j``'s earlier inputs would fall out to a
server that merely follows the protocol. Here everything revealed on a drop-out is bound to its exchange
(``s_ij(e)``, ``seed_i(e)``); only ``b`` is shared, and only a survivor's ``b`` is ever rebuilt, when its input
already carries pads the server does not know. The price: if a survivor that has a dropped neighbour also fails
to unmask, and that neighbour does not come back, their pad is lost and the sum is refused
(:class:`SecAggAborted`).

Messages are dicts of bytes, str, int, bool, lists of ids and ``uint64`` arrays; a cohort and its drop-outs
travel as bitmaps over the sorted roster (:func:`members_bitmap`, ``⌈K/8⌉`` bytes). Cost per client: at setup the
roster (``O(K)`` bytes, once), ``d_s`` encryptions and decryptions and two Shamir splits; per exchange what
:func:`~.masking.mask` costs (``d`` pads of ``P`` words) plus one self-mask pad, an ``O(K)`` graph, and at the
unmask one HKDF per pad asked; the server adds one pad per survivor and per survivor/dropped pair, and two
Shamir combinations per rebuilt ``b``.

**What the server sees and learns** (it follows the protocol; cryptographic assumptions: CDH on Curve25519,
HKDF, AES as PRFs). It sees every public key, the graphs, the ciphertexts of shares (not their content), each
survivor's ``y_i`` and ``seed_i(e)``, the pad seeds between survivors and dropped clients, and the ``b`` shares
of survivors that failed to unmask. Pads between survivors stay unknown, so it learns the sum of each connected
component of ``N_e`` restricted to ``S`` and nothing else about the inputs: with the Harary graph's connectivity
that is ``Σ_{i∈S} q_i`` unless the drop-outs cut the graph, and clients refuse to unmask when a component is
smaller than their ``min_cohort``. What is revealed is bound to one exchange, so another exchange's inputs stay
masked. A dropped client whose late ``y_j`` arrived keeps its self-mask: a server that follows the protocol
never rebuilds ``b_j`` (``j`` is excluded), and the clients shown ``j``'s drop-out refuse shares of it.

**Across exchanges** (with a roster). ``b`` serves the whole run, so a ``b`` rebuilt in one exchange and pads with
its owner revealed in another, before or after, unmask that exchange's input (two fresh attackers did it both
ways, with no colluders). So with a roster no holder gives a share of anyone's ``b``: a survivor that fails to
unmask aborts the sum (availability, not privacy); drop-outs before the masked input are recovered from pads as
before. Without a roster (semi-honest server) ``b`` is rebuilt as described above.

**What is not protected.** (1) Without a roster: a server that substitutes public keys at setup reads the shares and
can unmask everyone (with a roster, refused at ``share``; keys changed after setup are refused either way). (2)
Without a roster, a malicious server that lies about drop-outs to different clients: telling ``j`` it survived
(its seed, or its holders: their shares of ``b_j``) and all of ``j``'s neighbours that it dropped (their pads with
``j``) unmasks ``j``; with a roster the consistency round stops it while at most ``c`` cohort members collude, and
``c + 1`` colluders who sign both sets do not (the bound is tight). (3) What the sum itself reveals, and sums across
exchanges (distributed DP covers that). (4) Without a roster, sybils: ``s`` clients the server invents in a cohort
of ``n`` leave it the sum of the ``n − s`` honest clients, so ``min_cohort`` bounds what a curious server learns, not a
server that supplies sybils (with a roster a party not on it is refused; parties on it that collude with the server
are (5)). (5) Clients that collude with the server: fewer than ``t`` holders learn nothing about a ``b``; the
colluders' pads are known, so the server learns the sums of the honest survivors' groups once the colluders are
removed from the graph (the Harary graph is ``d``-connected: fewer than ``d`` colluders and drop-outs together leave
it connected, whatever the vertex order; beyond that, groups of ``≥ h + 1 − c``: :func:`honest_group_floor`), which
the clients' group check cannot see. The graphs' vertex orders are public hashes of the run
id (which the server draws) and the members (whom it picks), so a server can grind them (new run ids before the
setup, other cohorts for an exchange) until its colluders surround a victim: the guarantees hold against fewer than
``t`` colluders among all parties (no victim's ``b``) and fewer than ``h = ⌊d/2⌋ + 1`` in a cohort (no victim's pads:
the server declares a victim's other neighbours dropped, see the neighbour rule; fewer than ``d`` without drop-outs),
whatever it grinds, and beyond that only as likely as the graph is unlucky. (6) Traffic: who answered, and when.

Randomness that protects comes from the OS (:func:`secrets.token_bytes`, pycryptodome's and ``cryptography``'s
generators); there is no seed for tests.
"""

from __future__ import annotations

import functools
import hashlib
import json
import secrets
from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any, Callable, Dict, FrozenSet, Generator, Iterable, List, NoReturn, Optional, Sequence, Tuple, cast

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ..protocol.transport import PROTOCOL_STAGES
from .identity import (
    SIGNATURE_BYTES,
    advertise_message,
    certified_signers,
    check_roster,
    consistency_message,
    members_digest,
    quorum,
    roster_digest,
    verify,
)
from .masking import (
    PAD_SEED_BYTES,
    PUBLIC_KEY_BYTES,
    Exchange,
    MaskingKeys,
    SecureAggregation,
    length_prefixed,
    is_int,
    keystream,
    mask,
    masking_graph,
)
from .shamir import (
    SHARE_BYTES,
    ShamirError,
    ShareDecryptionError,
    ciphertext_bytes,
    combine_shares,
    decrypt_share,
    encrypt_share,
    split_secret,
)

__all__ = [
    "ROUND_LIMIT",
    "SecAggAborted",
    "SecAggClient",
    "SecAggRefused",
    "SecAggServer",
    "SecureSum",
    "SetupReport",
    "components",
    "default_colluders",
    "default_degree",
    "holder_graph",
    "honest_group_floor",
    "is_round",
    "members_bitmap",
    "members_of",
    "neighbour_floor",
    "payload_bytes",
    "self_mask_seed",
]


#: a protocol run as a generator: yields ``(stage, {client_id: request})``, is sent the answers, returns its result
Stages = Generator[Tuple[str, Dict[str, Dict[str, Any]]], Mapping[str, Any], Any]


_SETUP_PURPOSE, _SETUP_PHASE = "secure-aggregation-setup", "share-holders"
_SHARED = "self-mask seed b"
_SELF_MASK_DOMAIN = b"gpflow-fed/secure-aggregation/self-mask/v1"
_SLOT_DOMAIN = b"gpflow-fed/secure-aggregation/slot/v1"
_VIEW_DOMAIN = b"gpflow-fed/secure-aggregation/view/v1"
_STATE_FORMAT = b"gpflow-fed/secure-aggregation/client-state/v2"
_CIPHERTEXT = ciphertext_bytes(SHARE_BYTES)


class SecAggRefused(ValueError):
    """An honest client's refusal: the request breaks the protocol or the client's own policy."""


class SecAggAborted(RuntimeError):
    """The server cannot produce the sum (too few survivors or share holders, a lost pad); nothing is released."""


# --- shared helpers -----------------------------------------------------------------------------------
def default_degree(count: int) -> int:
    """``min(2⌈log₂ n⌉, n − 1)``, the degree of both graphs unless the server asks for another (≥ 2 members)."""
    return SecureAggregation().masking_degree(count)


#: the rounds a protocol request may name: ``[0, ROUND_LIMIT)``, the non-negative half of the 64-bit signed range the
#: protocol's digests encode (rounds are 0-based)
ROUND_LIMIT = 2**63


def is_round(value: object) -> bool:
    """Whether ``value`` is a round a protocol request may name: a plain Python ``int`` (not a bool, not a numpy
    integer: the wire carries Python ints) in ``[0, 2^63 − 1]``. Any other is refused where the request is parsed,
    so no ``OverflowError`` or ``TypeError`` of the digests reaches the server."""
    return type(value) is int and 0 <= value < ROUND_LIMIT


def default_colluders(cohort_size: int, threshold: int) -> int:
    """The collusion bound ``c`` a client assumes in the consistency round unless its own configuration says
    otherwise: ``max(⌊n/3⌋, t − 1)`` for a cohort of ``n`` and the run's share threshold ``t``.

    ``⌊n/3⌋`` is the corrupt fraction of Bonawitz et al.'s active-adversary setting (a third of the clients with the
    server); ``t − 1`` is the bound the rest of this protocol already states (``t`` colluding holders of one party
    rebuild its ``b``), so the round never assumes fewer colluders than the masking does. The quorum is then
    :func:`~.identity.quorum` ``(n, c)``, about ``2n/3``: up to about a third of a cohort may drop out.
    """
    if not is_int(cohort_size) or cohort_size < 1 or not is_int(threshold) or threshold < 1:
        raise ValueError(f"default_colluders: cohort_size and threshold must be ints ≥ 1, got {cohort_size, threshold}")
    return max(int(cohort_size) // 3, int(threshold) - 1)


def holder_graph(run_id: bytes, roster: Sequence[str], degree: int) -> Dict[str, Tuple[str, ...]]:
    """Each client's share holders: :func:`~.masking.masking_graph` over the whole roster, bound to the run
    (a run-level exchange); symmetric, so a client holds shares of exactly its own holders."""
    return dict(_holders(run_id, tuple(roster), degree))


# Public, deterministic functions of public data, cached: clients in one process share them, and a client
# reuses the graph of its masked input at the unmask. O(K) each, which a client pays once per exchange.
@functools.lru_cache(maxsize=32, typed=True)
def _exchange_of(
    run_id: bytes, purpose: str, round: int, phase: str, cohort: Tuple[str, ...], view: bytes = b""
) -> Exchange:
    return Exchange(run_id, purpose, round, phase, cohort, view)


@functools.lru_cache(maxsize=32)
def _graph(exchange: Exchange, degree: int) -> Mapping[str, Tuple[str, ...]]:
    return masking_graph(exchange, degree)


def _holders(run_id: bytes, roster: Tuple[str, ...], degree: int) -> Mapping[str, Tuple[str, ...]]:
    return _graph(_exchange_of(run_id, _SETUP_PURPOSE, 0, _SETUP_PHASE, tuple(sorted(roster))), degree)


#: certificates already checked in this process: (roster digest, run id, exchange digest, survivor-set digest,
#: signers, signatures, quorum) -> the valid signers; a deterministic function of exactly these, so the K in-process
#: parties of a simulation check one certificate once between them (as :func:`~.identity.verify` caches one signature)
_CERTIFIED: Dict[Tuple[Any, ...], FrozenSet[str]] = {}


def neighbour_floor(degree: int) -> int:
    """``h = ⌊d/2⌋ + 1``: the fewest of its ``d`` masking neighbours that must survive an exchange before a survivor
    signs its survivor set or reveals anything at its unmask (module docstring, *Neighbour rule*: a server must then
    control ``h`` of a victim's neighbours to leave it alone with them).

    :raises ValueError: ``degree`` not an int ≥ 1.
    """
    if not is_int(degree) or degree < 1:
        raise ValueError(f"neighbour_floor: degree must be an int ≥ 1, got {degree!r}")
    return int(degree) // 2 + 1


def honest_group_floor(survivors: int, dropped: int, degree: int, colluders: int) -> int:
    """The fewest honest survivors in any group whose sum a server controlling at most ``colluders`` members of the
    cohort can learn from one exchange (``survivors`` = ``|S|``, ``dropped`` = ``|D|``, ``degree`` = the graph's
    ``d``), when every survivor keeps the neighbour rule (``h = ⌊d/2⌋ + 1`` surviving neighbours) and the survivor
    set is consistent (at most the consistency round's ``c`` colluders).

    The server learns the sum of each connected component of the masking graph restricted to the honest survivors
    ``S \\ C`` (the pads between two honest survivors stay secret; a dropped client keeps its self-mask). If
    ``|D| + c < d`` that graph is connected (the Harary graph is ``d``-connected), so the one group holds
    ``|S| − c``; otherwise each member ``v`` of a group ``G`` has ``≥ h`` surviving neighbours, all in ``G`` or
    colluders, so ``|G| − 1 + c ≥ h`` and ``|G| ≥ h + 1 − c`` (at least 1: with ``c ≥ h`` a victim can be alone).
    Under distributed DP a sum carries the noise shares of its group only: compare this with the honest-client count
    the shares assume (``survivors − c ≥ honest_clients`` alone is not enough when the drop-outs and colluders can
    cut the graph).

    :raises ValueError: a count that is not an int ≥ 0, or ``degree < 1``.
    """
    for name, value in (("survivors", survivors), ("dropped", dropped), ("colluders", colluders)):
        if not is_int(value) or value < 0:
            raise ValueError(f"honest_group_floor: {name} must be an int ≥ 0, got {value!r}")
    if not is_int(degree) or degree < 1:
        raise ValueError(f"honest_group_floor: degree must be an int ≥ 1, got {degree!r}")
    honest = max(int(survivors) - int(colluders), 0)
    if int(dropped) + int(colluders) < int(degree):
        return honest
    return min(honest, max(1, neighbour_floor(degree) + 1 - int(colluders)))


@functools.lru_cache(maxsize=32)
def _short_of_neighbours(exchange: Exchange, degree: int, dropped: FrozenSet[str]) -> Tuple[Tuple[str, int, int], ...]:
    """The survivors that keep fewer than :func:`neighbour_floor` of their masking neighbours:
    ``(id, surviving neighbours, d)`` each, in id order (``O(K d)``)."""
    graph = _graph(exchange, degree)
    short = []
    for c in sorted(exchange.members - dropped):
        alive = sum(p not in dropped for p in graph[c])
        if alive < neighbour_floor(len(graph[c])):
            short.append((c, alive, len(graph[c])))
    return tuple(short)


@functools.lru_cache(maxsize=32)
def _survivor_components(exchange: Exchange, degree: int, dropped: FrozenSet[str]) -> Tuple[FrozenSet[str], ...]:
    """:func:`components` of the exchange's masking graph over its survivors (members not in ``dropped``), computed
    once per process: a public function of public values (the exchange, its degree and the drop-outs a request
    names), which each of K in-process clients would otherwise recompute in ``O(K d)`` at every unmask. Keyed on
    the whole exchange (cohort, round, phase, view) and the drop-out set, so another cohort or drop-out set is
    never served from another's entry; a tuple of frozensets, so no caller can change a cached value."""
    return tuple(components(_graph(exchange, degree), exchange.members - dropped))


@functools.lru_cache(maxsize=32)
def _smallest_group(exchange: Exchange, degree: int, dropped: FrozenSet[str]) -> int:
    """The fewest members of a connected component of the survivors (0 if none survive)."""
    groups = _survivor_components(exchange, degree, dropped)
    return min((len(g) for g in groups), default=0)


def self_mask_seed(b: bytes, exchange: Exchange, client_id: str) -> bytes:
    """``HKDF-SHA256(b, info = domain ‖ SHA-256(tag(e)) ‖ i)``: the only self-mask value a survivor reveals, so
    ``b`` and other exchanges' self-masks stay secret."""
    info = length_prefixed(_SELF_MASK_DOMAIN) + length_prefixed(exchange.digest) + length_prefixed(client_id.encode())
    return HKDF(algorithm=hashes.SHA256(), length=PAD_SEED_BYTES, salt=None, info=info).derive(b)


def components(graph: Mapping[str, Sequence[str]], members: Iterable[str]) -> List[FrozenSet[str]]:
    """The connected components of ``graph`` restricted to ``members``: what a server that unmasks the survivors
    ``members`` learns is the sum of each component's inputs."""
    left, found = set(members), []
    while left:
        todo = [left.pop()]
        seen = set(todo)
        while todo:
            for other in graph[todo.pop()]:
                if other in left:
                    left.discard(other)
                    seen.add(other)
                    todo.append(other)
        found.append(frozenset(seen))
    return found


def members_bitmap(roster: Sequence[str], members: Iterable[str]) -> bytes:
    """``members`` as a bitmap over the sorted ``roster`` (bit ``k`` of byte ``k // 8``, little-endian within a
    byte): how requests name a cohort and its drop-outs in ``⌈K/8⌉`` bytes instead of K ids.

    :raises ValueError: a member not in the roster.
    """
    index = {c: k for k, c in enumerate(sorted(roster))}
    bits = np.zeros(len(index), dtype=np.uint8)
    for c in members:
        if c not in index:
            raise ValueError(f"members_bitmap: {c!r} is not in the roster")
        bits[index[c]] = 1
    return np.packbits(bits, bitorder="little").tobytes()


def members_of(roster: Sequence[str], bitmap: bytes) -> Tuple[str, ...]:
    """The members a :func:`members_bitmap` names, in roster order.

    :raises ValueError: not bytes of length ``⌈K/8⌉``, or a bit set beyond the roster.
    """
    return _members_of(tuple(sorted(roster)), bitmap)


def _members_of(order: Tuple[str, ...], bitmap: Any) -> Tuple[str, ...]:
    if not isinstance(bitmap, bytes) or len(bitmap) != (len(order) + 7) // 8:
        raise ValueError(f"a bitmap of {(len(order) + 7) // 8} bytes over the roster of {len(order)}")
    return _decode_bitmap(order, bitmap)


@functools.lru_cache(maxsize=64)
def _decode_bitmap(order: Tuple[str, ...], bitmap: bytes) -> Tuple[str, ...]:
    bits = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8), bitorder="little")
    if bits[len(order) :].any():
        raise ValueError("a bitmap with bits beyond the roster")
    return tuple(np.asarray(order, dtype=object)[np.flatnonzero(bits[: len(order)])])


def payload_bytes(message: Any) -> int:
    """The bytes a message carries: raw bytes, array contents, UTF-8 text, 8 per number, 1 per flag, summed over
    dict keys and values and list items (no transport framing)."""
    if message is None:
        return 0
    if isinstance(message, (bytes, bytearray)):
        return len(message)
    if isinstance(message, str):
        return len(message.encode("utf-8"))
    if isinstance(message, (dict, Mapping)):
        return sum(payload_bytes(k) + payload_bytes(v) for k, v in message.items())
    if isinstance(message, np.ndarray):
        return int(message.nbytes)
    if isinstance(message, bool):
        return 1
    if isinstance(message, (list, tuple)):
        try:
            return len("".join(message).encode("utf-8"))  # a list of ids, fast
        except TypeError:
            return sum(payload_bytes(v) for v in message)
    return 8


def _slot(exchange: Exchange) -> bytes:
    """What a client answers at most once: the run, purpose, round and phase, whatever the cohort."""
    parts = (_SLOT_DOMAIN, exchange.run_id, exchange.purpose.encode(), exchange.round.to_bytes(8, "big", signed=True))
    return hashlib.sha256(b"".join(length_prefixed(p) for p in (*parts, exchange.phase.encode()))).digest()


def _view(exchange: Exchange, degree: int, dropped: Iterable[str] = ()) -> bytes:
    """The digest of one exchange as a client was shown it: the tag, the graph's degree, the dropped set."""
    parts = [_VIEW_DOMAIN, exchange.digest, str(int(degree)).encode(), *(d.encode() for d in sorted(dropped))]
    return hashlib.sha256(b"".join(length_prefixed(p) for p in parts)).digest()


def _public(private: bytes) -> bytes:
    return X25519PrivateKey.from_private_bytes(private).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def _ids(value: Any) -> Tuple[str, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise TypeError("a list of client ids")
    ids = tuple(value)
    if any(not isinstance(c, str) or not c for c in ids) or len(set(ids)) != len(ids):
        raise ValueError("distinct non-empty str client ids")
    return ids


def _is_key(value: Any, length: int = PUBLIC_KEY_BYTES) -> bool:
    return isinstance(value, bytes) and len(value) == length


# --- the client ---------------------------------------------------------------------------------------
class SecAggClient:
    """One client's side for one run: its secrets, its policy and its record of what it has answered.

    Make one per run (the keys and ``b`` are fresh from the OS); answer the server's requests with
    :meth:`respond` (or the per-stage methods). Every refusal raises :class:`SecAggRefused` with the reason;
    a runtime sends no answer (``None``) then.

    :param client_id: this client's id, as the server names it.
    :param min_degree: the least degree of a graph this client masks or shares over (its policy's
        ``masking_degree``); None: :func:`default_degree` of the graph's size, ``min(2⌈log₂ n⌉, n − 1)``. A request
        may ask for more, never for less (a server that lowers the degree for a cohort it picked leaves a victim
        with its colluders as its only neighbours).
    :param min_cohort: this client's own minimum (≥ 2): it masks only for a cohort of at least this many
        and unmasks only if every group of survivors whose sum the server would learn is this large. Set on
        the client (node config), never taken from the server.
    :param identity: this party's long-term Ed25519 signing key (:mod:`.identity`); it signs what it advertises.
    :param roster: the roster this party holds (party id → raw Ed25519 public key, agreed out of band; it must hold
        ``client_id`` under ``identity``'s key). With a roster the client accepts a setup only if every party in it
        is on the roster and carries a valid signature of its keys (no substituted key, no sybil); ``None``: the
        unauthenticated mode (a semi-honest server only). Both are the party's own configuration: never in
        :meth:`to_state`, given again to :meth:`from_state`.
    :param max_colluders: ``c``, the most members of a cohort this client assumes collude with the server, which sets
        the consistency round's quorum (:func:`~.identity.quorum`); None: :func:`default_colluders`. A request may
        ask for a larger ``c`` (a larger quorum), never a smaller one.
    :raises TypeError, ValueError: a malformed id, ``min_cohort``, identity or roster, or a roster without a key.
    """

    def __init__(
        self,
        client_id: str,
        *,
        min_cohort: int = 2,
        min_degree: Optional[int] = None,
        identity: Optional[Ed25519PrivateKey] = None,
        roster: Optional[Mapping[str, bytes]] = None,
        max_colluders: Optional[int] = None,
    ) -> None:
        if not isinstance(client_id, str) or not client_id:
            raise TypeError(f"SecAggClient: client_id must be a non-empty str, got {client_id!r}")
        if not is_int(min_cohort) or min_cohort < 2:
            raise ValueError(f"SecAggClient: min_cohort must be an int ≥ 2, got {min_cohort!r}")
        if min_degree is not None and (not is_int(min_degree) or min_degree < 2):
            raise ValueError(f"SecAggClient: min_degree must be an int ≥ 2 or None, got {min_degree!r}")
        if max_colluders is not None and (not is_int(max_colluders) or max_colluders < 0):
            raise ValueError(f"SecAggClient: max_colluders must be an int ≥ 0 or None, got {max_colluders!r}")
        self.client_id, self.min_cohort = client_id, int(min_cohort)
        self.min_degree = None if min_degree is None else int(min_degree)
        self.max_colluders = None if max_colluders is None else int(max_colluders)
        if identity is not None and not isinstance(identity, Ed25519PrivateKey):
            raise TypeError(
                f"SecAggClient: identity must be an Ed25519PrivateKey or None, got {type(identity).__name__}"
            )
        self._identity = identity
        self._signers: Optional[Dict[str, bytes]] = None  # the party's own roster: id -> Ed25519 public key
        if roster is not None:
            self._signers = check_roster(roster, "SecAggClient roster")
            if identity is None:
                raise ValueError("SecAggClient: a roster needs this party's identity (its signing key) to sign with")
            if self._signers.get(client_id) != identity.public_key().public_bytes_raw():
                raise ValueError(f"SecAggClient: the roster does not hold {client_id!r} with this party's public key")
        #: the roster's digest ("" without one): computed once per checked roster, shared by the clients that hold it
        self._roster_hash = "" if self._signers is None else roster_digest(self._signers)
        self._s_sk, self._c_sk, self._b = (secrets.token_bytes(32) for _ in range(3))
        self._run_id: Optional[bytes] = None
        self._roster: Dict[str, Tuple[bytes, bytes]] = {}  # id -> (s_pk, c_pk), as seen at setup
        self._order: Tuple[str, ...] = ()  # the roster's ids, sorted (what bitmaps index)
        self._degree = self._threshold = 0
        self._held: Dict[str, bytes] = {}  # sender -> its share of b_sender
        self._answered: Dict[bytes, bytes] = {}  # slot -> view of the exchange answered there
        self._masked_views: Dict[bytes, bytes] = {}  # slot -> the caller's view of the request it masked for
        self._signed: Dict[bytes, bytes] = {}  # slot -> digest of the one survivor set it signed or revealed under
        self._views: Dict[bytes, bytes] = {}  # exchange digest -> view shown at unmask
        self._excluded: Dict[str, bytes] = {}  # client -> digest of the exchange where it dropped or b was given
        self._restore_keys()

    def _restore_keys(self) -> None:
        self._keys = MaskingKeys.from_private_bytes(self._s_sk)
        self._c_pk = _public(self._c_sk)
        self._holders: Mapping[str, Tuple[str, ...]] = {}
        self._order = tuple(sorted(self._roster))
        if self._roster:
            self._holders = _holders(self._run_id, tuple(self._roster), self._degree)  # type: ignore[arg-type]  # a roster comes with its run id

    def __repr__(self) -> str:
        return (
            f"SecAggClient({self.client_id!r}, min_cohort={self.min_cohort}, set_up={bool(self._roster)}, "
            f"authenticated={self._signers is not None})"
        )

    @property
    def authenticated(self) -> bool:
        """Whether this client checks every party's keys against its own roster (False: unauthenticated mode)."""
        return self._signers is not None

    def __reduce__(self) -> NoReturn:
        raise TypeError("SecAggClient holds secrets: keep it with to_state() in the client's memory, never pickle it")

    @property
    def excluded(self) -> FrozenSet[str]:
        """Clients this client refuses for the rest of the run: listed as dropped in an unmask it was shown, or
        whose ``b`` share it gave away."""
        return frozenset(self._excluded)

    def _refuse(self, why: str) -> SecAggRefused:
        return SecAggRefused(f"secure aggregation: {self.client_id!r} refuses: {why}")

    def _get(self, request: Mapping[str, Any], name: str, check: Callable[[Any], bool], what: str) -> Any:
        if not isinstance(request, Mapping) or name not in request or not check(request[name]):
            raise self._refuse(f"the request's {name!r} must be {what}")
        return request[name]

    def survivor_groups(self, request: Mapping[str, Any]) -> List[FrozenSet[str]]:
        """The groups of survivors whose sums an ``unmask`` request would reveal (the connected components of the
        exchange's masking graph without the dropped clients); for a ``masked_input`` request, the cohort.

        :raises SecAggRefused: a malformed request.
        """
        exchange, degree, _ = self._exchange(request)
        try:
            dropped = frozenset(_members_of(self._order, request.get("dropped"))) if "dropped" in request else None
        except (TypeError, ValueError) as error:
            raise self._refuse(f"malformed request ({error})") from None
        if dropped is None:
            return [frozenset(exchange.members)]
        return list(_survivor_components(exchange, degree, dropped))

    def honest_floor(self, request: Mapping[str, Any], colluders: Optional[int] = None) -> int:
        """For an ``unmask`` request: :func:`honest_group_floor` of its survivors, drop-outs and graph degree with
        ``colluders`` cohort members assumed to side with the server, i.e. the fewest honest survivors in a group whose
        sum unmasking can reveal (what distributed DP must compare with the honest-client count its noise assumes).
        ``None``: ``h − 1`` for the graph's ``h = ⌊d/2⌋ + 1``, the most colluders the masking claims to withstand.

        :raises SecAggRefused: a malformed request, or one without ``"dropped"``.
        :raises ValueError: ``colluders`` not an int ≥ 0.
        """
        exchange, _, graph = self._exchange(request)
        try:
            dropped = set(_members_of(self._order, request.get("dropped")))
        except (TypeError, ValueError) as error:
            raise self._refuse(f"malformed request ({error})") from None
        if not dropped <= exchange.members:
            raise self._refuse("'dropped' names clients outside the cohort")
        degree = len(graph[exchange.cohort[0]])  # the graph is regular
        c = neighbour_floor(degree) - 1 if colluders is None else colluders
        return honest_group_floor(len(exchange.members) - len(dropped), len(dropped), degree, c)

    def masking_colluders(self, request: Mapping[str, Any]) -> int:
        """``h − 1`` for the graph of the exchange a request names (``h = ⌊d/2⌋ + 1``, :func:`neighbour_floor`): the
        most colluders the masking claims to withstand, which :meth:`honest_floor` assumes for ``colluders=None``.

        :raises SecAggRefused: a malformed request.
        """
        exchange, _, graph = self._exchange(request)
        return neighbour_floor(len(graph[exchange.cohort[0]])) - 1

    def _exchange(
        self, request: Mapping[str, Any], view: bytes = b""
    ) -> Tuple[Exchange, int, Mapping[str, Tuple[str, ...]]]:
        """The exchange a request names, bound to the client's own ``view`` of what it was asked (never the
        server's word), checked against the run and roster, with its degree and graph."""
        if not self._roster:
            raise self._refuse("setup is not complete (no roster)")
        if self._get(request, "run_id", lambda v: isinstance(v, bytes), "bytes") != self._run_id:
            raise self._refuse("the request is for another run")
        self._get(request, "round", is_round, "an int in [0, 2^63 − 1]")  # before any digest encodes it
        try:
            cohort = _members_of(self._order, request.get("cohort"))
            exchange = _exchange_of(
                self._run_id, request.get("purpose"), request.get("round"), request.get("phase"), cohort, view
            )
            degree = int(self._get(request, "degree", is_int, "an int"))
            graph = _graph(exchange, degree)
        except (TypeError, ValueError) as error:
            raise self._refuse(f"malformed exchange ({error})") from None
        return exchange, int(degree), graph

    def degree_floor(self, count: int) -> int:
        """The least degree this client accepts for a graph over ``count`` members (at most ``count − 1``)."""
        return default_degree(count) if self.min_degree is None else min(self.min_degree, count - 1)

    def _check_degree(self, degree: int, count: int, what: str) -> None:
        """Refuse a graph the request made sparser than this client's own floor (never the server's word)."""
        floor = self.degree_floor(count)
        if degree < floor:
            raise self._refuse(f"the {what} of degree {degree} over {count} members is below its floor {floor}")

    def _check_excluded(self, exchange: Exchange, allow_here: bool) -> None:
        barred = sorted(
            c
            for c, at in self._excluded.items()
            if c in exchange.members and not (allow_here and at == exchange.digest)
        )
        if barred:
            raise self._refuse(f"{barred[:3]} dropped out or had b rebuilt earlier in this run and are excluded")

    def _check_neighbours(
        self, graph: Mapping[str, Tuple[str, ...]], survivors: FrozenSet[str], owner: Optional[str] = None
    ) -> None:
        """The neighbour rule (module docstring): refuse unless at least ``h = ⌊d/2⌋ + 1`` of the masking neighbours of
        this client (or of ``owner``, whose ``b`` share is asked) in this exchange's graph are among ``survivors``."""
        who = self.client_id if owner is None else owner
        neighbours = graph.get(who, ())
        alive = sum(p in survivors for p in neighbours)
        need = neighbour_floor(max(len(neighbours), 1))
        if alive < need:
            whose = "its own" if owner is None else f"{owner!r}'s"
            raise self._refuse(
                f"only {alive} of {whose} {len(neighbours)} masking neighbours survive, below h = {need} (⌊d/2⌋ + 1; "
                f"more than d − h = {len(neighbours) - need} dropped): the few that survive could all be colluders"
            )

    # -- setup --
    def advertise(self, request: Mapping[str, Any]) -> Dict[str, Any]:
        """Stage ``advertise``: ``{"run_id"}`` → ``{"s_pk", "c_pk"}`` (public keys only), with ``"signature"``
        (Ed25519 over :func:`~.identity.advertise_message`: tag, run id, this id, both keys) when the client has an
        identity. Binds the client to the run; asking again for the same run gives the same keys, for another run
        is refused."""
        run_id = self._get(request, "run_id", lambda v: isinstance(v, bytes) and len(v) >= 16, "bytes (≥ 16)")
        if self._run_id is not None and run_id != self._run_id:
            raise self._refuse("a SecAggClient serves one run; make a new one (fresh keys) for another run")
        self._run_id = run_id
        answer: Dict[str, Any] = {"s_pk": self._keys.public_bytes, "c_pk": self._c_pk}
        if self._identity is not None:
            message = advertise_message(run_id, self.client_id, self._keys.public_bytes, self._c_pk)
            answer["signature"] = self._identity.sign(message)
        return answer

    def _check_signatures(self, request: Mapping[str, Any], ids: Sequence[str], s_pk: Mapping, c_pk: Mapping) -> None:
        """With a roster: every party of the setup is on this client's own roster (no sybil) and signed the keys the
        server relays for it (no substituted key); the server's word is never taken. Refuses the whole setup."""
        if self._signers is None:
            return
        strangers = sorted(c for c in ids if c not in self._signers)
        if strangers:
            raise self._refuse(f"{strangers[:3]} are not on its roster (a party the federation did not agree on)")
        signatures = request.get("signatures") if isinstance(request, Mapping) else None
        if not isinstance(signatures, Mapping):
            raise self._refuse("the setup carries no signatures of the parties' keys (its roster requires them)")
        run_id = cast(bytes, self._run_id)
        for c in ids:
            signature = signatures.get(c)
            if not (isinstance(signature, bytes) and len(signature) == SIGNATURE_BYTES):
                raise self._refuse(f"the keys of {c!r} come without a signature")
            if not verify(self._signers[c], advertise_message(run_id, c, s_pk[c], c_pk[c]), signature):
                raise self._refuse(f"the keys of {c!r} are not signed by {c!r}'s roster key (substituted keys)")

    def share(self, request: Mapping[str, Any]) -> Dict[str, Any]:
        """Stage ``share``: ``{"run_id", "s_pk": {id: key}, "c_pk": {id: key}, "degree", "threshold"}`` →
        ``{"ciphertexts": {holder: bytes}}``, the encrypted Shamir shares of ``b``; once per run.

        Refused: a second call, another run, a roster without this client's own keys or with malformed ones,
        a threshold not in ``(d_s/2, d_s]``.
        """
        if (
            self._run_id is None
            or self._get(request, "run_id", lambda v: isinstance(v, bytes), "bytes") != self._run_id
        ):
            raise self._refuse("share before advertise, or for another run")
        if self._roster:
            raise self._refuse("the shares of b are made once per run")
        s_pk = self._get(request, "s_pk", lambda v: isinstance(v, Mapping), "a mapping id -> key")
        c_pk = self._get(request, "c_pk", lambda v: isinstance(v, Mapping), "a mapping id -> key")
        ids = sorted(s_pk) if all(isinstance(c, str) and c for c in s_pk) else None
        if ids is None or set(c_pk) != set(ids) or len(ids) < 2:
            raise self._refuse("the roster must name ≥ 2 clients, the same ones for both keys")
        if not all(_is_key(s_pk[c]) and _is_key(c_pk[c]) for c in ids):
            raise self._refuse(f"every roster key must be {PUBLIC_KEY_BYTES} raw bytes")
        if s_pk.get(self.client_id) != self._keys.public_bytes or c_pk.get(self.client_id) != self._c_pk:
            raise self._refuse("the roster does not carry this client's own public keys")
        self._check_signatures(request, ids, s_pk, c_pk)
        degree = self._get(request, "degree", is_int, "an int")
        threshold = self._get(request, "threshold", is_int, "an int")
        try:
            holders = _holders(self._run_id, tuple(ids), degree)[self.client_id]
        except ValueError as error:
            raise self._refuse(f"bad holder graph ({error})") from None
        self._check_degree(int(degree), len(ids), "share-holder graph")
        if not len(holders) < 2 * threshold <= 2 * len(holders):
            raise self._refuse(f"threshold {threshold} is not in (d/2, d] for {len(holders)} share holders")
        self._roster = {c: (s_pk[c], c_pk[c]) for c in ids}
        self._degree, self._threshold = int(degree), int(threshold)
        self._restore_keys()
        shares = split_secret(self._b, self._threshold, len(holders))
        return {
            "ciphertexts": {
                holder: encrypt_share(self._c_sk, c_pk[holder], self._run_id, self.client_id, holder, _SHARED, share)
                for holder, (_, share) in zip(holders, shares)
            }
        }

    def store(self, request: Mapping[str, Any]) -> Dict[str, Any]:
        """Stage ``store``: ``{"run_id", "ciphertexts": {sender: bytes}}`` → ``{"stored": [senders]}``, those whose
        share authenticated (sent by a client this one holds shares for, to this client, for this run)."""
        if not self._roster or self._get(request, "run_id", lambda v: isinstance(v, bytes), "bytes") != self._run_id:
            raise self._refuse("store before share, or for another run")
        ciphertexts = self._get(request, "ciphertexts", lambda v: isinstance(v, Mapping), "a mapping")
        stored = []
        for sender, ciphertext in ciphertexts.items():
            if sender not in self._holders.get(self.client_id, ()) or sender in self._held:
                continue
            try:
                share = decrypt_share(
                    # a roster comes with its run id (checked above)
                    self._c_sk,
                    self._roster[sender][1],
                    cast(bytes, self._run_id),
                    sender,
                    self.client_id,
                    _SHARED,
                    ciphertext,
                )
            except ShareDecryptionError:
                continue
            if len(share) == SHARE_BYTES:
                self._held[sender] = share
                stored.append(sender)
        return {"stored": sorted(stored)}

    # -- per exchange --
    def masked_input(self, request: Mapping[str, Any], codes: np.ndarray, view: bytes = b"") -> Dict[str, Any]:
        """Stage ``masked_input``: ``{"run_id", "purpose", "round", "phase", "cohort", "degree", "size",
        "s_pk": {neighbour: key}}`` and this client's ``uint64`` codes → ``{"tag": exchange digest, "masked"}``.
        The cohort is a :func:`members_bitmap` over the roster.

        :param codes: ``uint64`` array ``[size]``, the fixed-point codes to sum (e.g. from
            :meth:`~.wire.FixedPoint.encode`), given by the caller, never by the server.
        :param view: the caller's digest of the request it answers (:func:`~.wire.request_view`), bound into
            the exchange's tag; the same at the exchange's unmask.
        :raises SecAggRefused: a second answer for the run, purpose, round and phase; a cohort below
            ``min_cohort``, without this client, with a stranger or an excluded client; a neighbour key that
            is missing or differs from the roster; a size that is not the codes'.
        :raises TypeError: codes that are not a 1-D ``uint64`` array.
        """
        if not isinstance(codes, np.ndarray) or codes.dtype != np.uint64 or codes.ndim != 1:
            raise TypeError("SecAggClient.masked_input: codes must be a 1-D uint64 array (fixed-point codes)")
        exchange, degree, graph = self._exchange(request, view)
        self._check_degree(degree, len(exchange.cohort), "masking graph")
        slot = _slot(exchange)
        if slot in self._answered:
            raise self._refuse(
                f"it has answered {exchange.purpose!r} round {exchange.round} phase {exchange.phase!r} already"
            )
        if self.client_id not in exchange.members:
            raise self._refuse("it is not in the cohort")
        if len(exchange.cohort) < self.min_cohort:
            raise self._refuse(f"a cohort of {len(exchange.cohort)} is below its min_cohort = {self.min_cohort}")
        self._check_excluded(exchange, allow_here=False)
        if self._get(request, "size", is_int, "an int") != codes.size:
            raise self._refuse(f"the server expects {request['size']} codes, the caller gave {codes.size}")
        offered = self._get(request, "s_pk", lambda v: isinstance(v, Mapping), "a mapping")
        neighbours = graph[self.client_id]
        if any(p not in offered for p in neighbours):
            raise self._refuse("the request lacks a neighbour's public key")
        if any(self._roster.get(p, (None,))[0] != key for p, key in offered.items()):
            raise self._refuse("a public key differs from the roster of setup (substituted keys)")
        try:
            masked = mask(self._keys, self.client_id, {"q": codes}, exchange, offered, neighbours)["q"]
        except ValueError as error:
            raise self._refuse(str(error)) from None
        self._answered[slot] = _view(exchange, degree)
        self._masked_views[slot] = bytes(view)
        with np.errstate(over="ignore"):
            masked += keystream(self_mask_seed(self._b, exchange, self.client_id), codes.size)
        return {"tag": exchange.digest, "masked": masked}

    def colluders(self, cohort_size: int, request: Optional[Mapping[str, Any]] = None) -> int:
        """``c`` for a cohort of ``cohort_size``: this client's own :attr:`max_colluders` (or
        :func:`default_colluders`), raised to the request's ``"colluders"`` if that asks for more.

        :raises SecAggRefused: a request's ``"colluders"`` that is not an int ≥ 0.
        """
        own = self.max_colluders
        if own is None:
            own = default_colluders(cohort_size, max(self._threshold, 1))
        if request is not None and "colluders" in request:
            asked = request["colluders"]
            if not is_int(asked) or asked < 0:
                raise self._refuse("the request's 'colluders' must be an int ≥ 0")
            own = max(own, int(asked))
        return own

    def _survivor_floor(self, exchange: Exchange, degree: int, survivors: FrozenSet[str], request: Any) -> int:
        """Refuse a survivor set below this client's own floors; the quorum ``q`` it needs otherwise."""
        n = len(exchange.cohort)
        least = max(self._threshold, self.min_cohort)
        if len(survivors) < least:
            raise self._refuse(
                f"{len(survivors)} survivor(s) of {n} are fewer than its own floor {least} (the share threshold "
                f"t = {self._threshold}, its min_cohort = {self.min_cohort})"
            )
        smallest = _smallest_group(exchange, degree, exchange.members - survivors)
        if smallest < self.min_cohort:
            raise self._refuse(
                f"unmasking would reveal the sum of a group of {smallest} survivor(s), below its min_cohort = "
                f"{self.min_cohort}"
            )
        needed = quorum(n, self.colluders(n, request))
        if len(survivors) < needed:
            raise self._refuse(
                f"{len(survivors)} survivor(s) of {n} cannot reach its quorum of {needed} signers "
                f"(c = {self.colluders(n, request)} colluders assumed)"
            )
        return needed

    def _message(self, exchange: Exchange, survivors: FrozenSet[str]) -> Callable[[str], bytes]:
        """``signer -> the consistency message`` for ``survivors`` of ``exchange`` (:mod:`.identity`)."""
        run_id, cohort = cast(bytes, self._run_id), members_digest(exchange.members)
        chosen = members_digest(survivors)
        return lambda signer: consistency_message(run_id, exchange.digest, cohort, chosen, signer)

    def consistency(self, request: Mapping[str, Any]) -> Dict[str, Any]:
        """Stage ``consistency`` (with a roster; Bonawitz et al.'s ConsistencyCheck): the exchange's fields and
        ``"survivors"`` (``S``, a :func:`members_bitmap`), optionally ``"colluders"`` (a larger ``c``) →
        ``{"tag", "signature"}``: this client's Ed25519 signature of :func:`~.identity.consistency_message` (run id,
        exchange digest, cohort, ``S``, its id).

        A client signs **at most one survivor set per exchange** (kept in :meth:`to_state`, so a restarted client
        cannot be made to sign a second one; asked again for the same set, it signs the same), and only a set that
        names itself, of an exchange it sent its masked input for (the same cohort, degree and view), within the
        cohort, with no client excluded earlier, and that meets its own floors (its share threshold, ``min_cohort``
        for every survivor group, and the quorum it will require at the unmask).

        :raises SecAggRefused: any of the above, no signing key, or a malformed request.
        """
        if self._identity is None:
            raise self._refuse("it has no signing key (unauthenticated mode), so it signs no survivor set")
        probe, _, _ = self._exchange(request)
        slot = _slot(probe)
        if slot not in self._masked_views:
            raise self._refuse("it sent no masked input for this exchange, so it signs no survivor set")
        exchange, degree, graph = self._exchange(request, self._masked_views[slot])
        if self._answered.get(slot) != _view(exchange, degree):
            raise self._refuse("it masked for another cohort or degree in this round and phase")
        try:
            survivors = frozenset(_members_of(self._order, request.get("survivors")))
        except (TypeError, ValueError) as error:
            raise self._refuse(f"malformed survivor set ({error})") from None
        if not survivors <= exchange.members:
            raise self._refuse("'survivors' names clients outside the cohort")
        if self.client_id not in survivors:
            raise self._refuse("it sent its masked input, so it signs no survivor set without itself")
        self._check_excluded(exchange, allow_here=True)
        self._survivor_floor(exchange, degree, survivors, request)
        self._check_neighbours(graph, survivors)
        chosen = members_digest(survivors)
        if self._signed.setdefault(slot, chosen) != chosen:
            raise self._refuse("it signed another survivor set for this exchange (one set per exchange)")
        signature = self._identity.sign(self._message(exchange, survivors)(self.client_id))
        return {"tag": exchange.digest, "signature": signature}

    def _check_certificate(
        self, request: Mapping[str, Any], exchange: Exchange, degree: int, survivors: FrozenSet[str]
    ) -> None:
        """With a roster: the unmask's survivor set ``S = U \\ D`` carries valid signatures of a quorum of the cohort
        (``"signers"``: a bitmap over the roster, ``"signatures"``: their 64-byte signatures concatenated in roster
        order), each verified against this client's **own** roster, and ``S`` is the set it signed, if it signed one
        (module docstring: why a quorum, and which)."""
        if self._signers is None:
            return
        try:
            signers = _members_of(self._order, request.get("signers"))
            blob = request.get("signatures")
            if not isinstance(blob, bytes) or len(blob) != SIGNATURE_BYTES * len(signers):
                raise ValueError(f"{len(signers)} signatures of {SIGNATURE_BYTES} bytes")
        except (TypeError, ValueError) as error:
            raise self._refuse(f"the unmask carries no well-formed survivor-set signatures ({error})") from None
        chosen, slot = members_digest(survivors), _slot(exchange)
        if self._signed.get(slot, chosen) != chosen:
            raise self._refuse("it signed another survivor set for this exchange; it reveals under that one only")
        needed = self._survivor_floor(exchange, degree, survivors, request)
        key = (self._roster_hash, self._run_id, exchange.digest, chosen, signers, blob, needed)
        valid = _CERTIFIED.get(key)
        if valid is None:
            pairs = ((c, blob[k * SIGNATURE_BYTES : (k + 1) * SIGNATURE_BYTES]) for k, c in enumerate(signers))
            valid = certified_signers(self._signers, pairs, survivors, self._message(exchange, survivors), needed)
            if len(_CERTIFIED) >= 16:
                _CERTIFIED.pop(next(iter(_CERTIFIED)), None)
            _CERTIFIED[key] = valid
        if len(valid) < needed:
            raise self._refuse(
                f"the survivor set carries {len(valid)} valid signature(s) of cohort members on its roster; "
                f"its quorum is {needed} of {len(exchange.cohort)}"
            )
        self._signed[slot] = chosen  # it reveals under this set only, and will sign no other

    def unmask(self, request: Mapping[str, Any], view: bytes = b"") -> Dict[str, Any]:
        """Stage ``unmask``: the exchange's fields and ``"dropped"`` (``D``, a :func:`members_bitmap`; survivors
        ``S = U \\ D``), with what is asked: ``"seed"`` (bool, this client's self-mask seed), ``"pads"``
        (neighbours whose pad seed with this client is asked), ``"b_shares"`` (clients whose ``b`` share is
        asked), and with a roster ``"signers"`` and ``"signatures"`` (the consistency round's certificate of
        ``S``) → ``{"tag", "seed"?, "pads": {peer: seed}, "b_shares": {client: share}}``.

        :raises SecAggRefused: (module docstring) another view of an exchange already unmasked; an exchange
            (cohort, degree) other than the one it masked for in this slot; the own seed while listed as dropped
            or for an exchange not answered; a pad with a neighbour unless exactly one of the pair is dropped; a
            ``b`` share of a dropped client, of itself or one not held; a survivor group smaller than
            ``min_cohort``; a cohort with a client excluded before; with a roster, a survivor set below its share
            threshold, without a quorum of valid signatures, or other than the one it signed.
        """
        exchange, degree, graph = self._exchange(request, view)
        try:
            dropped = set(_members_of(self._order, request.get("dropped")))
            pads, b_shares = _ids(request.get("pads", [])), _ids(request.get("b_shares", []))
        except (TypeError, ValueError) as error:
            raise self._refuse(f"malformed unmask request ({error})") from None
        want_seed = self._get(request, "seed", lambda v: isinstance(v, bool), "a bool")
        if not dropped <= exchange.members:
            raise self._refuse("'dropped' names clients outside the cohort")
        survivors = exchange.members - dropped
        view = _view(exchange, degree, dropped)
        if self._views.get(exchange.digest, view) != view:
            raise self._refuse("it was shown another set of drop-outs (or degree) for this exchange before")
        answered = self._answered.get(_slot(exchange))
        if answered is not None and answered != _view(exchange, degree):
            raise self._refuse("it masked for another cohort or degree in this round and phase")
        self._check_excluded(exchange, allow_here=True)
        smallest = _smallest_group(exchange, degree, frozenset(dropped))
        if smallest < self.min_cohort:
            raise self._refuse(
                f"unmasking would reveal the sum of a group of {smallest} survivor(s), below its min_cohort = "
                f"{self.min_cohort}"
            )
        if self.client_id in survivors:
            self._check_neighbours(graph, frozenset(survivors))
        self._check_certificate(request, exchange, degree, frozenset(survivors))
        me = self.client_id
        if want_seed:
            if me not in survivors:
                raise self._refuse("it is listed as dropped, so it does not reveal its self-mask seed")
            if answered is None:
                raise self._refuse("it sent no masked input for this exchange")
        for peer in pads:
            if peer not in graph.get(me, ()) or (me in dropped) == (peer in dropped):
                raise self._refuse(f"a pad with {peer!r} is given only to remove a neighbour pair with one end dropped")
        if b_shares and self._signers is not None:
            raise self._refuse(
                "with a roster no share of anyone's b is given: b serves the whole run, so a b rebuilt in one exchange "
                "and pads revealed in another (before or after) would unmask an input"
            )
        for owner in b_shares:
            if owner not in survivors or owner == me or owner not in self._held:
                raise self._refuse(f"a share of {owner!r}'s b is given only for another listed survivor it holds")
            self._check_neighbours(graph, frozenset(survivors), owner)
        try:
            pad_seeds = {p: self._keys.pad_seed(me, p, self._roster[p][0], exchange) for p in pads}
        except ValueError as error:
            raise self._refuse(str(error)) from None
        self._views[exchange.digest] = view
        for owner in (*dropped, *b_shares):
            self._excluded.setdefault(owner, exchange.digest)
        answer: Dict[str, Any] = {
            "tag": exchange.digest,
            "pads": pad_seeds,
            "b_shares": {owner: self._held[owner] for owner in b_shares},
        }
        if want_seed:
            answer["seed"] = self_mask_seed(self._b, exchange, me)
        return answer

    def respond(
        self, stage: str, request: Mapping[str, Any], codes: Optional[np.ndarray] = None, view: bytes = b""
    ) -> Dict[str, Any]:
        """The answer to ``request`` at ``stage`` (one of :data:`~..protocol.transport.PROTOCOL_STAGES`); ``codes``
        only for ``masked_input``, ``view`` (the caller's digest of the request answered) for ``masked_input`` and
        ``unmask``."""
        if stage == "masked_input":
            return self.masked_input(request, codes, view)  # type: ignore[arg-type]  # the encoder passes codes
        if stage == "unmask":
            return self.unmask(request, view)
        handler = {
            "advertise": self.advertise,
            "share": self.share,
            "store": self.store,
            "consistency": self.consistency,
        }
        if stage not in handler:
            raise self._refuse(f"unknown stage {stage!r}; expected one of {PROTOCOL_STAGES}")
        return handler[stage](request)

    # -- state: the client's memory across restarts --
    def to_state(self) -> Dict[str, bytes]:
        """Everything this client needs after a restart, as ``{name: bytes}`` (e.g. Flower's ``Context.state``).

        It holds the private keys, ``b`` and the shares of others' ``b``: keep it in the client's memory only,
        never on disk or in a checkpoint, and never send it. The signing key and the roster are not in it (the
        party's own configuration, given again to :meth:`from_state`); only the roster's digest is, so a restore
        without the same roster is refused.
        """
        record = {
            "client_id": self.client_id,
            "min_cohort": self.min_cohort,
            "min_degree": self.min_degree,
            "max_colluders": self.max_colluders,
            "degree": self._degree,
            "threshold": self._threshold,
            "roster": {c: [s.hex(), e.hex()] for c, (s, e) in self._roster.items()},
            "held": {c: v.hex() for c, v in self._held.items()},
            "answered": {k.hex(): v.hex() for k, v in self._answered.items()},
            "masked_views": {k.hex(): v.hex() for k, v in self._masked_views.items()},
            "signed": {k.hex(): v.hex() for k, v in self._signed.items()},
            "views": {k.hex(): v.hex() for k, v in self._views.items()},
            "excluded": {c: v.hex() for c, v in self._excluded.items()},
            "roster_digest": self._roster_hash,  # so a restore must give the same roster
        }
        return {
            "format": _STATE_FORMAT,
            "secrets": self._s_sk + self._c_sk + self._b,
            "run_id": self._run_id or b"",
            "record": json.dumps(record, sort_keys=True).encode(),
        }

    @classmethod
    def from_state(
        cls,
        state: Mapping[str, bytes],
        *,
        identity: Optional[Ed25519PrivateKey] = None,
        roster: Optional[Mapping[str, bytes]] = None,
    ) -> "SecAggClient":
        """The client :meth:`to_state` saved, with its answered-once record and exclusions, under the party's own
        ``identity`` and ``roster`` (as for the constructor; never from the state).

        :raises ValueError: a state of another format, or malformed; a roster other than the one it was saved with
            (or none where it had one, or one where it had none).
        """
        try:
            if state["format"] != _STATE_FORMAT or not _is_key(state["secrets"], 96):
                raise ValueError("format")
            record = json.loads(state["record"].decode())
            client = cls(
                record["client_id"],
                min_cohort=record["min_cohort"],
                min_degree=record.get("min_degree"),
                identity=identity,
                roster=roster,
                max_colluders=record["max_colluders"],
            )
            if client._roster_hash != record.get("roster_digest", ""):
                raise ValueError("the state was saved under another roster (or with/without one); give the same")
            secret = state["secrets"]
            client._s_sk, client._c_sk, client._b = secret[:32], secret[32:64], secret[64:]
            client._run_id = bytes(state["run_id"]) or None
            client._degree, client._threshold = int(record["degree"]), int(record["threshold"])
            client._roster = {c: (bytes.fromhex(s), bytes.fromhex(e)) for c, (s, e) in record["roster"].items()}
            client._held = {c: bytes.fromhex(v) for c, v in record["held"].items()}
            client._answered = {bytes.fromhex(k): bytes.fromhex(v) for k, v in record["answered"].items()}
            client._masked_views = {bytes.fromhex(k): bytes.fromhex(v) for k, v in record["masked_views"].items()}
            client._signed = {bytes.fromhex(k): bytes.fromhex(v) for k, v in record["signed"].items()}
            client._views = {bytes.fromhex(k): bytes.fromhex(v) for k, v in record["views"].items()}
            client._excluded = {c: bytes.fromhex(v) for c, v in record["excluded"].items()}
            client._restore_keys()
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise ValueError(f"SecAggClient.from_state: not a secure-aggregation client state ({error!r})") from None
        return client


# --- the server ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SetupReport:
    """The one-off setup: who is in, the holder graph, and what it cost in bytes (:func:`payload_bytes`)."""

    roster: Tuple[str, ...]
    eligible: Tuple[str, ...]
    degree: int
    threshold: int
    excluded: Dict[str, str]
    bytes_to_clients: int
    bytes_from_clients: int


@dataclass(frozen=True)
class SecureSum:
    """One exchange's result: ``total = Σ_{i ∈ survivors} codes_i mod 2^64`` (``uint64`` ``[size]``)."""

    total: np.ndarray
    survivors: Tuple[str, ...]
    dropped: Dict[str, str]  # excluded from now on
    recovered: Tuple[str, ...] = ()  # survivors whose b was rebuilt (excluded from now on)
    bytes_to_clients: int = 0
    bytes_from_clients: int = 0


class _Bad(Exception):
    """A client's response that fails validation (the client is treated as not having answered)."""


def _expect(condition: bool, why: str) -> None:
    if not condition:
        raise _Bad(why)


class SecAggServer:
    """The server's side for one run: setup once, then :meth:`secure_sum` per exchange.

    :param run_id: the run's id, fresh from the OS (:func:`~gpflow_fed.randomness.new_run_id`, ≥ 16 bytes).
    :param degree: the holder graph's degree ``d_s`` (at most the roster's size − 1); ``None``:
        :func:`default_degree` of the roster.
    :param threshold: ``t`` with ``d_s/2 < t ≤ d_s``; ``None``: ``⌊d_s/2⌋ + 1``.
    :param min_survivors: the server's own minimum (≥ 2) of survivors, and of each survivor group whose sum
        unmasking reveals; clients enforce their own ``min_cohort`` besides.
    :param colluders: the collusion bound ``c`` the server asks the clients to assume in the consistency round
        (each client takes the larger of this and its own); None: asks nothing, and expects the clients'
        :func:`default_colluders` quorum.
    """

    def __init__(
        self,
        run_id: bytes,
        *,
        degree: Optional[int] = None,
        threshold: Optional[int] = None,
        min_survivors: int = 2,
        colluders: Optional[int] = None,
    ) -> None:
        if not isinstance(run_id, bytes) or len(run_id) < 16:
            raise ValueError("SecAggServer: run_id must be ≥ 16 bytes from the OS (use new_run_id())")
        for name, value in (("degree", degree), ("threshold", threshold)):
            if value is not None and (not is_int(value) or value < 1):
                raise ValueError(f"SecAggServer: {name} must be None or an int ≥ 1, got {value!r}")
        if not is_int(min_survivors) or min_survivors < 2:
            raise ValueError(f"SecAggServer: min_survivors must be an int ≥ 2, got {min_survivors!r}")
        if colluders is not None and (not is_int(colluders) or colluders < 0):
            raise ValueError(f"SecAggServer: colluders must be None or an int ≥ 0, got {colluders!r}")
        self.colluders = None if colluders is None else int(colluders)
        #: whether every party signed its keys at setup: then each exchange runs the consistency round
        self.authenticated = False
        self.run_id, self.min_survivors = run_id, int(min_survivors)
        self._degree, self._threshold = degree, threshold
        self.threshold = 0
        self.roster: Dict[str, Tuple[bytes, bytes]] = {}
        self._order: Tuple[str, ...] = ()
        self.holders: Dict[str, Tuple[str, ...]] = {}
        self.stored: Dict[str, FrozenSet[str]] = {}  # client -> holders that stored its share of b
        self.excluded: Dict[str, str] = {}  # client -> why it takes no further part in the run

    @property
    def eligible(self) -> Tuple[str, ...]:
        """Clients that completed setup and were not excluded since."""
        return tuple(c for c in sorted(self.roster) if c not in self.excluded)

    @staticmethod
    def _ask(stage: str, requests: Dict[str, Dict[str, Any]], tally: List[int]) -> Stages:
        """One stage: yield ``(stage, requests)``, receive the answers, keep those asked (generator)."""
        answers = yield stage, requests
        if not isinstance(answers, Mapping):
            raise TypeError(f"secure aggregation: send({stage!r}, ...) must return a mapping client -> response")
        picked = {c: answers.get(c) for c in requests}
        tally[0] += sum(payload_bytes(r) for r in requests.values())
        tally[1] += sum(payload_bytes(r) for r in picked.values())
        return picked

    def setup_stages(self, clients: Sequence[str]) -> Stages:
        """Stages ``advertise``, ``share`` and ``store`` over ``clients``; once per run. A generator: it yields
        ``(stage, {client: request})``, is sent ``{client: answer or None}`` back, and returns the
        :class:`SetupReport` (the caller drives it, so the protocol never calls back into the caller).

        A client that does not answer, answers malformed data, presents a key another client presents, or
        whose share reached fewer than ``t`` holders is excluded (with the reason in :attr:`excluded`).

        :raises RuntimeError: a second setup.
        :raises ValueError: malformed ``clients`` or an invalid threshold for the holder graph.
        :raises SecAggAborted: fewer than two clients with valid keys.
        """
        if self.roster:
            raise RuntimeError("SecAggServer.setup runs once per run; start a new run (new run id) to set up again")
        ids = _ids(list(clients))
        tally = [0, 0]
        answers = yield from self._ask("advertise", {c: {"run_id": self.run_id} for c in ids}, tally)
        keys: Dict[str, Tuple[bytes, bytes]] = {}
        signatures: Dict[str, bytes] = {}
        for c in ids:
            a = answers[c]
            if isinstance(a, Mapping) and _is_key(a.get("s_pk")) and _is_key(a.get("c_pk")):
                keys[c] = (a["s_pk"], a["c_pk"])
                if _is_key(a.get("signature"), SIGNATURE_BYTES):
                    signatures[c] = a["signature"]  # relayed as given: each client checks it against its roster
            else:
                self.excluded[c] = "setup: no valid public keys advertised"
        seen: Dict[bytes, List[str]] = {}
        for c, pair in keys.items():
            for key in pair:
                seen.setdefault(key, []).append(c)
        for owners in seen.values():
            if len(owners) > 1:
                for c in owners:
                    self.excluded[c] = "setup: presents a public key used twice"
                    keys.pop(c, None)
        roster = sorted(keys)
        if len(roster) < 2:
            raise SecAggAborted(f"secure aggregation setup: {len(roster)} client(s) with valid keys, need ≥ 2")
        degree = min(self._degree, len(roster) - 1) if self._degree is not None else default_degree(len(roster))
        holders = _holders(self.run_id, tuple(roster), degree)
        d = len(holders[roster[0]])
        t = self._threshold if self._threshold is not None else d // 2 + 1
        if not d < 2 * t <= 2 * d:
            raise ValueError(f"SecAggServer: threshold {t} is not in (d/2, d] for {d} share holders per client")
        self.roster, self.holders, self.threshold = keys, dict(holders), t
        self._order = tuple(roster)
        self.authenticated = all(c in signatures for c in roster)
        request = {
            "run_id": self.run_id,
            "s_pk": {c: keys[c][0] for c in roster},
            "c_pk": {c: keys[c][1] for c in roster},
            "degree": degree,
            "threshold": t,
        }
        if signatures:
            request["signatures"] = {c: signatures[c] for c in roster if c in signatures}
        answers = yield from self._ask("share", {c: request for c in roster}, tally)
        ciphertexts: Dict[str, Mapping[str, bytes]] = {}
        for c in roster:
            a = answers[c]
            cts = a.get("ciphertexts") if isinstance(a, Mapping) else None
            if (
                isinstance(cts, Mapping)
                and set(cts) == set(holders[c])
                and all(isinstance(v, bytes) and len(v) == _CIPHERTEXT for v in cts.values())
            ):
                ciphertexts[c] = cts
            else:
                self.excluded[c] = "setup: no valid encrypted shares"
        requests = {
            h: {"run_id": self.run_id, "ciphertexts": {i: ciphertexts[i][h] for i in holders[h] if i in ciphertexts}}
            for h in roster
        }
        answers = yield from self._ask("store", requests, tally)
        stored: Dict[str, set] = {i: set() for i in ciphertexts}
        for h in roster:
            a = answers[h]
            names = a.get("stored") if isinstance(a, Mapping) else None
            if isinstance(names, (list, tuple)):
                for i in set(names) & set(requests[h]["ciphertexts"]):
                    stored[i].add(h)
        self.stored = {i: frozenset(s) for i, s in stored.items()}
        for i, holders_i in self.stored.items():
            if len(holders_i) < t:
                self.excluded[i] = f"setup: only {len(holders_i)} of its {d} share holders stored its shares (t = {t})"
        return SetupReport(
            roster=tuple(roster),
            eligible=self.eligible,
            degree=d,
            threshold=t,
            excluded=dict(self.excluded),
            bytes_to_clients=tally[0],
            bytes_from_clients=tally[1],
        )

    def _consistency(
        self, exchange: Exchange, base: Mapping[str, Any], survivors: Sequence[str], tally: List[int]
    ) -> Generator[Tuple[str, Dict[str, Dict[str, Any]]], Mapping[str, Any], Dict[str, bytes]]:
        """Stage ``consistency``: every survivor is shown the survivor set and signs it; returns the well-formed
        signatures (the server cannot verify them: each client checks them against its own roster).

        :raises SecAggAborted: fewer signatures than the quorum the clients will require.
        """
        ask: Dict[str, Any] = {**base, "survivors": members_bitmap(self._order, survivors)}
        if self.colluders is not None:
            ask["colluders"] = self.colluders
        answers = yield from self._ask("consistency", {c: ask for c in survivors}, tally)
        certificate: Dict[str, bytes] = {}
        for c in survivors:
            a = answers[c]
            if (
                isinstance(a, Mapping)
                and a.get("tag") == exchange.digest
                and _is_key(a.get("signature"), SIGNATURE_BYTES)
            ):
                certificate[c] = a["signature"]
        n = len(exchange.cohort)
        bound = max(default_colluders(n, self.threshold), self.colluders or 0)
        needed = quorum(n, bound)
        if len(certificate) < needed:
            raise SecAggAborted(
                f"secure aggregation: {len(certificate)} of {len(survivors)} survivors signed the survivor set, below "
                f"the quorum of {needed} of {n} (c = {bound}); nothing is unmasked"
            )
        return certificate

    def secure_sum_stages(self, exchange: Exchange, size: int, *, degree: Optional[int] = None) -> Stages:
        """``Σ_{i∈S} codes_i mod 2^64`` over the survivors ``S`` of ``exchange.cohort`` (stages ``masked_input``,
        ``consistency`` when every party signed its keys at setup (:attr:`authenticated`), ``unmask``, and
        ``unmask`` again for the ``b`` shares of survivors that did not answer it).

        Every response is validated; an invalid one counts as no answer. Dropped clients, and survivors whose
        ``b`` is rebuilt, are excluded for the rest of the run (:attr:`excluded`) as soon as they are named.

        :param exchange: the exchange (this run's id; a cohort of eligible clients, fixed after fault screening).
        :param size: P, the number of ``uint64`` codes each client sums.
        :param degree: the masking graph's degree; ``None``: :func:`default_degree` of the cohort.
        :raises ValueError: an exchange of another run, a cohort with ineligible clients or below
            ``min_survivors``, or a bad ``size``.
        :raises SecAggAborted: fewer survivors than ``min_survivors``, a survivor group below it, fewer signatures of
            the survivor set than the quorum, a pad whose two ends are both gone, or a rebuilt ``b`` with fewer than
            ``t`` shares (nothing is released then).
        """
        if not isinstance(exchange, Exchange) or exchange.run_id != self.run_id:
            raise ValueError("secure_sum: the exchange must be an Exchange of this run (same run_id)")
        if not self.roster:
            raise ValueError("secure_sum: run setup() first")
        ineligible = sorted(c for c in exchange.cohort if c not in self.roster or c in self.excluded)
        if ineligible:
            reasons = {c: self.excluded.get(c, "not in the roster") for c in ineligible[:3]}
            raise ValueError(f"secure_sum: cohort members are not eligible in this run: {reasons}")
        if len(exchange.cohort) < self.min_survivors:
            raise ValueError(
                f"secure_sum: a cohort of {len(exchange.cohort)} is below min_survivors = {self.min_survivors}"
            )
        if not is_int(size) or size < 1:
            raise ValueError(f"secure_sum: size must be an int ≥ 1, got {size!r}")
        d = degree if degree is not None else default_degree(len(exchange.cohort))
        graph = _graph(exchange, d)
        digest, tally = exchange.digest, [0, 0]
        base = {
            "run_id": self.run_id,
            "purpose": exchange.purpose,
            "round": exchange.round,
            "phase": exchange.phase,
            "cohort": members_bitmap(self._order, exchange.cohort),
            "degree": d,
        }
        requests: Dict[str, Dict[str, Any]] = {
            c: {**base, "size": size, "s_pk": {p: self.roster[p][0] for p in graph[c]}} for c in exchange.cohort
        }
        answers = yield from self._ask("masked_input", requests, tally)
        masked: Dict[str, np.ndarray] = {}
        dropped: Dict[str, str] = {}
        for c in exchange.cohort:
            a = answers[c]
            if a is None:
                dropped[c] = "no masked input"
                continue
            y = a.get("masked") if isinstance(a, Mapping) else None
            if not isinstance(a, Mapping):
                dropped[c] = "malformed answer"
            elif a.get("tag") != digest:
                dropped[c] = "masked input for another exchange (stale or replayed)"
            elif not (isinstance(y, np.ndarray) and y.dtype == np.uint64 and y.shape == (size,)):
                dropped[c] = f"masked input is not a uint64 array of {size} codes"
            else:
                masked[c] = y
        survivors = sorted(masked)
        if len(survivors) < self.min_survivors:
            raise SecAggAborted(
                f"secure aggregation: {len(survivors)} survivor(s) of {len(exchange.cohort)}, below min_survivors = "
                f"{self.min_survivors}; the sum is not unmasked"
            )
        smallest = _smallest_group(exchange, d, frozenset(dropped))
        if smallest < self.min_survivors:
            raise SecAggAborted(
                f"secure aggregation: the drop-outs split the survivors into a group of {smallest}, below "
                f"min_survivors = {self.min_survivors}; its sum would be revealed, so nothing is unmasked"
            )
        short = _short_of_neighbours(exchange, d, frozenset(dropped))
        if short:
            who, alive, deg = short[0]
            raise SecAggAborted(
                f"secure aggregation: survivor {who!r} keeps {alive} of its {deg} masking neighbours, below "
                f"h = {neighbour_floor(deg)} (⌊d/2⌋ + 1): more than d − h of them dropped out, so it reveals nothing "
                f"({len(short)} survivor(s) so placed); nothing is unmasked"
            )
        for j, why in dropped.items():
            self.excluded[j] = f"dropped out of {exchange.purpose!r} round {exchange.round} ({why})"
        unmask = {**base, "dropped": members_bitmap(self._order, dropped)}
        if self.authenticated:
            certificate = yield from self._consistency(exchange, base, survivors, tally)
            unmask["signers"] = members_bitmap(self._order, certificate)
            unmask["signatures"] = b"".join(certificate[c] for c in sorted(certificate))
        requests = {c: {**unmask, "seed": True, "pads": [p for p in graph[c] if p in dropped]} for c in survivors}
        for j in sorted(dropped):
            peers = [p for p in graph[j] if p in masked]
            if peers:
                requests[j] = {**unmask, "seed": False, "pads": peers}
        answers = yield from self._ask("unmask", requests, tally)
        seeds: Dict[str, bytes] = {}
        pads: Dict[Tuple[str, str], bytes] = {}  # (survivor, dropped) -> pad seed
        for c, request in requests.items():
            try:
                a = answers[c]
                _expect(isinstance(a, Mapping) and a.get("tag") == digest, "no answer for this exchange")
                got = a.get("pads")
                _expect(isinstance(got, Mapping) and set(got) == set(request["pads"]), "wrong pads")
                _expect(all(_is_key(v, PAD_SEED_BYTES) for v in got.values()), "malformed pads")
                _expect(not a.get("b_shares"), "unrequested shares")
                if request["seed"]:
                    _expect(_is_key(a.get("seed"), PAD_SEED_BYTES), "malformed seed")
            except _Bad:
                continue
            if request["seed"]:
                seeds[c] = a["seed"]
            for p, value in got.items():
                pair = (c, p) if c in masked else (p, c)
                if pads.setdefault(pair, value) != value:
                    raise SecAggAborted(f"secure aggregation: the two ends of pair {pair} gave different pad seeds")
        lost = sorted((i, j) for j in dropped for i in graph[j] if i in masked and (i, j) not in pads)
        if lost:
            raise SecAggAborted(
                f"secure aggregation: the pads of survivor/dropped pair(s) {lost[:3]} are lost (both ends left before "
                "unmasking); the sum cannot be recovered"
            )
        late = [c for c in survivors if c not in seeds]
        if late and self.authenticated:
            raise SecAggAborted(
                f"secure aggregation: survivor(s) {late[:3]} did not unmask, and with a roster no self-mask seed b is "
                "rebuilt (its holders refuse): the sum cannot be recovered"
            )
        if late:
            requests = {}
            for i in late:
                for h in sorted(self.stored.get(i, ())):
                    requests.setdefault(h, {**unmask, "seed": False, "pads": [], "b_shares": []})["b_shares"].append(i)
            for i in late:
                self.excluded[i] = f"its self-mask seed b was rebuilt in {exchange.purpose!r} round {exchange.round}"
            answers = yield from self._ask("unmask", requests, tally)
            shares: Dict[str, List[Tuple[int, bytes]]] = {i: [] for i in late}
            for h, request in requests.items():
                a = answers[h]
                got = a.get("b_shares") if isinstance(a, Mapping) and a.get("tag") == digest else None
                if not isinstance(got, Mapping) or set(got) != set(request["b_shares"]):
                    continue
                if not all(_is_key(v, SHARE_BYTES) for v in got.values()):
                    continue
                for i, value in got.items():
                    shares[i].append((self.holders[i].index(h) + 1, value))
            for i in late:
                try:
                    seeds[i] = self_mask_seed(combine_shares(shares[i], self.threshold), exchange, i)
                except ShamirError as error:
                    raise SecAggAborted(
                        f"secure aggregation: survivor {i!r} did not unmask and its b cannot be rebuilt: {error}"
                    ) from None
        total = np.zeros(size, dtype=np.uint64)
        for c in survivors:
            total += masked[c]  # uint64 arithmetic wraps modulo 2^64
            total -= keystream(seeds[c], size)
        for (i, j), seed in pads.items():
            if i < j:
                total -= keystream(seed, size)
            else:
                total += keystream(seed, size)
        return SecureSum(
            total=total,
            survivors=tuple(survivors),
            dropped=dropped,
            recovered=tuple(late),
            bytes_to_clients=tally[0],
            bytes_from_clients=tally[1],
        )
