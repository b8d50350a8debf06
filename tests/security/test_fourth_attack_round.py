"""Issue 43 (a fresh attacker), findings S2, S3, A6 and the round-overflow probe, played with the package's own client.

* **S2**: the one-cohort-per-broadcast rule compared the cohort's *bitmap* bytes; a bitmap indexes the sorted roster of
  the current setup, so a server that re-ran setup (a new secure-aggregation run id) with the roster "everyone but k"
  got the same bytes for a different cohort in every round: N sums of one broadcast gave every party's update, with no
  colluder. The encoder now records cohorts and drop-outs by the digest of their party ids, across setups and across a
  restart from its saved state (a Flower ClientApp).
* **S3**: distributed DP's conditional rounding could fail (``RuntimeError``) with a probability that depends on the
  payload when the server asked for β near 1; the failure was neither the generic data refusal nor followed by a stop,
  so the server could ask again and count. Any failure while encoding the client's data is now :data:`DATA_FAULT`,
  then the client stops; β is at most :data:`MAX_BETA` (and the rounding clips with a margin, so that a fine grid no
  longer fails on every payload at the clip norm).
* **A6**: the drop-out set of an unmask was pinned before the protocol client checked the request, so one invalid
  unmask made the honest one refused; **overflow**: a round of 2^70 raised ``OverflowError``.
"""

import os

import numpy as np
import pytest

from gpflow_fed.federated.protection import distributed_dp
from gpflow_fed.federated.protection.distributed_dp import MAX_BETA, DistributedDP, NoiseSource
from gpflow_fed.federated.protection.encoder import DATA_FAULT, ClientEncoder, EncoderRefusal
from gpflow_fed.federated.protection.identity import PartyIdentity
from gpflow_fed.federated.protection.masking import Exchange, keystream, masking_graph
from gpflow_fed.federated.protection.policy import ClientPolicy
from gpflow_fed.federated.protection.request import Protection
from gpflow_fed.federated.protection.secagg import default_degree, members_bitmap
from gpflow_fed.federated.protection.wire import broadcast_digest, decode_fixed_point, request_view
from gpflow_fed.federated.protocol.messages import Message

P = 3  # payload entries; the masked layout adds the saturation count and the weight (fixed point)


class Parties:
    """Parties with their own signing keys and the roster of them all, each with its own :class:`ClientEncoder`
    (default policy); ``restart``: every party is rebuilt from its saved state before each message (a Flower
    ClientApp with ``keep_alive=False``)."""

    def __init__(self, ids, restart=False):
        self.ids = list(ids)
        self.identities = PartyIdentity.federation(self.ids)
        self.policy = ClientPolicy()
        self.encoders = {c: ClientEncoder(c, self.policy, {c: 100 for c in self.ids}, self.identities[c]) for c in ids}
        self.restart = restart

    def ask(self, c, stage, request):
        if self.restart:
            state = self.encoders[c].to_state()
            self.encoders[c] = ClientEncoder.from_state(c, self.policy, state, self.identities[c])
        return self.encoders[c].respond(stage, request)

    def setup(self, members, run_id=None, degree=None):
        """A setup over ``members`` only (the server's choice of roster), with a fresh run id unless given (a server
        grinding run ids) and the default masking degree unless given."""
        run_id = os.urandom(32) if run_id is None else run_id
        adv = {c: self.ask(c, "advertise", {"run_id": run_id}) for c in members}
        d = default_degree(len(members)) if degree is None else degree
        request = {
            "run_id": run_id,
            "s_pk": {c: adv[c]["s_pk"] for c in members},
            "c_pk": {c: adv[c]["c_pk"] for c in members},
            "degree": d,
            "threshold": d // 2 + 1,
            "signatures": {c: adv[c]["signature"] for c in members},
        }
        cts = {c: self.ask(c, "share", request)["ciphertexts"] for c in members}
        for h in members:
            self.ask(h, "store", {"run_id": run_id, "ciphertexts": {i: cts[i][h] for i in members if h in cts[i]}})
        return run_id, adv

    def prepare(self, members, values, rnd, protection, theta=None):
        """Each member prepares its answer to one broadcast (the same in every round: the server repeats it; its
        ``theta``, float64 zeros unless given)."""
        theta = np.zeros(1) if theta is None else theta
        digest = broadcast_digest(Message("server", rnd, "p", {"theta": theta}))
        view = request_view(digest, protection.to_config(), len(members), "sum", b"")
        for c in members:
            self.encoders[c].claim("train", rnd, "p")
            message = Message(c, rnd, "p", {"g": values[c]}, weight=1.0)
            self.encoders[c].prepare(message, protection, "sum", len(members), "train", None, digest, view)
        return view

    def masked(self, run_id, adv, members, cohort, rnd, view, size):
        """The masked inputs of ``cohort`` (a bitmap over the setup's roster ``members``) and the exchange's fields."""
        fields = {
            "run_id": run_id,
            "purpose": "train",
            "round": rnd,
            "phase": "p",
            "cohort": members_bitmap(members, cohort),
            "degree": default_degree(len(cohort)),
        }
        graph = masking_graph(Exchange(run_id, "train", rnd, "p", tuple(cohort), view), fields["degree"])
        answers = {
            c: self.ask(c, "masked_input", {**fields, "size": size, "s_pk": {p: adv[p]["s_pk"] for p in graph[c]}})
            for c in cohort
        }
        return {c: a["masked"] for c, a in answers.items()}, fields

    def certificate(self, members, fields, survivors):
        signatures = {
            c: self.ask(c, "consistency", {**fields, "survivors": members_bitmap(members, survivors)})["signature"]
            for c in survivors
        }
        signers = sorted(signatures)
        return {"signers": members_bitmap(members, signers), "signatures": b"".join(signatures[c] for c in signers)}

    def secure_sum(self, members, values, rnd, protection=None, theta=None):
        """One fixed-point sum over a setup whose roster is ``members``, its cohort all of them: the decoded sum of
        the members' ``"g"`` (the broadcast's ``theta`` as :meth:`prepare`)."""
        protection = protection or Protection()
        run_id, adv = self.setup(members)
        view = self.prepare(members, values, rnd, protection, theta)
        masked, fields = self.masked(run_id, adv, members, members, rnd, view, P + 2)
        certificate = self.certificate(members, fields, members)
        unmask = {**fields, "dropped": members_bitmap(members, []), **certificate, "seed": True, "pads": []}
        total = np.zeros(P + 2, dtype=np.uint64)
        for c in members:
            seed = self.ask(c, "unmask", unmask)["seed"]
            total += masked[c]
            total -= keystream(seed, P + 2)
        return decode_fixed_point(total[:P], ClientPolicy().fractional_bits)  # sorted names: "g" first


