"""Attacks on secure aggregation with drop-out recovery (:mod:`gpflow_fed.federated.protection.secagg`).

The adversary is the server: it writes every request, relays every message, and keeps everything it receives
(``Net.view``). A curious server follows the protocol and computes what it can from that view; a deviating
one rewrites requests. Each attack asserts that it fails, with a control that the same computation succeeds
where the protection is absent. The limits the module docstring states are shown as such (``test_limit_*``).
"""

from dataclasses import replace

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from gpflow_fed.federated.protection.masking import MaskingKeys, keystream, masking_graph
from gpflow_fed.federated.protection.secagg import (
    SecAggAborted,
    SecAggClient,
    SecAggRefused,
    default_degree,
    members_bitmap,
    self_mask_seed,
)
from gpflow_fed.federated.protection.shamir import ShareDecryptionError, combine_shares, decrypt_share
from tests.federated.protection.secagg_helpers import Net, drive


def graph_of(exchange):
    return masking_graph(exchange, default_degree(len(exchange.cohort)))


def request(net, exchange, client, **extra):
    """The masked-input request the protocol sends to ``client`` (or, with ``dropped=[ids]``, an unmask request)."""
    base = {
        "run_id": net.run_id,
        "purpose": exchange.purpose,
        "round": exchange.round,
        "phase": exchange.phase,
        "cohort": members_bitmap(net.server.roster, exchange.cohort),
        "degree": default_degree(len(exchange.cohort)),
    }
    if "dropped" in extra:
        dropped = members_bitmap(net.server.roster, extra.pop("dropped"))
        return {**base, "seed": False, "pads": [], "b_shares": [], "dropped": dropped, **extra}
    return {**base, "size": net.size, "s_pk": {p: net.server.roster[p][0] for p in graph_of(exchange)[client]}, **extra}


def knowledge(net, exchange):
    """Everything a curious server holds about ``exchange`` from its view: masked inputs, survivors' self-mask
    seeds (given, or rebuilt from b shares) and the revealed pad seeds ``(survivor, dropped) -> seed``."""
    masked = {c: a[0]["masked"] for c, a in net.received("masked_input", exchange).items()}
    seeds, pads, shares = {}, {}, {}
    for c, answers in net.received("unmask", exchange).items():
        for a in answers:
            if "seed" in a:
                seeds[c] = a["seed"]
            for p, value in a["pads"].items():
                pads[(c, p) if c in masked else (p, c)] = value
            for owner, value in a["b_shares"].items():
                shares.setdefault(owner, []).append((net.server.holders[owner].index(c) + 1, value))
    for owner, got in shares.items():
        seeds[owner] = self_mask_seed(combine_shares(got, net.server.threshold), exchange, owner)
    return masked, seeds, pads


def unmask(net, members, masked, seeds, pads):
    """``Σ_{i ∈ members} y_i`` minus every self-mask and revealed pad the server can attribute to them."""
    total = np.zeros(net.size, dtype=np.uint64)
    for i in members:
        total += masked[i]
        total -= keystream(seeds[i], net.size)
    for (i, j), seed in pads.items():
        if i in members:
            total = total - keystream(seed, net.size) if i < j else total + keystream(seed, net.size)
    return total


# --- a curious server: what its view gives --------------------------------------------------------------
def test_the_server_view_unmasks_no_client_and_no_strict_subset():
    net = Net(30)
    net.setup()
    exchange = net.exchange(0)
    gone = set(net.ids[:3])  # 10 % drop out after masking
    net.offline = {"masked_input": gone, "unmask": {net.ids[10]}}  # one survivor during unmask; the dropped are back
    result = net.secure_sum(exchange)
    assert result.recovered == (net.ids[10],)
    masked, seeds, pads = knowledge(net, exchange)
    survivors = list(result.survivors)
    # control: the whole set of survivors gives the plain sum, as the protocol intends
    np.testing.assert_array_equal(unmask(net, survivors, masked, seeds, pads), net.plain(survivors))
    for i in survivors:  # no single client, including the one whose b was rebuilt
        assert not np.any(unmask(net, [i], masked, seeds, pads) == net.codes[i])
    rng = np.random.default_rng(1)
    for size in (2, 5, 13, len(survivors) - 1):
        for _ in range(10):
            subset = list(rng.choice(survivors, size, replace=False))
            assert not np.any(unmask(net, subset, masked, seeds, pads) == net.plain(subset))


