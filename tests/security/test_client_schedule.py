"""A deviating server against honest clients (a deployment's default ``ClientPolicy``), driven stage by stage.

Each attack comes from a fresh-context review of the federated core (see docs/guides/threat-model.md):

* a server that relabels a summed phase as ``"collect"`` to get the payload in plain;
* a server that asks an exchange outside the client's own algorithm's schedule;
* a server that asks one broadcast again under another round label and a larger cohort, to difference two sums;
* a server that asks one broadcast again under distributed DP, to average its fresh noise away;
* a server that unmasks a repeated broadcast with other drop-outs;
* a server that re-asks one broadcast with other fixed-point ranges, to bisect a value through the refusals.
"""

from typing import Dict, Sequence

import gpflow
import numpy as np
import pytest

from gpflow_fed.federated import Client, ClientPolicy, DistributedDP, Message, Protection, SecureAggregation, run
from gpflow_fed.federated.protocol.algorithm import FederationInfo
from gpflow_fed.federated.algorithms import FSGP
from gpflow_fed.federated.engine.endpoint import ClientEndpoint
from gpflow_fed.federated.protocol.messages import SERVER
from gpflow_fed.federated.protection.encoder import DATA_FAULT, ClientEncoder
from gpflow_fed.federated.protection.wire import broadcast_digest, request_view
from gpflow_fed.federated.protection.masking import Exchange
from gpflow_fed.federated.protection.secagg import SecAggAborted, SecAggServer
from tests.federated.protection.secagg_helpers import drive
from gpflow_fed.federated.protection.wire import pack, unpack
from gpflow_fed.federated.protocol.transport import UPDATE, Request
from gpflow_fed.randomness import new_run_id

from gpflow_fed.data import FederatedDataset
from tests.federated.helpers import FederatedMean

M = 4


class Server:
    """Honest parties (each its own bound FSGP copy and encoder) and a hand-driven server."""

    def __init__(self, sizes: Sequence[int], policy: ClientPolicy = ClientPolicy()) -> None:
        rng = np.random.default_rng(0)
        clients = [
            Client(f"c{k}", (rng.uniform(-2, 2, (n, 1)), rng.normal(size=(n, 1))), k) for k, n in enumerate(sizes)
        ]
        self.info = FederationInfo(tuple(c.id for c in clients), {c.id: c.num_data for c in clients}, 1, 1, 0)
        algorithm = FSGP(
            gpflow.kernels.SquaredExponential(), np.linspace(-2, 2, M)[:, None], 0.1, rounds=3, mode="exact"
        )
        self.algorithm = algorithm.bind(self.info)
        self.state = self.algorithm.initial_state(self.info)
        self.endpoints = {
            c.id: ClientEndpoint(algorithm.bind(self.info), c, self.info, ClientEncoder(c.id, policy)) for c in clients
        }
        self.run_id = new_run_id()
        self.secagg = SecAggServer(self.run_id, min_survivors=2)
        drive(self.secagg.setup_stages(sorted(self.endpoints)), self._send(0, "statistics", "train"))

    def _send(self, round: int, phase: str, purpose: str):
        def send(stage: str, requests: Dict[str, dict]) -> Dict[str, object]:
            answers = {}
            for cid, body in requests.items():
                structure, arrays = pack(body)
                down = Message(SERVER, round, f"{phase}/secagg/{stage}", arrays, weight=0.0)
                response = self.endpoints[cid].handle(Request(stage, down, purpose, {"protocol": structure}))
                answers[cid] = None if response.fault else unpack(response.config["protocol"], response.message.arrays)
            return answers

        return send

    def update(self, cohort, round, phase="statistics", purpose="train", aggregation="sum", protection=None):
        down = Message(SERVER, round, phase, self.algorithm.broadcast(self.state, round, phase), weight=0.0)
        config = {"aggregation": aggregation, "cohort_size": len(cohort)}
        config["protection"] = (protection or Protection()).to_config()
        # what an honest server binds into the masking (PhaseOwner): the request as it sent it
        sent = Protection.from_config(config["protection"]).to_config()
        # the view of what each client answers: the arrays its phase reads and what it computes (as the phase owner
        # binds it)
        read = self.algorithm.read_broadcast(down)
        digest = broadcast_digest(read, computation=self.algorithm.computation(phase))
        self.view = request_view(digest, sent, len(cohort), aggregation)
        return {c: self.endpoints[c].handle(Request(UPDATE, down, purpose, config)) for c in cohort}

    def masked_sum(self, cohort, round, phase="statistics", purpose="train", protection=None):
        responses = self.update(cohort, round, phase, purpose, protection=protection)
        faults = {c: r.fault for c, r in responses.items() if r.fault}
        assert not faults, faults
        size = sum(int(np.prod(s, dtype=int)) for s in next(iter(responses.values())).layout.values())
        exchange = Exchange(self.run_id, purpose, round, phase, tuple(sorted(cohort)), self.view)
        return drive(self.secagg.secure_sum_stages(exchange, size), self._send(round, phase, purpose))


