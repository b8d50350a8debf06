"""Issue 43 (the clip leak): a payload its algorithm bounds from public numbers is never clipped.

The twelfth attacker scaled what every party computes (FSGP's statistics through the kernel variance it broadcasts,
a column's scale in the moments) across the public fixed-point range ±R: ``Σ_k clip(v c_k, R)`` swept over v changes
slope where each party saturates, and gave each party's entries (1.4e-13) with no colluder. A party now encodes such
a phase only within its algorithm's public bound (``Algorithm.payload_bound``: the broadcast and the party's
:class:`~gpflow_fed.federated.protocol.domain.DataDomain`): a bound beyond the range is refused before anything is
encoded, on those numbers alone; a value beyond its bound stops the party (it cannot come from in-domain data).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Dict, List, Tuple

import gpflow
import numpy as np
import pytest

from gpflow_fed.data.dataset import FederatedDataset
from gpflow_fed.federated import run
from gpflow_fed.federated.algorithms import FSGP
from gpflow_fed.federated.algorithms.moments import Moments
from gpflow_fed.federated.protection.distributed_dp import DistributedDP
from gpflow_fed.federated.protection.dp import DifferentialPrivacy
from gpflow_fed.federated.protection.encoder import ClientEncoder, EncoderRefusal
from gpflow_fed.federated.protection.policy import ClientPolicy
from gpflow_fed.federated.protection.reduction import FixedPointSaturationWarning
from gpflow_fed.federated.protection.request import Protection
from gpflow_fed.federated.protection.wire import METRIC_PREFIX, FixedPoint, broadcast_digest
from gpflow_fed.federated.protocol.domain import DataDomain, power_of_two_ceiling
from gpflow_fed.federated.protocol.messages import Message
from tests.security.test_eleventh_attack_round import K, N, REFUSED, _federation, _fsgp

#: kernel variances the malicious server broadcasts, one a round, from honest to far beyond the range of K members
SWEEP = np.geomspace(1.0, 1e17, 9)


def test_a_domain_is_each_columns_largest_magnitude_rounded_up_to_a_power_of_two():
    got = power_of_two_ceiling(np.array([0.0, 1.0, 1.5, 2.0, -3.0, 0.3, np.nan, np.inf, 1.7e308]))
    np.testing.assert_array_equal(got, [0.0, 1.0, 2.0, 2.0, 4.0, 0.5, np.inf, np.inf, np.inf])
    domain = DataDomain.of(np.array([[1.0, -300.0], [0.2, 2.0]]), np.array([[0.7], [-0.1]]))
    assert domain == DataDomain(2, (1.0, 512.0), (1.0,))
    np.testing.assert_array_equal(domain.columns, [1.0, 512.0, 1.0])


def sweep(
    algorithm: Any,
    owner: Any,
    ids: List[str],
    name: str = "kernel.variance",
    values: np.ndarray = SWEEP,
    phase: str = "statistics",
) -> Tuple[List[float], Dict[float, Any]]:
    """The malicious server's sweep of the positive parameter ``name`` over ``values``, one ``phase`` exchange a round
    over every client; returns the values refused and the aggregates of those answered."""
    state = algorithm.initial_state(owner.info)
    positive = gpflow.utilities.positive()
    refused, answered = [], {}
    for r, value in enumerate(values):
        params = dict(state.params)
        params[name] = np.asarray(positive.inverse(np.float64(value)).numpy())
        try:
            _, aggregate, excluded = owner.run(dataclasses.replace(state, params=params), r, phase, ids, "train")
        except REFUSED:
            refused.append(float(value))
            continue
        assert not excluded
        answered[float(value)] = aggregate
    return refused, answered


def _public_limit(variance: float, domain: DataDomain) -> float:
    """FSGP's whitened statistics bound (``FSGP.payload_bound``) at ``variance``, with the weight entry N_k."""
    targets = np.asarray(domain.targets)
    n = float(domain.rows)
    return max(n * variance, n * np.sqrt(variance) * targets.max(), n * np.sum(targets**2), n)


