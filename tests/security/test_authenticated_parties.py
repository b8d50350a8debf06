"""Authenticated parties (issue 43, item 2): key substitution and sybils against clients that hold a roster.

The adversary is the server: it writes every setup request. Attack 1 of issue 43 (key substitution): the server
shows the victim its own keys and the server's keys for everyone else, decrypts the victim's Shamir shares (they
are encrypted to the server's keys), rebuilds its self-mask seed ``b`` and strips its pads. Each attack is played
against clients with rosters (refused at ``share``) with its control: the same attack against roster-less clients
(the unauthenticated mode) recovers the victim's input exactly, and the honest setup with rosters works.
"""

import copy
import hashlib
import json
import pickle

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from gpflow_fed.federated.protection import identity as identity_module
from gpflow_fed.federated.protection.identity import (
    PartyIdentity,
    advertise_message,
    check_roster,
    format_roster,
    public_key_bytes,
    read_roster,
    read_signing_key,
    roster_digest,
    roster_line,
    write_signing_key,
)
from gpflow_fed.federated.protection.masking import MaskingKeys, keystream, length_prefixed, masking_graph
from gpflow_fed.federated.protection.secagg import (
    SecAggClient,
    default_degree,
    holder_graph,
    members_bitmap,
    self_mask_seed,
)
from gpflow_fed.federated.protection.shamir import combine_shares, decrypt_share
from tests.federated.protection.secagg_helpers import Net, drive

SHARED = "self-mask seed b"


class SubstitutingServer:
    """A server that substitutes its own X25519 keys for every party but the victim, in the victim's ``share``
    request only (the others see the honest request). It keeps the victim's encrypted shares."""

    def __init__(self, net, victim):
        self.net, self.victim = net, victim
        self.private = {c: X25519PrivateKey.generate().private_bytes_raw() for c in net.ids if c != victim}
        self.s_keys = {c: MaskingKeys.from_private_bytes(p) for c, p in self.private.items()}  # as s_sk and c_sk
        self.ciphertexts = None
        self.victim_keys = None

    def send(self, stage, requests):
        if stage == "share":
            honest = requests[self.victim]
            self.victim_keys = (honest["s_pk"][self.victim], honest["c_pk"][self.victim])
            forged = {c: k.public_bytes for c, k in self.s_keys.items()}
            requests = {
                **requests,
                self.victim: {
                    **honest,
                    "s_pk": {**honest["s_pk"], **forged},
                    "c_pk": {**honest["c_pk"], **forged},
                },
            }
        answers = self.net.send(stage, requests)
        if stage == "share":
            self.ciphertexts = answers.get(self.victim)
            self.share_refusal = self.net.refusals.get(self.victim, "")
        return answers

    def rebuild_b(self, degree, threshold):
        """The victim's ``b`` from its shares, decrypted with the server's keys."""
        holders = holder_graph(self.net.run_id, self.net.ids, degree)[self.victim]
        shares = [
            (
                holders.index(h) + 1,
                decrypt_share(self.private[h], self.victim_keys[1], self.net.run_id, self.victim, h, SHARED, ct),
            )
            for h, ct in self.ciphertexts["ciphertexts"].items()
        ]
        return combine_shares(shares, threshold)

    def strip(self, b, exchange):
        """The victim's codes: its masked input asked with the server's keys as its neighbours', then its
        self-mask (from ``b``) and every pad (the server holds the neighbours' private keys) removed."""
        net, victim = self.net, self.victim
        degree = default_degree(len(exchange.cohort))
        neighbours = masking_graph(exchange, degree)[victim]
        request = {
            "run_id": net.run_id,
            "purpose": exchange.purpose,
            "round": exchange.round,
            "phase": exchange.phase,
            "cohort": members_bitmap(net.ids, exchange.cohort),
            "degree": degree,
            "size": net.size,
            "s_pk": {p: self.s_keys[p].public_bytes for p in neighbours},
        }
        y = net.clients[victim].masked_input(request, net.codes[victim])["masked"]
        y = y - keystream(self_mask_seed(b, exchange, victim), net.size)
        for p in neighbours:
            pad = keystream(self.s_keys[p].pad_seed(p, victim, self.victim_keys[0], exchange), net.size)
            y = y - pad if p > victim else y + pad  # the victim added +PRG for j > i, −PRG for j < i
        return y


def _attack(net):
    victim = net.ids[3]
    server = SubstitutingServer(net, victim)
    report = drive(net.server.setup_stages(net.ids), server.send)
    return server, report


def test_key_substitution_is_refused_by_clients_with_a_roster():
    net = Net(8, authenticated=True)
    server, report = _attack(net)
    victim = server.victim
    assert server.ciphertexts is None  # the victim sent no share at all
    assert "substituted keys" in server.share_refusal
    assert victim not in report.eligible  # it took no part; the others set up among themselves
    assert set(report.eligible) == set(net.ids) - {victim}


