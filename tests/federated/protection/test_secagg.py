"""Secure aggregation with drop-out recovery: exact sums, drop-outs at each stage, exclusions, state, validation."""

import pickle

import numpy as np
import pytest

from gpflow_fed.federated.protection.masking import MaskingKeys, masking_graph
from gpflow_fed.federated.protection.secagg import (
    SecAggAborted,
    SecAggClient,
    SecAggRefused,
    SecAggServer,
    components,
    default_degree,
    holder_graph,
    members_bitmap,
    members_of,
    neighbour_floor,
    payload_bytes,
)
from gpflow_fed.federated.protection.shamir import ciphertext_bytes
from tests.federated.protection.secagg_helpers import Net, drive, random_codes


def graph_of(net, exchange):
    return masking_graph(exchange, default_degree(len(exchange.cohort)))


def test_setup_builds_the_holder_graph_and_reports_its_bytes():
    net = Net(20)
    report = net.setup()
    assert report.roster == report.eligible == tuple(net.ids) and not report.excluded
    assert report.degree == default_degree(20) == 10 and report.threshold == 6
    assert all(len(net.server.stored[c]) == 10 for c in net.ids)  # every holder stored every share
    # from each client: advertise {"s_pk", "c_pk"}; share {"ciphertexts": {holder: ct}}; store {"stored": ids}
    ident = len("client_00")
    per_client = (4 + 32 + 4 + 32) + (11 + 10 * (ident + ciphertext_bytes(32))) + (6 + 10 * ident)
    assert report.bytes_from_clients == 20 * per_client
    assert report.bytes_to_clients >= 20 * 20 * 64  # the roster's public keys, to every client
    with pytest.raises(RuntimeError, match="once per run"):
        net.setup()


@pytest.mark.parametrize("K", [2, 3, 25])
def test_exact_sum_without_drop_outs(K):
    net = Net(K)
    net.setup()
    for round in range(2):
        exchange = net.exchange(round)
        result = net.secure_sum(exchange)
        assert result.total.dtype == np.uint64
        np.testing.assert_array_equal(result.total, net.plain(net.ids))
        assert result.survivors == tuple(net.ids) and not result.dropped and not result.recovered
        assert result.bytes_from_clients >= K * net.size * 8 + K * 32  # masked inputs and seeds
    assert not net.server.excluded


def spread_drop_outs(net, exchange, count):
    """``count`` clients to drop, drawn one by one so that every survivor keeps ``h = ⌊d/2⌋ + 1`` of its masking
    neighbours (the neighbour rule; more drop-outs around one client abort the sum, tested in
    ``tests/security/test_neighbour_survival.py``)."""
    graph = graph_of(net, exchange)
    for _ in range(100):
        gone = set()
        for c in net.rng.permutation(list(exchange.cohort)):
            trial = gone | {str(c)}
            left = [s for s in exchange.cohort if s not in trial]
            if all(sum(p not in trial for p in graph[s]) >= neighbour_floor(len(graph[s])) for s in left):
                gone = trial
            if len(gone) == count:
                return gone
    raise AssertionError(f"no {count} drop-outs keep every survivor's neighbours")


@pytest.mark.parametrize("fraction", [0.1, 0.3])
def test_exact_sum_of_the_survivors_with_drop_outs_after_masked_input(fraction):
    net = Net(30)
    net.setup()
    exchange = net.exchange(0)
    gone = spread_drop_outs(net, exchange, int(fraction * 30))
    net.offline = {"masked_input": gone, "unmask": gone}
    result = net.secure_sum(exchange)
    assert set(result.dropped) == gone and set(result.survivors) == set(net.ids) - gone
    np.testing.assert_array_equal(result.total, net.plain(result.survivors))
    # dropped clients take no further part in the run, on the server and on the clients shown the unmask
    assert set(net.server.excluded) == gone and set(net.server.eligible) == set(net.ids) - gone
    with pytest.raises(ValueError, match="not eligible"):
        net.secure_sum(net.exchange(1, cohort=net.ids))
    survivor = net.clients[result.survivors[0]]
    assert gone <= survivor.excluded
    # the next exchange over the remaining clients is exact again
    net.offline = {}
    nxt = net.exchange(1)
    np.testing.assert_array_equal(net.secure_sum(nxt).total, net.plain(nxt.cohort))


