"""Distributed DP (the distributed discrete Gaussian): the exact sampler, conditional rounding, the client encoding
through secure aggregation, the zCDP accounting, and where its randomness comes from."""

import copy
import hashlib
import itertools
import math
import os
import pickle
import random
from fractions import Fraction

import dp_accounting
import numpy as np
import pytest
from scipy import stats

from gpflow_fed.federated.protection import distributed_dp as ddp_module
from gpflow_fed.federated.protection.distributed_dp import (
    DistributedDP,
    DistributedPrivacyAccountant,
    NoiseSource,
    conditional_round,
    discrete_gaussian,
    release_rho,
    rounded_norm_bound,
    zcdp_epsilon,
)
from gpflow_fed.federated.protection.masking import (
    Exchange,
    MaskingKeys,
    mask,
    masking_graph,
    sum_masked,
)
from gpflow_fed.federated.protection.wire import decode_fixed_point

BETA = math.exp(-0.5)


def exact_pmf(sigma2, support):
    """P(X = x) ∝ exp(−x²/2σ²) on ``support``, normalised over |x| ≤ 40σ + 10 (the rest is < e^-800)."""
    s2 = float(sigma2)
    reach = int(40 * math.sqrt(s2)) + 10
    norm = sum(math.exp(-(y * y) / (2 * s2)) for y in range(-reach, reach + 1))
    return np.array([math.exp(-(x * x) / (2 * s2)) / norm for x in support])


def chi_square_p(draws, sigma2):
    """p-value of Pearson's test of ``draws`` against N_Z(0, σ²): cells with expected count ≥ 5, tails pooled."""
    draws = np.asarray(draws)
    n = draws.size
    reach = int(40 * math.sqrt(float(sigma2))) + 10
    support = np.arange(-reach, reach + 1)
    pmf = exact_pmf(sigma2, support)
    kept = support[pmf * n >= 5]
    lo, hi = int(kept.min()), int(kept.max())
    inner = (support > lo) & (support < hi)
    expected = np.array([pmf[support <= lo].sum(), *pmf[inner], pmf[support >= hi].sum()])
    observed = [np.sum(draws <= lo), *[np.sum(draws == x) for x in range(lo + 1, hi)], np.sum(draws >= hi)]
    return stats.chisquare(observed, expected / expected.sum() * n).pvalue


# --- the sampler --------------------------------------------------------------------------------------
@pytest.mark.parametrize("sigma2", [Fraction(1, 4), Fraction(1, 2), Fraction(3), Fraction(37, 4)])
def test_discrete_gaussian_matches_the_exact_pmf(sigma2):
    draws = discrete_gaussian(sigma2, 20_000, NoiseSource(insecure_seed=11))
    assert chi_square_p(draws, sigma2) > 1e-3


def test_the_pmf_test_rejects_a_rounded_continuous_gaussian():
    """Control: the same test tells a rounded N(0, σ²) from N_Z(0, σ²) at σ² = 1/2 (so it can fail)."""
    draws = np.rint(np.random.default_rng(0).normal(0, math.sqrt(0.5), size=20_000)).astype(int)
    assert chi_square_p(draws, Fraction(1, 2)) < 1e-6


@pytest.mark.parametrize("sigma2", [Fraction(2), Fraction(10**6), Fraction(2**61 + 1, 3)])
def test_discrete_gaussian_mean_variance_and_symmetry(sigma2):
    n = 10_000
    draws = np.array(discrete_gaussian(sigma2, n, NoiseSource(insecure_seed=5)), dtype=np.float64)
    s2 = float(sigma2)
    support = np.arange(-60, 61)
    # exact variance; for large σ² it equals σ² to within e^{-2π²σ²}·σ² (CKS20), i.e. exactly in float64
    variance = float(np.sum(support**2 * exact_pmf(sigma2, support))) if s2 < 10 else s2
    se_mean = math.sqrt(variance / n)
    assert abs(draws.mean()) < 4 * se_mean
    se_var = variance * math.sqrt(2.0 / n)
    assert abs(np.mean(draws**2) - variance) < 4 * se_var
    positive, negative = int(np.sum(draws > 0)), int(np.sum(draws < 0))
    assert stats.binomtest(positive, positive + negative, 0.5).pvalue > 1e-3