def test_fsgp_statistics_under_a_swept_kernel_variance_are_refused_past_the_range_never_clipped():
    """Every party answers while the public bound is within the range of the K members it masks over and refuses
    beyond (the set of refused variances is the one the public numbers give), and no answered sum holds a clipped
    entry: there is no slope change to read."""
    algorithm, owner, runtime, ids = _federation(_fsgp(rounds=len(SWEEP)), Protection())
    with warnings.catch_warnings():
        warnings.simplefilter("error", FixedPointSaturationWarning)
        refused, answered = sweep(algorithm, owner, ids)
    assert not owner.reducer.saturated
    domains = [endpoint.domain for endpoint in runtime.endpoints.values()]
    limit = FixedPoint(ClientPolicy().fractional_bits, K).range
    expected = [float(v) for v in SWEEP if max(_public_limit(v, d) for d in domains) > limit]
    assert refused == expected and 0 < len(refused) < len(SWEEP)
    assert all(d.rows == N for d in domains)


def test_control_without_the_bound_the_same_sweep_is_clipped(monkeypatch):
    """The test can fail: with no bound (the code before), the parties answer variances past the range and their
    entries are clipped and counted (the attacker's slope changes; this server's own consistency check then fails
    the clipped sums, which a malicious server would not run)."""
    monkeypatch.setattr(FSGP, "payload_bound", lambda self, broadcast, domain: None)
    algorithm, owner, _, ids = _federation(_fsgp(rounds=len(SWEEP)), Protection())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FixedPointSaturationWarning)
        refused, answered = sweep(algorithm, owner, ids)
    assert owner.reducer.saturated and len(refused) < len(SWEEP)


def test_the_refusals_depend_on_the_domain_not_on_the_values_within_it():
    """Two federations whose data differ but share each column's power of two: the same variances are refused."""

    def refusals(scale: float) -> List[float]:
        algorithm, owner, runtime, ids = _federation(_fsgp(rounds=len(SWEEP)), Protection())
        for endpoint in runtime.endpoints.values():
            X, Y = endpoint.client.data
            Y = Y * scale
            Y[0, 0] = 3.9  # every party's targets within 4 (its power of two), whatever the scale
            endpoint.client._data = (X, np.clip(Y, -3.9, 3.9))
            endpoint._domain = None
        return sweep(algorithm, owner, ids)[0]

    assert refusals(0.5) == refusals(1.0)


def _one(payload: Dict[str, np.ndarray], bound: Dict[str, float], metrics=None, aggregation: str = "sum"):
    encoder = ClientEncoder("c0", ClientPolicy())
    message = Message("c0", 0, "p", payload, weight=2.0, metrics=metrics or {})
    return encoder.prepare(message, Protection(), aggregation, 3, "t", bound=bound), encoder


def test_a_value_beyond_its_bound_is_a_value_error_not_a_clip():
    """A value (or NaN) beyond the bound its algorithm states cannot come from in-domain data: ``prepare`` raises
    ValueError, which the party's endpoint answers with DATA_FAULT and its stop, never a clipped code."""
    _one({"y": np.array([1.0, -2.0])}, {"y": 2.0})
    for bad in (2.5, np.nan, -np.inf):
        with pytest.raises(ValueError, match="beyond the bound") as caught:
            _one({"y": np.array([1.0, bad])}, {"y": 2.0})
        assert not isinstance(caught.value, EncoderRefusal)


def test_a_metric_without_a_bound_is_not_sent_and_a_mean_scales_its_bounds_by_the_weight():
    layout, encoder = _one({"y": np.array([1.0])}, {"y": 1.0, "loss": 5.0}, {"loss": 4.0, "other": 1e300})
    assert METRIC_PREFIX + "loss" in layout.arrays and METRIC_PREFIX + "other" not in layout.arrays
    _, kept = next(iter(encoder._prepared.items()))
    assert kept.limit == 10.0  # the metric's bound times the weight 2
    _, encoder = _one({"y": np.array([1.0])}, {"y": 1.0}, aggregation="mean")
    assert next(iter(encoder._prepared.values())).limit == 2.0


