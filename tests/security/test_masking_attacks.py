"""Attacks on secure aggregation, written as the adversary; each asserts that the attack fails.

The adversary is the server (it runs the code, knows the run's seed and the exchange, relays every public
key and receives every masked message), possibly with colluding clients that hand over their keys. Each
attack also has a control showing that the same attack code succeeds where the protection is absent, so
the tests can fail.
"""

import hashlib
from dataclasses import dataclass
from typing import Dict

import numpy as np
import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from scipy import stats

from gpflow_fed.federated.protection import masking
from gpflow_fed.federated.protection.masking import (
    Exchange,
    MaskingKeys,
    SecureAggregation,
    check_exchange,
    check_senders,
    keystream,
    mask,
    masking_graph,
    sum_masked,
)
from gpflow_fed.federated.protection.wire import FixedPoint
from gpflow_fed.randomness import new_run_id

RUN_SEED = 0  # the public run seed: in the configuration, the logs, the defaults


@dataclass
class Round:
    """One masked exchange as it happens: the clients' secrets and what the server sees."""

    exchange: Exchange
    keys: Dict[str, MaskingKeys]  # secret: each client's own
    encoded: Dict[str, Dict[str, np.ndarray]]  # secret: each client's own
    public: Dict[str, bytes]  # seen by the server
    graph: Dict[str, tuple]  # seen by the server
    masked: Dict[str, Dict[str, np.ndarray]]  # seen by the server


def play(exchange, payloads, keys=None, degree=None, sa=None):
    sa = sa or SecureAggregation(degree=degree)
    keys = keys or {c: MaskingKeys() for c in exchange.cohort}
    public = {c: k.public_bytes for c, k in keys.items()}
    graph = sa.graph(exchange)
    K = len(exchange.cohort)
    encoded = {
        c: {n: FixedPoint(sa.fractional_bits, K).encode(v)[0] for n, v in payloads[c].items()} for c in exchange.cohort
    }
    masked = {c: mask(keys[c], c, encoded[c], exchange, public, graph[c]) for c in exchange.cohort}
    return Round(exchange, keys, encoded, public, graph, masked)


def payloads_for(cohort, size=8, seed=0):
    rng = np.random.default_rng(seed)
    return {c: {"stats": rng.normal(size=size), "w": np.array([rng.uniform(10, 100)])} for c in cohort}


def cohort(K):
    return tuple(f"client_{k}" for k in range(K))


def unmask(masked_payload, client, pads):
    """``y_i`` with the given pads ``{peer: uint64 words}`` removed (the signs of :func:`mask`)."""
    names = sorted(masked_payload)
    flat = np.concatenate([masked_payload[n].ravel() for n in names]).copy()
    for peer, pad in pads.items():
        if client < peer:
            flat -= pad
        else:
            flat += pad
    return flat


def flat_codes(codes):
    return np.concatenate([codes[n].ravel() for n in sorted(codes)])


def looks_uniform(words):
    """Each of the 64 bit positions is set in half the words (±5σ) and the bytes pass a χ² test."""
    words = np.asarray(words, dtype=np.uint64)
    bits = (words[:, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)
    frequency = bits.mean(axis=0)
    if np.any(np.abs(frequency - 0.5) > 5 * 0.5 / np.sqrt(len(words))):
        return False
    counts = np.bincount(words.view(np.uint8), minlength=256)
    return stats.chisquare(counts).pvalue > 1e-6


# --- attack: regenerate the pads from what the server knows -------------------------------------------
def legacy_pad(seed, context, a, b, size):
    """Pads derived from the run seed and the exchange, as main derived them (the flaw of issue 16)."""
    first, second = sorted((a, b))
    text = "\x1f".join([str(seed), *(str(c) for c in context), first, second])
    words = np.frombuffer(hashlib.sha256(text.encode("utf-8")).digest(), dtype=np.uint32)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(w) for w in words])))
    return rng.bit_generator.random_raw(size).astype(np.uint64)


