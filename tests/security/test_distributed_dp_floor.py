"""Distributed DP decided by the party (issue 43, attack 4): (a) a server that declares live clients dropped gets a
sum carrying fewer noise shares than the accountant assumes, unless each client refuses to unmask below its
honest-client count; (b) a server that asks the same clients again with less noise (or none) differences the two
releases, unless a phase's DP never goes down within a run; and each party's own floor and honest-client bound."""

import numpy as np
import pytest

from gpflow_fed.federated import ClientPolicy, DifferentialPrivacy, DistributedDP, Message, Protection
from gpflow_fed.federated.protection.encoder import ClientEncoder, EncoderRefusal
from gpflow_fed.federated.protection.reduction import ExchangeContext
from gpflow_fed.federated.protection.secagg import SecAggAborted, SecAggServer, default_degree, neighbour_floor
from gpflow_fed.randomness import new_run_id
from tests.federated.protection.secagg_helpers import drive

K = 10


def _ddp(honest=K, z=1.0):
    return Protection(differential_privacy=DistributedDP(noise_multiplier=z, clip_norm=1.0, honest_clients=honest))


def _exchange_with_fake_dropouts(protection, answering):
    """Every party prepares and masks; the server forwards the masked inputs of ``answering`` clients only (it
    declares the rest dropped) and asks for the unmasking. Returns the secure sum or the refusal it ended in."""
    cohort = tuple(f"c{k}" for k in range(K))
    encoders = {c: ClientEncoder(c, ClientPolicy()) for c in cohort}  # each party's default policy
    for k, c in enumerate(cohort):
        message = Message(c, 0, "stats", {"x": np.full(3, 0.1 * k)}, weight=1.0)
        encoders[c].prepare(message, protection, "sum", K, "train", broadcast=b"b")
    refusals = {}

    def send(stage, requests):
        answers = {}
        for c, request in requests.items():
            if stage == "masked_input" and c not in answering:
                answers[c] = None  # the server pretends c dropped out
                continue
            try:
                answers[c] = encoders[c].respond(stage, request)
            except Exception as error:  # noqa: BLE001 - a refusal is no answer
                refusals[c] = str(error)
                answers[c] = None
        return answers

    server = SecAggServer(new_run_id(), min_survivors=2)  # a deviating server: it would unmask 2 survivors
    drive(server.setup_stages(cohort), send)
    context = ExchangeContext(server.run_id, "train", 0, "stats", "sum", cohort)
    try:
        size = 4  # the payload's codes (distributed DP sends no weight) and its saturation count
        return drive(server.secure_sum_stages(context.exchange, size), send), refusals
    except SecAggAborted as aborted:
        return aborted, refusals


def test_fake_dropouts_under_distributed_dp_are_refused():
    # seven survivors: connected in any masking graph of degree 8 over 10 (each party misses one other at most), and
    # each keeps at least h = 5 of its 8 neighbours (three dropped), so the deviating server itself would unmask them;
    # the parties refuse
    outcome, refusals = _exchange_with_fake_dropouts(_ddp(honest=K), answering={f"c{k}" for k in range(7)})
    assert isinstance(outcome, SecAggAborted)
    assert refusals and all("below the 10 honest clients" in why for why in refusals.values())
    # three survivors keep at most 2 of their 8 neighbours: the server's neighbour rule stops before the unmask
    outcome, refusals = _exchange_with_fake_dropouts(_ddp(honest=K), answering={"c0", "c1", "c2"})
    assert isinstance(outcome, SecAggAborted) and "below h = 5" in str(outcome) and not refusals


def test_control_enough_survivors_for_the_requests_honest_count():
    """9 of 10 survive; the honest survivors are counted with the party's own c = h − 1 = 4 colluders among them (the
    masking's bound at d = 8; the request's H does not lower it under the default policy): H = 5 holds (9 − 4),
    H = 6 is one short, and so is H = 9, which counting survivors alone accepted (and which assumes more honest
    clients than the party does: refused before the count)."""
    nine = {f"c{k}" for k in range(9)}
    degree = default_degree(10)
    assert neighbour_floor(degree) - 1 == 4
    outcome, refusals = _exchange_with_fake_dropouts(_ddp(honest=5), answering=nine)
    assert not isinstance(outcome, SecAggAborted), refusals
    assert set(outcome.survivors) == nine
    for honest in (6, 9):
        outcome, refusals = _exchange_with_fake_dropouts(_ddp(honest=honest), answering=nine)  # short: refused
        assert isinstance(outcome, SecAggAborted)
        assert f"below the {honest} honest clients" in next(iter(refusals.values()))