def _values(ids, seed=0):
    rng = np.random.default_rng(seed)
    return {c: rng.normal(size=P) for c in ids}


# --- S2: a re-setup does not make a new cohort look like the one answered ----------------------------------------
@pytest.mark.parametrize("restart", [False, True], ids=["in-process", "restored-each-message"])
def test_a_resetup_with_another_roster_does_not_alias_the_cohort(restart):
    """A3b: four honest parties; round k's setup has the roster "everyone but p_k" and the cohort all of it, so its
    bitmap is the same bytes (three ones) every round. Round 0's sum is answered; in round 1 (same broadcast, new
    setup) the parties of both cohorts refuse: they masked this broadcast for another set of parties. Without the
    rule, four sums give every update. Restored from its saved state before each message (a Flower ClientApp), the
    party keeps the same record."""
    ids = ["p0", "p1", "p2", "p3"]
    parties = Parties(ids, restart=restart)
    values = _values(ids)
    first = [c for c in ids if c != "p0"]
    np.testing.assert_allclose(parties.secure_sum(first, values, 0), sum(values[c] for c in first), atol=1e-8)
    second = [c for c in ids if c != "p1"]
    assert members_bitmap(first, first) == members_bitmap(second, second)  # the alias the attack relies on
    with pytest.raises(EncoderRefusal, match="for another cohort"):
        parties.secure_sum(second, values, 1)


def test_a_resetup_over_the_same_parties_answers_the_same_cohort_again():
    """Control: a new setup over the same parties (a Flower run's second job, say) is no attack; the broadcast
    answered in round 0 is answered again in round 1 over the same cohort, and the sum is exact."""
    ids = ["p0", "p1", "p2"]
    parties = Parties(ids)
    values = _values(ids, seed=1)
    for rnd in (0, 1):
        np.testing.assert_allclose(parties.secure_sum(ids, values, rnd), sum(values.values()), atol=1e-8)


