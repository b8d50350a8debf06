"""Differential privacy of the sums: clipping, the Gaussian mechanism's noise, and the (ε, δ) accountant."""

import math

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.stats import norm

from gpflow_fed.federated import LocalRuntime, Message, Protection, RunOptions, run
from gpflow_fed.federated import ClientPolicy, Protection
from gpflow_fed.federated.protection.encoder import ClientEncoder
from gpflow_fed.federated.protection.reduction import ExchangeContext, Reducer
from gpflow_fed.federated.protection.dp import DifferentialPrivacy, PrivacyAccountant, clip_payload

from tests.federated.helpers import FederatedMean, WeightedMean

#: the plain, readable messages these tests check (the secure default masks them)
PLAIN = Protection(secure_aggregation=False)


def analytic_gaussian_epsilon(ratio: float, delta: float) -> float:
    """ε of one Gaussian mechanism with sensitivity/σ = ``ratio`` (Balle & Wang 2018, Thm. 8)."""

    def excess(eps: float) -> float:
        return norm.cdf(ratio / 2 - eps / ratio) - math.exp(eps) * norm.cdf(-ratio / 2 - eps / ratio) - delta

    return brentq(excess, 0.0, 100.0, xtol=1e-12)


def test_clipping_bounds_the_global_norm():
    arrays = {"a": np.array([3.0, 0.0]), "b": np.array([[4.0]])}
    clipped, before = clip_payload(arrays, 1.0)
    assert before == pytest.approx(5.0)
    assert math.sqrt(sum(np.sum(v**2) for v in clipped.values())) == pytest.approx(1.0, rel=1e-14)
    np.testing.assert_allclose(clipped["a"], [0.6, 0.0])
    same, _ = clip_payload(arrays, 10.0)
    np.testing.assert_array_equal(same["b"], arrays["b"])


@pytest.mark.parametrize("aggregation, weight_bound", [("sum", 1.0), ("mean", 3.0)])
def test_noise_std_matches_and_aggregate_is_clipped_sum_plus_noise(aggregation, weight_bound):
    dp = DifferentialPrivacy(noise_multiplier=1.5, clip_norm=0.5, weight_bound=weight_bound, insecure_noise_seed=11)
    protection = Protection(secure_aggregation=False, differential_privacy=dp)  # central DP: the server reads
    aggregator = Reducer(protection)
    cohort = ("client_0", "client_1")
    context = ExchangeContext(
        run_id=bytes(16), purpose="train", round=2, phase="p", aggregation=aggregation, cohort=cohort
    )
    rng = np.random.default_rng(0)
    raw = [rng.normal(size=20_000), rng.normal(size=20_000) * 1e-4]
    weights = [5.0, 2.0]
    sent = [
        ClientEncoder(c, ClientPolicy(secure_aggregation=False)).prepare(
            Message(c, 2, "p", {"a": v}, weight=w), protection, aggregation, len(cohort), "train"
        )
        for c, v, w in zip(cohort, raw, weights)
    ]
    for m in sent:
        assert np.linalg.norm(m["a"]) <= dp.clip_norm * (1 + 1e-12)
    aggregate = aggregator.reduce(sent, context)
    capped = [min(w, weight_bound) if aggregation == "mean" else 1.0 for w in weights]
    clipped_sum = sum(c * clip_payload({"a": v}, dp.clip_norm)[0]["a"] for c, v in zip(capped, raw))
    noise = aggregator.noise_rng(context).normal(0.0, dp.noise_std(aggregation), size=20_000)
    denominator = sum(capped) if aggregation == "mean" else 1.0
    np.testing.assert_allclose(aggregate["a"], (clipped_sum + noise) / denominator, rtol=0, atol=1e-12)
    expected_std = dp.noise_multiplier * dp.clip_norm * (weight_bound if aggregation == "mean" else 1.0)
    assert np.std(aggregate["a"] * denominator - clipped_sum) == pytest.approx(expected_std, rel=0.03)


def test_dp_run_reports_epsilon_and_drops_client_metrics(dataset):  # noqa: F811
    dp = DifferentialPrivacy(noise_multiplier=1.0, clip_norm=100.0)
    result = run(
        FederatedMean(3),
        dataset,
        runtime=LocalRuntime(options=RunOptions(keep_payloads=True), protection=Protection(differential_privacy=dp)),
        seed=1,
    )
    eps = [h["epsilon"] for h in result.history]
    assert eps == sorted(eps) and eps[0] > 0
    assert result.privacy["epsilon"] == pytest.approx(eps[-1]) and result.privacy["delta"] == 1e-5
    assert all("local_mean" not in h for h in result.history)
    assert all(not m.metrics for m in result.ledger.messages if m.sender != "server")
    assert abs(result.state["mean"] - run(FederatedMean(3), dataset, seed=1).state["mean"]) > 0  # noised


def test_epsilon_falls_with_noise_and_grows_with_rounds(dataset):  # noqa: F811
    def epsilon(z, rounds, fraction=1.0):
        dp = DifferentialPrivacy(noise_multiplier=z, clip_norm=1.0)
        algorithm = FederatedMean(rounds, client_fraction=fraction)
        return run(algorithm, dataset, runtime=LocalRuntime(protection=Protection(differential_privacy=dp))).privacy[
            "epsilon"
        ]

    assert epsilon(0.8, 3) > epsilon(1.6, 3) > epsilon(3.2, 3)
    assert epsilon(1.6, 1) < epsilon(1.6, 3) < epsilon(1.6, 6)
    assert epsilon(1.6, 3, fraction=0.5) < epsilon(1.6, 3)  # amplification by sampling 2 of 4 clients


