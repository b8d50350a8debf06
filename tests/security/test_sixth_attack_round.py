"""Issue 43 (a fresh attacker, sixth round): one broadcast summed over many masking graphs, and an advertise that wiped.

* **Re-setup partition**: a party answered a broadcast it had answered before when the cohort's ids and the pinned
  drop-outs were the same, and that record held across a new ``advertise`` (a new secure-aggregation run id, so a new
  :class:`SecAggClient`). The masking graph's order is a hash of the run id and the cohort, so each setup draws a new
  Harary graph: a server that ground run ids until the honest survivors split into two groups, with ``h − 1``
  colluders and drop-outs a valid quorum allows, learnt other groups' sums from each setup and solved for every
  honest input (n = 16, d = 8, h = 5: 4 colluders, 4 dropped, 8 honest inputs from 7 setups to 1e-10). The encoder
  now records the masking graph (the digest of its edges: the run id, the cohort and the degree) with the cohort and
  the drop-outs, and refuses the same broadcast over another graph, also after a restart from its saved state.
* **Advertise wipe**: an ``advertise`` with a malformed run id was refused only after the encoder had replaced its
  protocol client (keys, held shares, signed sets) and taken the bad run id, so the run's unmask then failed. The new
  protocol client now answers the advertise before it replaces anything.

The parties are the package's own :class:`ClientEncoder` (and its :class:`SecAggClient`), driven with the helpers of
:mod:`tests.security.test_fourth_attack_round`; the server and its colluders are this file's.
"""

import hashlib
import io
import json

import numpy as np
import pytest

from gpflow_fed.federated.protection.encoder import ClientEncoder, EncoderRefusal
from gpflow_fed.federated.protection.masking import Exchange, keystream, masking_graph
from gpflow_fed.federated.protection.policy import ClientPolicy
from gpflow_fed.federated.protection.request import Protection
from gpflow_fed.federated.protection.secagg import components, default_degree, members_bitmap, neighbour_floor
from gpflow_fed.federated.protection.wire import decode_fixed_point
from tests.security.test_fourth_attack_round import P, Parties, _values

# the attacker's parameters: n = 16 at the default degree 8 (h = 5), the last 4 collude (h − 1), the 4 before them
# "drop" after setup (a valid quorum: every survivor keeps ≥ h surviving neighbours), the first 8 are honest survivors
IDS = [f"c{i:02d}" for i in range(16)]
DEGREE = default_degree(len(IDS))
COLLUDERS = IDS[12:]
DROPPED = IDS[8:12]
HONEST = IDS[:8]
SURVIVORS = [c for c in IDS if c not in DROPPED]
REFUSED = "for another cohort or masking graph"


def _graph(run_id, degree=DEGREE):
    """The masking graph of the cohort (all of :data:`IDS`) in the setup ``run_id`` (the round does not enter it)."""
    return masking_graph(Exchange(run_id, "train", 0, "p", tuple(IDS)), degree)


def _split(run_id):
    """The groups of honest survivors whose sums the server learns in setup ``run_id``: the components of the graph
    over the honest survivors (the colluders give their pads away, the dropped theirs are recovered)."""
    return frozenset(components(_graph(run_id), set(HONEST)))


def _grind(avoid=frozenset()):
    """The server's grinding, deterministic here: the first run id (a hash of a counter) whose graph keeps ≥ h
    surviving neighbours for every survivor (so every party answers) and splits the honest survivors into ≥ 2 groups,
    other than the splits ``avoid`` names."""
    h = neighbour_floor(DEGREE)
    for i in range(1_000_000):
        run_id = hashlib.sha256(b"sixth attack round" + i.to_bytes(8, "big")).digest()
        graph = _graph(run_id)
        if any(sum(p not in DROPPED for p in graph[c]) < h for c in SURVIVORS):
            continue
        split = _split(run_id)
        if len(split) > 1 and split not in avoid:
            return run_id
    raise AssertionError("no run id splits the honest survivors")  # pragma: no cover


def _setup(parties, run_id):
    """A setup over all of :data:`IDS` under the server's (ground) ``run_id``."""
    return parties.setup(IDS, run_id, DEGREE)[1]


def _fields(run_id, rnd, degree=DEGREE):
    return {
        "run_id": run_id,
        "purpose": "train",
        "round": rnd,
        "phase": "p",
        "cohort": members_bitmap(IDS, IDS),
        "degree": degree,
    }


def _masked(parties, run_id, adv, rnd, survivors, degree=DEGREE):
    """The masked inputs of ``survivors`` to round ``rnd`` (the same broadcast each round) over the whole cohort."""
    fields = _fields(run_id, rnd, degree)
    graph = _graph(run_id, degree)
    masked = {
        c: parties.ask(c, "masked_input", {**fields, "size": P + 2, "s_pk": {p: adv[p]["s_pk"] for p in graph[c]}})
        for c in survivors
    }
    return {c: a["masked"] for c, a in masked.items()}