@pytest.mark.parametrize("num, den", [(3, 10), (17, 10), (3, 1), (0, 5)])
def test_bernoulli_exp_frequency(num, den):
    rng = NoiseSource(insecure_seed=3)
    n = 20_000
    hits = sum(ddp_module._bernoulli_exp(num, den, rng.below) for _ in range(n))
    p = math.exp(-num / den)
    assert abs(hits / n - p) <= 4 * math.sqrt(p * (1 - p) / n) + 1e-12


def test_discrete_gaussian_validates():
    with pytest.raises(ValueError, match="positive"):
        discrete_gaussian(Fraction(0), 3, NoiseSource(insecure_seed=1))
    with pytest.raises(TypeError, match="NoiseSource"):
        discrete_gaussian(Fraction(1), 3, random.Random(0))
    assert discrete_gaussian(Fraction(1), 0, NoiseSource(insecure_seed=1)) == []


def test_below_is_uniform_and_in_range():
    rng = NoiseSource(insecure_seed=2)
    draws = [rng.below(7) for _ in range(14_000)]
    assert stats.chisquare(np.bincount(draws, minlength=7)).pvalue > 1e-3
    big = 2**70 + 3
    values = [rng.below(big) for _ in range(2000)]
    assert all(0 <= v < big for v in values)
    assert sum(v >= big // 2 for v in values) == pytest.approx(1000, abs=4 * math.sqrt(500))
    assert rng.below(1) == 0


# --- rounding -----------------------------------------------------------------------------------------
def test_rounded_norm_bound_by_hand():
    # c/γ = 1000, d = 16, β = e^{-1/2}: √(2 log(1/β)) = 1, so Δ̃² = min(1004², 1000² + 16/4 + (1000 + 4/2))
    #     = min(1,008,016, 1,001,006) = 1,001,006
    assert rounded_norm_bound(1000.0, 16, BETA) == pytest.approx(math.sqrt(1_001_006), rel=1e-14)
    # β = 0: the deterministic bound c/γ + √d
    assert rounded_norm_bound(1000.0, 16, 0.0) == 1004.0
    # c/γ = 1, d = 10,000: √(1 + 10,000/4 + 1·(1 + 100/2)) = √2552 ≈ 50.5, below the deterministic 1 + 100
    assert rounded_norm_bound(1.0, 10_000, BETA) == pytest.approx(math.sqrt(2552), rel=1e-14)
    # c/γ = 1, d = 1, β = 0.1: 1 + 1/4 + √(2 log 10)·(1 + 1/2) ≈ 4.47 > (1 + 1)² = 4, so the deterministic 2
    assert rounded_norm_bound(1.0, 1, 0.1) == 2.0


def test_conditional_rounding_respects_the_bound_where_plain_rounding_does_not():
    # every coordinate halfway between two integers (the largest rounding variance), ‖v‖ = c/γ = 44, d = 64
    # (every coordinate 5.5: ‖ṽ‖² = 1600 + 11·Bin(64, 1/2), above Δ̃² ≈ 1974 with probability ≈ 0.2)
    d, beta = 64, 0.9
    v = np.full(d, 5.5)
    grid_norm = float(np.linalg.norm(v))
    bound_sq = int(math.floor(rounded_norm_bound(grid_norm, d, beta) ** 2))
    rng = NoiseSource(insecure_seed=4)
    conditioned = [conditional_round(v, bound_sq, rng) for _ in range(300)]
    assert all(int(np.sum(r.astype(object) ** 2)) <= bound_sq for r in conditioned)
    assert all(np.all(np.abs(r - v) < 1) for r in conditioned)
    plain = [conditional_round(v, 10**18, rng) for _ in range(300)]
    exceed = sum(int(np.sum(r.astype(object) ** 2)) > bound_sq for r in plain)
    assert exceed > 0  # unconditioned rounding breaks the bound that the β-conditioning enforces
    assert exceed < 300 * beta


def test_conditional_rounding_is_nearly_unbiased():
    """Plain randomized rounding is unbiased; conditioning on the norm bound pulls ṽ slightly towards 0, by well
    under a grid step (here, c/γ ≈ 130 with d = 20, the bound is tight: about 1 try in 6 is rejected)."""
    d, n = 20, 4000
    v = np.random.default_rng(0).uniform(-50, 50, size=d)
    bound_sq = int(math.floor(rounded_norm_bound(float(np.linalg.norm(v)), d, BETA) ** 2))
    rng = NoiseSource(insecure_seed=6)
    se = np.sqrt((v - np.floor(v)) * (np.ceil(v) - v) / n) + 1e-12
    plain = np.mean([conditional_round(v, 10**18, rng) for _ in range(n)], axis=0)
    assert np.all(np.abs(plain - v) < 5 * se)
    conditioned = np.mean([conditional_round(v, bound_sq, rng) for _ in range(n)], axis=0)
    assert np.all(np.abs(conditioned - v) < 5 * se + 0.1)
    assert np.dot(conditioned - v, v) < 0  # towards smaller norms


def test_conditional_rounding_gives_up_loudly():
    with pytest.raises(RuntimeError, match="no rounding within the norm bound") as info:
        conditional_round(np.array([1.5, 1.5]), 1, NoiseSource(insecure_seed=1), max_tries=50)
    assert "1.5" not in str(info.value)


# --- encoding through secure aggregation --------------------------------------------------------------
def payloads(K, d, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=d) * rng.uniform(0.3, 3.0) for _ in range(K)]


