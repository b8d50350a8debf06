"""Secure aggregation's building blocks: fixed point, the exchange tag, the masking graph, keys, pads, sums."""

import copy
import itertools
import math
import pickle

import numpy as np
import pytest

from gpflow_fed.federated.protection.masking import (
    Exchange,
    MaskingKeys,
    SecureAggregation,
    check_exchange,
    from_limb_sums,
    keystream,
    mask,
    masking_graph,
    sum_masked,
    to_limbs,
)
from gpflow_fed.federated.protection.wire import FixedPoint, decode_fixed_point
from gpflow_fed.randomness import new_run_id

RUN = bytes(range(16))


def exchange(K, round=0, phase="stats", run=RUN, purpose="train"):
    return Exchange(run, purpose, round, phase, tuple(f"client_{k}" for k in range(K)))


def connected(graph, members):
    members = set(members)
    if not members:
        return True
    start = next(iter(members))
    seen, todo = {start}, [start]
    while todo:
        node = todo.pop()
        for other in graph[node]:
            if other in members and other not in seen:
                seen.add(other)
                todo.append(other)
    return seen == members


@pytest.mark.parametrize(
    "kwargs, error, word",
    [
        ({"fractional_bits": 0}, ValueError, "fractional_bits"),
        ({"fractional_bits": 63}, ValueError, "fractional_bits"),
        ({"fractional_bits": 3.0}, TypeError, "fractional_bits"),
        ({"min_cohort": 1}, ValueError, "min_cohort"),
        ({"min_cohort": True}, TypeError, "min_cohort"),
        ({"degree": 1}, ValueError, "degree"),
        ({"degree": 2.5}, TypeError, "degree"),
    ],
)
def test_settings_are_validated(kwargs, error, word):
    with pytest.raises(error, match=word):
        SecureAggregation(**kwargs)


def test_check_cohort_names_the_setting():
    assert SecureAggregation().check_cohort(["a", "b"]) == ("a", "b")
    with pytest.raises(ValueError, match=r"min_cohort=2"):
        SecureAggregation().check_cohort(["a"])
    with pytest.raises(ValueError, match=r"min_cohort=3"):
        SecureAggregation(min_cohort=3).check_cohort(["a", "b"])
    with pytest.raises(ValueError, match="twice"):
        SecureAggregation().check_cohort(["a", "a"])


@pytest.mark.parametrize("K", [2, 3, 7, 8, 9, 10, 100, 1000])
def test_default_degree_is_two_log2_k(K):
    assert SecureAggregation().masking_degree(K) == min(2 * math.ceil(math.log2(K)), K - 1)
    assert SecureAggregation(degree=4).masking_degree(K) == min(4, K - 1)


# --- the exchange -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"run_id": "0" * 16}, TypeError),
        ({"run_id": b"short"}, ValueError),
        ({"purpose": ""}, TypeError),
        ({"phase": 3}, TypeError),
        ({"round": True}, TypeError),
        ({"round": 1.0}, TypeError),
        ({"cohort": "ab"}, TypeError),
        ({"cohort": ()}, ValueError),
        ({"cohort": ("a", "a")}, ValueError),
        ({"cohort": ("a", 2)}, TypeError),
    ],
)
def test_exchange_is_validated(kwargs, error):
    fields = dict(run_id=RUN, purpose="train", round=0, phase="stats", cohort=("a", "b"))
    fields.update(kwargs)
    with pytest.raises(error):
        Exchange(**fields)


def test_exchange_tag_is_canonical_and_unambiguous():
    base = Exchange(RUN, "train", 1, "stats", ("a", "b", "c"))
    assert Exchange(RUN, "train", 1, "stats", ["c", "a", "b"]).tag == base.tag  # the cohort's order does not matter
    others = [
        Exchange(bytes(16), "train", 1, "stats", ("a", "b", "c")),
        Exchange(RUN, "evaluate", 1, "stats", ("a", "b", "c")),
        Exchange(RUN, "train", 2, "stats", ("a", "b", "c")),
        Exchange(RUN, "train", -1, "stats", ("a", "b", "c")),
        Exchange(RUN, "train", 1, "hyper", ("a", "b", "c")),
        Exchange(RUN, "train", 1, "stats", ("a", "b")),
        # the same characters split differently between fields must not collide
        Exchange(RUN, "trai", 1, "nstats", ("a", "b", "c")),
        Exchange(RUN, "train", 1, "stats", ("a", "bc")),
        Exchange(RUN, "train", 1, "stats", ("ab", "c")),
    ]
    tags = [base.tag] + [e.tag for e in others]
    assert len(set(tags)) == len(tags)


def test_check_exchange_refuses_stale_headers():
    e = exchange(3, round=4, phase="stats")
    check_exchange(4, "stats", e)
    with pytest.raises(ValueError, match="round 3"):
        check_exchange(3, "stats", e)
    with pytest.raises(ValueError, match="'hyper'"):
        check_exchange(4, "hyper", e)