def server_guesses_from_seeds(r, target, seeds):
    """The server rebuilds the target's pads from every seed it might know and checks if one unmasks it."""
    size = flat_codes(r.masked[target]).size
    context = (r.exchange.purpose, r.exchange.round, r.exchange.phase)
    hits = []
    for seed in seeds:
        pads = {j: legacy_pad(seed, context, target, j, size) for j in r.graph[target]}
        # the server cannot tell q from the result, but a correct guess has the payload's low magnitude
        guess = unmask(r.masked[target], target, pads).view(np.int64)
        if np.all(np.abs(guess) < 2**40):
            hits.append(seed)
    return hits


def test_server_cannot_regenerate_pads_from_the_run_seed():
    e = Exchange(new_run_id(), "train", 3, "stats", cohort(10))
    r = play(e, payloads_for(e.cohort))
    for target in e.cohort:
        assert server_guesses_from_seeds(r, target, range(100)) == []


def test_control_seed_derived_pads_are_regenerated():
    """The same attack on pads derived from the run seed (main's scheme) unmasks every client."""
    e = Exchange(new_run_id(), "train", 3, "stats", cohort(10))
    r = play(e, payloads_for(e.cohort))
    context = (e.purpose, e.round, e.phase)
    for c in e.cohort:  # mask the legacy way instead
        flat = flat_codes(r.encoded[c])
        for j in r.graph[c]:
            pad = legacy_pad(RUN_SEED, context, c, j, flat.size)
            flat = flat + pad if c < j else flat - pad
        sizes = [r.encoded[c][n].size for n in sorted(r.encoded[c])]
        r.masked[c] = dict(zip(sorted(r.encoded[c]), np.split(flat, np.cumsum(sizes)[:-1])))
    target = e.cohort[4]
    assert server_guesses_from_seeds(r, target, range(100)) == [RUN_SEED]


def test_server_cannot_derive_pair_secrets_from_public_values():
    """HKDF with the code's own info over every secret a server could build from public values fails."""
    e = Exchange(new_run_id(), "train", 0, "stats", cohort(6))
    r = play(e, payloads_for(e.cohort))
    target = e.cohort[0]
    truth = flat_codes(r.encoded[target])
    size = truth.size
    server_keys = MaskingKeys()  # the server's own key pair: its secrets with a client are not the pair's
    for neighbour in r.graph[target]:
        a, b = r.public[target], r.public[neighbour]
        guesses = [
            a,
            b,
            a + b,
            b + a,
            bytes(x ^ y for x, y in zip(a, b)),
            bytes(32),
            hashlib.sha256(str(RUN_SEED).encode()).digest(),
            server_keys._agree(a, target),
            server_keys._agree(b, neighbour),
        ]
        first, second = sorted((target, neighbour))
        info = (
            masking.length_prefixed(masking._PAD_DOMAIN)
            + masking.length_prefixed(e.digest)
            + masking.length_prefixed(first.encode())
            + masking.length_prefixed(second.encode())
        )
        true_seed = r.keys[target].pad_seed(target, neighbour, b, e)
        # control: with the real secret (which only the pair holds) this derivation is the pad seed
        real = r.keys[target]._agree(b, neighbour)
        assert HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(real) == true_seed
        for guess in guesses:
            seed = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(guess)
            assert seed != true_seed
            assert not np.array_equal(keystream(seed, size), keystream(true_seed, size))


def test_default_keys_are_not_any_seeded_key():
    """The server tries the keys of every small insecure seed: the clients' OS keys are none of them."""
    e = Exchange(new_run_id(), "train", 0, "stats", cohort(8))
    r = play(e, payloads_for(e.cohort))
    seeded = {MaskingKeys(insecure_seed=s).public_bytes for s in range(300)}
    assert not seeded & set(r.public.values())


