"""Secure aggregation by pairwise additive masking over a sparse masking graph, with X25519 pair secrets.

Protocol (Bonawitz et al., "Practical Secure Aggregation for Privacy-Preserving Machine Learning", CCS 2017,
doi:10.1145/3133956.3133982: pairwise masks as one-time pads; the sparse graph of Bell et al., "Secure Single-Server
Aggregation with (Poly)Logarithmic Overhead", CCS 2020, doi:10.1145/3372297.3417885).
Without the secret-sharing layer that recovers from drop-outs: a member that does not answer after masking
leaves its pads in the sum, so the cohort must be fixed before masking (see :class:`Exchange`).

For one exchange ``e`` (run, purpose, round, phase, cohort ``U``) every client ``i`` holds an X25519 key pair
``(sk_i, pk_i)`` (:class:`MaskingKeys`, the private key drawn from the OS and never serialised) and the masking
graph ``G_e`` (:func:`masking_graph`): a ``d``-regular graph on ``U``. For each edge ``{i, j}`` both ends
derive the same pad seed

    s_ij = HKDF-SHA256(X25519(sk_i, pk_j), info = SHA-256(tag(e)) ‖ min(i, j) ‖ max(i, j))   (32 bytes)

and expand it with AES-256-CTR into a pad ``PRG(s_ij) ∈ Z_{2^64}^P``. Client ``i`` encodes its payload in fixed
point, ``q_i = round(2^f x_i) mod 2^64`` (:class:`SecureAggregation`), and sends

    y_i = q_i + Σ_{j ∈ N(i), j > i} PRG(s_ij) − Σ_{j ∈ N(i), j < i} PRG(s_ij)   (mod 2^64)

(ids compared as strings). Every pad is added once and subtracted once, so ``Σ_{i∈U} y_i = Σ_{i∈U} q_i``
exactly, and the server decodes ``Σ_i x_i`` to the fixed-point resolution.

What it guarantees, and against whom:

* A curious server that follows the protocol knows the code, the run's seed, every public key, the graph
  and every ``y_i``, but no private key, so no ``s_ij`` (computational Diffie–Hellman on Curve25519, HKDF
  and AES as PRFs). For any set ``S`` of clients other than a whole connected component, ``Σ_{i∈S} y_i``
  keeps at least one pad across the cut and is uniform on ``Z_{2^64}^P``: the server learns the total only.
* Colluding clients learn the pads they share. The graph is a Harary graph (Harary, "The maximum
  connectivity of a graph", PNAS 48(7), 1962, doi:10.1073/pnas.48.7.1142), which is ``d``-connected:
  removing fewer than ``d`` members leaves the others connected, so the server with fewer than ``d``
  colluding clients still learns only the honest clients' total, whatever the graph's vertex order. ``d``
  colluders who are *all* of one client's neighbours can unmask it. The vertex order is a public hash of the
  run id and the cohort: colluders alone cannot choose whom they surround, but a server that colludes with
  them draws the run id and picks the cohort, so it can grind both until they surround a victim; against
  such a server the guarantee is the ``d``-connectivity above (fewer than ``d`` colluders in the cohort). With the
  drop-out recovery of :mod:`.secagg` a server can also declare a victim's honest neighbours dropped, and the
  bound there is ``h = ⌊d/2⌋ + 1`` colluders (its neighbour rule).
* Replays: ``s_ij`` depends on the whole exchange tag (run id, purpose, round, phase, cohort), so a message
  masked for one exchange does not cancel in another; :func:`check_exchange` rejects stale headers up
  front. A replay with a forged header is not detected by the server, but it makes the total meaningless
  rather than revealing anything.
* Not covered here: a server that substitutes public keys (the signed keys and roster of :mod:`.identity`
  stop it), drop-outs after masking (the secret sharing and consistency round of :mod:`.secagg`), and what
  the total itself reveals (with a cohort of two, each member learns the other's payload from the total;
  ``min_cohort`` bounds that).

Cost: ``d`` key agreements (cached for the run), ``d`` HKDFs and ``d`` pads of ``P`` words per client,
``O(d P)``; with the default ``d ≈ 2 ⌈log₂ K⌉`` a cohort of ``K`` costs ``O(K log K · P)`` instead of all
pairs' ``O(K² P)``.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from typing import Dict, FrozenSet, List, Mapping, NoReturn, Optional, Sequence, Tuple

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from ...randomness import check_insecure_seed

__all__ = [
    "Exchange",
    "MaskingKeys",
    "PAD_SEED_BYTES",
    "PUBLIC_KEY_BYTES",
    "SecureAggregation",
    "check_exchange",
    "check_senders",
    "from_limb_sums",
    "keystream",
    "mask",
    "masking_graph",
    "sum_masked",
    "to_limbs",
]

#: bytes of an X25519 public key (raw encoding)
PUBLIC_KEY_BYTES = 32
#: bytes of a pairwise pad seed (an AES-256 key)
PAD_SEED_BYTES = 32

_TAG_DOMAIN = b"gpflow-fed/secure-aggregation/exchange/v1"
_GRAPH_DOMAIN = b"gpflow-fed/secure-aggregation/graph/v2"
_PAD_DOMAIN = b"gpflow-fed/secure-aggregation/pad/v1"
_KEY_DOMAIN = b"gpflow-fed/secure-aggregation/insecure-test-key/v1"


def length_prefixed(data: bytes) -> bytes:
    """``len(data)`` as 8 big-endian bytes, then ``data``: concatenations of fields parse one way only."""
    return len(data).to_bytes(8, "big") + data


def is_int(value: object) -> bool:
    """Whether ``value`` is a Python or numpy integer (not a bool)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