def test_control_key_substitution_strips_a_roster_less_victim():
    """The unauthenticated mode (a semi-honest server only): the same attack gives the victim's codes exactly."""
    net = Net(8)
    server, report = _attack(net)
    victim = server.victim
    assert server.ciphertexts is not None and not server.share_refusal  # it accepted the substituted keys
    b = server.rebuild_b(report.degree, report.threshold)
    assert b == net.clients[victim].to_state()["secrets"][64:]  # its self-mask seed, from its own shares
    exchange = net.exchange(0, cohort=net.ids)  # the attacker's own cohort
    net.draw(exchange)
    np.testing.assert_array_equal(server.strip(b, exchange), net.codes[victim])


def test_control_the_honest_setup_with_rosters_sums_exactly():
    net = Net(8, authenticated=True)
    report = net.setup()
    assert report.eligible == tuple(net.ids) and not net.refusals
    assert all(net.clients[c].authenticated for c in net.ids)
    exchange = net.exchange(0)
    result = net.secure_sum(exchange)
    np.testing.assert_array_equal(result.total, net.plain(net.ids))


def _tampered_setup(net, tamper):
    """A setup whose ``share`` requests the server rewrites with ``tamper(request) -> request``."""

    refused = {}

    def send(stage, requests):
        if stage == "share":
            requests = {c: tamper(dict(r)) for c, r in requests.items()}
        net.refusals.clear()
        answers = net.send(stage, requests)
        if stage == "share":
            refused.update(net.refusals)
        return answers

    report = drive(net.server.setup_stages(net.ids), send)
    return report, refused


def _sybil(request, name, run_id):
    """``request`` with a party ``name`` whose keys and signature are the server's own."""
    s_pk = X25519PrivateKey.generate().public_key().public_bytes_raw()
    c_pk = X25519PrivateKey.generate().public_key().public_bytes_raw()
    signature = Ed25519PrivateKey.generate().sign(advertise_message(run_id, name, s_pk, c_pk))
    return {
        **request,
        "s_pk": {**request["s_pk"], name: s_pk},
        "c_pk": {**request["c_pk"], name: c_pk},
        "signatures": {**request["signatures"], name: signature},
    }


def test_a_sybil_not_on_the_roster_is_refused():
    net = Net(6, authenticated=True)
    _, refused = _tampered_setup(net, lambda r: _sybil(r, "client_99", net.run_id))
    assert set(refused) == set(net.ids)
    assert all("not on its roster" in why for why in refused.values())


def test_a_party_on_the_roster_impersonated_by_the_server_is_refused():
    """The roster holds 7 parties, 6 take part: the server adds the absent one with its own keys (a sybil under a
    name the parties agreed on). Its signature is not under that party's roster key."""
    everyone = PartyIdentity.federation([f"client_{k:02d}" for k in range(7)])
    net = Net(6)
    net.identities = everyone
    net.clients = {c: SecAggClient(c, **net.credentials(c)) for c in net.ids}
    _, refused = _tampered_setup(net, lambda r: _sybil(r, "client_06", net.run_id))
    assert set(refused) == set(net.ids)
    assert all("not signed by 'client_06'" in why for why in refused.values())


@pytest.mark.parametrize("missing", ["one signature", "every signature"])
def test_a_missing_signature_is_refused(missing):
    net = Net(6, authenticated=True)
    dropped = net.ids[4]

    def tamper(request):
        if missing == "every signature":
            request.pop("signatures")
        else:
            request["signatures"] = {c: s for c, s in request["signatures"].items() if c != dropped}
        return request

    report, refused = _tampered_setup(net, tamper)
    assert set(refused) == set(net.ids) and not report.eligible
    assert all(("without a signature" if missing == "one signature" else "no signatures") in why
               for why in refused.values())  # fmt: skip


def test_a_signature_from_another_run_is_refused():
    """A party's keys and signature from an earlier run, replayed in a new run: the run id is signed."""
    first = Net(5, authenticated=True)
    first.setup()
    old = first.server.roster[first.ids[1]]
    old_signature = first.view[1][2]["signature"]  # (advertise, client_01, its answer)
    assert first.view[1][1] == first.ids[1]
    second = Net(5)
    second.identities = first.identities
    second.clients = {c: SecAggClient(c, **second.credentials(c)) for c in second.ids}
    target = second.ids[1]

    def tamper(request):
        return {
            **request,
            "s_pk": {**request["s_pk"], target: old[0]},
            "c_pk": {**request["c_pk"], target: old[1]},
            "signatures": {**request["signatures"], target: old_signature},
        }

    _, refused = _tampered_setup(second, tamper)
    others = [c for c in second.ids if c != target]
    assert all("not signed by 'client_01'" in refused[c] for c in others)


