"""The neighbour rule (issue 43, finding S1): a server that declares a victim's honest masking neighbours dropped.

Attack A1 of the issue (cohort 32, degree 10): the server ignores the masked inputs of 9 of the victim's 10 masking
neighbours ("dropped"), keeps one colluding neighbour, and collects a valid quorum for that survivor set. The victim,
a survivor, reveals its self-mask seed and its pads with the "dropped"; the colluder's key gives the last pad: the
victim's input falls out with 1 colluder, fewer than the degree the threat model named. Now a survivor signs a survivor
set, and reveals anything, only if ``h = ⌊d/2⌋ + 1`` of its own masking neighbours survive, so the server must control
``h`` of them. Played here on a cohort of 16 (``d = 8``, ``h = 5``) with ``h − 1`` colluders (refused), the limit
with ``h`` colluders (the victim's input falls out: the bound is tight, an assumption and not a margin), the control
(``d − h`` neighbours really dropped: the sum is exact), and availability (``d − h + 1`` really dropped: refused, with
the reason).
"""

import numpy as np
import pytest

from gpflow_fed.federated.protection.identity import consistency_message, members_digest
from gpflow_fed.federated.protection.masking import MaskingKeys, keystream, masking_graph
from gpflow_fed.federated.protection.secagg import (
    SecAggAborted,
    components,
    default_degree,
    honest_group_floor,
    members_bitmap,
    neighbour_floor,
)
from tests.federated.protection.secagg_helpers import Net

K = 16


def _masking_key(net, client):
    """What the server knows of a colluding client: its masking key."""
    return MaskingKeys.from_private_bytes(net.clients[client].to_state()["secrets"][:32])


def _attack(colluding):
    """A1 on a cohort of 16: ``colluding`` of the victim's 8 neighbours collude, the other neighbours are declared
    dropped (their masked inputs ignored). Returns (the victim, its true codes, the codes the server rebuilds or None,
    the honest clients' refusals)."""
    net = Net(K, authenticated=True)
    net.setup()
    exchange = net.exchange(0)
    graph = masking_graph(exchange, default_degree(K))
    victim = exchange.cohort[0]
    colluders = set(graph[victim][:colluding])
    dropped = set(graph[victim]) - colluders
    survivors = frozenset(exchange.cohort) - dropped
    base = net.fields(exchange)
    net.draw(exchange)
    asked = {
        c: {**base, "size": net.size, "s_pk": {p: net.server.roster[p][0] for p in graph[c]}} for c in exchange.cohort
    }
    y = {c: a["masked"] for c, a in net.send("masked_input", asked).items() if a is not None}
    shown = {c: {**base, "survivors": members_bitmap(net.ids, survivors)} for c in survivors - colluders}
    signatures = {c: a["signature"] for c, a in net.send("consistency", shown).items() if a is not None}
    for c in colluders:  # the colluders sign whatever the server asks
        message = consistency_message(
            net.run_id, exchange.digest, members_digest(exchange.cohort), members_digest(survivors), c
        )
        signatures[c] = net.identities[c].signing_key.sign(message)
    unmask = {
        **base,
        "dropped": members_bitmap(net.ids, dropped),
        "signers": members_bitmap(net.ids, signatures),
        "signatures": b"".join(signatures[c] for c in sorted(signatures)),
        "seed": True,
        "pads": sorted(dropped),
    }
    answer = net.send("unmask", {victim: unmask})[victim]
    refusals = dict(net.refusals)
    if answer is None:
        return victim, net.codes[victim], None, refusals
    pads = dict(answer["pads"])
    for c in colluders:
        pads[c] = _masking_key(net, c).pad_seed(c, victim, net.server.roster[victim][0], exchange)
    value = y[victim] - keystream(answer["seed"], net.size)
    for peer, pad in pads.items():
        value = value - keystream(pad, net.size) if victim < peer else value + keystream(pad, net.size)
    return victim, net.codes[victim], value, refusals


