"""The fixed point is the party's own, and data never makes it refuse (issue 43, item 7 and attack 6).

The sixth attack drove a one-row party's real Flower ClientApp through 45 one-message runs with ``fractional_bits =
1`` and a claimed ``cohort_size`` of 3e17: the range ``2^(63 − f)/K`` those set was a threshold of the server's
choosing, and whether the party refused (a value beyond it) or answered was one bit of y per run: y to 1.2e-14.
Now the bits come from the party's policy and the range from them and the members of the cohort it verifies when it
masks; a value beyond the range is clipped (saturated) and counted inside the masked payload, the server warns on the
cohort's total, and what the party refuses depends on the request only.
"""

import math
import warnings
from typing import Dict, List, Optional, Sequence, Tuple

import gpflow
import numpy as np
import pytest

from gpflow_fed.data import FederatedDataset
from gpflow_fed.federated import (
    Algorithm,
    ClientPolicy,
    DifferentialPrivacy,
    DistributedDP,
    FaultPolicy,
    LocalRuntime,
    Message,
    Protection,
    RunOptions,
    SecureAggregation,
    run,
)
from gpflow_fed.federated.protection import distributed_dp as ddp_module
from gpflow_fed.federated.protection.dp import DPUtilityWarning
from gpflow_fed.federated.protection.encoder import DATA_FAULT, ClientEncoder, EncoderRefusal
from gpflow_fed.federated.protection.reduction import ExchangeContext, FixedPointSaturationWarning, Reducer
from gpflow_fed.federated.protection.secagg import SecAggServer
from gpflow_fed.federated.protection.wire import SATURATED_KEY, FixedPoint
from gpflow_fed.randomness import new_run_id
from tests.federated.protection.secagg_helpers import drive

#: the sixth attack's request: one fractional bit, and a cohort of 3e17 nobody checked
ATTACK_BITS, ATTACK_COHORT = 1, 3 * 10**17


class Sum(Algorithm):
    """One ``"sum"`` phase: each party sends the sum of its y (a one-row party: its y)."""

    name = "sum"

    def initial_state(self, info):
        return {"sums": []}

    def aggregation(self, phase):
        return "sum"

    def broadcast(self, state, round, phase):
        return {}

    def client_update(self, client, broadcast):
        return self.reply(client, broadcast, {"y": np.sum(client.data[1], axis=0)})

    def server_update(self, state, aggregate):
        return {"sums": state["sums"] + [np.array(aggregate["y"])]}

    def result(self, state):
        return gpflow.models.GPR((np.zeros((1, 1)), np.zeros((1, 1))), gpflow.kernels.Constant())


# --- the refusal oracle across Flower runs ---------------------------------------------------------------------------
def _one_message_run(node: Dict[str, object], run_id: int, bits: int, cohort_size: int) -> Tuple[Optional[str], object]:
    """A new Flower run of the party's real ClientApp (as deployed: its encoder saved to ``Context.state``) that asks
    one update of a ``"sum"`` phase; the party's answer: ``(fault, layout)``."""
    from flwr.app import MessageType

    from gpflow_fed.federated import FederationInfo
    from gpflow_fed.federated.protocol.messages import SERVER
    from gpflow_fed.federated.protocol.transport import UPDATE, Request
    from gpflow_fed.federated.runtimes.flower.client_app import ClientHost
    from gpflow_fed.federated.runtimes.flower.records import (
        JOB,
        TRAIN_JOB,
        job_to_config,
        recorddict_to_response,
        request_to_recorddict,
    )
    from gpflow_fed.federated.runtimes.flower.testing import LoopbackGrid
    from gpflow_fed.federated.runtimes.flower.transport import instruction

    info = FederationInfo(("client_0", "client_1", "client_2"), {"client_0": 1, "client_1": 5, "client_2": 5}, 1, 1, 0)
    host = ClientHost(keep_alive=False, job_algorithm=lambda job, config: Sum(1))
    grid = LoopbackGrid(host.app(), [node], {"algorithm": "sum"}, run_id=run_id)
    request_protection = Protection(secure_aggregation=SecureAggregation(bits))
    config = {"aggregation": "sum", "cohort_size": int(cohort_size), "protection": request_protection.to_config()}
    content = request_to_recorddict(Request(UPDATE, Message(SERVER, 0, "train", {}, weight=0.0), "train", config), info)
    content[JOB] = job_to_config(TRAIN_JOB, None)
    (reply,) = grid.send_and_receive([instruction(content, MessageType.TRAIN, 1001, "g")])
    response = recorddict_to_response(reply.content)
    return response.fault, response.layout