# --- fixed point --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SecureAggregation:
    """Fixed-point encoding, the minimum cohort and the masking graph's degree (module docstring: protocol).

    :param fractional_bits: f, the fixed-point resolution is ``2^{-f}``; a cohort of K clients can sum
        values with ``|x| < 2^{63-f} / K`` (larger values raise ``ValueError`` on the client, before
        anything is sent). The default f = 32 gives a resolution of 2.3e-10 and a range of ±2.1e9 / K.
    :param min_cohort: the fewest clients whose payloads may be summed (≥ 2): a cohort of one would send its
        plain encoding, and the total of a small cohort says much about each member.
    :param degree: d, each client's number of neighbours in the masking graph (≥ 2, so that the graph is
        connected). ``None``: ``2 ⌈log₂ K⌉`` (as SecAgg+, Bell et al. 2020), which is all pairs for
        K ≤ 7 and K = 9. Fewer than ``d`` colluding clients cannot unmask anyone (with the drop-out recovery of
        :mod:`.secagg`, fewer than ``⌊d/2⌋ + 1``); see :func:`masking_graph`.
    :raises ValueError: a setting out of range.
    :raises TypeError: a setting that is not an ``int``.
    """

    fractional_bits: int = 32
    min_cohort: int = 2
    degree: Optional[int] = None

    def __post_init__(self) -> None:
        for name, low, high in (("fractional_bits", 1, 62), ("min_cohort", 2, None), ("degree", 2, None)):
            value = getattr(self, name)
            if name == "degree" and value is None:
                continue
            if not is_int(value):
                raise TypeError(f"SecureAggregation: {name} must be an int, got {type(value).__name__}")
            if value < low or (high is not None and value > high):
                what = f"in [{low}, {high}]" if high is not None else f"≥ {low}"
                raise ValueError(f"SecureAggregation: {name} must be {what}, got {value}")

    def check_cohort(self, cohort: Sequence[str]) -> Tuple[str, ...]:
        """``cohort`` as a tuple, if it has at least ``min_cohort`` distinct members.

        :raises ValueError: too few members (naming ``min_cohort``), or a repeated member.
        """
        members = tuple(cohort)
        if len(set(members)) != len(members):
            raise ValueError(f"secure aggregation: the cohort {members} names a client twice")
        if len(members) < self.min_cohort:
            raise ValueError(
                f"secure aggregation: a cohort of {len(members)} client(s) {members} is below "
                f"SecureAggregation(min_cohort={self.min_cohort}); their total would reveal too much about each "
                "member (one client would send its plain encoding), so the exchange is refused: sample more "
                "clients or lower min_cohort (≥ 2)"
            )
        return members

    def masking_degree(self, cohort_size: int) -> int:
        """The degree asked of :func:`masking_graph` for a cohort of ``cohort_size``: ``degree``, or
        ``2 ⌈log₂ K⌉``, at most ``K − 1`` (all pairs)."""
        if not is_int(cohort_size) or cohort_size < 2:
            raise ValueError(f"secure aggregation: a masking graph needs a cohort of ≥ 2, got {cohort_size!r}")
        wanted = self.degree if self.degree is not None else 2 * math.ceil(math.log2(cohort_size))
        return int(min(wanted, cohort_size - 1))

    def graph(self, exchange: "Exchange") -> Dict[str, Tuple[str, ...]]:
        """:func:`masking_graph` of ``exchange`` with :meth:`masking_degree`, after :meth:`check_cohort`."""
        self.check_cohort(exchange.cohort)
        return masking_graph(exchange, self.masking_degree(len(exchange.cohort)))


