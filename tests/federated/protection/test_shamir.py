"""Shamir sharing of 32-byte secrets and the share encryption between two clients."""

import itertools
import os

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from gpflow_fed.federated.protection.shamir import (
    SHARE_BYTES,
    ShamirError,
    ShareDecryptionError,
    ciphertext_bytes,
    combine_shares,
    decrypt_share,
    encrypt_share,
    split_secret,
)

RUN = bytes(range(16))


def pair():
    private = os.urandom(32)
    public = X25519PrivateKey.from_private_bytes(private).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return private, public


def test_any_t_shares_give_the_secret_and_fewer_are_refused():
    secret = os.urandom(32)
    shares = split_secret(secret, 3, 5)
    assert [k for k, _ in shares] == [1, 2, 3, 4, 5] and all(len(s) == SHARE_BYTES for _, s in shares)
    for subset in itertools.combinations(shares, 3):
        assert combine_shares(list(subset), 3) == secret
    assert combine_shares(shares[::-1], 3) == secret  # any order, more than t
    with pytest.raises(ShamirError, match="2 distinct share.*threshold is 3"):
        combine_shares(shares[:2], 3)
    with pytest.raises(ShamirError, match="2 distinct share"):
        combine_shares([shares[0], shares[0], shares[1]], 3)  # a repeated share counts once


def test_t_minus_one_shares_or_a_forged_share_give_a_wrong_secret():
    """Combining t − 1 shares (as if t were t − 1) or t shares with one forged gives some other secret."""
    secret = os.urandom(32)
    shares = split_secret(secret, 3, 4)
    assert combine_shares(shares[:2], 2) != secret
    assert combine_shares([*shares[:2], (shares[2][0], os.urandom(32))], 3) != secret


def test_threshold_one_hands_out_the_secret_itself():
    secret = os.urandom(32)
    assert all(s == secret for _, s in split_secret(secret, 1, 3))


def test_inconsistent_shares_are_detected():
    secret = os.urandom(32)
    shares = split_secret(secret, 3, 5)
    for bad in range(5):
        altered = list(shares)
        altered[bad] = (shares[bad][0], bytes(b ^ 1 for b in shares[bad][1]))
        with pytest.raises(ShamirError, match="inconsistent"):
            combine_shares(altered, 3)
    with pytest.raises(ShamirError, match="two different shares"):
        combine_shares([*shares[:3], (1, os.urandom(32))], 3)
    other = split_secret(os.urandom(32), 3, 5)
    with pytest.raises(ShamirError, match="inconsistent"):
        combine_shares([*shares[:2], *other[2:]], 3)  # shares of two secrets


@pytest.mark.parametrize(
    "args, match",
    [
        ((b"short", 2, 3), "32 bytes"),
        ((bytes(32), 4, 3), "threshold"),
        ((bytes(32), 0, 3), "threshold"),
        ((bytes(32), 1, 0), "count"),
    ],
)
def test_split_validates(args, match):
    with pytest.raises(ValueError, match=match):
        split_secret(*args)


def test_combine_validates_shares():
    with pytest.raises(ShamirError, match="pair"):
        combine_shares([(0, bytes(32))], 1)
    with pytest.raises(ShamirError, match="not 32 bytes"):
        combine_shares([(1, bytes(16))], 1)
    with pytest.raises(ShamirError, match="threshold"):
        combine_shares([(1, bytes(32))], 0)


def test_a_share_decrypts_only_for_its_pair_run_and_purpose():
    (sk_i, pk_i), (sk_j, pk_j), (sk_k, pk_k) = pair(), pair(), pair()
    plaintext = os.urandom(32)
    ct = encrypt_share(sk_i, pk_j, RUN, "i", "j", "b", plaintext)
    assert len(ct) == ciphertext_bytes(32)
    assert decrypt_share(sk_j, pk_i, RUN, "i", "j", "b", ct) == plaintext
    assert ct != encrypt_share(sk_i, pk_j, RUN, "i", "j", "b", plaintext)  # fresh nonce
    wrong = [
        (sk_k, pk_i, RUN, "i", "k", "b"),  # redirected to another holder
        (sk_k, pk_i, RUN, "i", "j", "b"),  # another holder claiming to be j
        (sk_j, pk_k, RUN, "k", "j", "b"),  # presented as k's share
        (sk_j, pk_i, RUN, "j", "i", "b"),  # sender and recipient swapped
        (sk_j, pk_i, bytes(16), "i", "j", "b"),  # another run
        (sk_j, pk_i, RUN, "i", "j", "s_sk"),  # another secret
    ]
    for args in wrong:
        with pytest.raises(ShareDecryptionError, match="does not authenticate"):
            decrypt_share(*args, ct)
    altered = ct[:-1] + bytes([ct[-1] ^ 1])
    with pytest.raises(ShareDecryptionError, match="does not authenticate"):
        decrypt_share(sk_j, pk_i, RUN, "i", "j", "b", altered)
    with pytest.raises(ShareDecryptionError, match="malformed"):
        decrypt_share(sk_j, pk_i, RUN, "i", "j", "b", ct[:20])
    with pytest.raises(ShareDecryptionError, match="32 raw bytes"):
        encrypt_share(sk_i, pk_j[:5], RUN, "i", "j", "b", plaintext)
    with pytest.raises(ShareDecryptionError, match="invalid public key"):
        encrypt_share(sk_i, bytes(32), RUN, "i", "j", "b", plaintext)  # a low-order point