def clipped_sum(xs, c):
    return sum(x * min(1.0, c / np.linalg.norm(x)) for x in xs)


def test_encode_sum_decode_recovers_the_clipped_sum_within_the_noise():
    K, d, t, c = 8, 2000, 4, 1.5
    ddp = DistributedDP(noise_multiplier=0.5, clip_norm=c, honest_clients=t)
    rng = NoiseSource(insecure_seed=7)
    xs = payloads(K, d)
    total = np.zeros(d, dtype=np.uint64)
    for x in xs:
        message = ddp.encode(x, K, rng)
        assert message.dtype == np.int64 and message.shape == x.shape
        total += message.view(np.uint64)  # the ring secure aggregation sums in
    error = ddp.decode(total) - clipped_sum(xs, c)
    # each of K shares has variance σ² grid steps², rounding adds ≤ K/4: per coordinate (K σ² + ≤ K/4) γ²
    sigma2 = float(ddp.share_variance(d))
    expected = K * sigma2 * ddp.step**2
    assert abs(error.mean()) < 4 * math.sqrt(expected / d)
    assert np.var(error) == pytest.approx(expected, rel=4 * math.sqrt(2 / d))
    # K/t = 2 times the target variance (z Δ̃ γ)² of t honest shares
    assert expected == pytest.approx(K / t * ddp.noise_std(d) ** 2, rel=1e-9)


def test_messages_sum_through_masking_and_fixed_point_decoding():
    """With γ = 2^-f the messages sit on SecureAggregation's fixed-point grid: masking and its decode agree."""
    K, d = 4, 30
    ddp = DistributedDP(noise_multiplier=1.0, clip_norm=2.0, honest_clients=3, granularity=2.0**-32)
    cohort = tuple(f"client_{k}" for k in range(K))
    exchange = Exchange(bytes(range(16)), "train", 0, "stats", cohort)
    keys = {c: MaskingKeys(insecure_seed=i) for i, c in enumerate(cohort)}
    public = {c: k.public_bytes for c, k in keys.items()}
    graph = masking_graph(exchange, 2)
    rng = NoiseSource(insecure_seed=8)
    messages = [ddp.encode(x, K, rng) for x in payloads(K, d, seed=1)]
    masked = [mask(keys[c], c, {"x": m.view(np.uint64)}, exchange, public, graph[c]) for c, m in zip(cohort, messages)]
    total = sum_masked(masked)["x"]
    np.testing.assert_array_equal(total.view(np.int64), np.sum(messages, axis=0))
    np.testing.assert_array_equal(ddp.decode(total), decode_fixed_point(total, 32))


