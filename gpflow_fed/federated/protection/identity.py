"""Authenticated parties: each party's long-term Ed25519 signing key and the roster every party holds.

Without authentication a server that writes the setup messages can show each client its own keys and the server's
keys for everyone else (key substitution), decrypt the victim's Shamir shares, rebuild its self-mask seed and strip
its pads; or it can invent cohort members (sybils) and learn the sum of the few honest ones. Both need the server
to be believed about who holds which key. Here nobody believes it:

* each party has a long-term **signing key** (Ed25519, :func:`generate_signing_key`; a Flower party keeps it in a
  private 0600 file, :func:`write_signing_key` / :func:`read_signing_key`);
* a **roster** maps each party's protocol id (``client_k``, in the one normal form of
  :func:`~gpflow_fed.validation.party_name`) to its raw 32-byte Ed25519 public key. It is agreed **out of band**
  (each party runs ``gpflow-fed flower keygen`` and the parties exchange the printed lines over a channel the
  server does not control) and every party holds its own copy (:func:`read_roster`);
* at ``advertise`` a party signs :func:`advertise_message` (protocol tag, run id, its id, both public keys it
  advertises); the server relays every signature with the keys at ``share``; each client checks every party's
  signature against its **own** roster and refuses the whole setup if one is missing or invalid or a party is not
  on its roster (:class:`~.secagg.SecAggClient`). A substituted key carries no valid signature; a sybil is on no
  roster.

The same keys sign the **consistency round** (:func:`consistency_message`, :func:`quorum`,
:func:`certified_signers`): after the masked inputs, each survivor signs the survivor set the server shows it, at
most one per exchange, and a client reveals anything at the unmask only for a survivor set that a quorum of the
cohort signed (:class:`~.secagg.SecAggClient`). With at most ``c`` parties of a cohort of ``n`` colluding with the
server, a quorum ``q = min(n, ⌊(n + c)/2⌋ + 1)`` makes any two quorums share ``2q − n ≥ c + 1`` members, so an
honest one, who signed one set only: no two honest clients reveal under different survivor sets.

What this assumes: the roster's integrity (every honest party holds the same, correct roster, agreed out of band)
and the secrecy of each honest party's signing key. It does not stop a server from dropping parties (availability).

Cost (measured on this project's 2-core machine, ``python -m timeit``, cryptography 50): an Ed25519 signature
≈ 50 µs, a verification ≈ 160 µs (≈ 170 µs with parsing the raw public key), a key ≈ 56 µs. A party signs once
per run and verifies K signatures at setup: ≈ 0.17 s at K = 1,000; per exchange it signs one survivor set and
verifies at most ``q`` signatures (≈ 0.1 s at K = 1,000). Verifications are cached per process on the exact
(public key, message, signature) bytes (:func:`verify`), so an in-process run of K parties pays K verifications,
not K². A roster is checked and hashed once however many parties share it (:func:`check_roster` returns the
read-only roster it made as it is, its :func:`roster_digest` computed then), so :meth:`PartyIdentity.federation` of K
parties and their protocol clients take time linear in K, not quadratic.
"""

from __future__ import annotations

import functools
import hashlib
import os
import stat
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, FrozenSet, Iterable, Mapping, NoReturn, Optional, Tuple

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ...validation import party_key, party_name
from .masking import length_prefixed

__all__ = [
    "ADVERTISE_TAG",
    "CONSISTENCY_TAG",
    "PUBLIC_KEY_BYTES",
    "ROSTER_TAG",
    "SIGNATURE_BYTES",
    "PartyIdentity",
    "advertise_message",
    "certified_signers",
    "check_roster",
    "consistency_message",
    "format_roster",
    "generate_signing_key",
    "members_digest",
    "node_identity",
    "public_key_bytes",
    "quorum",
    "read_roster",
    "read_signing_key",
    "roster_digest",
    "roster_line",
    "verify",
    "write_federation",
    "write_signing_key",
]