def _bisect(answers_below, asks: int, high: float = 16.0) -> Tuple[float, List[object]]:
    """The attacker: bisect |y| on [0, high] with ``answers_below(threshold)`` (True: "|y| < threshold", read from
    whether the party answered); returns its estimate and the transcript of the party's answers."""
    low, transcript = 0.0, []
    for _ in range(asks):
        middle = (low + high) / 2
        below, answer = answers_below(middle)
        transcript.append(answer)
        low, high = (low, middle) if below else (middle, high)
    return (low + high) / 2, transcript


def test_the_refusal_oracle_across_flower_runs_learns_nothing(tmp_path):
    """The sixth attack against a one-row party's real ClientApp, one fresh run per question, for two values of y.
    The request that set the threshold (one fractional bit, cohort size K = 2^62/threshold) is refused for its bits,
    and one with the party's own bits is answered whatever K: every answer is the same whatever y."""
    pytest.importorskip("flwr")
    transcripts, estimates = {}, {}
    for y in (3.25, 11.0 + 2.0**-30):
        path = tmp_path / f"party-{y}.npz"
        np.savez(path, X=np.zeros((1, 1)), Y=np.array([[y]]))
        node = {"data": str(path), "client-index": 0, "state-dir": str(tmp_path / f"state-{y}"), "no-roster": True}
        runs = iter(range(1_000, 2_000))
        for bits in (ATTACK_BITS, 32):

            def ask(threshold: float, bits: int = bits, node: Dict[str, object] = node) -> Tuple[bool, object]:
                cohort = min(max(int(2.0 ** (63 - bits) / threshold), 2), 2**62)  # the range 2^(63 − f)/K of old
                fault, layout = _one_message_run(node, next(runs), bits, cohort)
                return fault is None, (fault, layout)

            estimates[y, bits], transcripts[y, bits] = _bisect(ask, asks=12)
    for bits in (ATTACK_BITS, 32):
        assert transcripts[3.25, bits] == transcripts[11.0 + 2.0**-30, bits]  # nothing depends on y
        assert estimates[3.25, bits] == estimates[11.0 + 2.0**-30, bits]
    refused = {fault for fault, _ in transcripts[3.25, ATTACK_BITS]}
    assert len(refused) == 1 and "the request names 1" in refused.pop()  # the request's own value
    layouts = [layout for fault, layout in transcripts[3.25, 32]]
    assert all(fault is None for fault, _ in transcripts[3.25, 32])
    assert all(layout == {"y": (1,), "secagg/weight": (1,), SATURATED_KEY: (1,)} for layout in layouts)


def test_control_the_same_attack_reads_y_from_a_data_dependent_refusal():
    """The attacker's bisection, against the rule the party applied before (refuse when ``|y| ≥ 2^(63 − f)/K``
    for the request's f and claimed K), recovers y to 1e-12 in 45 one-message runs: the test above would see it."""
    for y in (3.25, 11.0 + 2.0**-30):

        def old_rule(threshold: float, y: float = y) -> Tuple[bool, object]:
            cohort = int(2.0 ** (63 - ATTACK_BITS) / threshold)
            fits = abs(y) < 2.0 ** (63 - ATTACK_BITS) / cohort
            return fits, fits

        estimate, _ = _bisect(old_rule, asks=45)
        assert estimate == pytest.approx(y, abs=1e-12)


# --- the encoding: the party's bits, the members it verified ---------------------------------------------------------
def _secure_sum(
    payloads: Sequence[Dict[str, np.ndarray]],
    request: Protection,
    claimed: int,
    policy: Optional[ClientPolicy] = None,
    aggregation: str = "sum",
) -> Tuple[object, Dict[str, str], Reducer]:
    """Every party prepares its payload for a request naming ``claimed`` members and masks over the real cohort;
    returns the server's aggregate (or None), the parties' refusals and the server's reducer."""
    cohort = tuple(f"c{k}" for k in range(len(payloads)))
    encoders = {c: ClientEncoder(c, policy or ClientPolicy()) for c in cohort}
    refusals: Dict[str, str] = {}
    reducer = Reducer(request)
    layout = None
    for c, arrays in zip(cohort, payloads):
        try:
            layout = encoders[c].prepare(Message(c, 0, "p", arrays, weight=1.0), request, aggregation, claimed, "train")
        except EncoderRefusal as refusal:
            refusals[c] = str(refusal)
    if refusals or layout is None:
        return None, refusals, reducer

    def send(stage, requests):
        answers = {}
        for c, body in requests.items():
            try:
                answers[c] = encoders[c].respond(stage, body)
            except ValueError as refusal:  # a refusal is no answer
                refusals[c], answers[c] = str(refusal), None
        return answers

    server = SecAggServer(new_run_id(), min_survivors=2)
    drive(server.setup_stages(cohort), send)
    context = ExchangeContext(server.run_id, "train", 0, "p", aggregation, cohort)
    names = sorted(layout.arrays)
    sizes = [int(layout.arrays[n].size) for n in names]
    try:
        result = drive(server.secure_sum_stages(context.exchange, sum(sizes)), send)
    except Exception:  # noqa: BLE001 - the refusals say why
        return None, refusals, reducer
    offsets = np.cumsum([0] + sizes)
    sums = {n: result.total[a:b] for n, a, b in zip(names, offsets, offsets[1:])}
    return reducer.finish(sums, context, masked=True), refusals, reducer