# --- the masking graph --------------------------------------------------------------------------------
@pytest.mark.parametrize("K", [2, 3, 4, 5, 7, 8, 9, 10, 31, 64, 101])
@pytest.mark.parametrize("degree", [2, 3, 4, 5, 8])
def test_masking_graph_is_symmetric_regular_and_connected(K, degree):
    e = exchange(K, round=K + degree)
    graph = masking_graph(e, degree)
    assert sorted(graph) == sorted(e.cohort)
    expected = min(degree + (degree % 2 and K % 2), K - 1)
    for member, neighbours in graph.items():
        assert len(neighbours) == len(set(neighbours)) == expected
        assert member not in neighbours
        assert all(member in graph[n] for n in neighbours)
    assert connected(graph, e.cohort)
    assert masking_graph(e, degree) == graph  # every client computes the same graph


@pytest.mark.parametrize("K, degree", [(8, 2), (9, 3), (10, 4), (11, 5), (12, 3)])
def test_masking_graph_survives_fewer_than_degree_removals(K, degree):
    """Harary graphs are d-connected: removing any d − 1 members leaves the others connected."""
    e = exchange(K)
    graph = masking_graph(e, degree)
    d = len(next(iter(graph.values())))
    for removed in itertools.combinations(e.cohort, d - 1):
        assert connected(graph, set(e.cohort) - set(removed)), removed


def test_masking_graph_changes_with_run_and_cohort_only_and_refuses_a_cohort_of_one():
    def frozen(e):
        return tuple(sorted(masking_graph(e, 6).items()))

    runs = {frozen(exchange(50, run=bytes([r]) * 16)) for r in range(5)}
    assert len(runs) == 5
    same_cohort = {
        frozen(exchange(50, round=r, phase=p, purpose=q)) for r in range(3) for p in "ab" for q in ("train", "final")
    }
    assert len(same_cohort) == 1  # the same cohort keeps its graph through a run
    other_cohort = Exchange(RUN, "train", 0, "stats", exchange(50).cohort[1:] + ("x",))
    assert frozen(exchange(50)) != frozen(other_cohort)
    members = sorted(exchange(10).cohort)
    assert masking_graph(exchange(10), 20) == {m: tuple(o for o in members if o != m) for m in members}
    with pytest.raises(ValueError, match="cohort of one"):
        masking_graph(exchange(1), 2)
    with pytest.raises(ValueError, match="degree"):
        masking_graph(exchange(5), 1)
    with pytest.raises(TypeError, match="Exchange"):
        masking_graph(("a", "b"), 2)


# --- keys and pads ------------------------------------------------------------------------------------
def test_pad_seeds_agree_across_a_pair_and_differ_across_exchanges():
    a, b = MaskingKeys(), MaskingKeys()
    e = Exchange(RUN, "train", 0, "stats", ("a", "b", "c"))
    seed = a.pad_seed("a", "b", b.public_bytes, e)
    assert len(seed) == 32
    assert b.pad_seed("b", "a", a.public_bytes, e) == seed
    assert a.pad_seed("a", "b", b.public_bytes, Exchange(RUN, "train", 1, "stats", ("a", "b", "c"))) != seed
    assert a.pad_seed("a", "c", b.public_bytes, e) != seed  # the pair's ids are bound too


def test_keys_are_fresh_reproducible_only_on_request_and_never_pickled():
    assert MaskingKeys().public_bytes != MaskingKeys().public_bytes
    assert MaskingKeys(insecure_seed=5).public_bytes == MaskingKeys(insecure_seed=5).public_bytes
    assert MaskingKeys(insecure_seed=5).public_bytes != MaskingKeys(insecure_seed=6).public_bytes
    keys = MaskingKeys()
    with pytest.raises(TypeError, match="never serialises"):
        pickle.dumps(keys)
    assert copy.deepcopy(keys) is keys and copy.copy(keys) is keys
    assert keys.public_bytes.hex()[:16] in repr(keys)
    with pytest.raises(TypeError):
        MaskingKeys(insecure_seed=True)


def test_bad_public_keys_are_refused():
    keys = MaskingKeys()
    e = Exchange(RUN, "train", 0, "stats", ("a", "b"))
    with pytest.raises(ValueError, match="invalid"):
        keys.pad_seed("a", "b", bytes(32), e)  # a low-order point: the shared secret would be zero
    with pytest.raises(ValueError, match="32 raw bytes"):
        keys.pad_seed("a", "b", b"123", e)
    with pytest.raises(ValueError, match="own public key"):
        keys.pad_seed("a", "b", keys.public_bytes, e)
    with pytest.raises(ValueError, match="not in the exchange"):
        keys.pad_seed("a", "z", MaskingKeys().public_bytes, e)
    with pytest.raises(ValueError, match="itself"):
        keys.pad_seed("a", "a", MaskingKeys().public_bytes, e)


def test_keystream_is_a_deterministic_function_of_its_seed():
    seed = bytes(range(32))
    words = keystream(seed, 1000)
    assert words.dtype == np.uint64 and words.shape == (1000,)
    assert np.array_equal(keystream(seed, 10), words[:10])
    assert not np.array_equal(keystream(bytes(32), 1000), words)
    with pytest.raises(ValueError):
        keystream(b"short", 4)
    with pytest.raises(ValueError):
        keystream(seed, -1)