@pytest.mark.parametrize("z, t, d", [(0.3, 1, 5), (1.0, 7, 100), (4.0, 20, 1000)])
def test_t_shares_carry_at_least_the_target_variance(z, t, d):
    ddp = DistributedDP(noise_multiplier=z, clip_norm=1.0, honest_clients=t, granularity=0.05)
    target = (z * ddp.norm_bound(d)) ** 2
    share = ddp.share_variance(d)
    assert t * share >= Fraction(target)  # (S), exactly
    assert float(t * share) <= target * (1 + 1e-9) + t * 2**-20  # and not much more
    # the sum of t independent shares: variance ≥ target (empirically, within 4 standard errors)
    n = 3000
    rng = NoiseSource(insecure_seed=9)
    sums = np.sum([discrete_gaussian(share, n, rng) for _ in range(t)], axis=0).astype(np.float64)
    assert np.mean(sums**2) >= target * (1 - 4 * math.sqrt(2 / n))


def test_sum_range_overflow_raises_before_anything_is_drawn():
    ddp = DistributedDP(noise_multiplier=1.0, clip_norm=1.0, honest_clients=2)
    ddp.check_range(100, 1000)
    with pytest.raises(ValueError, match="64 bits"):
        ddp.check_range(100, 2**33)
    with pytest.raises(ValueError, match="coarser granularity"):
        ddp.encode(np.ones(100), 2**33, NoiseSource(insecure_seed=1))
    with pytest.raises(ValueError, match="2\\^52"):
        DistributedDP(noise_multiplier=1.0, clip_norm=1.0, honest_clients=2, granularity=2.0**-53)


def test_noise_beyond_the_tail_is_truncated_and_counted_never_refused(monkeypatch):
    """A draw beyond T = ⌈13σ⌉ (probability < 5e-37) is truncated to ±T, whatever the payload, so every message stays
    within the range of a 64-bit sum over K (check_range) and nothing about the payload makes the client refuse."""
    ddp = DistributedDP(noise_multiplier=1.0, clip_norm=1.0, honest_clients=2)
    monkeypatch.setattr(ddp_module, "discrete_gaussian", lambda variance, size, rng: [2**62, -(2**62)][:size])
    secret = np.array([0.123456789, -0.987654321])
    message, truncated = ddp.encode_counted(secret, 4, NoiseSource(insecure_seed=1))
    tail = ddp.tail_bound(2)
    assert truncated == 2 and np.all(np.abs(message) <= ddp.message_bound(4))
    np.testing.assert_allclose(ddp.decode(message) - secret, [tail * ddp.step, -tail * ddp.step], atol=2 * ddp.step)
    monkeypatch.setattr(ddp_module, "discrete_gaussian", lambda variance, size, rng: [0] * size)  # control
    assert ddp.encode_counted(secret, 4, NoiseSource(insecure_seed=1))[1] == 0


def test_encode_refuses_small_cohorts_and_bad_payloads():
    ddp = DistributedDP(noise_multiplier=1.0, clip_norm=1.0, honest_clients=3)
    rng = NoiseSource(insecure_seed=1)
    with pytest.raises(ValueError, match="below honest_clients = 3"):
        ddp.encode(np.ones(4), 2, rng)
    with pytest.raises(ValueError, match="NaN or inf"):
        ddp.encode(np.array([1.0, np.nan]), 3, rng)
    with pytest.raises(ValueError, match="empty"):
        ddp.encode(np.array([]), 3, rng)
    with pytest.raises(TypeError, match="complex"):
        ddp.encode(np.array([1j]), 3, rng)
    with pytest.raises(TypeError, match="NoiseSource"):
        ddp.encode(np.ones(2), 3, np.random.default_rng(0))
    with pytest.raises(TypeError, match="int64 or uint64"):
        ddp.decode(np.ones(3))