def test_a_masked_input_request_naming_dropouts_does_not_shrink_the_cohort():
    """The cohort a party masks over is the request's cohort: a ``"dropped"`` field in a ``masked_input`` request
    (which the protocol client does not read there) does not lower the member count the encoding's range and the
    distributed-DP checks use (here: four honest clients assumed; two named "dropped" would have made it refuse)."""
    ids = ["p0", "p1", "p2", "p3"]
    parties = Parties(ids)
    ddp = DistributedDP(noise_multiplier=1.0, clip_norm=1.0, honest_clients=4)
    protection = Protection(differential_privacy=ddp)
    run_id, adv = parties.setup(ids)
    view = parties.prepare(ids, _values(ids), 0, protection)
    extra = {"dropped": members_bitmap(ids, ["p2", "p3"])}
    fields = {
        "run_id": run_id,
        "purpose": "train",
        "round": 0,
        "phase": "p",
        "cohort": members_bitmap(ids, ids),
        "degree": default_degree(len(ids)),
    }
    graph = masking_graph(Exchange(run_id, "train", 0, "p", tuple(ids), view), fields["degree"])
    request = {**fields, **extra, "size": P + 1, "s_pk": {p: adv[p]["s_pk"] for p in graph["p0"]}}
    assert parties.ask("p0", "masked_input", request)["masked"].size == P + 1


# --- S3: a failure while encoding is the generic data refusal, then a stop; β is bounded ------------------------
def _ddp_parties(monkeypatch, fail):
    ids = ["p0", "p1", "p2"]
    parties = Parties(ids)
    protection = Protection(differential_privacy=DistributedDP(noise_multiplier=1.0, clip_norm=1.0, honest_clients=2))
    run_id, adv = parties.setup(ids)
    view = parties.prepare(ids, _values(ids), 0, protection)
    if fail:
        real = distributed_dp.DistributedDP.encode_counted

        def failing(self, x, cohort_size, rng=None):
            if np.any(x > 0.0):  # a failure that depends on the payload (as the rounding's did)
                raise RuntimeError("conditional_round: no rounding within the norm bound in 10000 tries")
            return real(self, x, cohort_size, rng)

        monkeypatch.setattr(distributed_dp.DistributedDP, "encode_counted", failing)
    fields = {
        "run_id": run_id,
        "purpose": "train",
        "round": 0,
        "phase": "p",
        "cohort": members_bitmap(ids, ids),
        "degree": default_degree(len(ids)),
    }
    graph = masking_graph(Exchange(run_id, "train", 0, "p", tuple(ids), view), fields["degree"])
    request = {**fields, "size": P + 1, "s_pk": {p: adv[p]["s_pk"] for p in graph["p0"]}}
    return parties, request


def test_an_encoding_failure_is_the_generic_refusal_then_a_stop(monkeypatch):
    """A7: the server asks the masked input of the same exchange again and again; the first failure is answered in
    the words of :data:`DATA_FAULT` (whichever error), the kept payload is dropped and the party stops: every later
    ask is refused without encoding, so the server learns one bit per run."""
    parties, request = _ddp_parties(monkeypatch, fail=True)
    with pytest.raises(EncoderRefusal) as first:
        parties.ask("p0", "masked_input", request)
    assert str(first.value) == DATA_FAULT
    assert parties.encoders["p0"].stopped
    for _ in range(2):
        with pytest.raises(EncoderRefusal, match="answers no protected exchange again") as again:
            parties.ask("p0", "masked_input", request)
        assert str(again.value) != DATA_FAULT


def test_an_encoding_that_succeeds_is_masked(monkeypatch):
    """Control: the same exchange without a failure is masked, and the party is not stopped."""
    parties, request = _ddp_parties(monkeypatch, fail=False)
    assert parties.ask("p0", "masked_input", request)["masked"].size == P + 1
    assert not parties.encoders["p0"].stopped


def test_a_request_for_beta_near_one_is_refused():
    """A7's request (β = 1 − 10^-15) does not parse on the client: β is at most 0.99 (rounding fails with probability
    below 0.99^10000 < 3e-44); 0.99 itself is accepted."""
    ddp = DistributedDP(noise_multiplier=1.0, clip_norm=1.0, honest_clients=2, beta=MAX_BETA)
    config = Protection(differential_privacy=ddp).to_config()
    assert Protection.from_config(config).distributed.beta == MAX_BETA
    for beta in (1 - 1e-15, 0.995):
        with pytest.raises(ValueError, match="beta must be a number in"):
            Protection.from_config({**config, "ddp-beta": beta})