def test_one_release_matches_the_analytic_gaussian_mechanism():
    z, delta = 2.0, 1e-5
    expected = analytic_gaussian_epsilon(ratio=2.0 / z, delta=delta)  # replace one client: sensitivity 2C, σ = zC
    pld = PrivacyAccountant(DifferentialPrivacy(z, 1.0, delta=delta, accountant="pld"))
    pld.record(10, 10, 1)
    assert pld.epsilon() == pytest.approx(expected, rel=1e-3)
    rdp = PrivacyAccountant(DifferentialPrivacy(z, 1.0, delta=delta, accountant="rdp"))
    rdp.record(10, 10, 1)
    assert expected < rdp.epsilon() < 2 * expected  # RDP is a valid but looser upper bound


def test_rdp_composition_is_dp_accountings_own_to_the_last_bit_and_each_curve_is_computed_once():
    import dp_accounting

    from gpflow_fed.federated.protection import dp as dp_module

    z = 0.83
    dp = DifferentialPrivacy(z, 1.0, delta=1e-6, accountant="rdp")
    releases = [(20, 5, 1)] * 3 + [(20, 20, 2)] * 2 + [(20, 5, 1)] * 2
    ours, reference = (
        PrivacyAccountant(dp),
        dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE),
    )
    dp_module._release_rdp.cache_clear()
    for release in releases:
        ours.record(*release)
        reference.compose(dp_module.release_event(z, *release))
        assert ours.epsilon() == reference.get_epsilon(1e-6)
    assert dp_module._release_rdp.cache_info().misses == 2  # one curve per distinct release, not per round
    restored, counted = (
        PrivacyAccountant(dp),
        dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE),
    )
    restored.restore(releases)
    counted.compose(dp_module.release_event(z, 20, 5, 1), 5)
    counted.compose(dp_module.release_event(z, 20, 20, 2), 2)
    assert restored.epsilon() == counted.get_epsilon(1e-6)


def test_pld_rejects_sampling_and_bad_settings_are_named():
    with pytest.raises(ValueError, match="accountant='rdp'"):
        PrivacyAccountant(DifferentialPrivacy(1.0, 1.0, accountant="pld")).record(10, 3, 1)
    with pytest.raises(ValueError, match="noise_multiplier"):
        DifferentialPrivacy(0.0, 1.0)
    with pytest.raises(ValueError, match="delta"):
        DifferentialPrivacy(1.0, 1.0, delta=1.5)
    with pytest.raises(TypeError, match="clip_norm"):
        DifferentialPrivacy(1.0, "1")
    with pytest.raises(ValueError, match="accountant"):
        DifferentialPrivacy(1.0, 1.0, accountant="moments")
    with pytest.raises(TypeError, match="differential_privacy"):
        LocalRuntime(protection=Protection(differential_privacy={"noise_multiplier": 1.0}))


def test_dp_composes_with_secure_aggregation(dataset):  # noqa: F811
    dp = DifferentialPrivacy(noise_multiplier=0.5, clip_norm=20.0, weight_bound=100.0, insecure_noise_seed=4)
    plain_dp = run(
        WeightedMean(2), dataset, runtime=LocalRuntime(protection=Protection(differential_privacy=dp)), seed=3
    )
    both = run(
        WeightedMean(2),
        dataset,
        runtime=LocalRuntime(protection=Protection(differential_privacy=dp, secure_aggregation=True)),
        seed=3,
    )
    assert both.state["mean"] == pytest.approx(plain_dp.state["mean"], abs=1e-8)  # same noise, masks cancel
    assert both.privacy == plain_dp.privacy


class WithFinal(FederatedMean):
    def final_phases(self):
        return ("stats",)


def test_dp_on_named_phases_only(dataset):  # noqa: F811
    dp = DifferentialPrivacy(noise_multiplier=1.0, clip_norm=1.0, phases=("stats",), accountant="pld")
    result = run(
        WithFinal(3),
        dataset,
        runtime=LocalRuntime(options=RunOptions(keep_payloads=True), protection=Protection(differential_privacy=dp)),
        seed=2,
    )
    plain = run(WithFinal(3), dataset, seed=2)
    train_ups = [m for m in result.ledger.messages if m.sender != "server" and m.phase == "train"]
    stats_ups = [m for m in result.ledger.messages if m.sender != "server" and m.phase == "stats"]
    assert all(m.metrics for m in train_ups) and all(np.linalg.norm(m["sum_y"]) > 1 for m in train_ups)  # untouched
    assert all(np.sqrt(np.sum(m["sum_y"] ** 2) + np.sum(m["n"] ** 2)) <= 1 + 1e-12 for m in stats_ups)  # clipped
    assert [h["epsilon"] for h in result.history] == [0.0, 0.0, 0.0]  # training sums are not released noised
    one = PrivacyAccountant(dp)
    one.record(4, 4, 1)
    assert result.privacy["epsilon"] == pytest.approx(one.epsilon()) and result.privacy["releases"] == 1
    assert result.state["mean"] != plain.state["mean"]
    with pytest.raises(ValueError, match="never executes"):
        run(
            WithFinal(1),
            dataset,
            runtime=LocalRuntime(
                protection=Protection(differential_privacy=DifferentialPrivacy(1.0, 1.0, phases=("predict",)))
            ),
        )