def test_encode_clips_to_the_norm_bound():
    ddp = DistributedDP(noise_multiplier=1e-3, clip_norm=1.0, honest_clients=1, granularity=1e-4)
    x = np.array([30.0, 40.0])  # norm 50, clipped to (0.6, 0.8)
    decoded = ddp.decode(ddp.encode(x, 1, NoiseSource(insecure_seed=2)))
    np.testing.assert_allclose(decoded, [0.6, 0.8], atol=5 * (ddp.noise_std(2) + ddp.step))


@pytest.mark.parametrize(
    "kwargs, error",
    [
        (dict(noise_multiplier=0.0), ValueError),
        (dict(clip_norm=-1.0), ValueError),
        (dict(honest_clients=0), ValueError),
        (dict(honest_clients=True), TypeError),
        (dict(honest_clients=2.0), TypeError),
        (dict(delta=1.0), ValueError),
        (dict(granularity=0.0), ValueError),
        (dict(beta=1.0), ValueError),
        (dict(beta=-0.1), ValueError),
    ],
)
def test_settings_are_validated(kwargs, error):
    settings = dict(noise_multiplier=1.0, clip_norm=1.0, honest_clients=2) | kwargs
    with pytest.raises(error):
        DistributedDP(**settings)


def test_a_share_below_half_a_grid_step_is_refused():
    ddp = DistributedDP(noise_multiplier=0.01, clip_norm=1.0, honest_clients=100, granularity=1.0)
    with pytest.raises(ValueError, match="below 1/4"):
        ddp.share_variance(1)


# --- accounting ---------------------------------------------------------------------------------------
def test_epsilon_decreases_as_the_noise_multiplier_grows():
    eps = []
    for z in (0.5, 1.0, 2.0, 4.0, 8.0):
        accountant = DistributedPrivacyAccountant(DistributedDP(z, 1.0, 5))
        accountant.record(10, 10, 3, dimension=500)
        eps.append(accountant.epsilon())
    assert all(a > b for a, b in zip(eps, eps[1:]))


def test_zcdp_composes_additively_and_restores():
    ddp = DistributedDP(1.5, 1.0, 4)
    a = DistributedPrivacyAccountant(ddp)
    a.record(20, 10, 1, dimension=100)
    a.record(20, 8, 2, dimension=30)
    a.record(20, 8, 0, dimension=30)  # nothing released, nothing recorded
    assert a.rho() == pytest.approx(release_rho(ddp, 100) + 2 * release_rho(ddp, 30), rel=1e-12)
    assert a.releases == ((20, 10, 1, 100), (20, 8, 2, 30))
    b = DistributedPrivacyAccountant(ddp)
    b.restore(a.releases)
    assert b.epsilon() == a.epsilon() and b.report()["releases"] == 3
    c = DistributedPrivacyAccountant(ddp)
    c.record(20, 10, 4, dimension=100)
    assert c.rho() == pytest.approx(4 * release_rho(ddp, 100), rel=1e-12)
    assert DistributedPrivacyAccountant(ddp).epsilon() == 0.0


def test_one_share_is_the_discrete_gaussian_mechanism():
    # t = 1: τ = 0 and ρ = Δ₂²/(2σ²) = (2Δ̃)²/(2 (zΔ̃)²) = 2/z², the central Gaussian's ρ at the same z
    for z in (0.5, 2.0, 7.0):
        assert release_rho(DistributedDP(z, 3.0, 1), 1000) == pytest.approx(2 / z**2, rel=1e-9)