def test_a_dropped_client_that_comes_back_gives_its_pads():
    """A client whose masked input was lost answers the unmask: the pad with a survivor that then fails is
    taken from the dropped end, and the survivor's seed from its b shares."""
    net = Net(20)
    net.setup()
    exchange = net.exchange(0)
    graph = graph_of(net, exchange)
    j = net.ids[3]
    f = graph[j][0]
    net.offline = {"masked_input": {j}, "unmask": {f}}
    result = net.secure_sum(exchange)
    assert result.dropped == {j: "no masked input"} and result.recovered == (f,)
    np.testing.assert_array_equal(result.total, net.plain(result.survivors))
    assert {j, f} <= set(net.server.excluded)


def test_a_survivor_that_fails_to_unmask_is_recovered_from_its_b_shares_and_excluded():
    net = Net(20)
    net.setup()
    exchange = net.exchange(0)
    late = net.ids[5]
    net.offline = {"unmask": {late}}
    result = net.secure_sum(exchange)
    assert result.recovered == (late,) and not result.dropped and late in result.survivors
    np.testing.assert_array_equal(result.total, net.plain(net.ids))
    assert "b was rebuilt" in net.server.excluded[late]
    holders = net.server.stored[late]
    assert all(late in net.clients[h].excluded for h in holders)  # the holders that gave its shares
    net.offline = {}
    with pytest.raises(ValueError, match="not eligible"):
        net.secure_sum(net.exchange(1, cohort=net.ids))


def test_too_many_drop_outs_abort_with_a_clear_error():
    net = Net(10, min_survivors=4)
    net.setup()
    net.offline = {"masked_input": set(net.ids[:7])}
    with pytest.raises(SecAggAborted, match="3 survivor.*min_survivors = 4"):
        net.secure_sum(net.exchange(0))
    assert not net.server.excluded  # nothing was unmasked, so nobody is excluded


def test_drop_outs_that_isolate_a_survivor_abort_before_anything_is_unmasked():
    net = Net(20)
    net.setup()
    exchange = net.exchange(0)
    lonely = net.ids[0]
    around = set(graph_of(net, exchange)[lonely])
    net.offline = {"masked_input": around}
    with pytest.raises(SecAggAborted, match="group of 1"):
        net.secure_sum(exchange)
    assert not [s for s, _, _ in net.view if s == "unmask"]


def test_too_few_holders_of_b_abort():
    net = Net(12)
    report = net.setup()
    late = net.ids[2]
    holders = sorted(net.server.stored[late])
    gone = set(holders[: report.degree - report.threshold + 1])  # one holder more than the slack
    net.offline = {"unmask": {late, *gone}}
    with pytest.raises(SecAggAborted, match=f"{late}.*cannot be rebuilt.*threshold is {report.threshold}"):
        net.secure_sum(net.exchange(0, cohort=[c for c in net.ids if c not in gone]))
    assert late in net.server.excluded


def test_a_pad_whose_two_ends_are_gone_aborts():
    net = Net(20)
    net.setup()
    exchange = net.exchange(0)
    j = net.ids[4]
    f = graph_of(net, exchange)[j][0]
    net.offline = {"masked_input": {j}, "unmask": {j, f}}
    with pytest.raises(SecAggAborted, match="are lost"):
        net.secure_sum(exchange)
    # the survivor's b was not rebuilt for nothing: no share of it was asked for
    assert f not in net.server.excluded
    assert not any(answer.get("b_shares") for stage, _, answer in net.view if stage == "unmask")