def test_control_seeded_keys_are_found_and_every_client_unmasked():
    e = Exchange(new_run_id(), "train", 0, "stats", cohort(8))
    r = play(e, payloads_for(e.cohort), keys={c: MaskingKeys(insecure_seed=k) for k, c in enumerate(e.cohort)})
    found = {MaskingKeys(insecure_seed=s).public_bytes: MaskingKeys(insecure_seed=s) for s in range(300)}
    for c in e.cohort:
        stolen = found[r.public[c]]
        size = flat_codes(r.masked[c]).size
        pads = {j: keystream(stolen.pad_seed(c, j, r.public[j], e), size) for j in r.graph[c]}
        assert np.array_equal(unmask(r.masked[c], c, pads), flat_codes(r.encoded[c]))


# --- attack: read the masked message ------------------------------------------------------------------
def test_masked_payload_is_statistically_uniform():
    """Even an all-zero payload (the most structured one) is sent as uniform words."""
    e = Exchange(new_run_id(), "train", 0, "stats", cohort(5))
    zeros = {c: {"stats": np.zeros(20000)} for c in e.cohort}
    r = play(e, zeros)
    assert not looks_uniform(flat_codes(r.encoded[e.cohort[0]]))  # control: the encoding is not uniform
    for c in e.cohort:
        assert looks_uniform(flat_codes(r.masked[c]))
    # and two clients with the same payload send unrelated words
    assert np.mean(r.masked[e.cohort[0]]["stats"] == r.masked[e.cohort[1]]["stats"]) < 1e-3


def test_pads_are_never_reused_across_exchanges():
    """The same payload in two rounds: the difference of the masked messages is uniform, not q1 − q2 = 0."""
    run = new_run_id()
    same = {c: {"stats": np.full(20000, 0.25)} for c in cohort(4)}
    keys = {c: MaskingKeys() for c in cohort(4)}
    first = play(Exchange(run, "train", 0, "stats", cohort(4)), same, keys=keys)
    second = play(Exchange(run, "train", 1, "stats", cohort(4)), same, keys=keys)
    c = cohort(4)[2]
    assert looks_uniform(first.masked[c]["stats"] - second.masked[c]["stats"])


# --- attack: a cohort of one --------------------------------------------------------------------------
def test_cohort_of_one_is_refused_everywhere():
    """ρ = 0.3 of K = 3, or exclusions leaving one client: nothing is masked, so nothing may be sent."""
    lonely = Exchange(new_run_id(), "train", 0, "stats", ("client_0",))
    sa = SecureAggregation()
    with pytest.raises(ValueError, match="min_cohort"):
        sa.check_cohort(lonely.cohort)
    with pytest.raises(ValueError, match="min_cohort"):
        sa.graph(lonely)
    with pytest.raises(ValueError, match="cohort of one"):
        masking_graph(lonely, 2)
    keys = MaskingKeys()
    with pytest.raises(ValueError, match="plain"):
        mask(keys, "client_0", {"stats": FixedPoint(32, 1).encode(np.ones(3))[0]}, lonely, {}, ())
    with pytest.raises(ValueError, match="min_cohort"):
        SecureAggregation(min_cohort=1)
    with pytest.raises(ValueError, match="min_cohort=3"):
        SecureAggregation(min_cohort=3).check_cohort(("client_0", "client_1"))