#: the protocol tag every advertise signature starts with (a signature made for anything else never verifies here)
ADVERTISE_TAG = b"gpflow-fed/secure-aggregation/advertise/v1"
#: the protocol tag every consistency-round signature starts with (:func:`consistency_message`)
CONSISTENCY_TAG = b"gpflow-fed/secure-aggregation/consistency/v1"
#: the tag a roster's digest starts with (:func:`roster_digest`)
ROSTER_TAG = b"gpflow-fed/roster/v1"
#: raw Ed25519 public keys and signatures
PUBLIC_KEY_BYTES, SIGNATURE_BYTES = 32, 64
_MEMBERS_DOMAIN = b"gpflow-fed/secure-aggregation/members/v1"
_KEY_FILE_HEADER = "# gpflow-fed Ed25519 signing key (private: keep this file 0600, never share it)"


def advertise_message(run_id: bytes, client_id: str, s_pk: bytes, c_pk: bytes) -> bytes:
    """What a party signs at ``advertise``: the tag, the run id, its id and both public keys, each length-prefixed
    (the fields parse one way only, so no other run, party or key pair shares the message)."""
    fields = (ADVERTISE_TAG, bytes(run_id), client_id.encode("utf-8"), bytes(s_pk), bytes(c_pk))
    return b"".join(length_prefixed(f) for f in fields)


def members_digest(members: Iterable[str]) -> bytes:
    """SHA-256 of a set of party ids (sorted, each length-prefixed, after a domain tag): how a signature names a
    cohort or a survivor set in 32 bytes whatever its size. A public value of a public set, computed once per process
    for each set (the K clients of a simulation share it: each computing it made a round ``O(K²)``)."""
    return _members_digest(frozenset(members))


@functools.lru_cache(maxsize=64)
def _members_digest(members: FrozenSet[str]) -> bytes:
    parts = [length_prefixed(_MEMBERS_DOMAIN), *(length_prefixed(c.encode("utf-8")) for c in sorted(members))]
    return hashlib.sha256(b"".join(parts)).digest()


def consistency_message(run_id: bytes, exchange: bytes, cohort: bytes, survivors: bytes, signer: str) -> bytes:
    """What a survivor signs in the consistency round: the tag, the run id, the exchange's digest (run, purpose,
    round, phase, cohort and the signer's view of the request), the :func:`members_digest` of the cohort and of the
    survivor set, and the signer's id, each length-prefixed (so no other run, exchange, set or party shares it)."""
    fields = (CONSISTENCY_TAG, bytes(run_id), bytes(exchange), bytes(cohort), bytes(survivors), signer.encode("utf-8"))
    return b"".join(length_prefixed(f) for f in fields)