def test_the_attackers_payload_rounds_at_the_largest_beta():
    """A7's victim: the clipped payload's first coordinate just below an integer on a grid of 2^20 steps per clip
    norm; at β = 0.99 it encodes every time (at β = 1 − 10^-15 its first ask failed)."""
    G = 2.0**20
    ddp = DistributedDP(1.0, 1.0, 2, granularity=1.0 / G, beta=MAX_BETA)
    m = next(m for m in range(1000, 10**6) if 0.99999 < (np.sqrt(G * G - m * m) % 1.0) < 0.999999)
    v2 = m + 1e-9
    x = 2 * np.array([np.sqrt(G**2 - v2**2), v2]) / G
    rng = NoiseSource()
    for _ in range(20):
        assert ddp.encode(x, 2, rng).shape == (2,)


@pytest.mark.parametrize("steps", [44, 48, 52])
def test_a_payload_at_the_clip_norm_rounds_on_a_fine_grid(steps):
    """With c/γ ≥ 2^44 the loop's bound Δ̃² (1 − 10^-12) fell below ‖v‖² for every payload at the clip norm, so the
    rounding failed exactly for the payloads the clip touched (an oracle on ‖x‖ > c); the rounding now clips to
    c (1 − 2^-36) and succeeds, within the bound the accounting uses."""
    ddp = DistributedDP(1.0, 1.0, 2, granularity=2.0**-steps, beta=MAX_BETA)
    x = np.random.default_rng(steps).normal(size=8)
    x *= 2.0 / np.linalg.norm(x)
    rng = NoiseSource()
    for _ in range(3):
        assert ddp.encode(x, 2, rng).shape == (8,)


# --- A6: drop-outs pinned only once the unmask is answered; the round's range --------------------------------------
def _masked_and_certified(ids):
    parties = Parties(ids)
    run_id, adv = parties.setup(ids)
    view = parties.prepare(ids, _values(ids), 0, Protection())
    _, fields = parties.masked(run_id, adv, ids, ids, 0, view, P + 2)
    return parties, fields, parties.certificate(ids, fields, ids)


@pytest.mark.parametrize("invalid", ["uncertified-dropouts", "forged-certificate"])
def test_an_invalid_unmask_does_not_pin_its_dropouts(invalid):
    """A6: the server first sends an unmask the protocol client refuses (drop-outs without a certificate, or the honest
    drop-outs with forged signatures); the party refuses it, and then answers the honest, certified unmask."""
    ids = ["p0", "p1", "p2", "p3", "p4"]
    parties, fields, certificate = _masked_and_certified(ids)
    honest = {**fields, "dropped": members_bitmap(ids, []), **certificate, "seed": True, "pads": []}
    if invalid == "uncertified-dropouts":
        bad = {**fields, "dropped": members_bitmap(ids, ["p4"]), "seed": True, "pads": []}
    else:
        bad = {**honest, "signatures": b"\1" * len(certificate["signatures"])}
    with pytest.raises(ValueError):
        parties.ask("p0", "unmask", bad)
    assert "seed" in parties.ask("p0", "unmask", honest)


def test_after_an_answered_unmask_other_dropouts_are_refused():
    """Control: once an unmask is answered, its drop-outs are pinned for the broadcast."""
    ids = ["p0", "p1", "p2", "p3", "p4"]
    parties, fields, certificate = _masked_and_certified(ids)
    parties.ask("p0", "unmask", {**fields, "dropped": members_bitmap(ids, []), **certificate, "seed": True, "pads": []})
    other = {**fields, "dropped": members_bitmap(ids, ["p4"]), **certificate, "seed": False, "pads": []}
    with pytest.raises(EncoderRefusal, match="other drop-outs"):
        parties.ask("p0", "unmask", other)


@pytest.mark.parametrize("stage", ["masked_input", "consistency", "unmask"])
@pytest.mark.parametrize("round", [2**63, -(2**63) - 1, 2**70])
def test_a_round_outside_64_bits_is_refused(stage, round):
    """A round the protocol's digests cannot encode is refused like any malformed request (no ``OverflowError``)."""
    ids = ["p0", "p1", "p2"]
    parties, fields, certificate = _masked_and_certified(ids)
    request = {**fields, "round": round, "survivors": members_bitmap(ids, ids), "dropped": members_bitmap(ids, [])}
    with pytest.raises(EncoderRefusal, match="outside the 64-bit signed range"):
        parties.ask("p0", stage, {**request, **certificate, "seed": True, "pads": [], "size": P + 2, "s_pk": {}})


