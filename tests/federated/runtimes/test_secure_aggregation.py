"""Secure aggregation by pairwise masking: exact cancellation, masked ledger, exclusion before masking."""

import numpy as np
import pytest

from gpflow_fed.data import FederatedDataset
from gpflow_fed.federated import FaultPolicy, LocalRuntime, Message, Protection, RunOptions, run
from gpflow_fed.federated.protection.masking import SecureAggregation, sum_masked
from gpflow_fed.federated.protection.reduction import FixedPointSaturationWarning, Reducer
from gpflow_fed.federated.protection.wire import SATURATED_KEY, WEIGHT_KEY, FixedPoint, count_code, decode_fixed_point

from tests.federated.helpers import FederatedMean, Faulty, WeightedMean, secure_exchange

#: runs and runtimes compared bit for bit: the fixed point rounds to nearest (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("nearest_rounding")


class Collecting(FederatedMean):
    calls = 0

    def aggregation(self, phase):
        return "collect"

    def client_update(self, client, broadcast):
        Collecting.calls += 1
        return super().client_update(client, broadcast)

    def server_update(self, state, aggregate):
        total = sum(float(m["sum_y"][0]) for m in aggregate.messages)
        return {"mean": total / sum(float(m["n"][0]) for m in aggregate.messages), "seen": state["seen"]}


def _codes(protection, values, cohort):
    """Each client's fixed-point codes as its encoder flattens them (sorted names, weight and count entries)."""
    fixed = FixedPoint(protection.secure.fractional_bits, len(cohort))
    out = {}
    for c in cohort:
        codes = {n: fixed.encode(v)[0] for n, v in {**values[c], WEIGHT_KEY: np.array([1.0])}.items()}
        codes[SATURATED_KEY] = count_code(0)
        out[c] = np.concatenate([codes[n].ravel() for n in sorted(codes)])
    return out


def test_masks_cancel_exactly_in_fixed_point():
    protection = Protection(secure_aggregation=SecureAggregation(fractional_bits=30))
    rng = np.random.default_rng(1)
    cohort = tuple(f"client_{k}" for k in range(5))
    values = {c: {"a": rng.normal(size=(3, 4)), "b": rng.normal(size=7) * 100} for c in cohort}
    masked, result, _ = secure_exchange([Message(c, 0, "p", values[c]) for c in cohort], protection)
    codes = _codes(protection, values, cohort)
    np.testing.assert_array_equal(result.total, sum_masked([{"q": codes[c]} for c in cohort])["q"])
    for c in cohort:  # each masked payload alone is unrelated to the client's codes
        assert np.mean(masked[c] == codes[c]) < 0.05
    assert (
        np.max(
            np.abs(
                decode_fixed_point(
                    sum_masked([{"q": masked[c]} for c in cohort[:4]])["q"], protection.secure.fractional_bits
                )
            )
        )
        > 1e3
    )
    # a different exchange draws different masks
    again, _, _ = secure_exchange([Message(c, 1, "p", values[c]) for c in cohort], protection)
    assert np.all(again[cohort[0]] != masked[cohort[0]])


def test_fixed_point_range_and_bad_settings_are_rejected():
    with pytest.raises(ValueError, match="fractional_bits"):
        SecureAggregation(fractional_bits=63)
    with pytest.raises(TypeError, match="secure_aggregation"):
        LocalRuntime(protection=Protection(secure_aggregation="yes"))


@pytest.mark.parametrize("algorithm_class", [FederatedMean, WeightedMean])
def test_server_sees_only_masks_and_the_exact_sum(dataset, algorithm_class):  # noqa: F811
    plain = run(algorithm_class(rounds=2), dataset, runtime=LocalRuntime(), seed=4)
    secure = run(
        algorithm_class(rounds=2),
        dataset,
        runtime=LocalRuntime(options=RunOptions(keep_payloads=True), protection=Protection(secure_aggregation=True)),
        seed=4,
    )
    assert secure.state["mean"] == pytest.approx(plain.state["mean"], abs=1e-9)
    assert secure.state["seen"] == plain.state["seen"]
    assert secure.history[0]["local_mean"] == pytest.approx(plain.history[0]["local_mean"], abs=1e-8)
    codec = SecureAggregation()
    by_id = {f"client_{k}": data for k, data in enumerate(dataset.clients)}
    ups = [m for m in secure.ledger.messages if m.sender != "server"]
    stages = {m.phase.split("/secagg/")[-1] for m in ups}
    assert stages == {"advertise", "share", "store", "masked_input", "consistency", "unmask"}  # nothing in plain
    masked = [m for m in ups if m.phase.endswith("/masked_input")]
    assert len(masked) == 2 * dataset.num_clients
    wire = b"".join(a.tobytes() for m in ups for a in m.arrays.values())
    for m in masked:
        assert m.weight == 0.0
        Y = by_id[m.sender][1]
        for name, truth in {"sum_y": Y.sum(0), "mean_y": len(Y) * Y.mean(0), "n": np.array([len(Y)], float)}.items():
            assert FixedPoint(codec.fractional_bits, dataset.num_clients).encode(truth)[0].tobytes() not in wire
            assert truth.tobytes() not in wire