def test_epsilon_of_a_hand_computed_case():
    # c = 1, γ = 1, d = 1, β = e^{-1/2}, z = 1, t = 2:
    #   Δ̃² = min((1 + 1)², 1 + 1/4 + 1·(1 + 1/2)) = min(4, 2.75) = 2.75
    #   σ² = ⌈(1·2.75 / 2)·(1 + 10⁻¹²)·2²⁰⌉ / 2²⁰ = ⌈1,441,792.0000014⌉ / 1,048,576 = 1,441,793 / 1,048,576
    #   τ = 10 Σ_{k=1}^{1} exp(−2π²σ²·k/(k+1)) = 10 exp(−π²σ²) ≈ 10 · e^{−13.5707} ≈ 1.2785e-5
    #   Δ₂ = 2√2.75, Δ₁ = 2 min(√1·√2.75, 2.75) = 2√2.75, √(nσ²) = √(2σ²)
    #   term 1 = Δ₂²/(2·2σ²) + τ·1 = 11/(4σ²) + τ = 2.75/σ² + τ ≈ 1.9999986 + 0.0000128
    #   term 2 = (11/(2σ²) + 2τ·2√2.75/√(2σ²) + τ²)/2 ≈ 2 + 2τ,  term 3 = (√(11/(2σ²)) + τ)²/2 ≈ 2 + 2τ:  ρ = term 1
    ddp = DistributedDP(1.0, 1.0, 2, granularity=1.0)
    sigma2 = 1_441_793 / 1_048_576
    assert float(ddp.share_variance(1)) == sigma2
    tau = 10 * math.exp(-(math.pi**2) * sigma2)
    assert tau == pytest.approx(1.2785e-5, rel=1e-3)
    rho = 2.75 / sigma2 + tau
    assert release_rho(ddp, 1) == pytest.approx(rho, rel=1e-10)
    assert rho == pytest.approx(2.0000114, abs=1e-6)
    # ε at δ = 1e-5 by (C): minimise αρ + log(1/δ)/(α−1) + log(1 − 1/α) − log(α)/(α−1) on a fine grid
    alpha = 1 + np.linspace(1e-3, 5, 2_000_001)
    bound = alpha * rho + np.log(1e5) / (alpha - 1) + np.log1p(-1 / alpha) - np.log(alpha) / (alpha - 1)
    by_hand = float(bound.min())
    accountant = DistributedPrivacyAccountant(DistributedDP(1.0, 1.0, 2, delta=1e-5, granularity=1.0))
    accountant.record(2, 2, 1, dimension=1)
    assert accountant.epsilon() == pytest.approx(by_hand, rel=1e-6)
    # tighter than Bun & Steinke's ρ + 2√(ρ log(1/δ)) = 2.0000114 + 2√(2.0000114 · 11.5129) ≈ 11.5967
    assert accountant.epsilon() < rho + 2 * math.sqrt(rho * math.log(1e5)) - 0.5


@pytest.mark.parametrize("rho", [1e-3, 0.05, 0.5, 5.0, 50.0])
def test_conversion_agrees_with_dp_accounting(rho):
    """dp-accounting's RDP accountant converts a non-sampled ρ-zCDP event by the same bound (C) on its orders: on
    its default orders we are at least as tight, and on a fine grid of orders the two agree."""
    ours = zcdp_epsilon(rho, 1e-6)
    coarse = dp_accounting.rdp.RdpAccountant()
    coarse.compose(dp_accounting.ZCDpEvent(rho))
    assert ours <= coarse.get_epsilon(1e-6) + 1e-9
    fine = dp_accounting.rdp.RdpAccountant(orders=list(1 + np.logspace(-4, 5, 4000)))
    fine.compose(dp_accounting.ZCDpEvent(rho))
    assert ours == pytest.approx(fine.get_epsilon(1e-6), rel=1e-3)
    assert ours < rho + 2 * math.sqrt(rho * math.log(1e6))  # Bun & Steinke's simpler conversion is looser