# --- attack: replay a masked message ------------------------------------------------------------------
@pytest.mark.parametrize("field", ["round", "phase", "run", "purpose", "cohort"])
def test_replayed_message_does_not_cancel(field):
    run = new_run_id()
    members = cohort(6)
    keys = {c: MaskingKeys() for c in members + ("client_new",)}
    old = Exchange(run, "train", 2, "stats", members)
    new = {
        "round": Exchange(run, "train", 3, "stats", members),
        "phase": Exchange(run, "train", 2, "hyper", members),
        "run": Exchange(new_run_id(), "train", 2, "stats", members),
        "purpose": Exchange(run, "evaluate", 2, "stats", members),
        "cohort": Exchange(run, "train", 2, "stats", members + ("client_new",)),
    }[field]
    payloads = payloads_for(new.cohort, size=64)
    before = play(old, payloads, keys={c: keys[c] for c in old.cohort})
    now = play(new, payloads, keys={c: keys[c] for c in new.cohort})
    truth = sum_masked(list(now.encoded.values()))
    assert sum_masked(list(now.masked.values())).keys() == truth.keys()
    assert all(np.array_equal(sum_masked(list(now.masked.values()))[n], truth[n]) for n in truth)  # honest run
    replayer = members[3]
    forged = dict(now.masked, **{replayer: before.masked[replayer]})  # the same payload, masked for `old`
    total = sum_masked(list(forged.values()))
    for n in truth:
        assert np.mean(total[n] == truth[n]) < 0.05
    if field in ("round", "phase"):
        with pytest.raises(ValueError, match="stale or replayed"):
            check_exchange(old.round, old.phase, new)


# --- attack: drop out after masking, or inject a message -------------------------------------------
def test_incomplete_or_padded_cohorts_are_refused():
    e = Exchange(new_run_id(), "train", 1, "stats", cohort(6))
    r = play(e, payloads_for(e.cohort))
    truth = sum_masked(list(r.encoded.values()))
    check_senders(list(r.masked), e)
    dropped = [c for c in e.cohort if c != "client_2"]
    partial = sum_masked([r.masked[c] for c in dropped])
    assert np.mean(partial["stats"] == truth["stats"]) < 0.05  # control: the pads do not cancel without it
    with pytest.raises(ValueError, match=r"missing \['client_2'\]"):
        check_senders(dropped, e)
    with pytest.raises(ValueError, match=r"unexpected \['mallory'\]"):
        check_senders(list(r.masked) + ["mallory"], e)
    with pytest.raises(ValueError, match=r"repeated \['client_0'\]"):
        check_senders(list(r.masked) + ["client_0"], e)


# --- attack: colluding clients ------------------------------------------------------------------------
def collusion_attack(r, target, colluders):
    """The server and ``colluders`` remove every pad they can compute from the target's message."""
    size = flat_codes(r.masked[target]).size
    pads = {
        j: keystream(r.keys[j].pad_seed(j, target, r.public[target], r.exchange), size)
        for j in colluders
        if j in r.graph[target]
    }
    return unmask(r.masked[target], target, pads)


@pytest.mark.parametrize("degree", [3, 4, 6])
def test_fewer_colluders_than_neighbours_cannot_unmask(degree):
    e = Exchange(new_run_id(), "train", 0, "stats", cohort(14))
    r = play(e, payloads_for(e.cohort), degree=degree)
    d = len(r.graph[e.cohort[0]])
    for target in e.cohort:
        neighbours = r.graph[target]
        truth = flat_codes(r.encoded[target])
        # all but one neighbour, plus as many non-neighbours as the budget of d − 1 colluders allows
        for left_out in neighbours:
            colluders = [j for j in neighbours if j != left_out][: d - 1]
            recovered = collusion_attack(r, target, colluders)
            assert np.mean(recovered == truth) < 0.05
        outsiders = [c for c in e.cohort if c != target and c not in neighbours][: d - 1]
        assert np.array_equal(collusion_attack(r, target, outsiders), flat_codes(r.masked[target]))  # they know nothing


@pytest.mark.parametrize("degree", [3, 4])
def test_control_all_neighbours_colluding_unmask(degree):
    e = Exchange(new_run_id(), "train", 0, "stats", cohort(14))
    r = play(e, payloads_for(e.cohort), degree=degree)
    target = e.cohort[5]
    assert np.array_equal(collusion_attack(r, target, r.graph[target]), flat_codes(r.encoded[target]))