def test_a_flower_party_restored_from_its_context_refuses_the_aliased_cohort(tmp_path):
    """A3d: parties behind the deployed ClientApp (``keep_alive=False``: every message restores the party's encoder
    from ``Context.state`` and saves it back, messages through Flower's records). Round 0's setup has the roster
    "everyone but client_0" and is summed; round 1 repeats the broadcast under a new setup whose roster is "everyone
    but client_1" (the same cohort bitmap bytes): the parties of both cohorts refuse to mask."""
    pytest.importorskip("flwr")
    from gpflow_fed.federated.protocol.algorithm import Algorithm, FederationInfo
    from gpflow_fed.federated.protocol.transport import UPDATE, Request
    from gpflow_fed.federated.runtimes.flower.client_app import ClientHost
    from gpflow_fed.federated.runtimes.flower.records import (
        TRAIN_JOB,
        recorddict_to_response,
        request_context,
        request_to_recorddict,
    )
    from gpflow_fed.federated.runtimes.flower.testing import LoopbackGrid
    from gpflow_fed.federated.protection.wire import pack, unpack

    class Repeat(Algorithm):
        """A "sum" of each party's Y under a broadcast that never changes (the server repeats it)."""

        name = "repeat"

        def initial_state(self, info):
            return {}

        def aggregation(self, phase):
            return "sum"

        def broadcast(self, state, round, phase):
            return {"theta": np.zeros(1)}

        def client_update(self, client, broadcast):
            return self.reply(client, broadcast, {"sum_y": np.sum(client.data[1], axis=0)})

        def server_update(self, state, aggregate):
            return state

        def result(self, state):
            return None

    ids = [f"client_{k}" for k in range(4)]
    rng = np.random.default_rng(3)
    nodes = []
    for k, c in enumerate(ids):
        np.savez(tmp_path / f"{c}.npz", X=rng.normal(size=(4, 1)), Y=rng.normal(size=(4, 1)))
        nodes.append({"data": str(tmp_path / f"{c}.npz"), "client-index": k, "no-roster": True})
        nodes[-1]["state-dir"] = str(tmp_path / "state")
    info = FederationInfo(tuple(ids), {c: 4 for c in ids}, 1, 1, 0)
    host = ClientHost(keep_alive=False, job_algorithm=lambda job, config: Repeat(4))
    grid = LoopbackGrid(host.app(), nodes, {"algorithm": "repeat"}, run_id=7)
    node = {c: 1001 + k for k, c in enumerate(ids)}
    protection = Protection()

    def send(c, request):
        (reply,) = grid.send_and_receive(
            [grid.create_message(request_to_recorddict(request, info), "train", node[c], "g")]
        )
        response = recorddict_to_response(reply.content)
        if response.fault:
            raise EncoderRefusal(response.fault)
        return response

    def ask(c, stage, fields, rnd):
        structure, arrays = pack(fields)
        response = send(c, Request(stage, Message("server", rnd, "train", arrays), "train", {"protocol": structure}))
        return unpack(response.config["protocol"], response.message.arrays)

    def secure_sum(members, rnd):
        run_id = os.urandom(32)
        adv = {c: ask(c, "advertise", {"run_id": run_id}, rnd) for c in members}
        d = default_degree(len(members))
        keys = {"s_pk": {c: adv[c]["s_pk"] for c in members}, "c_pk": {c: adv[c]["c_pk"] for c in members}}
        cts = {
            c: ask(c, "share", {"run_id": run_id, **keys, "degree": d, "threshold": d // 2 + 1}, rnd) for c in members
        }
        for h in members:
            held = {i: cts[i]["ciphertexts"][h] for i in members if h in cts[i]["ciphertexts"]}
            ask(h, "store", {"run_id": run_id, "ciphertexts": held}, rnd)
        down = Message("server", rnd, "train", {"theta": np.zeros(1)})
        config = {"aggregation": "sum", "protection": protection.to_config(), "cohort_size": len(members)}
        layout = {c: send(c, Request(UPDATE, down, "train", config)).layout for c in members}[members[0]]
        size = int(sum(np.prod(layout[n]) for n in layout))
        context = request_context(info, TRAIN_JOB, None)
        view = request_view(broadcast_digest(down), protection.to_config(), len(members), "sum", context)
        graph = masking_graph(Exchange(run_id, "train", rnd, "train", tuple(members), view), d)
        fields = {"run_id": run_id, "purpose": "train", "round": rnd, "phase": "train", "degree": d}
        fields["cohort"] = members_bitmap(members, members)
        for c in members:
            ask(c, "masked_input", {**fields, "size": size, "s_pk": {p: adv[p]["s_pk"] for p in graph[c]}}, rnd)
        return fields["cohort"]

    first = secure_sum([c for c in ids if c != "client_0"], 0)
    with pytest.raises(EncoderRefusal, match="for another cohort"):
        assert secure_sum([c for c in ids if c != "client_1"], 1) == first
