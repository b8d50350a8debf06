"""Issue 43 (a fresh attacker, fifth round): a round the digests cannot encode, and a collusion bound the server set.

* **Round types**: a round given as a numpy integer (``np.uint64(2**64 − 1)``), a bool or an int outside the 64-bit
  signed range passed the encoder's round check (Python ints only) and raised ``OverflowError`` inside the protocol
  client, where the exchange's slot and tag encode the round in 8 signed bytes. A request's round is now a plain
  Python ``int`` in ``[0, 2^63 − 1]`` (the wire carries Python ints; rounds are 0-based), checked where the request
  is parsed, by the encoder (:class:`EncoderRefusal`) and by the protocol client itself (:class:`SecAggRefused`).
* **Collusion bound**: under distributed DP the unmask check took ``c = min(m − H, max_colluders or h − 1)`` with
  ``H`` the honest-client count the *server* asks for, so with the default policy (``honest_clients=None``) a request
  for ``H = m`` made ``c = 0`` and the "every honest group holds ``H``" check vacuous. The client now takes ``c`` from
  its own policy (``max_colluders``, or the masking's ``h − 1``), lowered by ``m − H`` only down to its own
  ``m − honest_clients``, and refuses a request with ``H > m − c``.

The parties are the package's own :class:`ClientEncoder` (and its :class:`SecAggClient`), driven with the helpers of
:mod:`tests.security.test_fourth_attack_round`.
"""

import numpy as np
import pytest

from gpflow_fed.federated.protection.distributed_dp import DistributedDP
from gpflow_fed.federated.protection.encoder import ClientEncoder, EncoderRefusal
from gpflow_fed.federated.protection.policy import ClientPolicy
from gpflow_fed.federated.protection.request import Protection
from gpflow_fed.federated.protection.secagg import SecAggRefused, default_degree, members_bitmap, neighbour_floor
from tests.federated.protection.secagg_helpers import Net
from tests.security.test_fourth_attack_round import P, Parties, _masked_and_certified, _values

STAGES = ["masked_input", "consistency", "unmask"]
#: rounds that got past the encoder's check before: numpy integers (out of range: ``OverflowError``; in range: taken
#: as the round, answered at ``consistency`` and ``unmask``) and a negative round (refused only for other reasons)
ENCODER_ROUNDS = [
    pytest.param(np.uint64(2**64 - 1), id="np.uint64-max"),
    pytest.param(np.uint64(2**63), id="np.uint64-2^63"),
    pytest.param(np.int64(0), id="np.int64-in-range"),
    pytest.param(-1, id="negative"),
]
#: and at the protocol client itself, plain ints beyond 64 bits (``OverflowError`` from its slot and tag)
PROTOCOL_ROUNDS = [*ENCODER_ROUNDS, pytest.param(2**63, id="2^63"), pytest.param(2**64 - 1, id="2^64-1")]
#: other types, refused before too (as a malformed exchange): a control that the new check lets no error escape
OTHER_ROUNDS = [pytest.param(True, id="bool"), pytest.param(0.0, id="float"), pytest.param("0", id="str")]


def _request(ids, fields, certificate, round):
    """A request for any of :data:`STAGES` over the exchange ``fields`` names, with ``round`` in place of its own."""
    request = {**fields, "round": round, "survivors": members_bitmap(ids, ids), "dropped": members_bitmap(ids, [])}
    return {**request, **certificate, "seed": True, "pads": [], "size": P + 2, "s_pk": {}}


# --- a round the digests cannot encode is refused where the request is parsed ------------------------------------
@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("round", ENCODER_ROUNDS)
def test_the_encoder_refuses_a_round_that_is_not_a_plain_int_in_range(stage, round):
    """``np.uint64(2**64 − 1)`` raised ``OverflowError`` from the protocol client's slot; a numpy integer in range, a
    bool or a negative round got past the encoder's check to another answer. Each is now the encoder's ordinary
    refusal of a malformed request, and no ``OverflowError``/``TypeError`` reaches the server."""
    ids = ["p0", "p1", "p2"]
    parties, fields, certificate = _masked_and_certified(ids)
    with pytest.raises(EncoderRefusal, match="is not a plain int ≥ 0, or is outside the 64-bit signed range"):
        parties.ask("p0", stage, _request(ids, fields, certificate, round))


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("round", PROTOCOL_ROUNDS)
def test_the_protocol_client_refuses_a_round_that_is_not_a_plain_int_in_range(stage, round):
    """The same requests handed to the party's :class:`SecAggClient` itself (a caller without the encoder): it refuses
    them where it builds the exchange from the request (``OverflowError`` from ``_slot``/the tag before; a numpy round
    in range, or a negative one, was taken as a round)."""
    ids = ["p0", "p1", "p2"]
    parties, fields, certificate = _masked_and_certified(ids)
    secagg = parties.encoders["p0"]._secagg
    with pytest.raises(SecAggRefused, match="'round' must be an int in"):
        secagg.respond(stage, _request(ids, fields, certificate, round), np.zeros(P + 2, np.uint64), b"")


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("round", OTHER_ROUNDS)
def test_a_round_of_another_type_is_still_an_ordinary_refusal(stage, round):
    """Control: a bool, a float or a string is refused by the encoder and by its protocol client, each in its own
    refusal (no ``TypeError``)."""
    ids = ["p0", "p1", "p2"]
    parties, fields, certificate = _masked_and_certified(ids)
    request = _request(ids, fields, certificate, round)
    with pytest.raises(EncoderRefusal, match="is not a plain int"):
        parties.ask("p0", stage, request)
    with pytest.raises(SecAggRefused, match="'round' must be an int in"):
        parties.encoders["p0"]._secagg.respond(stage, request, np.zeros(P + 2, np.uint64), b"")