# --- limbs: 64-bit codes through transports that add floats or small integers -------------------------
def to_limbs(codes: np.ndarray, bits: int) -> np.ndarray:
    """``uint64`` codes ``[n]`` as ``⌈64/b⌉`` limbs of ``b`` bits, ``[⌈64/b⌉ n]`` float64 (limb-major).

    A transport that adds floats (or small integers) exactly can then sum 64-bit codes modulo 2^64: sum the
    limbs, then :func:`from_limb_sums`. A sum of K limb vectors is exact in float64 while ``K 2^b ≤ 2^53``.

    :raises ValueError: ``bits`` not an int in [1, 63].
    """
    _check_bits(bits)
    codes = np.asarray(codes, dtype=np.uint64).ravel()
    low = np.uint64((1 << bits) - 1)
    return np.concatenate([(codes >> np.uint64(bits * j)) & low for j in range(-(-64 // bits))]).astype(np.float64)


def from_limb_sums(limb_sums: np.ndarray, bits: int) -> np.ndarray:
    """``Σ_k code_k mod 2^64`` (``uint64`` ``[n]``) from the sums over k of :func:`to_limbs` (any K).

    :raises ValueError: ``bits`` not an int in [1, 63], or a length that is not a multiple of ``⌈64/b⌉``.
    """
    _check_bits(bits)
    flat = np.rint(np.asarray(limb_sums, dtype=np.float64)).ravel()
    count = -(-64 // bits)
    if flat.size % count:
        raise ValueError(f"from_limb_sums: {flat.size} limb sums are not a multiple of ⌈64/{bits}⌉ = {count}")
    sums = flat.astype(np.uint64).reshape(count, -1)
    total = np.zeros(sums.shape[1], dtype=np.uint64)
    for j, limb in enumerate(sums):
        total += limb << np.uint64(bits * j)  # uint64 arithmetic wraps modulo 2^64
    return total


def _check_bits(bits: int) -> None:
    if not is_int(bits) or not 1 <= bits <= 63:
        raise ValueError(f"limb bits must be an int in [1, 63], got {bits!r}")


# --- the exchange and its graph -----------------------------------------------------------------------
@dataclass(frozen=True)
class Exchange:
    """What one masked sum belongs to; every pad is bound to it through :attr:`tag`.

    :param run_id: the run's identifier, fresh from the OS per run
        (:func:`~gpflow_fed.randomness.new_run_id`), at least 16 bytes.
    :param purpose: e.g. ``"train"``, ``"evaluate"``, ``"final"``.
    :param round: the round number.
    :param phase: the phase name.
    :param cohort: the distinct client ids whose messages are summed (fixed before masking; its order does
        not matter).
    :param view: what the client was asked, as it saw it (:func:`~.wire.request_view`: the broadcast, the
        protection request, the cohort size); part of the tag, so the pads of two clients shown different requests
        do not cancel and their sum is noise (empty: not bound).
    :raises TypeError: a field of the wrong type.
    :raises ValueError: a short ``run_id``, an empty name, an empty cohort or a repeated member.
    """

    run_id: bytes
    purpose: str
    round: int
    phase: str
    cohort: Tuple[str, ...]
    view: bytes = b""

    def __post_init__(self) -> None:
        if not isinstance(self.run_id, bytes):
            raise TypeError(f"Exchange: run_id must be bytes (use new_run_id()), got {type(self.run_id).__name__}")
        if len(self.run_id) < 16:
            raise ValueError(f"Exchange: run_id must have ≥ 16 bytes (use new_run_id()), got {len(self.run_id)}")
        for name in ("purpose", "phase"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise TypeError(f"Exchange: {name} must be a non-empty str, got {value!r}")
        if not isinstance(self.view, bytes):
            raise TypeError(f"Exchange: view must be bytes, got {type(self.view).__name__}")
        if not is_int(self.round):
            raise TypeError(f"Exchange: round must be an int, got {type(self.round).__name__}")
        if isinstance(self.cohort, (str, bytes)):
            raise TypeError("Exchange: cohort must be a sequence of client ids, not one string")
        cohort = tuple(self.cohort)
        if not cohort:
            raise ValueError("Exchange: the cohort is empty")
        bad = [c for c in cohort if not isinstance(c, str) or not c]
        if bad:
            raise TypeError(f"Exchange: client ids must be non-empty str, got {bad[:3]!r}")
        if len(set(cohort)) != len(cohort):
            raise ValueError(f"Exchange: the cohort names a client twice: {cohort}")
        object.__setattr__(self, "cohort", cohort)
        object.__setattr__(self, "round", int(self.round))

    @cached_property
    def members(self) -> FrozenSet[str]:
        """The cohort as a set (membership checks in O(1))."""
        return frozenset(self.cohort)

    @cached_property
    def tag(self) -> bytes:
        """The canonical encoding: a domain label, then each field length-prefixed (the round as 8 signed
        big-endian bytes, the cohort sorted), so two different exchanges never share a tag."""
        members = sorted(self.cohort)
        parts = [
            length_prefixed(self.run_id),
            length_prefixed(self.purpose.encode("utf-8")),
            length_prefixed(self.round.to_bytes(8, "big", signed=True)),
            length_prefixed(self.phase.encode("utf-8")),
            length_prefixed(len(members).to_bytes(8, "big")),
            *(length_prefixed(m.encode("utf-8")) for m in members),
        ]
        if self.view:  # an exchange bound to the request each client saw (a separate label: no empty-view clash)
            parts += [length_prefixed(b"view"), length_prefixed(self.view)]
        return length_prefixed(_TAG_DOMAIN) + b"".join(parts)

    @cached_property
    def digest(self) -> bytes:
        """SHA-256 of :attr:`tag` (32 bytes): what the pads are bound to, so deriving a pad costs O(1) in K."""
        return hashlib.sha256(self.tag).digest()


def check_exchange(message_round: int, message_phase: str, exchange: Exchange) -> None:
    """The server's header check: a message for ``exchange`` must say its round and phase.

    A message replayed from another round or phase is refused here; one whose header was rewritten passes,
    but its pads belong to another exchange and do not cancel (module docstring).

    :raises ValueError: a header that does not match, naming both.
    """
    if message_round != exchange.round or message_phase != exchange.phase:
        raise ValueError(
            f"secure aggregation: a message for round {message_round!r}, phase {message_phase!r} arrived in the "
            f"exchange of round {exchange.round}, phase {exchange.phase!r}; stale or replayed messages are refused"
        )


def check_senders(senders: Sequence[str], exchange: Exchange) -> None:
    """The server's check before summing: exactly the cohort sent, each once.

    A member that masked and then dropped out leaves its neighbours' pads in the sum, and a stranger's or a
    repeated message adds pads that nothing cancels; recovering a drop-out needs the secret sharing of
    Bonawitz et al., which these in-process exchanges do not run, so such a sum is refused.

    :raises ValueError: naming the missing, unexpected or repeated senders.
    """
    sent = list(senders)
    missing = sorted(exchange.members - set(sent))
    unexpected = sorted(set(sent) - exchange.members)
    repeated = sorted(s for s, n in Counter(sent).items() if n > 1)
    if missing or unexpected or repeated:
        raise ValueError(
            f"secure aggregation: round {exchange.round}, phase {exchange.phase!r}: missing {missing}, unexpected "
            f"{unexpected}, repeated {repeated}; the pairwise masks cancel only over the whole cohort, so the sum "
            "is refused (a client that drops out after masking cannot be recovered here)"
        )


def masking_graph(exchange: Exchange, degree: int) -> Dict[str, Tuple[str, ...]]:
    """Each member's neighbours: a symmetric, ``d``-regular, ``d``-connected graph on ``exchange.cohort``.

    The Harary graph ``H_{d,K}`` (Harary 1962): members in a pseudo-random order ``π``, each member ranked by
    SHA-256 of the run id and its own id (public; every client computes the same graph). The rank of a member does
    not depend on who else is in the cohort, so cohorts that differ by a few drop-outs share most of their edges
    and the key agreements cached for the run are reused (with the order drawn per cohort, 10 % drop-outs made every
    exchange's graph new: ≈ 20,000 agreements at K = 1,000, issue 43); the same cohort keeps its graph through a
    run, and a coalition gets no fresh draw each round. A server that draws the run id and picks cohorts can place
    its colluders beside a member either way, so what holds against it is the graph's ``d``-connectivity, which no
    order changes: fewer than ``d`` colluders never hold all of a member's pads,
    member ``π_i`` adjacent to
    ``π_{i±1}, …, π_{i±⌊d/2⌋}`` and, for odd ``d``, to ``π_{i+K/2}``. A regular graph of odd degree on an
    odd number of vertices does not exist, so an odd ``d`` with odd ``K`` becomes ``d + 1``; ``d ≥ K − 1``
    gives all pairs. ``O(K d)`` time.

    :param exchange: the exchange (its cohort has ≥ 2 members).
    :param degree: d ≥ 2 (≥ 2 keeps the graph connected; 1 is allowed for a pair), see
        :meth:`SecureAggregation.masking_degree`.
    :return: ``{member: sorted neighbour ids}``; every member has the same number of neighbours.
    :raises ValueError: a cohort of one, or ``degree < 2``.
    """
    if not isinstance(exchange, Exchange):
        raise TypeError(f"masking_graph: exchange must be an Exchange, got {type(exchange).__name__}")
    members = sorted(exchange.cohort)
    K = len(members)
    if K < 2:
        raise ValueError(
            f"masking_graph: a cohort of one ({members[0]!r}) cannot be masked; its message would be plain"
        )
    if not is_int(degree) or degree < min(2, K - 1):
        raise ValueError(f"masking_graph: degree must be an int ≥ 2 (a connected graph), got {degree!r}")
    d = int(min(degree, K - 1))
    if d % 2 and K % 2:
        d = min(d + 1, K - 1)
    if d == K - 1:
        return {m: tuple(o for o in members if o != m) for m in members}
    order = sorted(members, key=lambda member: _graph_rank(exchange.run_id, member))
    offsets: List[int] = [j for h in range(1, d // 2 + 1) for j in (h, -h)] + ([K // 2] if d % 2 else [])
    return {order[i]: tuple(sorted(order[(i + j) % K] for j in offsets)) for i in range(K)}


@functools.lru_cache(maxsize=1 << 16)
def _graph_rank(run_id: bytes, member: str) -> Tuple[bytes, str]:
    """A member's place in the run's masking order (:func:`masking_graph`): SHA-256 of the run id and its id alone,
    then the id (a tie between two digests is impossible in practice, and resolved the same way by every client)."""
    digest = hashlib.sha256(
        length_prefixed(_GRAPH_DOMAIN) + length_prefixed(run_id) + length_prefixed(member.encode("utf-8"))
    ).digest()
    return digest, member


# --- keys and pads ------------------------------------------------------------------------------------
def keystream(seed: bytes, count: int) -> np.ndarray:
    """``PRG(seed)``: ``count`` uniform ``uint64`` words, the AES-256-CTR keystream of key ``seed`` (nonce 0).

    Each seed keys one pad only (a fresh HKDF output per pair and exchange), so the fixed nonce is safe.

    :raises ValueError: ``seed`` not 32 bytes, or a negative ``count``.
    """
    if not isinstance(seed, bytes) or len(seed) != PAD_SEED_BYTES:
        raise ValueError(f"keystream: seed must be {PAD_SEED_BYTES} bytes")
    if not is_int(count) or count < 0:
        raise ValueError(f"keystream: count must be a non-negative int, got {count!r}")
    encryptor = Cipher(algorithms.AES(seed), modes.CTR(bytes(16))).encryptor()
    return np.frombuffer(encryptor.update(bytes(8 * int(count))), dtype="<u8").astype(np.uint64, copy=False)


class MaskingKeys:
    """One client's X25519 key pair for secure aggregation (the key agreement of Bonawitz et al. 2017).

    The private key is generated from the OS by ``cryptography`` and stays inside this object: it has no
    accessor, and pickling raises ``TypeError`` (copies share the object). Shared secrets are cached per
    peer key, so a run pays one key agreement per neighbour pair. A client that must keep its key across
    restarts in its own memory (:class:`~gpflow_fed.federated.protection.secagg.SecAggClient`) draws the 32
    bytes itself and rebuilds the pair with :meth:`from_private_bytes`.

    :param insecure_seed: for tests only: derive the private key from this integer (SHA-256), which gives
        it to anyone who knows or guesses the integer.
    """

    __slots__ = ("_private", "_public", "_shared")

    def __init__(self, insecure_seed: Optional[int] = None) -> None:
        seed = check_insecure_seed(insecure_seed)
        if seed is None:
            self._private = X25519PrivateKey.generate()
        else:
            material = hashlib.sha256(
                length_prefixed(_KEY_DOMAIN) + length_prefixed(str(seed).encode("ascii"))
            ).digest()
            self._private = X25519PrivateKey.from_private_bytes(material)
        self._public = self._private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self._shared: Dict[bytes, bytes] = {}

    @classmethod
    def from_private_bytes(cls, private: bytes) -> "MaskingKeys":
        """The pair of a 32-byte X25519 private key that the owning client holds (drawn from the OS, e.g.
        :func:`secrets.token_bytes`, and kept in memory only); the key is not kept as bytes here either.

        :raises ValueError: ``private`` is not 32 bytes.
        """
        if not isinstance(private, bytes) or len(private) != PUBLIC_KEY_BYTES:
            raise ValueError(f"MaskingKeys.from_private_bytes: the private key must be {PUBLIC_KEY_BYTES} bytes")
        keys = cls.__new__(cls)
        keys._private = X25519PrivateKey.from_private_bytes(private)
        keys._public = keys._private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        keys._shared = {}
        return keys

    @property
    def public_bytes(self) -> bytes:
        """The public key, 32 raw bytes: what the client publishes to its neighbours (through the server)."""
        return self._public

    def __repr__(self) -> str:
        return f"MaskingKeys(public={self._public.hex()[:16]}…)"

    def __reduce__(self) -> NoReturn:
        raise TypeError("MaskingKeys holds a private key, which the library never serialises; make new keys instead")

    def __copy__(self) -> "MaskingKeys":
        return self

    def __deepcopy__(self, memo: Dict[int, object]) -> "MaskingKeys":
        return self

    def _agree(self, peer_public: bytes, peer_id: str) -> bytes:
        secret = self._shared.get(peer_public)
        if secret is None:
            try:
                secret = self._private.exchange(X25519PublicKey.from_public_bytes(peer_public))
            except ValueError as error:  # low-order points give an all-zero secret, which cryptography refuses
                raise ValueError(f"secure aggregation: {peer_id!r}'s public key is invalid ({error})") from None
            self._shared[peer_public] = secret
        return secret

    def pad_seed(self, client_id: str, peer_id: str, peer_public: bytes, exchange: Exchange) -> bytes:
        """``s_ij`` (32 bytes): HKDF-SHA256 of the X25519 secret, ``info = SHA-256(tag) ‖ min(i, j) ‖ max(i, j)``.

        Symmetric: ``i``'s keys with ``pk_j`` and ``j``'s keys with ``pk_i`` give the same seed.

        :param client_id: this client's id ``i``; ``peer_id``: ``j``; both in ``exchange.cohort``.
        :param peer_public: ``pk_j``, 32 bytes.
        :raises ValueError: ids not in the cohort or equal, or a malformed or invalid public key.
        """
        if client_id == peer_id:
            raise ValueError(f"secure aggregation: {client_id!r} cannot share a pad with itself")
        for who in (client_id, peer_id):
            if who not in exchange.members:
                raise ValueError(f"secure aggregation: {who!r} is not in the exchange's cohort")
        if not isinstance(peer_public, bytes) or len(peer_public) != PUBLIC_KEY_BYTES:
            raise ValueError(f"secure aggregation: {peer_id!r}'s public key must be {PUBLIC_KEY_BYTES} raw bytes")
        if peer_public == self._public:
            raise ValueError(f"secure aggregation: {peer_id!r} presents {client_id!r}'s own public key")
        first, second = sorted((client_id, peer_id))
        info = b"".join(
            length_prefixed(part) for part in (_PAD_DOMAIN, exchange.digest, first.encode(), second.encode())
        )
        return HKDF(algorithm=hashes.SHA256(), length=PAD_SEED_BYTES, salt=None, info=info).derive(
            self._agree(peer_public, peer_id)
        )


def _check_codes(encoded: Mapping[str, np.ndarray], who: str) -> List[str]:
    if not isinstance(encoded, Mapping) or not encoded:
        raise ValueError(f"secure aggregation: {who} must be a non-empty mapping of name to uint64 array")
    for name, value in encoded.items():
        if not isinstance(value, np.ndarray) or value.dtype != np.uint64:
            raise TypeError(
                f"secure aggregation: {who}[{name!r}] must be a uint64 array (encode it with "
                f"FixedPoint.encode first), got {getattr(value, 'dtype', type(value).__name__)}"
            )
    return sorted(encoded)


def mask(
    keys: MaskingKeys,
    client_id: str,
    encoded: Mapping[str, np.ndarray],
    exchange: Exchange,
    public_keys: Mapping[str, bytes],
    neighbours: Sequence[str],
) -> Dict[str, np.ndarray]:
    """``y_i``: client ``i``'s encodings plus ``+PRG(s_ij)`` for each neighbour ``j > i`` and ``−PRG(s_ij)``
    for each ``j < i`` (mod 2^64; ids compared as strings). Arrays are concatenated in sorted-name order and
    masked by one pad per pair, so both ends of a pair use the same words. ``O(d P)`` for ``d`` neighbours
    and ``P`` words.

    :param keys: this client's :class:`MaskingKeys`.
    :param client_id: ``i``, a member of ``exchange.cohort``.
    :param encoded: ``{name: uint64 array}`` from :meth:`~.wire.FixedPoint.encode`.
    :param exchange: the exchange the message is for.
    :param public_keys: at least each neighbour's public key (``public_keys[i]``, if present, must be ours).
    :param neighbours: ``i``'s neighbours in :func:`masking_graph` of ``exchange``.
    :return: ``{name: uint64 array}``, the same names and shapes.
    :raises ValueError: no neighbours (the message would be plain), a neighbour outside the cohort, a
        missing or foreign public key.
    :raises TypeError: payloads that are not ``uint64`` arrays.
    """
    if not isinstance(keys, MaskingKeys):
        raise TypeError(f"mask: keys must be MaskingKeys, got {type(keys).__name__}")
    if not isinstance(exchange, Exchange):
        raise TypeError(f"mask: exchange must be an Exchange, got {type(exchange).__name__}")
    if client_id not in exchange.members:
        raise ValueError(f"secure aggregation: {client_id!r} is not in the exchange's cohort")
    peers = tuple(neighbours)
    if not peers:
        raise ValueError(
            f"secure aggregation: {client_id!r} has no neighbour to mask with, so its message would be its plain "
            "encoding; refused (a cohort needs ≥ 2 members and a masking graph from masking_graph())"
        )
    if len(set(peers)) != len(peers) or client_id in peers or any(p not in exchange.members for p in peers):
        raise ValueError(
            f"secure aggregation: neighbours {peers} of {client_id!r} are not distinct other cohort members"
        )
    own = public_keys.get(client_id)
    if own is not None and own != keys.public_bytes:
        raise ValueError(f"secure aggregation: public_keys[{client_id!r}] is not the public key of the keys given")
    missing = [p for p in peers if p not in public_keys]
    if missing:
        raise ValueError(f"secure aggregation: no public key for neighbour(s) {missing} of {client_id!r}")
    names = _check_codes(encoded, "encoded")
    shapes = [encoded[n].shape for n in names]
    flat = np.concatenate([encoded[n].ravel() for n in names]).astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        for peer in sorted(peers):
            pad = keystream(keys.pad_seed(client_id, peer, public_keys[peer], exchange), flat.size)
            if client_id < peer:
                flat += pad  # uint64 arithmetic wraps modulo 2^64
            else:
                flat -= pad
    out: Dict[str, np.ndarray] = {}
    offset = 0
    for name, shape in zip(names, shapes):
        size = int(np.prod(shape, dtype=np.int64))
        out[name] = flat[offset : offset + size].reshape(shape)
        offset += size
    return out


def sum_masked(payloads: Sequence[Mapping[str, np.ndarray]]) -> Dict[str, np.ndarray]:
    """``Σ_i y_i mod 2^64`` per name; equals ``Σ_i q_i mod 2^64`` when the whole cohort is summed.

    :param payloads: the cohort's masked messages (:func:`mask`), one mapping per client.
    :raises ValueError: no payloads, or payloads whose names or shapes differ.
    :raises TypeError: arrays that are not ``uint64``.
    """
    if isinstance(payloads, Mapping) or not len(payloads):
        raise ValueError("sum_masked: payloads must be a non-empty sequence of {name: uint64 array} mappings")
    names = _check_codes(payloads[0], "payloads[0]")
    total = {n: np.array(payloads[0][n], dtype=np.uint64, copy=True) for n in names}
    for index, payload in enumerate(payloads[1:], start=1):
        if _check_codes(payload, f"payloads[{index}]") != names:
            raise ValueError(f"sum_masked: payloads[{index}] has names {sorted(payload)}, expected {names}")
        for n in names:
            if payload[n].shape != total[n].shape:
                raise ValueError(
                    f"sum_masked: payloads[{index}][{n!r}] has shape {payload[n].shape}, expected {total[n].shape}"
                )
            total[n] += payload[n]  # wraps modulo 2^64
    return total
