"""Shamir secret sharing of 32-byte secrets, and the authenticated encryption of a share from one client to another.

Sharing (Shamir, "How to share a secret", CACM 22(11), 1979, doi:10.1145/359168.359176) uses pycryptodome's
:class:`Crypto.Protocol.SecretSharing.Shamir`, which shares 16-byte secrets over GF(2^128) with random
coefficients from the OS: a 32-byte secret is split into two 16-byte halves, each shared with a polynomial of
degree ``t − 1`` at the same indices ``1, …, n``, so holder ``k`` gets ``(k, p_low(k) ‖ p_high(k))``. Any ``t``
shares give the secret back; ``t − 1`` shares are independent of it (each half is information-theoretically
hidden).

Encryption of a share from client ``i`` to holder ``j`` (the relaying server must neither read nor redirect it):

    key_ij = HKDF-SHA256(X25519(c_sk_i, c_pk_j), info = domain ‖ run_id ‖ i ‖ j)        (32 bytes)
    ct     = nonce ‖ AES-256-GCM(key_ij, nonce, plaintext, AD = domain ‖ run_id ‖ i ‖ j ‖ what)

with a 12-byte nonce from the OS and every field length-prefixed. Only ``i`` and ``j`` can compute ``key_ij``
(X25519 is symmetric, so ``j`` derives it from ``(c_sk_j, c_pk_i)``); a ciphertext presented to another holder,
with sender and recipient swapped, for another run or as another kind of secret fails authentication.
What is not covered here: the server relays the public keys, so one that substitutes its own keys at setup reads
every share, unless each client checks the keys' signatures against its own roster (:mod:`.identity`, as
:class:`~.secagg.SecAggClient` does with a roster). Lengths are visible.
"""

from __future__ import annotations

import os
from typing import List, Sequence, Tuple

from Crypto.Protocol.SecretSharing import Shamir
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from .masking import length_prefixed, is_int

__all__ = [
    "NONCE_BYTES",
    "SECRET_BYTES",
    "SHARE_BYTES",
    "ShamirError",
    "ShareDecryptionError",
    "ciphertext_bytes",
    "combine_shares",
    "decrypt_share",
    "encrypt_share",
    "split_secret",
]

#: bytes of a shared secret (an X25519 private key or a 32-byte seed)
SECRET_BYTES = 32
#: bytes of one share of a 32-byte secret (two GF(2^128) elements)
SHARE_BYTES = 32
#: bytes of the AES-GCM nonce that starts every ciphertext
NONCE_BYTES = 12
_GCM_TAG_BYTES = 16
_HALF = SECRET_BYTES // 2

_KEY_DOMAIN = b"gpflow-fed/secure-aggregation/share-key/v1"
_AD_DOMAIN = b"gpflow-fed/secure-aggregation/share/v1"

Share = Tuple[int, bytes]


class ShamirError(ValueError):
    """Shares that cannot give a secret back: too few, malformed or inconsistent."""


class ShareDecryptionError(ValueError):
    """A ciphertext that does not decrypt under the pair, run and purpose it claims."""


def split_secret(secret: bytes, threshold: int, count: int) -> List[Share]:
    """``count`` shares ``(k, share_k)``, ``k = 1, …, count``, of which any ``threshold`` give ``secret`` back.

    :param secret: 32 bytes.
    :param threshold: t, 1 ≤ t ≤ ``count`` (t = 1 gives every holder the secret itself).
    :param count: n ≥ 1, the number of holders.
    :raises ValueError: a secret that is not 32 bytes, or t, n out of range.
    """
    if not isinstance(secret, bytes) or len(secret) != SECRET_BYTES:
        raise ValueError(f"split_secret: the secret must be {SECRET_BYTES} bytes")
    if not is_int(count) or count < 1:
        raise ValueError(f"split_secret: count must be an int ≥ 1, got {count!r}")
    if not is_int(threshold) or not 1 <= threshold <= count:
        raise ValueError(f"split_secret: threshold must be an int in [1, count = {count}], got {threshold!r}")
    # ssss=False is pycryptodome's default, spelled out because its stubs omit the default
    low = Shamir.split(int(threshold), int(count), secret[:_HALF], ssss=False)
    high = Shamir.split(int(threshold), int(count), secret[_HALF:], ssss=False)
    return [(k, a + b) for (k, a), (_, b) in zip(low, high)]