def test_the_encoder_answers_a_plain_round_at_the_top_of_the_range():
    """Control: ``2^63 − 1`` is a round (the refusal is for the request's type and range, not for large rounds): the
    party refuses it only because it prepared nothing for that round."""
    ids = ["p0", "p1", "p2"]
    parties, fields, certificate = _masked_and_certified(ids)
    with pytest.raises(EncoderRefusal, match="prepared no payload for round 9223372036854775807"):
        parties.ask("p0", "masked_input", _request(ids, fields, certificate, 2**63 - 1))


def test_a_server_exchange_with_a_numpy_round_still_sums():
    """Control: the package's own server may hold a numpy round (an :class:`Exchange` converts it to ``int``), and
    what it sends the clients is a plain int, which they answer: the sum is exact."""
    net = Net(4)
    net.setup()
    exchange = net.exchange(np.int64(3))
    result = net.secure_sum(exchange)
    np.testing.assert_array_equal(result.total, net.plain(net.ids))
    assert not net.refusals


# --- the collusion bound is the client's own ---------------------------------------------------------------------
IDS = ["p0", "p1", "p2", "p3", "p4"]  # default degree 4 over 5: h = 3, so the masking's c = h − 1 = 2


def _ddp_unmask(policy, honest):
    """Five parties under ``policy`` prepare and mask one distributed-DP answer assuming ``honest`` honest clients;
    the certified unmask of all five (no drop-outs) and the parties."""
    parties = Parties(IDS)
    parties.policy = policy
    parties.encoders = {c: ClientEncoder(c, policy, {i: 100 for i in IDS}, parties.identities[c]) for c in IDS}
    ddp = DistributedDP(noise_multiplier=1.0, clip_norm=1.0, honest_clients=honest)
    run_id, adv = parties.setup(IDS)
    view = parties.prepare(IDS, _values(IDS), 0, Protection(differential_privacy=ddp))
    _, fields = parties.masked(run_id, adv, IDS, IDS, 0, view, P + 1)
    certificate = parties.certificate(IDS, fields, IDS)
    return parties, {**fields, "dropped": members_bitmap(IDS, []), **certificate, "seed": True, "pads": []}


def test_the_masking_bound_of_the_example():
    """The numbers the tests below rely on: a cohort of 5 at the default degree 4 withstands ``h − 1 = 2``."""
    assert default_degree(len(IDS)) == 4 and neighbour_floor(4) - 1 == 2


@pytest.mark.parametrize("honest", [5, 4])
def test_a_request_assuming_more_honest_clients_than_the_client_does_is_refused(honest):
    """The attack: with the default policy the server asks for ``H = 5`` (or 4) honest clients of 5, so ``c`` was
    ``m − H = 0`` (or 1) and the floor check passed whatever the colluders could isolate; every party unmasked. Now
    ``c`` is the party's own ``h − 1 = 2``, and ``H > m − c = 3`` is refused by every party."""
    parties, unmask = _ddp_unmask(ClientPolicy(), honest)
    for c in IDS:
        with pytest.raises(EncoderRefusal, match=f"at most 3 of the cohort of 5 are honest, below the {honest} honest"):
            parties.ask(c, "unmask", unmask)


def test_a_request_within_the_clients_own_bound_is_unmasked():
    """Control: ``H = m − c = 3`` with the default policy is answered (its seed revealed)."""
    parties, unmask = _ddp_unmask(ClientPolicy(), 3)
    for c in IDS:
        assert "seed" in parties.ask(c, "unmask", unmask)


@pytest.mark.parametrize(
    "policy", [ClientPolicy(honest_clients=5), ClientPolicy(max_colluders=0)], ids=["honest_clients=5", "c=0"]
)
def test_a_client_that_assumes_fewer_colluders_itself_unmasks(policy):
    """Control: a client whose *own* policy accepts all 5 as honest (``honest_clients=5``, so ``c = m − H = 0``), or
    assumes no colluders (``max_colluders=0``), answers the ``H = 5`` request: its choice, not the server's."""
    parties, unmask = _ddp_unmask(policy, 5)
    for c in IDS:
        assert "seed" in parties.ask(c, "unmask", unmask)