def test_fewer_than_h_colluders_cannot_isolate_a_victim():
    d = default_degree(K)
    h = neighbour_floor(d)
    assert (d, h) == (8, 5)
    victim, truth, rebuilt, refusals = _attack(h - 1)
    assert rebuilt is None  # before the rule: the victim's exact codes, with 1 colluder of 10 in attack A1
    assert "only 4 of its own 8 masking neighbours survive, below h = 5" in refusals[victim]


def test_h_colluders_isolate_a_victim_the_bound_is_tight():
    """With ``h`` of the victim's neighbours colluding and the other ``d − h`` declared dropped, every honest client
    keeps its rule and the victim's codes fall out: the package claims fewer than ``h`` colluders, no more."""
    victim, truth, rebuilt, refusals = _attack(neighbour_floor(default_degree(K)))
    assert victim not in refusals and rebuilt is not None and (rebuilt == truth).all()


def test_the_same_drop_outs_below_the_limit_still_unmask():
    """Control: ``d − h`` of a client's neighbours really drop out; the sum of the survivors is exact."""
    net = Net(K, authenticated=True)
    net.setup()
    exchange = net.exchange(0)
    graph = masking_graph(exchange, default_degree(K))
    victim = exchange.cohort[0]
    gone = set(graph[victim][: default_degree(K) - neighbour_floor(default_degree(K))])
    net.offline["masked_input"] = gone
    result = net.secure_sum(exchange)
    assert set(result.dropped) == gone and not net.refusals
    assert (result.total == net.plain(result.survivors)).all()


def test_more_than_d_minus_h_real_drop_outs_abort_with_the_reason():
    """Availability: ``d − h + 1`` of a client's neighbours really drop out; the server aborts before the consistency
    round (naming the client and the rule), and the client refuses to sign or unmask if asked anyway."""
    net = Net(K, authenticated=True)
    net.setup()
    exchange = net.exchange(0)
    graph = masking_graph(exchange, default_degree(K))
    victim = exchange.cohort[0]
    gone = set(graph[victim][:4])
    net.offline["masked_input"] = gone
    with pytest.raises(SecAggAborted, match=r"keeps 4 of its 8 masking neighbours, below h = 5 \(⌊d/2⌋ \+ 1\)"):
        net.secure_sum(exchange)
    survivors = frozenset(exchange.cohort) - gone
    asked = {**net.fields(exchange), "survivors": members_bitmap(net.ids, survivors)}
    assert net.send("consistency", {victim: asked})[victim] is None
    assert "only 4 of its own 8 masking neighbours survive, below h = 5" in net.refusals[victim]
    unmask = {**net.fields(exchange), "dropped": members_bitmap(net.ids, gone), "seed": True, "pads": sorted(gone)}
    unmask.update({"signers": members_bitmap(net.ids, []), "signatures": b""})
    assert net.send("unmask", {victim: unmask})[victim] is None
    assert "only 4 of its own 8 masking neighbours survive" in net.refusals[victim]


def test_without_a_roster_no_b_share_of_a_survivor_short_of_neighbours():
    """Unauthenticated mode: the victim refuses to unmask, and its share holders refuse to rebuild its ``b`` (else a
    server would take the victim's pads from its "dropped" neighbours and its seed from its holders)."""
    net = Net(K)
    net.setup()
    exchange = net.exchange(0)
    graph = masking_graph(exchange, default_degree(K))
    victim = exchange.cohort[0]
    base = net.fields(exchange)
    net.draw(exchange)
    asked = {
        c: {**base, "size": net.size, "s_pk": {p: net.server.roster[p][0] for p in graph[c]}} for c in exchange.cohort
    }
    net.send("masked_input", asked)
    for holder in net.server.stored[victim]:
        # four of the victim's neighbours "dropped", as few of the holder's own as possible
        others = sorted((p for p in graph[victim] if p != holder), key=lambda p: (p in graph[holder], p))
        dropped = set(others[:4])
        if sum(p not in dropped for p in graph[holder]) >= neighbour_floor(len(graph[holder])):
            break
    else:
        raise AssertionError("no holder keeps its own neighbours (the graphs changed: revisit the choice)")
    request = {**base, "dropped": members_bitmap(net.ids, dropped), "seed": False, "pads": [], "b_shares": [victim]}
    assert net.send("unmask", {holder: request})[holder] is None
    assert f"only 4 of {victim!r}'s 8 masking neighbours survive, below h = 5" in net.refusals[holder]
    # control: with three dropped the holder gives its share
    request["dropped"] = members_bitmap(net.ids, others[:3])
    assert victim in net.send("unmask", {holder: request})[holder]["b_shares"]