def test_a_client_that_drops_later_keeps_its_earlier_inputs():
    """Client j survives exchange 1 (the server holds y_j and j's self-mask seed) and drops in exchange 2.
    What the server receives on the drop-out is bound to exchange 2, so exchange 1 stays masked.

    Control: had the protocol Shamir-shared the masking key s_sk_j (and rebuilt it on the drop-out, as the
    single-exchange protocols do), the same view gives j's exchange-1 codes exactly; so the key is not shared."""
    net = Net(16)
    net.setup()
    first = net.exchange(0)
    net.secure_sum(first)
    j, codes_1 = net.ids[4], net.codes[net.ids[4]]
    masked_1, seeds_1, _ = knowledge(net, first)
    second = net.exchange(1)
    net.offline = {"masked_input": {j}, "unmask": {j}}
    net.secure_sum(second)
    _, _, pads_2 = knowledge(net, second)
    assert any(d == j for _, d in pads_2)
    self_removed = masked_1[j] - keystream(seeds_1[j], net.size)
    for (i, d), seed in pads_2.items():  # exchange 2's pads do not fit exchange 1
        if d == j:
            self_removed = (
                self_removed - keystream(seed, net.size) if j < i else self_removed + keystream(seed, net.size)
            )
    assert not np.any(self_removed == codes_1)
    # control: with s_sk_j the server recomputes every exchange-1 pad of j
    s_sk_j = net.clients[j].to_state()["secrets"][:32]
    keys = MaskingKeys.from_private_bytes(s_sk_j)
    recovered = masked_1[j] - keystream(seeds_1[j], net.size)
    for peer in graph_of(first)[j]:
        pad = keystream(keys.pad_seed(j, peer, net.server.roster[peer][0], first), net.size)
        recovered = recovered - pad if j < peer else recovered + pad
    np.testing.assert_array_equal(recovered, codes_1)