def combine_shares(shares: Sequence[Share], threshold: int) -> bytes:
    """The 32-byte secret from at least ``threshold`` shares of :func:`split_secret` (any of them, any order).

    With exactly ``t`` shares the result is whatever polynomial they fit, so a caller that can should check
    it (e.g. against a public key). With more, the ``t`` lowest and the ``t`` highest indices are combined
    separately and must agree: a single wrong share among them is detected (for ``n < 2t`` that is any share).

    :param shares: ``(index, 32-byte share)`` pairs; an index repeated with the same share counts once.
    :param threshold: t, as given to :func:`split_secret`.
    :raises ShamirError: fewer than t distinct shares, a malformed share, one index with two different
        shares, or shares that do not lie on one polynomial.
    """
    if not is_int(threshold) or threshold < 1:
        raise ShamirError(f"combine_shares: threshold must be an int ≥ 1, got {threshold!r}")
    distinct: dict = {}
    for share in shares:
        if not (isinstance(share, tuple) and len(share) == 2 and is_int(share[0]) and share[0] >= 1):
            raise ShamirError("combine_shares: a share must be a pair (index ≥ 1, 32 bytes)")
        index, value = int(share[0]), share[1]
        if not isinstance(value, bytes) or len(value) != SHARE_BYTES:
            raise ShamirError(f"combine_shares: share {index} is not {SHARE_BYTES} bytes")
        if distinct.setdefault(index, value) != value:
            raise ShamirError(f"combine_shares: index {index} comes with two different shares (inconsistent)")
    if len(distinct) < threshold:
        raise ShamirError(
            f"combine_shares: {len(distinct)} distinct share(s), the threshold is {threshold}: too few to recover"
        )
    ordered = sorted(distinct.items())
    secret = _combine(ordered[:threshold])
    if len(ordered) > threshold and _combine(ordered[-threshold:]) != secret:
        raise ShamirError(f"combine_shares: the {len(ordered)} shares do not lie on one polynomial (inconsistent)")
    return secret


def _combine(shares: Sequence[Share]) -> bytes:
    # ssss=False is pycryptodome's default, spelled out because its stubs omit the default
    low = Shamir.combine([(k, v[:_HALF]) for k, v in shares], ssss=False)
    high = Shamir.combine([(k, v[_HALF:]) for k, v in shares], ssss=False)
    return low + high


def ciphertext_bytes(plaintext_bytes: int) -> int:
    """The length of :func:`encrypt_share`'s output for a plaintext of ``plaintext_bytes``."""
    return NONCE_BYTES + int(plaintext_bytes) + _GCM_TAG_BYTES


def _cipher(own_private: bytes, peer_public: bytes, run_id: bytes, sender: str, recipient: str) -> AESGCM:
    for name, key in (("private", own_private), ("public", peer_public)):
        if not isinstance(key, bytes) or len(key) != 32:
            raise ShareDecryptionError(f"share encryption: the {name} key must be 32 raw bytes")
    try:
        secret = X25519PrivateKey.from_private_bytes(own_private).exchange(
            X25519PublicKey.from_public_bytes(peer_public)
        )
    except ValueError as error:  # a low-order public key gives an all-zero secret, which cryptography refuses
        raise ShareDecryptionError(f"share encryption: invalid public key ({error})") from None
    info = b"".join(length_prefixed(p) for p in (_KEY_DOMAIN, run_id, sender.encode(), recipient.encode()))
    return AESGCM(HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(secret))


def _associated(run_id: bytes, sender: str, recipient: str, what: str) -> bytes:
    return b"".join(
        length_prefixed(p) for p in (_AD_DOMAIN, run_id, sender.encode(), recipient.encode(), what.encode())
    )


def encrypt_share(
    sender_private: bytes,
    recipient_public: bytes,
    run_id: bytes,
    sender: str,
    recipient: str,
    what: str,
    plaintext: bytes,
) -> bytes:
    """``nonce ‖ AES-GCM(key_ij, plaintext)`` for ``recipient`` only (module docstring), bound to the run,
    both ids and ``what`` is shared.

    :param sender_private: ``c_sk_i``, the sender's 32-byte X25519 private key.
    :param recipient_public: ``c_pk_j``, 32 raw bytes.
    :raises ShareDecryptionError: a malformed or invalid key.
    """
    nonce = os.urandom(NONCE_BYTES)
    cipher = _cipher(sender_private, recipient_public, run_id, sender, recipient)
    return nonce + cipher.encrypt(nonce, plaintext, _associated(run_id, sender, recipient, what))


def decrypt_share(
    recipient_private: bytes,
    sender_public: bytes,
    run_id: bytes,
    sender: str,
    recipient: str,
    what: str,
    ciphertext: bytes,
) -> bytes:
    """The plaintext of :func:`encrypt_share`, if it was made by ``sender`` for ``recipient``, this run and ``what``.

    :param recipient_private: ``c_sk_j``, the recipient's 32-byte X25519 private key.
    :param sender_public: ``c_pk_i``, 32 raw bytes.
    :raises ShareDecryptionError: any mismatch (wrong keys, ids, run or purpose, a changed byte), or a
        malformed ciphertext.
    """
    if not isinstance(ciphertext, bytes) or len(ciphertext) < ciphertext_bytes(0):
        raise ShareDecryptionError(f"share from {sender!r} to {recipient!r}: the ciphertext is malformed")
    cipher = _cipher(recipient_private, sender_public, run_id, sender, recipient)
    try:
        return cipher.decrypt(
            ciphertext[:NONCE_BYTES], ciphertext[NONCE_BYTES:], _associated(run_id, sender, recipient, what)
        )
    except InvalidTag:
        raise ShareDecryptionError(
            f"share from {sender!r} to {recipient!r} does not authenticate "
            "(wrong keys, ids, run or purpose, or altered)"
        ) from None