def test_honest_group_floor_bounds_every_group_the_server_can_learn():
    """:func:`honest_group_floor` against brute force: random drop-outs and colluders on a cohort of 16 that keep
    every survivor's rule; each component of the graph over the honest survivors (what the server learns the sums of)
    has at least the floor's members."""
    net = Net(K)
    exchange = net.exchange(0, cohort=net.ids)
    d = default_degree(K)
    graph = masking_graph(exchange, d)
    rng = np.random.default_rng(43)
    checked = 0
    for _ in range(3000):
        # half the draws near one client (where a cut is likeliest), half anywhere
        pool = net.ids if rng.random() < 0.5 else list(graph[net.ids[int(rng.integers(0, K))]])
        dropped = set(rng.choice(pool, int(rng.integers(0, 6)), replace=False))
        survivors = set(net.ids) - dropped
        if any(sum(p in survivors for p in graph[c]) < neighbour_floor(d) for c in survivors):
            continue  # the survivors refuse: nothing is unmasked
        for c in range(0, 7):
            colluders = set(rng.choice(pool if len(pool) >= c else net.ids, c, replace=False))
            honest = survivors - colluders
            groups = components(graph, honest)
            floor = honest_group_floor(len(survivors), len(dropped), d, c)
            assert min((len(g) for g in groups), default=0) >= floor
            checked += 1
    assert checked > 1000
    # the two regimes: drop-outs and colluders fewer than d leave one group; else the neighbour rule's h + 1 − c
    assert honest_group_floor(13, 3, 8, 4) == 9
    assert honest_group_floor(12, 4, 8, 4) == 2
    assert honest_group_floor(12, 4, 8, 5) == 1 and honest_group_floor(8, 8, 8, 0) == 6
    with pytest.raises(ValueError, match="colluders"):
        honest_group_floor(12, 4, 8, -1)
    with pytest.raises(ValueError, match="degree"):
        honest_group_floor(12, 4, 0, 1)


def test_distributed_dp_attack_a5_the_honest_floor_sees_the_isolated_victim():
    """A5 (a cohort of 32, degree 10, 16 honest clients assumed by the noise): 9 of the victim's neighbours declared
    dropped and one colluder. Survivors 23 ≥ 16 passed the encoder's count; the honest floor with ``c = h − 1 = 5``
    (the masking's stated bound) is 2, below 16, and the rule refuses anyway; with no drop-out it is 27."""
    net = Net(32)
    net.setup()
    exchange = net.exchange(0)
    graph = masking_graph(exchange, default_degree(32))
    victim = exchange.cohort[0]
    dropped = set(graph[victim][1:])
    request = {**net.fields(exchange), "dropped": members_bitmap(net.ids, dropped)}
    c = neighbour_floor(default_degree(32)) - 1
    assert net.clients[victim].honest_floor(request, c) == 2 < 16 <= 32 - len(dropped)
    request["dropped"] = members_bitmap(net.ids, [])
    assert net.clients[victim].honest_floor(request, c) == 27 == net.clients[victim].honest_floor(request)