def test_a_summed_phase_relabelled_collect_is_refused():
    server = Server((20, 20, 20))
    for aggregation in ("collect", "mean"):
        responses = server.update(["c0", "c1", "c2"], 0, aggregation=aggregation, protection=Protection())
        assert all(r.message is None and r.layout is None for r in responses.values())
        assert all("aggregates it as 'sum'" in r.fault for r in responses.values())


@pytest.mark.parametrize(
    "round, phase, purpose",
    [(3, "statistics", "train"), (-1, "statistics", "train"), (0, "predict", "train"), (4, "predict", "final")],
)
def test_an_exchange_outside_the_clients_own_schedule_is_refused(round, phase, purpose):
    server = Server((20, 20))
    responses = server.update(["c0", "c1"], round, phase=phase, purpose=purpose)
    assert all("not an exchange of this client's algorithm" in r.fault for r in responses.values())


def test_one_broadcast_is_not_masked_for_a_second_cohort_under_another_round_label():
    """{c0, c1} at round 0, then the same broadcast as round 1 over {c0, c1, c2}: c2's statistics would be the
    difference. c0 and c1 refuse to encode it for a cohort of 3 (another request view), and, shown the same cohort
    size, refuse their masked inputs for another cohort, so the second sum is never unmasked."""
    server = Server((20, 20, 20, 20))
    server.masked_sum(["c0", "c1"], 0)
    responses = server.update(["c0", "c1", "c2"], 1)
    assert all("under another request" in responses[c].fault for c in ("c0", "c1"))
    with pytest.raises(SecAggAborted):
        server.masked_sum(["c0", "c3"], 2)


def test_a_broadcast_with_an_array_the_algorithm_does_not_read_is_refused():
    """An ignored extra array would make a "new" broadcast (another digest) with the same answer, for free."""
    server = Server((20, 20, 20))
    down = Message(SERVER, 0, "statistics", {**server.algorithm.broadcast(server.state, 0, "statistics"), "junk": 1.0})
    config = {"aggregation": "sum", "cohort_size": 3, "protection": Protection().to_config()}
    responses = [e.handle(Request(UPDATE, down, "train", config)) for e in server.endpoints.values()]
    assert all(r.layout is None and "arrays other than the algorithm's" in r.fault for r in responses)


def test_one_broadcast_over_the_same_cohort_is_answered_again():
    """An algorithm whose broadcast repeats (FederatedMean's state is a fixed point after round 1) still runs under
    the secure default: the same broadcast over the same cohort reveals nothing new."""
    dataset = FederatedDataset([(np.zeros((3, 1)), np.full((3, 1), float(k))) for k in range(3)])
    result = run(FederatedMean(4), dataset, seed=0)
    assert result.state["mean"] == pytest.approx(1.0, abs=1e-8)