def quorum(cohort_size: int, colluders: int) -> int:
    """The fewest signers of one survivor set before a client reveals anything under it:
    ``q = min(n, ⌊(n + c)/2⌋ + 1)`` for a cohort of ``n`` of which at most ``c`` collude with the server.

    Two signer sets ``Q₁, Q₂ ⊆ U`` of ``q`` each share ``|Q₁ ∩ Q₂| ≥ 2q − n`` members; with ``q = ⌊(n + c)/2⌋ + 1``
    that is ``≥ c + 1``, so at least one honest party signed both sets, and it signs one set per exchange: the sets
    are equal (Bonawitz et al., CCS 2017, doi:10.1145/3133956.3133982: the ConsistencyCheck round of the protocol
    against an active server, where the threshold over all clients plays the quorum's part). When that
    exceeds ``n`` (``c ≥ n − 1``) every member must sign: a set without a member ``j`` has no signature of ``j``
    (a party signs only a set naming it), so only the whole cohort can be signed by all, and it is one set.
    ``q − 1`` signers would not do: two sets of ``q − 1`` can share only ``c`` members, all of them colluders.

    :raises ValueError: ``cohort_size < 1`` or ``colluders < 0`` (or not ints).
    """
    if isinstance(cohort_size, bool) or not isinstance(cohort_size, int) or cohort_size < 1:
        raise ValueError(f"quorum: cohort_size must be an int ≥ 1, got {cohort_size!r}")
    if isinstance(colluders, bool) or not isinstance(colluders, int) or colluders < 0:
        raise ValueError(f"quorum: colluders must be an int ≥ 0, got {colluders!r}")
    return min(cohort_size, (cohort_size + colluders) // 2 + 1)


def certified_signers(
    roster: Mapping[str, bytes],
    signatures: Iterable[Tuple[str, Any]],
    eligible: Iterable[str],
    message: Callable[[str], bytes],
    needed: int,
) -> FrozenSet[str]:
    """The distinct parties of ``eligible`` whose signature (``(party, signature)`` pairs) verifies under **this
    party's own** ``roster`` key over ``message(party)``, counted until ``needed`` are found (the rest is not
    verified: a quorum is enough).

    A signature of a party not on the roster or not eligible, a malformed one, or one that does not verify (forged,
    made for another set or exchange, or another party's signature under this name) does not count, and a party
    counts once however often it is listed; none of these is an error, so a colluding client that sends garbage
    cannot stop an honest round.
    """
    members = set(eligible)
    found: set = set()
    for party, signature in signatures:
        if len(found) >= needed:
            break
        if party in found or party not in members or not isinstance(signature, bytes):
            continue
        key = roster.get(party)
        if key is not None and len(signature) == SIGNATURE_BYTES and verify(key, message(party), signature):
            found.add(party)
    return frozenset(found)


def generate_signing_key() -> Ed25519PrivateKey:
    """A fresh Ed25519 signing key from the OS's randomness."""
    return Ed25519PrivateKey.generate()


def public_key_bytes(key: Ed25519PrivateKey) -> bytes:
    """The raw 32-byte public key of a signing key (what the roster holds)."""
    return key.public_key().public_bytes_raw()


@functools.lru_cache(maxsize=1 << 14)
def verify(public_key: bytes, message: bytes, signature: bytes) -> bool:
    """Whether ``signature`` is a valid Ed25519 signature of ``message`` under the raw ``public_key``.

    Cached on the exact bytes: verification is a deterministic function of them, so the cache changes no answer, and
    the K in-process parties of a simulation verify each party's signature once between them."""
    if len(public_key) != PUBLIC_KEY_BYTES or len(signature) != SIGNATURE_BYTES:
        return False
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


class _CheckedRoster(Dict[str, bytes]):
    """A roster :func:`check_roster` checked, read-only: it is made only by checking (its constructor runs every
    check) and refuses every change (``TypeError``), so it is still the roster that was checked when
    :func:`check_roster` meets it again and returns it as it is. A ``dict`` for its readers (``SecAggClient`` keeps
    one); ``dict``'s own methods called on it directly (``dict.__setitem__(roster, …)``) are outside this, as
    ``object.__setattr__`` is for a frozen dataclass. Its :attr:`digest` is computed once, when it is made."""

    __slots__ = ("_digest",)
    _digest: str

    def __init__(self, roster: Any, where: str) -> None:
        super().__init__(_checked_entries(roster, where))
        parts = [length_prefixed(ROSTER_TAG)]
        parts += [length_prefixed(c.encode("utf-8")) + length_prefixed(k) for c, k in sorted(self.items())]
        object.__setattr__(self, "_digest", hashlib.sha256(b"".join(parts)).hexdigest())

    @property
    def digest(self) -> str:
        """:func:`roster_digest` of this roster (computed when it was made)."""
        return self._digest

    def _refuse(self) -> NoReturn:
        raise TypeError("a checked roster is read-only; change a copy (dict(roster)), which is checked again")

    def __setattr__(self, name: str, value: Any) -> NoReturn:
        self._refuse()

    def __delattr__(self, name: str) -> NoReturn:
        self._refuse()

    def __setitem__(self, key: str, value: bytes) -> NoReturn:
        self._refuse()

    def __delitem__(self, key: str) -> NoReturn:
        self._refuse()

    def __ior__(self, *args: Any, **kwargs: Any) -> NoReturn:  # type: ignore[misc]
        self._refuse()

    def update(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse()

    def setdefault(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse()

    def pop(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse()

    def popitem(self) -> NoReturn:
        self._refuse()

    def clear(self) -> NoReturn:
        self._refuse()

    def __copy__(self) -> "_CheckedRoster":
        return self  # read-only: a copy would be the same roster

    def __deepcopy__(self, memo: Dict[int, object]) -> "_CheckedRoster":
        return self

    def __reduce__(self) -> Tuple[Any, Tuple[Dict[str, bytes], str]]:
        return _CheckedRoster, (dict(self), "roster")  # unpickled: checked again


def check_roster(roster: Any, where: str = "roster") -> _CheckedRoster:
    """A roster, checked: a mapping of party ids, each already in :func:`~gpflow_fed.validation.party_name`'s normal
    form and no two look-alikes (:func:`~gpflow_fed.validation.party_key`), to distinct raw 32-byte Ed25519 public
    keys that parse.

    :return: the roster, read-only (a ``dict`` that refuses every change with a ``TypeError``; ``dict(roster)`` is a
        copy to change). A roster this function returned is returned as it is, not checked again: it was checked
        when it was made and cannot have changed since, so K parties that share one roster
        (:meth:`PartyIdentity.federation`, their protocol clients) check it once between them, in time linear in K,
        not K times. Any other mapping, however it was made, is checked in full.
    :raises TypeError: not a mapping of str to bytes.
    :raises ValueError: an empty roster, a name not in normal form, look-alike names, a malformed or repeated key.
    """
    if type(roster) is _CheckedRoster:  # exactly: a subclass could skip the checks in its constructor
        return roster
    return _CheckedRoster(roster, where)


def roster_digest(roster: Any) -> str:
    """SHA-256 of a roster, in hex: of ``length_prefixed(ROSTER_TAG)`` followed, for each party id in sorted order, by
    ``length_prefixed(id in UTF-8) + length_prefixed(its 32-byte public key)``
    (:func:`~.masking.length_prefixed`). What a protocol client's state records, so a restore must give the same
    roster. Computed once per checked roster (:func:`check_roster`; a roster it returned is not hashed again), so K
    protocol clients that share one roster hash it once between them, not K times.

    :raises TypeError, ValueError: as :func:`check_roster`, for a roster not checked yet.
    """
    return check_roster(roster).digest


def _checked_entries(roster: Any, where: str) -> Dict[str, bytes]:
    """:func:`check_roster`'s checks, in time linear in the roster's size: its entries as a new dict."""
    if not isinstance(roster, Mapping):
        raise TypeError(f"{where} must be a mapping party id -> raw Ed25519 public key, got {type(roster).__name__}")
    if not roster:
        raise ValueError(f"{where} is empty")
    checked: Dict[str, bytes] = {}
    keys: Dict[str, str] = {}
    owners: Dict[bytes, str] = {}
    for name, key in roster.items():
        if not isinstance(name, str):
            raise TypeError(f"{where}: party ids must be str, got {type(name).__name__}")
        if party_name(name, f"{where}: party {ascii(name)}") != name:
            raise ValueError(f"{where}: party id {ascii(name)} is not in normal form (NFKC, no surrounding spaces)")
        if party_key(name) in keys:
            raise ValueError(f"{where}: party ids {ascii(keys[party_key(name)])} and {ascii(name)} are look-alikes")
        if not isinstance(key, (bytes, bytearray)) or len(key) != PUBLIC_KEY_BYTES:
            raise ValueError(f"{where}: the key of {name!r} must be {PUBLIC_KEY_BYTES} raw bytes")
        key = bytes(key)
        try:
            Ed25519PublicKey.from_public_bytes(key)
        except ValueError:
            raise ValueError(f"{where}: the key of {name!r} is not an Ed25519 public key") from None
        if key in owners:
            raise ValueError(f"{where}: {owners[key]!r} and {name!r} have the same public key")
        keys[party_key(name)], owners[key], checked[name] = name, name, key
    return checked


@dataclass(frozen=True)
class PartyIdentity:
    """A party's authentication: its own signing key and the roster it holds (agreed out of band).

    Kept outside the frozen :class:`~.policy.ClientPolicy` (a policy is a value to compare and print; a signing key
    is a secret) and passed to :class:`~.encoder.ClientEncoder` beside it; like the policy, it is the party's own
    configuration, given again when the encoder is restored, never part of a saved state.

    :param signing_key: the party's Ed25519 private key.
    :param roster: party id → raw public key, checked by :func:`check_roster` (kept read-only; a roster
        :func:`check_roster` already returned is kept as it is, not checked again); must hold this party's own key.
    """

    signing_key: Ed25519PrivateKey
    roster: Mapping[str, bytes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.signing_key, Ed25519PrivateKey):
            raise TypeError(f"PartyIdentity: signing_key must be an Ed25519PrivateKey, got {type(self.signing_key)}")
        object.__setattr__(self, "roster", check_roster(self.roster, "PartyIdentity roster"))

    def __repr__(self) -> str:  # never the key
        return f"PartyIdentity(public={self.public_key.hex()[:16]}…, roster of {len(self.roster)})"

    @property
    def public_key(self) -> bytes:
        return public_key_bytes(self.signing_key)

    def check_party(self, client_id: str) -> None:
        """:raises ValueError: ``client_id`` is not on the roster under this identity's public key."""
        if self.roster.get(client_id) != self.public_key:
            raise ValueError(f"PartyIdentity: the roster does not hold {client_id!r} with this party's public key")

    @classmethod
    def federation(cls, ids: Iterable[str]) -> Dict[str, "PartyIdentity"]:
        """Fresh keys for parties ``ids`` and one roster of them all: what an in-process runtime makes (every party
        in one process; parity with a deployment, not protection).

        The roster is checked once (:func:`check_roster`) and shared, read-only, by every identity: time linear in
        the number of parties (a check per party would be quadratic).
        """
        keys = {c: generate_signing_key() for c in ids}
        roster = check_roster({c: public_key_bytes(k) for c, k in keys.items()}, "PartyIdentity roster")
        return {c: cls(k, roster) for c, k in keys.items()}


# --- files ------------------------------------------------------------------------------------------------------
def write_signing_key(path: str) -> Ed25519PrivateKey:
    """Make a signing key and write it to a new private file at ``path`` (0600, never over an existing file nor
    through a link; :func:`~gpflow_fed.private_files.new_file`); a missing folder is made 0700.

    :raises FileExistsError: something is already at ``path``.
    :raises ValueError: the folder is a link or another user's.
    """
    from ...private_files import make_private_folder, new_file

    folder = os.path.dirname(os.path.abspath(os.fspath(path)))
    if not os.path.isdir(folder):
        make_private_folder(folder, "the signing key's folder")
    key = generate_signing_key()
    with new_file(os.fspath(path)) as f:
        f.write(f"{_KEY_FILE_HEADER}\n{key.private_bytes_raw().hex()}\n")
    return key


def read_signing_key(path: str) -> Ed25519PrivateKey:
    """The signing key :func:`write_signing_key` wrote.

    :raises ValueError: a link, not a regular file, a file others may read or write (not 0600 or stricter), another
        user's file, or not a key file.
    """
    path = os.fspath(path)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
        raise ValueError(f"signing key {path}: not a regular file (a link or something else)")
    if st.st_mode & 0o077:
        raise ValueError(f"signing key {path}: others may read or write it (mode {st.st_mode & 0o777:o}); chmod 600")
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise ValueError(f"signing key {path}: another user's file")
    with open(path, encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    try:
        if len(lines) != 1:
            raise ValueError
        return Ed25519PrivateKey.from_private_bytes(bytes.fromhex(lines[0]))
    except ValueError:
        raise ValueError(f"signing key {path}: not a gpflow-fed signing key file (one line of 64 hex digits)") from None


def roster_line(client_id: str, public_key: bytes) -> str:
    """One roster line: ``<id> <hex public key>``."""
    name = party_name(client_id, "roster line")
    if name != client_id or any(c.isspace() for c in name):
        raise ValueError(f"roster line: party id {ascii(client_id)} must be in normal form, without spaces")
    return f"{name} {bytes(public_key).hex()}"


def format_roster(roster: Mapping[str, bytes]) -> str:
    """A roster file's text: one :func:`roster_line` per party, sorted."""
    return "".join(roster_line(c, roster[c]) + "\n" for c in sorted(check_roster(roster)))


def read_roster(path: str) -> Dict[str, bytes]:
    """A roster file: one line per party, ``<id> <hex public key>`` (blank lines and ``#`` comments ignored).

    :raises ValueError: a malformed line (naming it), a party twice, or a roster :func:`check_roster` refuses.
    """
    roster: Dict[str, bytes] = {}
    with open(os.fspath(path), encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            parts = text.split()
            key: Optional[bytes] = None
            if len(parts) == 2:
                try:
                    key = bytes.fromhex(parts[1])
                except ValueError:
                    key = None
            if key is None or len(key) != PUBLIC_KEY_BYTES:
                raise ValueError(f"roster {path}, line {number}: expected '<id> <64 hex digits>'")
            if parts[0] in roster:
                raise ValueError(f"roster {path}, line {number}: party {parts[0]!r} is listed twice")
            roster[parts[0]] = key
    return check_roster(roster, f"roster {path}")


def write_federation(folder: str, ids: Iterable[str]) -> Tuple[Dict[str, str], str]:
    """Fresh signing-key files for parties ``ids`` in ``folder`` (``<id>.key``, 0600) and their roster file
    (``roster``): what an in-process or loopback Flower federation makes for its parties (parity with a deployment).

    :return: ``({id: key file}, roster file)``.
    """
    folder = os.fspath(folder)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    paths = {c: os.path.join(folder, f"{c}.key") for c in ids}
    roster = {c: public_key_bytes(write_signing_key(p)) for c, p in paths.items()}
    roster_path = os.path.join(folder, "roster")
    with open(roster_path, "w", encoding="utf-8") as f:
        f.write(format_roster(roster))
    return paths, roster_path


def node_identity(config: Mapping[str, Any], client_id: str) -> Optional[PartyIdentity]:
    """A Flower party's identity from its node config: ``signing-key`` (its key file) and ``roster`` (the roster
    file), or ``no-roster = true`` (parsed strictly) to opt out: the unauthenticated mode, against a semi-honest
    server only (None).

    :raises ValueError: neither a roster nor the opt-out (a deployment without a roster refuses to start), both, a
        key without a roster or the reverse, unreadable files, or a roster without this party under its key.
    """
    from ...validation import parse_boolean

    opted_out = parse_boolean(config.get("no-roster", False), "node config no-roster")
    given = [k for k in ("signing-key", "roster") if k in config]
    if opted_out:
        if given:
            raise ValueError(f"node config no-roster = true contradicts {' and '.join(given)}; give one or the other")
        return None
    if len(given) < 2:
        raise ValueError(
            f"party {client_id!r} refuses to start without authenticated parties: its node config needs signing-key "
            "(its key file, `gpflow-fed flower keygen`) and roster (the roster file agreed out of band), or "
            "no-roster = true to opt out (then it is protected against a semi-honest server only)"
        )
    for name in given:
        if not isinstance(config[name], str) or not config[name].strip():
            raise ValueError(f"node config {name} must be a path (a non-empty string), got {config[name]!r}")
    identity = PartyIdentity(read_signing_key(config["signing-key"]), read_roster(config["roster"]))
    identity.check_party(client_id)
    return identity