def test_aggregate_equals_sum_of_fixed_point_encodings():
    protection = Protection(secure_aggregation=SecureAggregation(fractional_bits=20))
    cohort = ("client_0", "client_1", "client_2")
    values = [np.array([0.1, -2.3]), np.array([1e-7, 4.0]), np.array([3.3, 0.0])]
    _, result, context = secure_exchange([Message(c, 0, "p", {"a": v}) for c, v in zip(cohort, values)], protection)
    sums = {"a": result.total[:2], SATURATED_KEY: result.total[2:3], WEIGHT_KEY: result.total[3:]}  # sorted names
    aggregate = Reducer(protection).finish(sums, context, masked=True)
    exact = decode_fixed_point(sum_masked([{"a": FixedPoint(20, 3).encode(v)[0]} for v in values])["a"], 20)
    np.testing.assert_array_equal(aggregate["a"], exact)
    np.testing.assert_allclose(aggregate["a"], np.sum(values, axis=0), atol=3 * 2.0**-21)
    assert aggregate.total_weight == 3.0


def test_faulty_client_is_excluded_before_masking(dataset):  # noqa: F811
    runtime = LocalRuntime(
        options=RunOptions(faults=FaultPolicy(on_error="exclude")), protection=Protection(secure_aggregation=True)
    )
    result = run(Faulty(2, "nan"), dataset, runtime=runtime)
    keep = [k for k in range(4) if k != 1]
    expected = sum(dataset.clients[k][1].sum() for k in keep) / sum(dataset.client_sizes[k] for k in keep)
    assert result.state["mean"] == pytest.approx(expected, abs=1e-9)
    assert "client_1" in result.history[0]["excluded"]


def test_fixed_point_overflow_saturates_and_the_server_warns(dataset):  # noqa: F811
    # 2^(63-59) / 4 clients = 4 < N_k, so every "n" payload is beyond the range: clipped and counted, not refused
    protection = Protection(secure_aggregation=SecureAggregation(fractional_bits=59))
    with pytest.warns(FixedPointSaturationWarning, match="fixed-point range"):
        result = run(FederatedMean(1), dataset, runtime=LocalRuntime(protection=protection))
    R = FixedPoint(59, dataset.num_clients).range  # sum_y, n, the weight N_k and the metric N_k · mean
    expected = sum(2 * int(abs(float(Y.sum())) > R) + 2 * int(len(Y) > R) for _, Y in dataset.clients)
    assert result.history[0]["saturated"] == {"train": expected} and expected >= dataset.num_clients
    assert "excluded" not in result.history[0]


def test_a_collect_phase_is_sent_in_plain_under_secure_aggregation(dataset):  # noqa: F811
    """Secure aggregation covers "sum"/"mean" phases; a "collect" phase (the server reads each message, by the
    algorithm's design) is sent as it is, and the client's policy lets it through (the threat model says so)."""
    Collecting.calls = 0
    result = run(Collecting(2), dataset, options=RunOptions(keep_payloads=True))
    assert Collecting.calls == 2 * dataset.num_clients
    assert result.state["mean"] == pytest.approx(float(dataset.pooled()[1].mean()), rel=1e-12)
    up = [m for m in result.ledger.messages if m.sender != "server"]
    assert {m.phase for m in up} == {"train"} and all("sum_y" in m.arrays for m in up)


def test_fsgp_with_secure_aggregation_matches_plain_fsgp():
    import gpflow

    from gpflow_fed.data import FederatedDataset
    from gpflow_fed.federated.algorithms import FSGP

    rng = np.random.default_rng(0)
    clients = [(X, np.sin(X) + 0.1 * rng.normal(size=X.shape)) for X in (rng.uniform(-3, 3, (12, 1)) for _ in range(2))]
    data = FederatedDataset(clients=clients, test=(np.linspace(-3, 3, 7)[:, None], np.zeros((7, 1))), name="sine")

    def fsgp():
        return FSGP(
            gpflow.kernels.SquaredExponential(),
            np.linspace(-2, 2, 3)[:, None],
            0.1,
            rounds=2,
            local_steps=2,
            learning_rate=0.05,
        )

    plain = run(fsgp(), data, seed=1)
    secure = run(fsgp(), data, runtime=LocalRuntime(protection=Protection(secure_aggregation=True)), seed=1)
    for key, value in plain.state.params.items():  # averaged w: mean phase; statistics: sum phase
        np.testing.assert_allclose(secure.state.params[key], value, rtol=0, atol=1e-8)
    for key, value in plain.state.statistics.items():
        np.testing.assert_allclose(secure.state.statistics[key], value, rtol=0, atol=1e-8)
    for a, b in zip(plain.model.predict_f(data.test[0]), secure.model.predict_f(data.test[0])):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("K", [8, 12])
def test_all_pairs_above_the_default_degree_runs(K):
    """SecureAggregation(degree=K − 1) above default_degree(K) (6 at K = 8, 8 at K = 12): each client's own floor
    is the configured degree, so the server's share-holder graph follows it. It once kept the default degree and
    every client refused setup (a run of 0 clients)."""
    rng = np.random.default_rng(K)
    data = FederatedDataset([(rng.normal(size=(3, 1)), rng.normal(size=(3, 1))) for _ in range(K)])
    secure = SecureAggregation(degree=K - 1)
    plain = run(FederatedMean(1), data, runtime=LocalRuntime(protection=Protection(secure_aggregation=False)))
    masked = run(FederatedMean(1), data, runtime=LocalRuntime(protection=Protection(secure_aggregation=secure)))
    assert masked.history[0]["clients"] == K and "excluded" not in masked.history[0]
    assert masked.state["mean"] == pytest.approx(plain.state["mean"], abs=1e-9)