def test_restore_from_state_keeps_the_roster_outside_the_state():
    net = Net(8, authenticated=True)
    net.restart = True  # every client is rebuilt from to_state() with its own key and roster before each message
    net.setup()
    exchange = net.exchange(0)
    np.testing.assert_array_equal(net.secure_sum(exchange).total, net.plain(net.ids))
    client = net.ids[0]
    state = net.clients[client].to_state()
    party = net.identities[client]
    blob = b"".join(state.values())
    assert party.signing_key.private_bytes_raw() not in blob  # the signing key is never in the state
    assert all(key not in blob for key in party.roster.values())  # nor the roster (only its digest)
    with pytest.raises(ValueError, match="another roster"):
        SecAggClient.from_state(state)  # restored without its roster: refused, never a silent downgrade
    other = PartyIdentity.federation(net.ids)[client]
    with pytest.raises(ValueError, match="another roster"):
        SecAggClient.from_state(state, identity=other.signing_key, roster=other.roster)
    with pytest.raises(ValueError, match="another roster"):  # a roster-less state restored with one
        SecAggClient.from_state(SecAggClient("client_00").to_state(), identity=party.signing_key, roster=party.roster)


def test_a_roster_is_checked_when_the_client_is_made():
    party = PartyIdentity.federation(["a", "b"])["a"]
    with pytest.raises(ValueError, match="needs this party's identity"):
        SecAggClient("a", roster=party.roster)
    with pytest.raises(ValueError, match="does not hold 'c'"):
        SecAggClient("c", identity=party.signing_key, roster=party.roster)
    with pytest.raises(ValueError, match="does not hold 'b'"):
        SecAggClient("b", identity=party.signing_key, roster=party.roster)  # a's key under b's name
    key = party.roster["a"]
    with pytest.raises(ValueError, match="look-alikes"):
        check_roster({"Alice": key, "alice": party.roster["b"]})
    with pytest.raises(ValueError, match="normal form"):
        check_roster({"Ａ": key})
    with pytest.raises(ValueError, match="control or invisible"):
        check_roster({"a\u200b": key})
    with pytest.raises(ValueError, match="same public key"):
        check_roster({"a": key, "b": key})
    assert "signing" not in repr(party) and party.signing_key.private_bytes_raw().hex() not in repr(party)


def test_key_and_roster_files(tmp_path):
    path = tmp_path / "party.key"
    key = write_signing_key(str(path))
    assert (path.stat().st_mode & 0o777) == 0o600
    assert read_signing_key(str(path)).private_bytes_raw() == key.private_bytes_raw()
    with pytest.raises(FileExistsError):
        write_signing_key(str(path))  # never over an existing key
    path.chmod(0o644)
    with pytest.raises(ValueError, match="chmod 600"):
        read_signing_key(str(path))
    other = Ed25519PrivateKey.generate()
    roster = {"client_0": public_key_bytes(key), "client_1": public_key_bytes(other)}
    text = format_roster(roster)
    assert text.splitlines()[0] == roster_line("client_0", public_key_bytes(key))
    (tmp_path / "roster").write_text("# agreed out of band\n" + text)
    assert read_roster(str(tmp_path / "roster")) == roster
    (tmp_path / "bad").write_text(text + "client_2 abcd\n")
    with pytest.raises(ValueError, match="line 3"):
        read_roster(str(tmp_path / "bad"))
    (tmp_path / "twice").write_text(text + text.splitlines()[0] + "\n")
    with pytest.raises(ValueError, match="listed twice"):
        read_roster(str(tmp_path / "twice"))


def test_a_flower_party_without_a_roster_refuses_to_start_unless_it_opts_out(tmp_path):
    from gpflow_fed.federated.protection.identity import node_identity, write_federation

    with pytest.raises(ValueError, match="refuses to start without authenticated parties"):
        node_identity({}, "client_0")
    for word in ("yes", "1", "True "):  # strict parsing: never a silent opt-out
        with pytest.raises(ValueError, match="no-roster"):
            node_identity({"no-roster": word}, "client_0")
    assert node_identity({"no-roster": True}, "client_0") is None
    assert node_identity({"no-roster": "true"}, "client_0") is None
    keys, roster = write_federation(str(tmp_path / "ids"), ["client_0", "client_1"])
    with pytest.raises(ValueError, match="contradicts"):
        node_identity({"no-roster": True, "roster": roster}, "client_0")
    with pytest.raises(ValueError, match="refuses to start"):
        node_identity({"roster": roster}, "client_0")
    party = node_identity({"signing-key": keys["client_0"], "roster": roster}, "client_0")
    assert party.public_key == read_roster(roster)["client_0"]
    with pytest.raises(ValueError, match="does not hold 'client_1'"):  # client_0's key under client_1's name
        node_identity({"signing-key": keys["client_0"], "roster": roster}, "client_1")