def _answered(encoder, protection, round_):
    message = Message(encoder.client_id, round_, "stats", {"x": np.ones(3)}, weight=1.0)
    return encoder.prepare(message, protection, "sum", K, "train", broadcast=bytes([round_]))


@pytest.mark.parametrize("later", [_ddp(z=1e-6), Protection(), Protection(secure_aggregation=False)], ids=repr)
def test_a_phases_dp_never_goes_down_within_a_run(later):
    encoder = ClientEncoder("c0", ClientPolicy(secure_aggregation=False))
    _answered(encoder, _ddp(z=1.0), 0)
    with pytest.raises(EncoderRefusal, match="noise multiplier 1"):
        _answered(encoder, later, 1)
    _answered(encoder, _ddp(z=1.0), 2)  # control: the same noise, or more, is answered
    _answered(encoder, _ddp(z=2.0), 3)
    restored = ClientEncoder.from_state("c0", encoder.policy, encoder.to_state())
    with pytest.raises(EncoderRefusal, match="noise multiplier 2"):
        _answered(restored, _ddp(z=1.0), 4)  # the floor survives a restart (a Flower ClientApp's)


def test_a_partys_own_floor_and_honest_client_bound():
    policy = ClientPolicy.from_node_config({"min-noise-multiplier": "0.8", "honest-clients": "4"})
    assert (policy.min_noise_multiplier, policy.honest_clients) == (0.8, 4)
    assert "noise multiplier ≥ 0.8" in policy.refusal(_ddp(honest=4, z=0.5), "stats", "sum")
    assert "noise multiplier ≥ 0.8" in policy.refusal(Protection(), "stats", "sum")  # no DP at all
    assert "assumes 10 honest clients" in policy.refusal(_ddp(honest=10, z=1.0), "stats", "sum")
    assert policy.refusal(_ddp(honest=4, z=0.8), "stats", "sum") == ""  # control
    assert policy.refusal(Protection(), "stats", "collect") == ""  # a collect phase is not DP's
    assert ClientPolicy().refusal(Protection(), "stats", "sum") == ""  # the default party has no DP floor


# --- found by the fresh attacker (issue 43's review) ------------------------------------------------------------
def test_a_cohort_size_lie_cannot_shrink_the_noised_sum():
    """The server told every client ``cohort_size = 8`` (so each encoded one eighth of the noise) and masked over a
    cohort of 2: the released sum carried 2 noise shares of 8. Each client masks only over the cohort its encoding
    was made for."""
    cohort = tuple(f"c{k}" for k in range(8))
    protection = _ddp(honest=8)
    encoders = {c: ClientEncoder(c, ClientPolicy()) for c in cohort}
    for c in cohort:
        encoders[c].prepare(Message(c, 0, "stats", {"x": np.ones(3)}, weight=1.0), protection, "sum", 8, "train")
    refusals = {}

    def send(stage, requests):
        answers = {}
        for c, request in requests.items():
            try:
                answers[c] = encoders[c].respond(stage, request)
            except Exception as error:  # noqa: BLE001 - a refusal is no answer
                refusals[c], answers[c] = str(error), None
        return answers

    server = SecAggServer(new_run_id(), min_survivors=2)
    drive(server.setup_stages(cohort), send)
    small = ExchangeContext(server.run_id, "train", 0, "stats", "sum", cohort[:2])  # the victim and one other
    with pytest.raises(SecAggAborted):
        drive(server.secure_sum_stages(small.exchange, 4), send)  # 3 codes and the saturation count
    assert set(refusals) == set(cohort[:2]) and all(
        "assuming 8 honest clients but is asked to mask over 2" in r for r in refusals.values()
    )


def test_central_dp_is_not_the_partys_own_noise():
    """A party that answered a phase under distributed DP refuses it under central DP (the server, who adds that
    noise, is the adversary), and its noise floor counts central DP as none."""
    encoder = ClientEncoder("c0", ClientPolicy(secure_aggregation=False))
    _answered(encoder, _ddp(z=1.0), 0)
    central = Protection(differential_privacy=DifferentialPrivacy(noise_multiplier=1.0, clip_norm=1.0))
    with pytest.raises(EncoderRefusal, match="a request with 0 is refused"):
        _answered(encoder, central, 1)
    floor = ClientPolicy(min_noise_multiplier=1.0)
    assert "noise multiplier ≥ 1" in floor.refusal(central, "stats", "sum")
    assert floor.refusal(_ddp(z=1.0), "stats", "sum") == ""  # control
    fresh = ClientEncoder("c1", ClientPolicy(secure_aggregation=False))
    _answered(fresh, central, 0)  # control: a run under central DP alone is answered (the in-process default)