def test_moments_refuse_a_scale_that_would_take_a_column_past_the_range():
    """The moments' second exchange under a scale of 2^64 for one column (the server's choice): every party's bound
    is beyond its range, so all refuse; under the scales the first exchange gives, all answer, nothing clipped."""
    rng = np.random.default_rng(0)
    dataset = FederatedDataset([(rng.normal(size=(6, 2)) * 100, rng.normal(size=(6, 1))) for _ in range(3)])
    with warnings.catch_warnings():
        warnings.simplefilter("error", FixedPointSaturationWarning)
        result = run(Moments(), dataset)
    assert "saturated" not in str(result.history)
    moments = Moments()
    domain = DataDomain.of(*dataset.clients[0])
    honest = moments.payload_bound(Message("s", 0, "moments", {"scale": np.array([2.0**-9, 2.0**-9, 0.25])}), domain)
    assert honest["sum"] <= 6.0 and honest["count"] == 6.0
    attack = moments.payload_bound(Message("s", 0, "moments", {"scale": np.array([2.0**64, 1.0, 1.0])}), domain)
    assert attack["sum"] > FixedPoint(32, 3).range


# --- a DP clip the server chooses (the thirteenth attacker) ----------------------------------------------------------
def _central(clip_norm: float) -> Protection:
    return Protection(differential_privacy=DifferentialPrivacy(1e-300, clip_norm=clip_norm, insecure_noise_seed=0))


def _distributed(clip_norm: float) -> Protection:
    # z = 1e-5: as good as no noise for the clip sweep, and a share variance above the party's floor
    # (encoder.MIN_SHARE_VARIANCE; at the attacker's z = 1e-9 the request is refused for that alone)
    return Protection(differential_privacy=DistributedDP(1e-5, clip_norm=clip_norm, honest_clients=2))


@pytest.mark.parametrize("request_of", [_central, _distributed])
def test_a_dp_clip_below_the_public_bound_is_refused_without_noise_the_party_trusts(request_of):
    """The attack (``/tmp/attack43j/a1_dpclip_sweep.py``): secure aggregation plus a DP request whose clip norm the
    server sweeps, with no real noise: the sums' kinks gave each party's FSGP statistics (2.4e-9; distributed DP at
    z = 1e-9: 1.1e-6). Under the default policy a clip norm below the payload's public L2 bound is refused, whatever
    the values; at or above it the clip never binds and the party answers."""
    payload, bound = {"y": np.array([3.0, -4.0])}, {"y": 4.0}  # the L2 bound: √(2 · 16) = 5.66
    encoder = ClientEncoder("c0", ClientPolicy())
    message = Message("c0", 0, "p", payload, weight=1.0)
    for small in (0.5, 5.0, 5.6):
        with pytest.raises(EncoderRefusal, match="below the 5.66"):
            encoder.prepare(message, request_of(small), "sum", 3, "t", bound=bound)
    ClientEncoder("c0", ClientPolicy()).prepare(message, request_of(5.7), "sum", 3, "t", bound=bound)
    trusted = (
        ClientPolicy(trust_server_noise=True) if request_of is _central else ClientPolicy(min_noise_multiplier=1e-9)
    )
    ClientEncoder("c0", trusted).prepare(message, request_of(0.5), "sum", 3, "t", bound=bound)


def test_the_dp_clip_sweep_over_a_real_federation_is_refused_under_the_default_policy(monkeypatch):
    """The same sweep over the package's parties (default policy): every clip norm below the statistics' public bound
    fails the exchange; in-process runs (``ClientPolicy.matching``) trust their own server's central-DP noise."""
    assert ClientPolicy.matching(_central(1.0)).trust_server_noise
    assert not ClientPolicy.matching(_distributed(1.0)).trust_server_noise and not ClientPolicy().trust_server_noise
    monkeypatch.setattr(ClientPolicy, "matching", classmethod(lambda cls, protection: cls()))
    for clip_norm in (1.0, 30.0, 90.0):  # the parties' bounds at the initial parameters: 95.2 to 229
        algorithm, owner, _, ids = _federation(_fsgp(rounds=1), _central(clip_norm))
        with pytest.raises(REFUSED, match="below the"):
            owner.run(algorithm.initial_state(owner.info), 0, "statistics", ids, "train")
    algorithm, owner, _, ids = _federation(_fsgp(rounds=1), _central(1000.0))  # control: a clip that cannot bind
    _, _, excluded = owner.run(algorithm.initial_state(owner.info), 0, "statistics", ids, "train")
    assert not excluded