def test_for_target_reaches_the_target_and_no_further():
    releases = [(3, 200), (1, 50)]
    ddp = DistributedDP.for_target(2.0, 1e-5, releases, clip_norm=1.0, honest_clients=5, tolerance=1e-4)

    def spent(z):
        accountant = DistributedPrivacyAccountant(DistributedDP(z, 1.0, 5, delta=1e-5))
        accountant.record(10, 10, 3, dimension=200)
        accountant.record(10, 10, 1, dimension=50)
        return accountant.epsilon()

    assert spent(ddp.noise_multiplier) <= 2.0
    assert spent(ddp.noise_multiplier / 1.001) > 2.0
    with pytest.raises(ValueError, match="out of reach"):
        DistributedDP.for_target(1e-6, 1e-10, [(10**6, 10)], clip_norm=1.0, honest_clients=1)
    with pytest.raises(ValueError, match="empty"):
        DistributedDP.for_target(1.0, 1e-5, [(0, 10)], clip_norm=1.0, honest_clients=1)


def test_accountant_refuses_releases_below_the_honest_threshold():
    accountant = DistributedPrivacyAccountant(DistributedDP(1.0, 1.0, 5))
    with pytest.raises(ValueError, match="below honest_clients = 5"):
        accountant.record(10, 4, 1, dimension=10)
    with pytest.raises(ValueError, match="invalid release"):
        accountant.record(3, 5, 1, dimension=10)
    with pytest.raises(ValueError, match="num_clients, sample_size, num_sums, dimension"):
        accountant.restore([(10, 10, 1)])
    with pytest.raises(TypeError):
        DistributedPrivacyAccountant(object())


def test_report_names_the_mechanism_and_what_it_covers():
    accountant = DistributedPrivacyAccountant(DistributedDP(2.0, 1.0, 7))
    accountant.record(10, 9, 2, dimension=40)
    report = accountant.report()
    assert report["releases"] == 2 and report["honest_clients"] == 7
    assert report["epsilon"] == accountant.epsilon() > 0 and report["rho"] == accountant.rho()
    assert "discrete Gaussian" in report["mechanism"] and "no sampling amplification" in report["accountant"]
    assert "at least 7 clients" in report["covers"] and "secure aggregation" in report["covers"]
    assert "fewer than 7" in report["not_covered"]


# --- where the randomness comes from ------------------------------------------------------------------
def test_noise_is_not_reproducible_without_the_insecure_seed():
    ddp = DistributedDP(1.0, 1.0, 2)
    x = np.linspace(-1, 1, 50)
    assert not np.array_equal(ddp.encode(x, 2), ddp.encode(x, 2))
    assert not np.array_equal(ddp.encode(x, 2, NoiseSource()), ddp.encode(x, 2, NoiseSource()))
    np.testing.assert_array_equal(
        ddp.encode(x, 2, NoiseSource(insecure_seed=3)), ddp.encode(x, 2, NoiseSource(insecure_seed=3))
    )


def test_nothing_protective_comes_from_a_public_seed(monkeypatch):
    ddp = DistributedDP(1.0, 1.0, 2)
    x = np.linspace(-1, 1, 50)
    draws = []
    for _ in range(2):
        random.seed(0)
        np.random.seed(0)
        draws.append(ddp.encode(x, 2))
    assert not np.array_equal(*draws)  # the global generators (a run's seed) play no part
    assert NoiseSource().secure and not NoiseSource(insecure_seed=0).secure
    assert not any("seed" in field for field in DistributedDP.__dataclass_fields__)

    # the source is the OS: with os.urandom made predictable, the noise becomes predictable
    def predictable_os():
        counter = itertools.count()
        monkeypatch.setattr(ddp_module.os, "urandom", lambda n: hashlib.shake_256(b"%d" % next(counter)).digest(n))

    predictable_os()
    first = ddp.encode(x, 2)
    predictable_os()
    np.testing.assert_array_equal(first, ddp.encode(x, 2))


def test_noise_sources_are_never_copied_out():
    source = NoiseSource()
    with pytest.raises(TypeError, match="must not be copied"):
        pickle.dumps(source)
    assert copy.copy(source) is source and copy.deepcopy({"s": source})["s"] is source
    source.below(10)
    assert source._words
    source._pid = -1  # as after os.fork: the buffer read by the parent is dropped
    source.check_fork()
    assert source._words == [] and source._pid == os.getpid()
    assert "INSECURE" in repr(NoiseSource(insecure_seed=1)) and "os.urandom" in repr(source)