@pytest.mark.usefixtures("nearest_rounding")  # compared with a run or encoding bit for bit
def test_a_requests_cohort_size_no_longer_changes_the_encoding():
    """The same payloads for a request that names the cohort's real size and one that claims 3e17: the masked sums
    are bit-identical, the codes of FixedPoint(32, 3) (the party's bits, the 3 members it verified)."""
    rng = np.random.default_rng(0)
    payloads = [{"y": rng.normal(size=4) * 1e3} for _ in range(3)]
    honest, _, _ = _secure_sum(payloads, Protection(), claimed=3)
    claimed, _, _ = _secure_sum(payloads, Protection(), claimed=ATTACK_COHORT)
    np.testing.assert_array_equal(honest["y"], claimed["y"])
    codes = sum(FixedPoint(32, 3).encode(p["y"])[0].view(np.int64) for p in payloads)
    np.testing.assert_array_equal(honest["y"], codes / 2.0**32)
    assert honest.total_weight == 3.0


@pytest.mark.usefixtures("nearest_rounding")  # sums compared exactly: rounding to nearest
@pytest.mark.parametrize("bits", [1, 20, 31, 33, 61])
def test_a_requests_fractional_bits_are_refused_for_the_request_whatever_the_payload(bits):
    request = Protection(secure_aggregation=SecureAggregation(bits))
    answers = set()
    for value in (0.0, 1.5, 1e300, np.inf):  # control below: the same payloads under the party's own bits
        _, refusals, _ = _secure_sum([{"y": np.array([value])}, {"y": np.array([1.0])}], request, claimed=2)
        assert set(refusals) == {"c0", "c1"}
        answers.add(refusals["c0"])
    assert len(answers) == 1 and f"the request names {bits}" in answers.pop()
    policy = ClientPolicy(fractional_bits=bits)  # control: a party whose own policy has those bits answers
    aggregate, refusals, _ = _secure_sum([{"y": np.array([0.5])}, {"y": np.array([0.5])}], request, 2, policy)
    assert not refusals and aggregate["y"][0] == 1.0


def test_a_partys_bits_come_from_its_node_config_strictly():
    assert ClientPolicy.from_node_config({}).fractional_bits == 32 == ClientPolicy().fractional_bits
    assert ClientPolicy.from_node_config({"fractional-bits": "20"}).fractional_bits == 20
    assert ClientPolicy.matching(Protection(secure_aggregation=SecureAggregation(24))).fractional_bits == 24
    for value in ("twenty", "2.5", "0", "63"):
        with pytest.raises(ValueError, match="fractional"):
            ClientPolicy.from_node_config({"fractional-bits": value})


# --- saturation: clipped, counted, summed, warned --------------------------------------------------------------------
@pytest.mark.usefixtures("nearest_rounding")  # sums compared exactly: rounding to nearest
def test_values_beyond_the_range_are_clipped_and_counted_not_refused():
    """Three parties; the range over 3 members at 32 bits is ⌊(2^63 − 1)/3⌋/2^32 ≈ 7.2e8. Two parties have entries
    beyond it (a NaN and an inf among them): every party answers, each clipped entry counts, and the server sees the
    cohort's total count only (each party's count is one more masked entry)."""
    payloads = [
        {"y": np.array([1e12, -2.0, np.nan])},  # two saturated: 1e12 → +R, NaN → 0
        {"y": np.array([-np.inf, 3.0, 0.5])},  # one: −inf → −R
        {"y": np.array([1.0, 1.0, 1.0])},
    ]
    with pytest.warns(FixedPointSaturationWarning, match="3 entries"):
        aggregate, refusals, reducer = _secure_sum(payloads, Protection(), claimed=3)
    assert not refusals
    np.testing.assert_array_equal(aggregate["y"], [1.0, 2.0, 1.5])  # +R and −R cancel exactly: no wrap-around
    assert reducer.saturated == {("train", 0, "p"): 3}
    assert SATURATED_KEY not in aggregate.arrays and aggregate.total_weight == 3.0