def test_a_policys_trust_in_server_noise_is_its_node_configs():
    assert ClientPolicy.from_node_config({}).trust_server_noise is False
    policy = ClientPolicy.from_node_config({"trust-server-noise": "true"})
    assert policy.trust_server_noise is True and policy.to_node_config()["trust-server-noise"] is True
    with pytest.raises(ValueError, match="trust-server-noise"):
        ClientPolicy.from_node_config({"trust-server-noise": "yes"})


def test_a_bound_beyond_float64_is_a_refusal_before_any_value_is_read():
    """A scale whose bound overflows (s A > 1.3e154) was a Python OverflowError from the bound itself; now the bound is
    inf and the party refuses, the same words for any payload (the sixth attacker's rule: no data-dependent refusal)."""
    domain = DataDomain(4, (2.0**600,), (1.0,))
    bound = Moments().payload_bound(Message("s", 0, "moments", {"scale": np.array([2.0**64, 1.0])}), domain)
    assert bound["sum_squares"] == np.inf
    texts = set()
    for value in (0.0, 1e300, np.nan):
        with pytest.raises(EncoderRefusal) as caught:
            _one({"count": np.array([4.0]), "sum": np.array([value, 1.0]), "sum_squares": np.ones(2)}, bound)
        texts.add(str(caught.value))
    assert len(texts) == 1


# --- a fifteenth attacker: one cache keyed by bytes, a mean checked against its weighted bound ------------------------
def test_the_kernel_variance_cache_reads_values_not_bytes():
    """The attack (``/tmp/attack43k/attack_dtype_cache.py``): a float64 broadcast filled a party's variance cache, then
    the same bytes as int64 (other numbers: a variance of 100, not 0.69) hit it, so the bound was computed for the other
    variance and a DP clip within it bound the real payload (each party's statistics to 1e-10). The cache is now keyed
    by the float64 values."""
    algorithm, owner, _, _ = _federation(_fsgp(), Protection())
    state = algorithm.initial_state(owner.info)
    as_float = dict(state.params, **{"kernel.variance": np.int64(100).view(np.float64)})
    as_int = dict(state.params, **{"kernel.variance": np.int64(100)})
    assert algorithm._kernel_variance(as_float) == pytest.approx(np.log(2.0), rel=1e-6)
    assert algorithm._kernel_variance(as_int) == pytest.approx(100.0, rel=1e-9)


def test_the_same_numbers_as_integers_are_the_same_broadcast():
    """An update reads an integer broadcast as the same floats, so a server must not get it answered twice by sending
    it once as floats and once as integers (the seventh round's float widths, for integers)."""
    floats = Message("server", 0, "p", {"a": np.array([100.0, -3.0]), "b": np.array(1.0)})
    ints = Message("server", 0, "p", {"a": np.array([100, -3]), "b": np.array(True)})
    assert broadcast_digest(floats) == broadcast_digest(ints)
    assert broadcast_digest(Message("server", 0, "p", {"a": np.array([2**60])})) != broadcast_digest(
        Message("server", 0, "p", {"a": np.array([float(2**60)])})
    )  # beyond 2^53 an integer stays one (its float would be another number)


def test_a_weighted_payload_is_checked_against_its_bound_before_weighting():
    """A ``"mean"`` reply's values were checked against bound × weight: with N_k = 20 an array 19× over its bound passed
    and was encoded at 380 against a range checked for 40. Each value is now within its own bound, and only the
    encoded limit is weighted."""
    with pytest.raises(ValueError, match="beyond the bound"):
        _one({"y": np.array([1.5])}, {"y": 1.0}, aggregation="mean")  # weight 2: 1.5 ≤ 2 passed before
    with pytest.raises(ValueError, match="beyond the bound"):
        _one({"y": np.array([1.0])}, {"y": 1.0, "loss": 3.0}, {"loss": 4.0})  # a metric over its bound
    _, encoder = _one({"y": np.array([1.0])}, {"y": 1.0, "loss": 3.0}, {"loss": 3.0}, aggregation="mean")
    assert next(iter(encoder._prepared.values())).limit == 6.0