def _group_sums(parties, run_id, adv, rnd, view, masked):
    """The rest of the attacker's exchange: the survivors' consistency round, the honest survivors' unmask with the
    four drop-outs, and what the server then holds: each honest survivor's input without its self-mask, its pads with
    the dropped (revealed) and its pads with the colluders (theirs), summed over each group of :func:`_split`.
    ``{group: decoded sum}``."""
    fields = _fields(run_id, rnd)
    certificate = parties.certificate(IDS, fields, SURVIVORS)
    unmask = {**fields, "dropped": members_bitmap(IDS, DROPPED), **certificate, "seed": True}
    graph = _graph(run_id)
    exchange = Exchange(run_id, "train", rnd, "p", tuple(IDS), view)
    alone = {}
    for c in HONEST:
        answer = parties.ask(c, "unmask", {**unmask, "pads": [p for p in graph[c] if p in DROPPED]})
        y = masked[c] - keystream(answer["seed"], P + 2)
        for p in graph[c]:
            if p in DROPPED:
                seed = answer["pads"][p]
            elif p in COLLUDERS:
                seed = parties.encoders[p]._secagg._keys.pad_seed(p, c, adv[c]["s_pk"], exchange)
            else:
                continue
            y = y - keystream(seed, P + 2) if p > c else y + keystream(seed, P + 2)
        alone[c] = y
    return {group: _decode(sum((alone[c] for c in group), np.zeros(P + 2, np.uint64))) for group in _split(run_id)}


def _decode(total):
    return decode_fixed_point(total[:P], ClientPolicy().fractional_bits)  # sorted names: "g" first


def _attack_round(parties, run_id, adv, rnd, values):
    """One round of the attack in setup ``run_id``: all prepare the same broadcast, the survivors mask, the server
    unmasks with the drop-outs and holds the sums of the groups of honest survivors, which are checked."""
    view = parties.prepare(IDS, values, rnd, Protection())
    sums = _group_sums(parties, run_id, adv, rnd, view, _masked(parties, run_id, adv, rnd, SURVIVORS))
    for group, total in sums.items():
        np.testing.assert_allclose(total, sum(values[c] for c in group), atol=1e-8)
    return sums


def _full_round(parties, run_id, adv, rnd, values, degree=DEGREE):
    """One round in setup ``run_id`` with every party surviving (no drop-outs): the sum of all, checked exact."""
    parties.prepare(IDS, values, rnd, Protection())
    masked = _masked(parties, run_id, adv, rnd, IDS, degree)
    fields = _fields(run_id, rnd, degree)
    certificate = parties.certificate(IDS, fields, IDS)
    unmask = {**fields, "dropped": members_bitmap(IDS, []), **certificate, "seed": True, "pads": []}
    total = np.zeros(P + 2, dtype=np.uint64)
    for c in IDS:
        total += masked[c] - keystream(parties.ask(c, "unmask", unmask)["seed"], P + 2)
    np.testing.assert_allclose(_decode(total), sum(values.values()), atol=1e-8)


def _refused_by_all(parties, members, run_id, adv, rnd, values, degree=DEGREE):
    """The same broadcast asked again in round ``rnd``: every one of ``members`` refuses to mask it."""
    parties.prepare(IDS, values, rnd, Protection())
    fields = _fields(run_id, rnd, degree)
    graph = _graph(run_id, degree)
    for c in members:
        request = {**fields, "size": P + 2, "s_pk": {p: adv[p]["s_pk"] for p in graph[c]}}
        with pytest.raises(EncoderRefusal, match=REFUSED):
            parties.ask(c, "masked_input", request)


# --- the re-setup partition: one graph per broadcast --------------------------------------------------------------
@pytest.mark.parametrize("restart", [False, True], ids=["in-process", "restored-each-message"])
def test_a_new_setup_does_not_get_the_same_broadcast_over_another_graph(restart):
    """The attack: setup 1 (a ground run id) splits the 8 honest survivors into groups, whose sums the server learns
    (checked: the replay is the attacker's). Setup 2, another ground run id with another split, asks the same
    broadcast, cohort and drop-outs again: every honest party refuses, so the server holds the sums of one split only
    and cannot solve for the inputs (the attacker had all 8 from 7 setups). Restored from its saved state before each
    message (a Flower ClientApp), a party keeps the same record."""
    parties = Parties(IDS, restart=restart)
    values = _values(IDS, seed=6)
    first = _grind()
    adv = _setup(parties, first)
    learnt = _attack_round(parties, first, adv, 0, values)
    second = _grind(avoid={_split(first)})
    adv = _setup(parties, second)
    _refused_by_all(parties, HONEST, second, adv, 1, values)
    rows = [[1.0 if c in group else 0.0 for c in HONEST] for group in learnt]
    assert np.linalg.matrix_rank(np.array(rows)) < len(HONEST)  # no linear system: one split's sums only