def test_clients_that_fail_setup_are_excluded():
    net = Net(12)
    net.offline = {"advertise": {net.ids[0]}, "share": {net.ids[1]}}
    report = net.setup()
    assert report.roster == tuple(net.ids[1:])
    assert report.excluded == {
        net.ids[0]: "setup: no valid public keys advertised",
        net.ids[1]: "setup: no valid encrypted shares",
    }
    assert report.eligible == tuple(net.ids[2:])
    result = net.secure_sum(net.exchange(0))
    np.testing.assert_array_equal(result.total, net.plain(net.ids[2:]))


def test_a_client_whose_share_reached_too_few_holders_is_excluded():
    net = Net(12)
    victim = net.ids[0]
    d = default_degree(12)
    holders = holder_graph(net.run_id, net.ids, d)[victim]
    net.offline = {"store": set(holders[: d - (d // 2 + 1) + 1])}  # one more than the slack d − t
    report = net.setup()
    assert "share holders stored its shares" in report.excluded[victim]
    assert all(len(net.server.stored[c]) >= report.threshold for c in report.eligible)


def test_duplicate_public_keys_are_excluded_at_setup():
    net = Net(6)

    def send(stage, requests):
        answers = net.send(stage, requests)
        if stage == "advertise":
            answers[net.ids[0]] = dict(answers[net.ids[1]])  # a client presenting another's keys
        return answers

    report = drive(net.server.setup_stages(net.ids), send)
    assert set(report.excluded) == {net.ids[0], net.ids[1]} and "used twice" in report.excluded[net.ids[0]]


def test_invalid_masked_inputs_count_as_drop_outs():
    net = Net(12)
    net.setup()
    exchange = net.exchange(0)

    def send(stage, requests):
        answers = net.send(stage, requests)
        if stage == "masked_input":
            answers[net.ids[0]] = {**answers[net.ids[0]], "masked": answers[net.ids[0]]["masked"].astype(np.int64)}
            answers[net.ids[1]] = {**answers[net.ids[1]], "masked": answers[net.ids[1]]["masked"][:-1]}
            answers[net.ids[2]] = "garbage"
        return answers

    net.draw(exchange)
    result = drive(net.server.secure_sum_stages(exchange, net.size), send)
    assert set(result.dropped) == set(net.ids[:3])
    assert result.dropped[net.ids[0]] == f"masked input is not a uint64 array of {net.size} codes"
    np.testing.assert_array_equal(result.total, net.plain(result.survivors))


def test_malformed_unmask_answers_are_ignored():
    net = Net(12)
    net.setup()
    exchange = net.exchange(0)
    bad = net.ids[0]

    def send(stage, requests):
        answers = net.send(stage, requests)
        if stage == "unmask" and bad in answers and answers[bad] and "seed" in answers[bad]:
            answers[bad] = {**answers[bad], "seed": b"short"}
        return answers

    net.draw(exchange)
    result = drive(net.server.secure_sum_stages(exchange, net.size), send)
    assert result.recovered == (bad,)  # its malformed seed was ignored, its b rebuilt instead
    np.testing.assert_array_equal(result.total, net.plain(net.ids))


def test_clients_restarted_before_every_message_give_the_same_exact_sums():
    net = Net(15)
    net.restart = True
    net.setup()
    gone = {net.ids[1]}
    net.offline = {"masked_input": gone, "unmask": {net.ids[7]}}
    result = net.secure_sum(net.exchange(0))
    np.testing.assert_array_equal(result.total, net.plain(result.survivors))
    net.offline = {}
    nxt = net.exchange(1)
    np.testing.assert_array_equal(net.secure_sum(nxt).total, net.plain(nxt.cohort))


def test_state_round_trip_keeps_keys_records_and_policy():
    net = Net(6, min_cohort=3)
    net.setup()
    exchange = net.exchange(0)
    net.secure_sum(exchange)
    client = net.clients[net.ids[0]]
    state = client.to_state()
    assert set(state) == {"format", "secrets", "run_id", "record"} and all(isinstance(v, bytes) for v in state.values())
    again = SecAggClient.from_state(state)
    assert again.to_state() == state and again.min_cohort == 3
    assert again._keys.public_bytes == client._keys.public_bytes
    with pytest.raises(SecAggRefused, match="answered"):  # the answered-once record survived
        again.masked_input({**_request(net, exchange, net.ids[0])}, random_codes(net.rng, net.size))
    with pytest.raises(ValueError, match="not a secure-aggregation client state"):
        SecAggClient.from_state({**state, "format": b"other"})
    with pytest.raises(ValueError, match="not a secure-aggregation client state"):
        SecAggClient.from_state({**state, "record": b"{"})
    with pytest.raises(TypeError, match="never pickle"):
        pickle.dumps(client)


def _request(net, exchange, client):
    graph = graph_of(net, exchange)
    return {
        "run_id": net.run_id,
        "purpose": exchange.purpose,
        "round": exchange.round,
        "phase": exchange.phase,
        "cohort": members_bitmap(net.server.roster, exchange.cohort),
        "degree": default_degree(len(exchange.cohort)),
        "size": net.size,
        "s_pk": {p: net.server.roster[p][0] for p in graph[client]},
    }


def test_clients_and_server_validate_settings():
    with pytest.raises(ValueError, match="min_cohort"):
        SecAggClient("a", min_cohort=1)
    with pytest.raises(TypeError, match="client_id"):
        SecAggClient("")
    with pytest.raises(ValueError, match="run_id"):
        SecAggServer(b"short")
    with pytest.raises(ValueError, match="min_survivors"):
        SecAggServer(bytes(16), min_survivors=1)
    with pytest.raises(ValueError, match=r"threshold 2 is not in \(d/2, d\]"):
        Net(12, threshold=2).setup()
    net = Net(4)
    with pytest.raises(ValueError, match="run setup"):
        net.secure_sum(net.exchange(0, cohort=net.ids))
    net.setup()
    with pytest.raises(ValueError, match="size"):
        drive(net.server.secure_sum_stages(net.exchange(0), 0), net.send)
    client = net.clients[net.ids[0]]
    with pytest.raises(TypeError, match="uint64"):
        client.masked_input(_request(net, net.exchange(0), net.ids[0]), np.zeros(net.size))
    with pytest.raises(SecAggRefused, match="unknown stage"):
        client.respond("nope", {})


def test_the_masking_key_is_rebuilt_from_its_bytes():
    private = bytes(range(32))
    keys = MaskingKeys.from_private_bytes(private)
    assert keys.public_bytes == MaskingKeys.from_private_bytes(private).public_bytes
    with pytest.raises(ValueError, match="32 bytes"):
        MaskingKeys.from_private_bytes(b"short")


def test_members_bitmap_round_trip_and_validation():
    roster = [f"c{k}" for k in range(11)]
    bitmap = members_bitmap(roster[::-1], ["c3", "c0", "c10"])
    assert len(bitmap) == 2 and members_of(roster, bitmap) == ("c0", "c10", "c3")  # sorted roster order
    assert members_of(roster, members_bitmap(roster, [])) == ()
    with pytest.raises(ValueError, match="not in the roster"):
        members_bitmap(roster, ["zz"])
    with pytest.raises(ValueError, match="2 bytes"):
        members_of(roster, b"\x01")
    with pytest.raises(ValueError, match="beyond the roster"):
        members_of(roster, b"\x00\x80")


def test_payload_bytes_and_components():
    assert payload_bytes({"a": b"xy", "n": 3, "f": True, "v": np.zeros(4, np.uint64), "l": ["ab", None]}) == (
        1 + 2 + 1 + 8 + 1 + 1 + 1 + 32 + 1 + 2
    )
    graph = {"a": ("b",), "b": ("a", "c"), "c": ("b",), "d": ()}
    assert sorted(sorted(c) for c in components(graph, "abcd")) == [["a", "b", "c"], ["d"]]
    assert sorted(sorted(c) for c in components(graph, "acd")) == [["a"], ["c"], ["d"]]