def test_distributed_dp_releases_once_per_broadcast():
    """The same broadcast asked again under distributed DP (same cohort): refused, so the server cannot average the
    clients' fresh noise away."""
    # parties with a DP floor of their own: their noise lets the clip bind (a party without one refuses a clip below
    # its payload's public bound, test_payload_bounds.py)
    server = Server((20, 20, 20), ClientPolicy(min_noise_multiplier=1.0))
    protection = Protection(differential_privacy=DistributedDP(noise_multiplier=1.0, clip_norm=10.0, honest_clients=2))
    server.masked_sum(["c0", "c1", "c2"], 0, protection=protection)
    with pytest.raises(SecAggAborted):
        server.masked_sum(["c0", "c1", "c2"], 1, protection=protection)


def test_a_final_phase_is_answered_once_and_rounds_increase():
    server = Server((20, 20, 20))
    server.masked_sum(["c0", "c1", "c2"], 1)
    for round, phase, purpose in ((0, "statistics", "train"), (3, "predict", "final")):
        if purpose == "final":
            server.masked_sum(["c0", "c1", "c2"], round, phase=phase, purpose=purpose)
        responses = server.update(["c0", "c1", "c2"], round, phase=phase, purpose=purpose)
        assert all("does not follow it" in r.fault for r in responses.values())  # before anything is computed


def _range(fractional_bits: int) -> Protection:
    return Protection(secure_aggregation=SecureAggregation(fractional_bits=fractional_bits))


@pytest.mark.parametrize("round, new_broadcast", [(0, False), (1, False), (1, True)])
def test_a_request_for_another_range_is_refused_for_the_request_alone(round, new_broadcast):
    """The third and fifth attackers' oracle: a payload beyond the range a request named (its ``fractional_bits`` and
    cohort size) was refused, so asking again (over the same broadcast, or one made new by an entry the answer hardly
    depends on) bisected a client's largest value. The range is now the client's own (its bits, the members it
    verifies: ``test_fixed_point_range.py``): a request that names other bits is refused for them, whatever the
    payload, and what the client answers next depends on the requests alone (its claim, its one view per
    broadcast)."""
    server = Server((20, 20, 20))
    cohort = ["c0", "c1", "c2"]
    first = server.update(cohort, 0, protection=_range(62))
    assert all(r.layout is None and "the request names 62" in r.fault for r in first.values())
    if new_broadcast:
        down = server.algorithm.broadcast(server.state, 0, "statistics")
        name = next(iter(down))
        server.algorithm.broadcast = lambda state, round, phase: {**down, name: np.asarray(down[name]) * (1 + 1e-12)}
    again = server.update(cohort, round, protection=_range(32))  # the clients' own bits
    if round == 0:
        assert all("does not follow it" in r.fault for r in again.values())  # the exchange was claimed
    elif new_broadcast:
        assert all(r.fault is None and r.layout is not None for r in again.values())
    else:
        assert all("under another request" in r.fault for r in again.values())  # one view per broadcast


def test_a_fit_is_the_answer_too_so_a_descending_search_stops_at_once():
    """From the other side: a request that fits returns a layout and says "below this range"; narrowing it (a
    larger ``fractional_bits`` or cohort size) over the same broadcast is refused, fitting or not."""
    server = Server((20, 20, 20))
    cohort = ["c0", "c1", "c2"]
    assert all(r.layout is not None for r in server.update(cohort, 0).values())
    for round, protection in ((0, _range(33)), (1, _range(62))):  # at the same round, or relabelled as the next
        refused = server.update(cohort, round, protection=protection)
        reason = "does not follow it" if round == 0 else "under another request"
        assert all(reason in r.fault for r in refused.values())