def _dataset(values: Sequence[float]) -> FederatedDataset:
    return FederatedDataset([(np.zeros((1, 1)), np.array([[v]])) for v in values])


@pytest.mark.usefixtures("nearest_rounding")  # sums compared exactly: rounding to nearest
def test_the_server_warns_and_the_history_carries_the_count():
    huge = _dataset([1e12, 2.0, -3e15])  # two parties beyond the range of 3 members
    with pytest.warns(FixedPointSaturationWarning, match="2 entries .* clipped") as caught:
        result = run(Sum(2), huge, runtime=LocalRuntime(), seed=0)
    assert len([w for w in caught if w.category is FixedPointSaturationWarning]) == 1  # once per phase and run
    assert [entry["saturated"] for entry in result.history] == [{"train": 2}, {"train": 2}]
    assert result.state["sums"][0][0] == 2.0  # +R − R + 2: the clipped sum


class SumWithNaN(Sum):
    """Sum, where party ``client_1``'s update holds a NaN (its local computation failed, or its data)."""

    def client_update(self, client, broadcast):
        if client.id != "client_1":
            return super().client_update(client, broadcast)
        return self.reply(client, broadcast, {"y": np.array([np.nan])})


@pytest.mark.usefixtures("nearest_rounding")  # sums compared exactly: rounding to nearest
def test_a_non_finite_update_is_encoded_and_counted_not_refused():
    """Under secure aggregation without DP a NaN in a party's update made it refuse (DATA_FAULT, then no protected
    answer for the rest of the run): a refusal that depended on its data. Now it answers: the NaN is encoded as 0 and
    counted in its masked saturation count, and the server warns on the cohort's total. Control: finite updates
    count nothing; under DP the party still refuses (a count would be a release outside the accounting)."""
    values = [1.5, 2.0, -0.25]
    with pytest.warns(FixedPointSaturationWarning, match="1 entry of the cohort's payloads was beyond"):
        result = run(SumWithNaN(2), _dataset(values), runtime=LocalRuntime(), seed=0)
    assert [entry["saturated"] for entry in result.history] == [{"train": 1}, {"train": 1}]
    assert all("excluded" not in entry for entry in result.history)  # every party answered, in every round
    assert result.state["sums"][0][0] == 1.5 - 0.25  # the NaN encoded as 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", FixedPointSaturationWarning)
        control = run(Sum(2), _dataset(values), runtime=LocalRuntime(), seed=0)
    assert all("saturated" not in entry for entry in control.history)
    assert control.state["sums"][0][0] == 1.5 + 2.0 - 0.25
    dp = Protection(differential_privacy=DifferentialPrivacy(1.0, clip_norm=10.0, insecure_noise_seed=0))
    options = RunOptions(faults=FaultPolicy(on_error="exclude"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DPUtilityWarning)
        under_dp = run(SumWithNaN(1), _dataset(values), runtime=LocalRuntime(options=options, protection=dp), seed=0)
    assert under_dp.history[0]["excluded"] == {"client_1": DATA_FAULT}


class SumThenTotal(Sum):
    """Sum, and a final ``"total"`` phase that sends the same."""

    def final_phases(self):
        return ("total",)


def test_a_final_phases_count_is_in_the_history_too():
    with pytest.warns(FixedPointSaturationWarning) as caught:
        result = run(SumThenTotal(1), _dataset([1e12, 2.0, 1.0]), runtime=LocalRuntime(), seed=0)
    texts = [str(w.message) for w in caught if w.category is FixedPointSaturationWarning]
    assert len(texts) == 2 and "phase 'total' (final): 1 entry of the cohort's payloads was beyond" in texts[1]
    assert result.history[-1]["saturated"] == {"train": 1} and result.history[-1]["final_saturated"] == {"total": 1}


@pytest.mark.usefixtures("nearest_rounding")  # compared with a run or encoding bit for bit
def test_control_nothing_saturates_no_warning_and_the_sum_is_the_same_as_before():
    """In range: no warning, no ``saturated`` entry, and the masked sum is the one the fixed point always gave
    (``round(2^32 x)`` per party) within its resolution of the plain sum; plain
    (``secure_aggregation=False``) stays exact."""
    values = [0.1, -2.75, 1e6 / 3]
    with warnings.catch_warnings():
        warnings.simplefilter("error", FixedPointSaturationWarning)
        secure = run(Sum(1), _dataset(values), runtime=LocalRuntime(), seed=0)
    plain = run(Sum(1), _dataset(values), runtime=LocalRuntime(protection=Protection(secure_aggregation=False)), seed=0)
    assert "saturated" not in secure.history[0]
    before = sum(FixedPoint(32, 3).encode(np.array([v]))[0].view(np.int64)[0] for v in values) / 2.0**32
    assert secure.state["sums"][0][0] == before
    assert abs(secure.state["sums"][0][0] - sum(values)) <= 3 * 2.0**-33
    assert plain.state["sums"][0][0] == np.sum([np.array([v]) for v in values], axis=0)[0]  # exact, as before


@pytest.mark.parametrize("members", [2, 3, 1000, 2**40])
def test_no_wrap_around_for_the_members_the_party_verified(members):
    """The worst case: every one of n members saturates at +R (or −R); the sum is n L_n, within ±(2^63 − 1)."""
    fixed = FixedPoint(32, members)
    for value in (np.inf, -np.inf, 1e300):
        codes, count = fixed.encode(np.array([value]))
        assert count == 1
        total = codes * np.uint64(members)  # n equal codes, summed modulo 2^64
        signed = int(total.view(np.int64)[0])
        assert signed == int(math.copysign(1, value)) * members * fixed.limit
        assert abs(signed) <= 2**63 - 1


# --- under DP the clipping is DP's ------------------------------------------------------------------------------------
def _ddp(honest: int = 2) -> Protection:
    return Protection(differential_privacy=DistributedDP(noise_multiplier=1.0, clip_norm=1.0, honest_clients=honest))


def test_under_distributed_dp_no_value_saturates_and_no_payload_is_refused():
    """A payload of norm 1e300 or with an inf is clipped by DP's L2 clip (its sensitivity), never by the range (which
    holds Δ̃ + 13σ), so the count stays 0 and the parties answer whatever their values."""
    for big in (1e300, np.inf, 0.5):
        aggregate, refusals, reducer = _secure_sum(
            [{"y": np.array([big, 0.0])}, {"y": np.array([0.0, 0.25])}], _ddp(), 2
        )
        assert not refusals and aggregate is not None and aggregate.noised and not reducer.saturated


def test_under_distributed_dp_truncated_noise_is_counted_and_warned(monkeypatch):
    """Noise draws beyond 13σ (probability < 5e-37 each) are truncated, whatever the payload; the server warns."""
    monkeypatch.setattr(ddp_module, "discrete_gaussian", lambda variance, size, rng: [2**62] * size)
    with pytest.warns(FixedPointSaturationWarning, match="truncated 4 distributed-DP noise"):
        aggregate, refusals, reducer = _secure_sum(
            [{"y": np.array([0.5, 0.0])}, {"y": np.array([0.0, 0.25])}], _ddp(), 2
        )
    assert not refusals and reducer.saturated == {("train", 0, "p"): 4}
    ddp = _ddp().distributed
    tail = ddp.tail_bound(2) * ddp.step
    np.testing.assert_allclose(aggregate["y"], [0.5 + 2 * tail, 0.25 + 2 * tail], atol=4 * ddp.step)


@pytest.mark.filterwarnings("ignore::gpflow_fed.federated.protection.dp.DPUtilityWarning")
def test_under_central_dp_the_range_must_hold_the_clip_whatever_the_payload():
    """Central DP clips to C before the fixed point: a range below C over the verified members is refused for the
    request (C) and the cohort, for every payload; a range that holds C never saturates a value."""
    policy = ClientPolicy(fractional_bits=40)  # over 3 members: |value| ≤ 2^23/3 ≈ 2.8e6
    wide = Protection(
        secure_aggregation=SecureAggregation(40), differential_privacy=DifferentialPrivacy(1.0, clip_norm=1e7)
    )
    answers = set()
    for value in (0.0, 1e9):
        _, refusals, _ = _secure_sum(
            [{"y": np.array([value])}, {"y": np.array([1.0])}, {"y": np.ones(1)}], wide, 3, policy
        )
        answers.add(tuple(sorted(refusals.values())))
    assert len(answers) == 1 and "below the 1e+07 a clipped DP payload may reach" in next(iter(answers))[0]
    narrow = Protection(secure_aggregation=SecureAggregation(40), differential_privacy=DifferentialPrivacy(1.0, 1e6))
    aggregate, refusals, _ = _secure_sum(
        [{"y": np.array([1e9])}, {"y": np.array([1.0])}, {"y": np.ones(1)}], narrow, 3, policy
    )
    assert not refusals and aggregate.noised  # control: clipped to 1e6 by DP, not saturated