# --- masking and summing ------------------------------------------------------------------------------
def masked_round(K, degree, payloads, sa=None, e=None):
    sa = sa or SecureAggregation(degree=degree)
    e = e or exchange(K)
    keys = {c: MaskingKeys() for c in e.cohort}
    public = {c: k.public_bytes for c, k in keys.items()}
    graph = sa.graph(e)
    encoded = {c: {n: FixedPoint(sa.fractional_bits, K).encode(v)[0] for n, v in payloads[c].items()} for c in e.cohort}
    masked = {c: mask(keys[c], c, encoded[c], e, public, graph[c]) for c in e.cohort}
    return sa, encoded, masked


@pytest.mark.parametrize("K, degree", [(2, None), (3, None), (5, 2), (8, None), (13, 3), (40, None), (40, 4)])
def test_masks_cancel_exactly_in_the_sum(K, degree):
    rng = np.random.default_rng(K)
    e = exchange(K)
    payloads = {
        c: {"kuu": rng.normal(size=(4, 4)), "b": rng.normal(size=6), "w": np.array(rng.uniform(1, 9))} for c in e.cohort
    }
    sa, encoded, masked = masked_round(K, degree, payloads, e=e)
    total = sum_masked(list(masked.values()))
    plain = sum_masked(list(encoded.values()))
    assert sorted(total) == ["b", "kuu", "w"]
    for name in total:
        assert total[name].shape == np.shape(payloads["client_0"][name])
        assert np.array_equal(total[name], plain[name])
        np.testing.assert_allclose(
            decode_fixed_point(total[name], sa.fractional_bits),
            sum(p[name] for p in payloads.values()),
            rtol=0,
            atol=K * 2.0 ** (-sa.fractional_bits),
        )
    for c in e.cohort:  # and no single masked message is its encoding
        assert not any(np.array_equal(masked[c][n], encoded[c][n]) for n in ("kuu", "b"))


def test_mask_validates_its_inputs():
    e = exchange(3)
    keys = {c: MaskingKeys() for c in e.cohort}
    public = {c: k.public_bytes for c, k in keys.items()}
    codes = {"x": np.zeros(3, dtype=np.uint64)}
    me, other, third = e.cohort
    with pytest.raises(ValueError, match="plain"):
        mask(keys[me], me, codes, e, public, ())
    with pytest.raises(ValueError, match="not in the exchange"):
        mask(keys[me], "stranger", codes, e, public, (other,))
    with pytest.raises(ValueError, match="not distinct other cohort members"):
        mask(keys[me], me, codes, e, public, (other, "stranger"))
    with pytest.raises(ValueError, match="not distinct other cohort members"):
        mask(keys[me], me, codes, e, public, (other, me))
    with pytest.raises(ValueError, match="no public key"):
        mask(keys[me], me, codes, e, {other: public[other]}, (other, third))
    with pytest.raises(ValueError, match="not the public key"):
        mask(keys[other], me, codes, e, public, (other, third))
    with pytest.raises(TypeError, match="uint64"):
        mask(keys[me], me, {"x": np.zeros(3)}, e, public, (other, third))
    with pytest.raises(ValueError, match="non-empty"):
        mask(keys[me], me, {}, e, public, (other, third))
    with pytest.raises(TypeError, match="MaskingKeys"):
        mask(b"key", me, codes, e, public, (other, third))


def test_sum_masked_validates_its_inputs():
    a = {"x": np.zeros(3, dtype=np.uint64)}
    with pytest.raises(ValueError, match="non-empty"):
        sum_masked([])
    with pytest.raises(ValueError, match="names"):
        sum_masked([a, {"y": np.zeros(3, dtype=np.uint64)}])
    with pytest.raises(ValueError, match="shape"):
        sum_masked([a, {"x": np.zeros(4, dtype=np.uint64)}])
    with pytest.raises(TypeError, match="uint64"):
        sum_masked([a, {"x": np.zeros(3)}])
    top = {"x": np.full(3, 2**63, dtype=np.uint64)}
    assert np.array_equal(sum_masked([top, top])["x"], np.zeros(3, dtype=np.uint64))  # modulo 2^64


@pytest.mark.parametrize("bits", [13, 16, 31])
def test_limbs_sum_codes_modulo_two_to_the_64(bits):
    rng = np.random.default_rng(bits)
    codes = [rng.integers(0, 2**64, size=7, dtype=np.uint64) for _ in range(50)]
    limb_sums = np.sum([to_limbs(c, bits) for c in codes], axis=0)
    assert np.array_equal(from_limb_sums(limb_sums, bits), sum_masked([{"c": c} for c in codes])["c"])
    with pytest.raises(ValueError, match="bits"):
        to_limbs(codes[0], 0)
    with pytest.raises(ValueError, match="multiple"):
        from_limb_sums(limb_sums[:-1], bits)


def test_new_run_ids_make_valid_exchanges():
    e = Exchange(new_run_id(), "train", 0, "stats", ("a", "b"))
    assert len(e.run_id) == 16