def test_no_run_level_secret_reaches_the_server():
    net = Net(12)
    net.setup()
    exchange = net.exchange(0)
    late = next(c for c in net.ids[1:] if c not in graph_of(exchange)[net.ids[0]])
    net.offline = {"masked_input": {net.ids[0]}, "unmask": {net.ids[0], late}}
    assert net.secure_sum(exchange).recovered == (late,)  # b shares, pads and seeds all reach the server
    secrets = [net.clients[c].to_state()["secrets"] for c in net.ids]
    secret_parts = {s[k : k + 32] for s in secrets for k in (0, 32, 64)}

    def leaves(value):
        if isinstance(value, dict):
            for v in value.values():
                yield from leaves(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                yield from leaves(v)
        elif isinstance(value, np.ndarray):
            yield value.tobytes()
        elif isinstance(value, bytes):
            yield value

    seen = b"".join(leaf for _, _, answer in net.view for leaf in leaves(answer))
    assert seen and not any(part in seen for part in secret_parts)


def test_shares_are_neither_readable_nor_redirectable_by_the_server():
    net = Net(10)
    relayed = {}

    def send(stage, requests):
        if stage == "store":  # the server sends each holder the ciphertexts meant for another holder
            relayed.update({h: dict(r["ciphertexts"]) for h, r in requests.items()})
            holders = sorted(requests)
            requests = {
                h: {**requests[h], "ciphertexts": requests[holders[k - 1]]["ciphertexts"]}
                for k, h in enumerate(holders)
            }
        return net.send(stage, requests)

    report = drive(net.server.setup_stages(net.ids), send)
    assert not report.eligible and all("stored its shares" in why for why in report.excluded.values())
    # the server's own key pair cannot open a share, whichever sender key it pairs it with
    own = X25519PrivateKey.generate()
    own_private = own.private_bytes_raw()
    holder, ciphertexts = next(iter(relayed.items()))
    sender, ciphertext = next(iter(ciphertexts.items()))
    for pk in (net.server.roster[sender][1], net.server.roster[holder][1]):
        with pytest.raises(ShareDecryptionError):
            decrypt_share(own_private, pk, net.run_id, sender, holder, "self-mask seed b", ciphertext)
    # control: the intended holder opens it
    holder_private = net.clients[holder].to_state()["secrets"][32:64]
    assert (
        len(
            decrypt_share(
                holder_private, net.server.roster[sender][1], net.run_id, sender, holder, "self-mask seed b", ciphertext
            )
        )
        == 32
    )


# --- a deviating server: what honest clients refuse -----------------------------------------------------
def test_a_replayed_masked_input_is_refused():
    net = Net(10)
    net.setup()
    first = net.exchange(0)
    net.secure_sum(first)
    victim = net.ids[2]
    old = net.received("masked_input", first)[victim][0]

    def send(stage, requests):
        answers = net.send(stage, requests)
        if stage == "masked_input":
            answers[victim] = old  # the network (or the server) replays last round's message
        return answers

    second = net.exchange(1)
    net.draw(second)
    result = drive(net.server.secure_sum_stages(second, net.size), send)
    assert result.dropped == {victim: "masked input for another exchange (stale or replayed)"}
    np.testing.assert_array_equal(result.total, net.plain(result.survivors))


def test_one_answer_per_broadcast_whatever_the_cohort():
    """Issue 32's differencing attack: the same broadcast summed over {A, B, C} and then {A, B} gives C."""
    net = Net(8)
    net.setup()
    everyone = net.exchange(0)
    net.secure_sum(everyone)
    fewer = net.exchange(0, cohort=net.ids[:-1])
    with pytest.raises(SecAggAborted, match="0 survivor"):
        drive(net.server.secure_sum_stages(fewer, net.size), net.send)
    assert all("answered" in net.refusals[c] for c in fewer.cohort)
    with pytest.raises(SecAggRefused, match="answered"):  # the same exchange again
        net.clients[net.ids[0]].masked_input(request(net, everyone, net.ids[0]), net.codes[net.ids[0]])
    # control: another phase of the same round is answered
    assert net.secure_sum(net.exchange(0, phase="other")).survivors == tuple(net.ids)


def test_a_cohort_below_the_clients_own_minimum_is_refused():
    net = Net(8, min_cohort=5)  # the server's own minimum is 2
    net.setup()
    small = net.exchange(0, cohort=net.ids[:4])
    with pytest.raises(SecAggAborted, match="0 survivor"):
        net.secure_sum(small)
    assert not net.received("masked_input", small)  # nothing was sent, masked or not
    assert all("below its min_cohort = 5" in net.refusals[c] for c in small.cohort)
    assert net.secure_sum(net.exchange(1, cohort=net.ids[:5])).survivors == tuple(net.ids[:5])  # control


def test_clients_refuse_to_unmask_a_group_below_their_minimum():
    """A server that skips its own check and unmasks after drop-outs that isolate a client."""
    net = Net(20, min_cohort=3)
    net.setup()
    exchange = net.exchange(0)
    net.draw(exchange)
    lonely = net.ids[0]
    around = graph_of(exchange)[lonely]
    for c in exchange.cohort:
        if c not in around:
            net.clients[c].masked_input(request(net, exchange, c), net.codes[c])
    ask = request(net, exchange, lonely, dropped=list(around), seed=True)
    with pytest.raises(SecAggRefused, match="group of 1 survivor"):
        net.clients[lonely].unmask(ask)
    for peer in around:
        with pytest.raises(SecAggRefused, match="group of 1 survivor"):
            net.clients[peer].unmask(request(net, exchange, peer, dropped=list(around), pads=[lonely]))


def test_a_substituted_public_key_is_refused():
    net = Net(8)
    net.setup()
    exchange = net.exchange(0)
    net.draw(exchange)
    victim = net.ids[0]
    attacker = MaskingKeys()
    honest = request(net, exchange, victim)
    peer = next(iter(honest["s_pk"]))
    with pytest.raises(SecAggRefused, match="substituted"):
        net.clients[victim].masked_input(
            {**honest, "s_pk": {**honest["s_pk"], peer: attacker.public_bytes}}, net.codes[victim]
        )
    with pytest.raises(SecAggRefused, match="lacks a neighbour"):
        net.clients[victim].masked_input({**honest, "s_pk": {}}, net.codes[victim])
    with pytest.raises(SecAggRefused, match="malformed exchange"):  # a cohort can name roster members only
        net.clients[victim].masked_input({**honest, "cohort": b"\xff\xff"}, net.codes[victim])
    assert net.clients[victim].masked_input(honest, net.codes[victim])["masked"].shape == (net.size,)  # control
    # at setup, a roster that does not carry the client's own keys is refused
    fresh = SecAggClient("a")
    keys = fresh.advertise({"run_id": net.run_id})
    roster = {
        "s_pk": {"a": attacker.public_bytes, "b": attacker.public_bytes},
        "c_pk": {"a": keys["c_pk"], "b": keys["c_pk"]},
    }
    with pytest.raises(SecAggRefused, match="own public keys"):
        fresh.share({"run_id": net.run_id, **roster, "degree": 1, "threshold": 1})


def test_a_server_cannot_claim_a_client_both_survived_and_dropped():
    net = Net(12)
    net.setup()
    exchange = net.exchange(0)
    net.draw(exchange)
    for c in exchange.cohort:
        net.clients[c].masked_input(request(net, exchange, c), net.codes[c])
    graph = graph_of(exchange)
    j = net.ids[3]
    holder = sorted(net.server.stored[j])[0]
    neighbour = graph[j][0]
    # j listed as dropped: it does not reveal its self-mask seed
    with pytest.raises(SecAggRefused, match="listed as dropped"):
        net.clients[j].unmask(request(net, exchange, j, dropped=[j], seed=True))
    # a share of b_j is never given while j is listed as dropped
    with pytest.raises(SecAggRefused, match="listed survivor"):
        net.clients[holder].unmask(request(net, exchange, holder, dropped=[j], b_shares=[j]))
    # a neighbour shown "j dropped" gives its pad with j, then refuses every other view of the exchange
    shown_dropped = net.clients[neighbour].unmask(request(net, exchange, neighbour, dropped=[j], pads=[j]))
    assert set(shown_dropped["pads"]) == {j}
    with pytest.raises(SecAggRefused, match="another set of drop-outs"):
        net.clients[neighbour].unmask(request(net, exchange, neighbour, dropped=[], seed=True))
    # a pad between two survivors, or with a non-neighbour, is never given
    other = next(p for p in graph[neighbour] if p != j)
    with pytest.raises(SecAggRefused, match="one end dropped"):
        net.clients[neighbour].unmask(request(net, exchange, neighbour, dropped=[j], pads=[other]))
    far = next(c for c in exchange.cohort if c not in graph[j] and c != j)
    with pytest.raises(SecAggRefused, match="one end dropped"):
        net.clients[far].unmask(request(net, exchange, far, dropped=[j], pads=[j]))
    # control: a consistent view is answered again (a retry)
    assert (
        net.clients[neighbour].unmask(request(net, exchange, neighbour, dropped=[j], pads=[j]))["pads"]
        == shown_dropped["pads"]
    )


def test_a_seed_is_revealed_only_for_an_exchange_the_client_answered():
    net = Net(6)
    net.setup()
    exchange = net.exchange(0)
    c = net.ids[0]
    with pytest.raises(SecAggRefused, match="sent no masked input"):
        net.clients[c].unmask(request(net, exchange, c, dropped=[], seed=True))
    net.draw(exchange)
    net.clients[c].masked_input(request(net, exchange, c), net.codes[c])
    # the same round and phase shown with another degree (another graph) or another cohort: nothing is given
    with pytest.raises(SecAggRefused, match="another cohort or degree"):
        net.clients[c].unmask({**request(net, exchange, c, dropped=[], seed=True), "degree": 2})
    smaller = net.exchange(0, cohort=net.ids[:-1])
    with pytest.raises(SecAggRefused, match="another cohort or degree"):
        net.clients[c].unmask(request(net, smaller, c, dropped=[net.ids[1]], pads=[net.ids[1]]))
    assert len(net.clients[c].unmask(request(net, exchange, c, dropped=[], seed=True))["seed"]) == 32  # control


def test_a_client_whose_b_was_given_away_is_refused_by_its_holders():
    net = Net(12)
    net.setup()
    late = net.ids[1]
    net.offline = {"unmask": {late}}
    net.secure_sum(net.exchange(0))
    net.offline = {}
    holders = sorted(net.server.stored[late])
    nxt = net.exchange(1, cohort=net.ids)  # a server that ignores its own exclusion list
    net.draw(nxt)
    for h in holders:
        with pytest.raises(SecAggRefused, match="excluded"):
            net.clients[h].masked_input(request(net, nxt, h), net.codes[h])
    bystander = next(c for c in net.ids if c not in holders and c != late)
    assert net.clients[bystander].masked_input(request(net, nxt, bystander), net.codes[bystander])  # control


def test_limit_a_server_that_lies_to_different_clients_unmasks_one():
    """Not protected (module docstring): told it survived, j reveals its seed; told j dropped, each neighbour
    reveals its pad with j. No single honest client sees both claims, so the server gets j's codes."""
    net = Net(10)
    net.setup()
    exchange = net.exchange(0)
    net.draw(exchange)
    y = {c: net.clients[c].masked_input(request(net, exchange, c), net.codes[c])["masked"] for c in exchange.cohort}
    j = net.ids[0]
    seed = net.clients[j].unmask(request(net, exchange, j, dropped=[], seed=True))["seed"]
    value = y[j] - keystream(seed, net.size)
    for peer in graph_of(exchange)[j]:
        pad = net.clients[peer].unmask(request(net, exchange, peer, dropped=[j], pads=[j]))["pads"][j]
        value = value - keystream(pad, net.size) if j < peer else value + keystream(pad, net.size)
    np.testing.assert_array_equal(value, net.codes[j])


def test_limit_sybils_leave_the_sum_of_the_honest_clients():
    """s clients the server controls in a cohort of n: it learns the sum of the n − s others."""
    net = Net(6)
    net.setup()
    exchange = net.exchange(0)
    result = net.secure_sum(exchange)
    sybils = net.ids[:4]
    honest = [c for c in net.ids if c not in sybils]
    rest = result.total
    for s in sybils:
        rest = rest - net.codes[s]  # the server knows its sybils' codes
    np.testing.assert_array_equal(rest, net.plain(honest))


class ViewNet(Net):
    """Clients that bind their own view of the request (``views[client]``) into their pads, and a deviating server
    that accepts whatever tag comes back (it skips its own tag check)."""

    def __init__(self, K: int) -> None:
        super().__init__(K)
        self.views: dict = {}
        self.expected = b""

    def send(self, stage, requests):
        answers = {}
        for c, request in requests.items():
            answer = self.clients[c].respond(stage, request, self.codes.get(c), self.views.get(c, b""))
            answers[c] = {**answer, "tag": self.expected} if "tag" in answer else answer
        return answers


@pytest.mark.parametrize("shown", ["the same request", "another request to one client"])
def test_a_server_that_shows_cohort_members_different_requests_unmasks_noise(shown):
    """The third fresh-context attack: a server sent one client a broadcast that zeroed its answer (the moments
    exchange's scale 2^−64) and read its neighbours' sums alone. Each client binds its own view of the request
    (``request_view``) into its pads, so differing views leave the pads uncancelled: no subset's sum comes out."""
    from itertools import combinations

    net = ViewNet(4)
    net.setup()
    net.views = {c: b"view of the broadcast" for c in net.ids}
    if shown != "the same request":
        net.views[net.ids[0]] = b"a broadcast that zeroes client_00's answer"
    exchange = replace(net.exchange(0), view=b"view of the broadcast")
    net.expected = exchange.digest
    total = net.secure_sum(exchange).total
    if shown == "the same request":  # control: the honest protocol sums exactly
        np.testing.assert_array_equal(total, net.plain(net.ids))
        return
    for size in range(1, len(net.ids) + 1):
        for members in combinations(net.ids, size):
            assert not np.array_equal(total, net.plain(members)), members


def test_two_broadcasts_never_share_a_digest_through_a_name_holding_a_nul():
    """The fourth attack: without length prefixes, a name holding ``\\0`` shifted the boundary between arrays, so a
    broadcast that zeroed the others' answers had the victim's digest (and request view, and pads that cancel)."""
    from gpflow_fed.federated.protocol.messages import SERVER, Message
    from gpflow_fed.federated.protection.wire import broadcast_digest

    def header(name, value):
        return f"{name}\0{value.dtype.str}\0{value.shape}\0".encode()

    honest, zeroed, filler = np.array([1.0, 2.0, 3.0]), np.zeros(3), np.zeros(4, np.uint8)
    honest_entry = header("x", honest) + honest.tobytes()
    tail = b"z\0|u1\0" + f"({len(honest_entry)},)".encode() + b"\0"
    blob = f"|u1\0({filler.size},)\0".encode() + filler.tobytes() + header("x", zeroed) + zeroed.tobytes() + tail
    victim = {"a": np.frombuffer(blob, np.uint8), "x": honest}
    others = {f"a\0|u1\0({len(blob)},)": filler, "x": zeroed, "z": np.frombuffer(honest_entry, np.uint8)}
    digests = {broadcast_digest(Message(SERVER, 0, "p", arrays, weight=0.0)) for arrays in (victim, others)}
    assert len(digests) == 2