@pytest.mark.parametrize("name", ["fedbnr", "fgp"])
def test_a_protected_phase_refuses_a_broadcast_with_an_array_it_does_not_read(name):
    """The fourth attack's route: an array the client ignores makes a "new" broadcast (another digest and request
    view) with the same answer. FedBNR's summed ``weights`` phase and FGP's ``train`` phase read exactly theirs."""
    from gpflow_fed.federated.algorithms import FGP, FedBNR
    from gpflow_fed.kernels import URK

    rng = np.random.default_rng(0)
    client = Client("c0", (rng.normal(size=(8, 2)), rng.normal(size=(8, 1))), 0)
    info = FederationInfo(("c0",), {"c0": 8}, 2, 1, 0)
    if name == "fedbnr":
        algorithm, phase = FedBNR(URK(2, num_samples=8), rounds=0, protocol="two_step").bind(info), "weights"
        honest = {"a_inverse": np.eye(16)}  # L = 2 × 8 random features
    else:
        algorithm, phase = FGP(gpflow.kernels.SquaredExponential()).bind(info), "train"
    state = algorithm.initial_state(info)
    algorithm.setup_client(client, info)
    if name == "fgp":
        honest = dict(algorithm.broadcast(state, 0, phase))
    assert algorithm.client_update(client, Message(SERVER, 0, phase, honest, weight=0.0)).arrays  # control
    with pytest.raises(ValueError, match="arrays other than"):
        algorithm.client_update(client, Message(SERVER, 0, phase, {**honest, "junk": np.zeros(3)}, weight=0.0))


@pytest.mark.filterwarnings("ignore::gpflow_fed.federated.protection.dp.DPUtilityWarning")
def test_a_faulty_protected_reply_is_one_generic_refusal_then_none():
    """Under DP, a reply its own checks stop (here NaN; a server can steer a value past ±1e150 by scaling what it
    sends) is refused in words that name neither the payload nor the check, and the client answers no later protected
    exchange of the run; the others' mean is still right (to the DP noise). Without DP no value is refused: it is
    encoded and counted (test_fixed_point_range.py)."""
    from gpflow_fed.federated import DifferentialPrivacy, FaultPolicy, LocalRuntime, RunOptions

    from tests.federated.helpers import Faulty

    rng = np.random.default_rng(0)
    dataset = FederatedDataset(
        [(rng.normal(size=(n, 2)), rng.normal(loc=k, size=(n, 1))) for k, n in enumerate([5, 7, 9])]
    )
    dp = DifferentialPrivacy(noise_multiplier=1e-4, clip_norm=100.0, insecure_noise_seed=0)  # noise std 0.01 a sum
    options = RunOptions(faults=FaultPolicy(on_error="exclude"))
    result = run(
        Faulty(3, "nan"), dataset, runtime=LocalRuntime(options=options, protection=Protection(differential_privacy=dp))
    )
    honest = np.concatenate([dataset.clients[0][1], dataset.clients[2][1]])
    assert result.state["mean"] == pytest.approx(float(honest.mean()), abs=1e-2)
    first, *later = [entry["excluded"]["client_1"] for entry in result.history]
    assert first == DATA_FAULT and later and all("answers no protected exchange again" in r for r in later)


def test_an_error_in_a_protected_update_is_one_generic_refusal_then_none():
    """The seventh attack: a server-chosen broadcast that makes the client's own computation fail only for some data
    (FGP's Cholesky under a tiny lengthscale) gave a bit per round through the error's presence and its text. On a
    protected phase the client sends one generic refusal and stops; a refusal of the broadcast's form keeps its text."""
    from gpflow_fed.federated import FaultPolicy, LocalRuntime, RunOptions
    from gpflow_fed.federated.protection.encoder import UPDATE_FAULT

    from tests.federated.helpers import Faulty

    rng = np.random.default_rng(0)
    dataset = FederatedDataset([(rng.normal(size=(n, 2)), rng.normal(size=(n, 1))) for n in (5, 7, 9)])
    result = run(
        Faulty(3, "raise"), dataset, runtime=LocalRuntime(options=RunOptions(faults=FaultPolicy(on_error="exclude")))
    )
    first, *later = [entry["excluded"]["client_1"] for entry in result.history]
    assert first == UPDATE_FAULT and "out of memory" not in first
    assert later and all("answers no protected exchange again" in r for r in later)