def test_a_federation_checks_its_roster_once_and_a_roster_given_in_full(monkeypatch):
    """``PartyIdentity.federation`` checked the roster once per party (K checks of K entries, quadratic in K); now
    once, and every identity and protocol client shares that read-only roster. A roster a user gives,
    however it was made, is checked in full."""
    checked = []
    real = identity_module.party_name

    def counting(value, where="party name"):
        checked.append(value)
        return real(value, where)

    monkeypatch.setattr(identity_module, "party_name", counting)
    ids = [f"client_{k:02d}" for k in range(20)]
    parties = PartyIdentity.federation(ids)
    assert sorted(checked) == ids  # each entry once (a check per identity: 20 × 20)
    roster = parties[ids[0]].roster
    assert all(party.roster is roster for party in parties.values())
    checked.clear()
    key = parties[ids[3]].signing_key
    assert SecAggClient(ids[3], identity=key, roster=roster).authenticated and checked == []  # not again
    # what was checked cannot change: every change is refused, and the roster is as it was
    other = public_key_bytes(Ed25519PrivateKey.generate())

    def merge(r):
        r |= {"intruder": other}

    for change in (
        lambda r: r.__setitem__("intruder", other),
        lambda r: r.__delitem__(ids[0]),
        lambda r: r.update({"intruder": other}),
        lambda r: r.setdefault("intruder", other),
        lambda r: r.pop(ids[0]),
        lambda r: r.popitem(),
        lambda r: r.clear(),
        merge,
    ):
        with pytest.raises(TypeError, match="read-only"):
            change(roster)
    assert sorted(roster) == ids and "intruder" not in roster
    assert copy.copy(roster) is roster and copy.deepcopy(roster) is roster
    assert pickle.loads(pickle.dumps(roster)) == roster  # unpickled: checked again
    # a roster given by a user is checked in full: a copy of the checked one, one with a look-alike or a shared key
    checked.clear()
    assert PartyIdentity(key, dict(roster)).roster == roster and sorted(checked) == ids
    look_alike = {**roster, "Client_00": other}
    shared = {**roster, "client_99": roster[ids[1]]}
    with pytest.raises(ValueError, match="look-alikes"):
        PartyIdentity(key, look_alike)
    with pytest.raises(ValueError, match="same public key"):
        PartyIdentity(key, shared)
    with pytest.raises(ValueError, match="look-alikes"):
        SecAggClient(ids[3], identity=key, roster=look_alike)

    class Posing(type(roster)):  # a subclass that skips the checks does not pass for a checked roster
        def __init__(self, entries):
            dict.__init__(self, entries)

    with pytest.raises(ValueError, match="look-alikes"):
        PartyIdentity(key, Posing(look_alike))


def test_a_roster_is_hashed_once_with_the_documented_digest(monkeypatch):
    """Each protocol client hashed the whole roster itself (K hashes of K entries at an in-process set-up: quadratic);
    now the checked roster carries its digest, computed once when it is made, and every client that holds it uses
    that. The digest is as before: SHA-256 of the length-prefixed tag, then each (id, key) pair in sorted order."""
    ids = [f"client_{k:02d}" for k in range(6)]
    keys = {c: Ed25519PrivateKey.from_private_bytes(bytes([k + 1]) * 32) for k, c in enumerate(ids)}  # fixed
    hashed = []
    real = hashlib.sha256

    def counting(data=b"", **kwargs):
        hashed.append(bytes(data).startswith(length_prefixed(b"gpflow-fed/roster/v1")))
        return real(data, **kwargs)

    monkeypatch.setattr(hashlib, "sha256", counting)
    roster = check_roster({c: public_key_bytes(k) for c, k in keys.items()})
    assert hashed.count(True) == 1  # when it was made
    clients = [SecAggClient(c, identity=keys[c], roster=roster) for c in ids]
    assert hashed.count(True) == 1  # not again, by any of the clients
    monkeypatch.setattr(hashlib, "sha256", real)
    parts = [length_prefixed(b"gpflow-fed/roster/v1")]
    parts += [length_prefixed(c.encode("utf-8")) + length_prefixed(public_key_bytes(keys[c])) for c in sorted(ids)]
    expected = hashlib.sha256(b"".join(parts)).hexdigest()
    assert roster.digest == roster_digest(roster) == roster_digest(dict(roster)) == expected
    assert all(json.loads(c.to_state()["record"])["roster_digest"] == expected for c in clients)
    with pytest.raises(TypeError, match="read-only"):
        roster.digest = "0" * 64
    shuffled = dict(reversed(list(roster.items())))  # the same roster in another order: the same digest
    assert roster_digest(shuffled) == expected and roster_digest({c: roster[c] for c in ids[1:]}) != expected