@pytest.mark.parametrize("restart", [False, True], ids=["in-process", "restored-each-message"])
def test_a_retry_within_a_setup_is_answered_and_another_setup_or_degree_refused(restart):
    """A retry within one setup (the same broadcast in round 1, the same run id, degree and cohort, nobody dropped)
    is answered as before, and the sum is exact. The same broadcast under a larger degree (9: above the parties' floor
    8, so the protocol client accepts it) is another graph, and under a new setup another one again: every party
    refuses both."""
    parties = Parties(IDS, restart=restart)
    values = _values(IDS, seed=7)
    first = _grind()
    adv = _setup(parties, first)
    _full_round(parties, first, adv, 0, values)
    _full_round(parties, first, adv, 1, values)  # the retry: answered as before
    assert _graph(first, DEGREE + 1) != _graph(first)
    _refused_by_all(parties, IDS, first, adv, 2, values, degree=DEGREE + 1)
    second = _grind(avoid={_split(first)})
    assert _graph(second) != _graph(first)
    adv = _setup(parties, second)
    _refused_by_all(parties, IDS, second, adv, 3, values)


def _without_graph_record(state):
    """An encoder state as saved before the graph record: the header without ``"graphs"``."""
    with np.load(io.BytesIO(state), allow_pickle=False) as npz:
        arrays = {name: npz[name] for name in npz.files}
    header = json.loads(arrays["header"].tobytes().decode("utf-8"))
    header.pop("graphs", None)
    arrays["header"] = np.frombuffer(json.dumps(header).encode("utf-8"), np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def test_an_old_state_without_the_graph_record_loads_and_records_the_next_graph():
    """A party restored from a state saved before the record (no ``"graphs"``) loads, takes it as no record, and
    answers the retry within the setup; that masking records the graph, so the next setup's repeat is refused."""
    parties = Parties(IDS)
    values = _values(IDS, seed=8)
    first = _grind()
    adv = _setup(parties, first)
    _full_round(parties, first, adv, 0, values)
    for c in IDS:
        state = _without_graph_record(parties.encoders[c].to_state())
        parties.encoders[c] = ClientEncoder.from_state(c, parties.policy, state, parties.identities[c])
    _full_round(parties, first, adv, 1, values)
    second = _grind(avoid={_split(first)})
    adv = _setup(parties, second)
    _refused_by_all(parties, IDS, second, adv, 2, values)


# --- a refused advertise changes nothing ---------------------------------------------------------------------------
@pytest.mark.parametrize("restart", [False, True], ids=["in-process", "restored-each-message"])
@pytest.mark.parametrize(
    "bad",
    [{"run_id": b"short"}, {"run_id": None}, {"run_id": "x" * 32}, {}],
    ids=["8-bytes", "None", "str", "missing"],
)
def test_a_refused_advertise_leaves_the_setup_intact(bad, restart):
    """``advertise_wipe.py``: after the parties masked and signed the survivor set, the server sends each a malformed
    advertise. It is refused, and the party's state (run id, keys, held shares, signed sets, records) is byte for byte
    what it was, also as saved for a restart; the run's unmask is then answered and the sum is exact (it failed: the
    encoder had replaced its protocol client and taken the bad run id)."""
    ids = ["p0", "p1", "p2", "p3", "p4"]
    parties = Parties(ids, restart=restart)
    values = _values(ids, seed=9)
    run_id, adv = parties.setup(ids)
    view = parties.prepare(ids, values, 0, Protection())
    masked, fields = parties.masked(run_id, adv, ids, ids, 0, view, P + 2)
    certificate = parties.certificate(ids, fields, ids)
    for c in ids:
        before = parties.encoders[c].to_state()
        with pytest.raises(ValueError, match="run_id"):
            parties.ask(c, "advertise", bad)
        assert parties.encoders[c]._run_id == run_id
        assert parties.encoders[c].to_state() == before
    unmask = {**fields, "dropped": members_bitmap(ids, []), **certificate, "seed": True, "pads": []}
    total = np.zeros(P + 2, dtype=np.uint64)
    for c in ids:
        total += masked[c] - keystream(parties.ask(c, "unmask", unmask)["seed"], P + 2)
    np.testing.assert_allclose(_decode(total), sum(values.values()), atol=1e-8)
