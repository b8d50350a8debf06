"""Issue 43, a sixteenth attacker: secure aggregation's fixed point rounded to nearest, so a masked sum was a
staircase of each party's payload, and a server that scales the payload continuously read every party's entries
from where the sum steps, with no clip and every bound met (FSGP's whitened ``kuf_y`` is ``g(v) b_k`` in the
kernel variance v it broadcasts: bisecting on the first v whose sum is not 0 gave ``max_k |b_k|`` to 1e-15, then each
next party by subtracting the known staircase). A party now rounds at random and without bias from the operating
system's randomness (``FixedPoint.encode(uniform=…)``): ``E[code] = 2^f x`` is linear in the payload, and where a sum
first leaves 0 says nothing exact about any party."""

from __future__ import annotations

import dataclasses

import gpflow
import numpy as np
import pytest

from gpflow_fed.federated.protection.distributed_dp import NoiseSource
from gpflow_fed.federated.protection.encoder import DITHER_CODES
from gpflow_fed.federated.protection.request import Protection
from gpflow_fed.federated.protection.policy import ClientPolicy
from gpflow_fed.federated.protection.wire import FixedPoint
from gpflow_fed.federated.protocol.messages import Message
from tests.security.test_eleventh_attack_round import _federation, _fsgp

STEPS = 24  # bisection steps on ln v over [ln 1e-14, ln 1e-6]: the bracket ends 1.1e-6 wide in relative v


def _attack() -> float:
    """The server's bisection for the smallest kernel variance whose masked ``kuf_y[0]`` is not 0; returns the
    largest party's code there, ``max_k |2^f kuf_y_k[0]|`` computed from its data (0.5 exactly when the sum steps
    where the largest payload rounds away from 0)."""
    algorithm, owner, runtime, ids = _federation(_fsgp(rounds=STEPS + 2), Protection())
    state = algorithm.initial_state(owner.info)
    positive = gpflow.utilities.positive()

    def broadcast(variance: float) -> dict:
        params = dict(state.params)
        params["kernel.variance"] = np.asarray(positive.inverse(np.float64(variance)).numpy())
        return params

    low, high = np.log(1e-14), np.log(1e-6)
    for r in range(STEPS):
        middle = 0.5 * (low + high)
        _, aggregate, excluded = owner.run(
            dataclasses.replace(state, params=broadcast(float(np.exp(middle)))), r, "statistics", ids, "train"
        )
        assert not excluded
        if np.asarray(aggregate.arrays["kuf_y"]).ravel()[0] != 0.0:
            high = middle
        else:
            low = middle
    found = broadcast(float(np.exp(high)))
    scale = FixedPoint(ClientPolicy().fractional_bits, len(ids)).scale
    codes = []
    for endpoint in runtime.endpoints.values():  # what each party computes there (the test reads their data)
        read = algorithm.read_broadcast(Message("server", STEPS, "statistics", found))
        reply = algorithm.client_update(endpoint.client, read)
        codes.append(abs(scale * float(np.asarray(reply.arrays["kuf_y"]).ravel()[0])))
    return max(codes)


@pytest.mark.usefixtures("nearest_rounding")
def test_control_rounding_to_nearest_gives_the_largest_partys_entry():
    """The test can fail: with the fixed point rounding to nearest (the code before), the sum first leaves 0 exactly
    where the largest party's entry reaches half a code, so the bisection has that party's value to its width."""
    assert _attack() == pytest.approx(0.5, rel=3e-6)


def test_randomized_rounding_leaves_no_step_to_find():
    """The parties' default encoding: the bisection ends where random codes happened to appear, not at a party's
    value (the chance of landing within the control's width of 0.5 by luck is about 1e-5)."""
    assert _attack() != pytest.approx(0.5, rel=3e-6)


#: draws per fraction in the variance tests: the two variances' difference has a standard deviation of 0.03 codes²
DRAWS = 1_000_000


def _error_variance(fraction: float, dither: float) -> float:
    """The variance, in codes², of ``code − 2^f x`` for DRAWS encodings of one x whose scaled fraction is
    ``fraction`` (the party's draws: the OS's, :class:`NoiseSource`)."""
    fixed = FixedPoint(ClientPolicy().fractional_bits, 3)
    x = np.full(DRAWS, (12345 + fraction) / fixed.scale)
    codes, _ = fixed.encode(x, uniform=NoiseSource().uniform, dither=dither)
    return float(np.var(codes.view(np.int64) - (12345 + fraction)))


def test_control_randomized_rounding_alone_has_a_variance_that_reads_the_fraction():
    """The test can fail: a seventeenth attacker read each party's statistic to 1e-8 in 60 exchanges from the
    variance φ(1 − φ) of randomized rounding alone (a broadcast of repeated inducing points gave many known scales of
    one number); φ = 1/2 and φ = 0 give variances 1/4 and 0."""
    assert _error_variance(0.5, 0.0) == pytest.approx(0.25, abs=0.01) and _error_variance(0.0, 0.0) == 0.0


def test_with_the_partys_gaussian_the_error_does_not_depend_on_the_fraction():
    """With σ = DITHER_CODES the error's law depends on φ only through terms of order e^{−2π²σ²} (1e-137): its
    variance is σ² + 1/6 at φ = 0 and at φ = 1/2 alike (within the sampling error)."""
    low, high = _error_variance(0.0, DITHER_CODES), _error_variance(0.5, DITHER_CODES)
    expected = DITHER_CODES**2 + 1 / 6
    assert low == pytest.approx(expected, abs=0.15) and high == pytest.approx(expected, abs=0.15)
    assert abs(high - low) < 0.15  # randomized rounding alone: 0.25


def test_a_party_encodes_with_its_gaussian(monkeypatch):
    """The parties' encoder draws its rounding from the OS with the Gaussian (the mechanism the tests above
    measure), on an ordinary secure exchange."""
    calls = []
    encode = FixedPoint.encode

    def spy(self, values, uniform=None, dither=0.0):
        calls.append((uniform is not None, dither))
        return encode(self, values, uniform=uniform, dither=dither)

    monkeypatch.setattr(FixedPoint, "encode", spy)
    algorithm, owner, _, ids = _federation(_fsgp(rounds=2), Protection())
    state = algorithm.initial_state(owner.info)
    owner.run(state, 0, "statistics", ids, "train")
    assert calls and set(calls) == {(True, DITHER_CODES)}


#: a party's entry at 2^59 codes: float64 holds multiples of 128 codes there
LATTICE_TOP = 2.0**59.5
LATTICE_DRAWS = 200_000


def _first_harmonic(offset: float, dither: float) -> complex:
    """``E exp(2πi·code/256)`` over LATTICE_DRAWS encodings of the float at 2^59 + ``offset`` codes (a multiple of
    128): the signal an eighteenth attacker read from ``total mod 256`` (about +1 or −1 when the code mod 256 is the
    party's lattice bit; sampling noise, ~1/√draws, for a law that does not depend on where the value sits)."""
    fixed = FixedPoint(ClientPolicy().fractional_bits, 3)
    x = np.full(LATTICE_DRAWS, (2.0**59 + offset) / fixed.scale)
    codes, _ = fixed.encode(x, uniform=NoiseSource().uniform, dither=dither)
    return complex(np.mean(np.exp(2j * np.pi * (codes.view(np.int64) % 256) / 256.0)))


def test_control_a_four_code_gaussian_leaves_the_float_lattice_readable():
    """The test can fail: with σ = 4 codes, a float of 2^59 codes (a multiple of 128) keeps its lattice bit in
    ``code mod 256`` (σ ≪ 128); before the Gaussian was added as an integer, float64 rounded it away altogether."""
    assert _first_harmonic(0.0, DITHER_CODES).real > 0.95 and _first_harmonic(128.0, DITHER_CODES).real < -0.95


def test_the_gaussian_scaled_to_the_float_spacing_hides_the_lattice():
    """σ = ``dither_codes(top)`` (4 spacings of the largest float the entry may be), added as an integer: ``code mod
    256`` has the same law for a value on either lattice point (its first harmonic is sampling noise). Added in
    float64 instead, the Gaussian near 2^59 lands on two lattices (64 codes apart below 2^59, 128 above): |harmonic|
    0.026, five times this bound."""
    from gpflow_fed.federated.protection.encoder import dither_codes, float_spread

    assert float_spread(2.0**40) == 1.0 and float_spread(LATTICE_TOP) == 128.0
    assert dither_codes(2.0**40) == DITHER_CODES and dither_codes(LATTICE_TOP) == 4 * 128.0
    for offset in (0.0, 128.0):
        assert abs(_first_harmonic(offset, dither_codes(LATTICE_TOP))) < 5.0 / np.sqrt(LATTICE_DRAWS)


def test_a_party_widens_its_gaussian_with_its_public_bound(monkeypatch):
    """On an ordinary secure exchange whose payload bound reaches past 2^56 codes (a kernel variance the server chose
    so, as the attacker did), the party's Gaussian is ``dither_codes`` of that bound, not 4 codes."""
    from gpflow_fed.federated.protection.encoder import dither_codes

    calls = []
    encode = FixedPoint.encode

    def spy(self, values, uniform=None, dither=0.0):
        calls.append(dither)
        return encode(self, values, uniform=uniform, dither=dither)

    algorithm, owner, runtime, ids = _federation(_fsgp(rounds=2), Protection())
    state = algorithm.initial_state(owner.info)
    fixed = FixedPoint(ClientPolicy().fractional_bits, len(ids))
    positive = gpflow.utilities.positive()

    def at(variance: float) -> tuple:
        params = dict(state.params)
        params["kernel.variance"] = np.asarray(positive.inverse(np.float64(variance)).numpy())
        read = algorithm.read_broadcast(Message("server", 0, "statistics", params))
        tops = [
            max(float(np.max(np.abs(b))) for b in algorithm.payload_bound(read, e.domain).values()) * fixed.scale
            for e in runtime.endpoints.values()
        ]
        return params, max(tops)

    variance = 1.0
    while at(variance * 2.0)[1] < 2.0**60:  # the largest power of two the range still holds (with its margin)
        variance *= 2.0
    params, top = at(variance)
    assert 2.0**56 <= top
    monkeypatch.setattr(FixedPoint, "encode", spy)
    _, _, excluded = owner.run(dataclasses.replace(state, params=params), 0, "statistics", ids, "train")
    assert not excluded and calls and max(calls) >= dither_codes(2.0**56) > DITHER_CODES


def test_a_central_dp_request_does_not_narrow_the_gaussian(monkeypatch):
    """A nineteenth attacker: under central DP the payload's bound was not used (the clip decides the values), so σ
    fell back to 4 codes, and a request with noise multiplier 1e-300 and a clip just below the range brought the
    float-lattice leak back (a party's statistic to 3.6e-15 in 352 exchanges). σ now comes from the clip (times the
    weight cap for a mean), the public top of what the party encodes under central DP."""
    from gpflow_fed.federated import DifferentialPrivacy
    from gpflow_fed.federated.protection.encoder import dither_codes

    calls = []
    encode = FixedPoint.encode

    def spy(self, values, uniform=None, dither=0.0):
        calls.append(dither)
        return encode(self, values, uniform=uniform, dither=dither)

    fixed = FixedPoint(ClientPolicy().fractional_bits, 8)
    clip = 0.9 * fixed.range
    protection = Protection(differential_privacy=DifferentialPrivacy(1e-300, clip_norm=clip, insecure_noise_seed=0))
    algorithm, owner, _, ids = _federation(_fsgp(rounds=2), protection)
    assert len(ids) == 8
    monkeypatch.setattr(FixedPoint, "encode", spy)
    state = algorithm.initial_state(owner.info)
    _, _, excluded = owner.run(state, 0, "statistics", ids, "train")
    assert not excluded and calls and set(calls) == {dither_codes(clip * fixed.scale)}
    assert dither_codes(clip * fixed.scale) == 4 * 128  # 0.9 · 2^60 codes: floats 128 codes apart


def test_a_distributed_dp_share_below_the_floor_is_refused():
    """A nineteenth attacker: distributed DP adds its noise after the rounding, whose variance φ(1 − φ) reads the
    payload's fine digits; a request with noise multiplier 6e-7 and a share variance just above 1/4 gave three
    parties' statistics to 1e-5 in 600 exchanges. A party refuses a share below ``MIN_SHARE_VARIANCE`` (2^20 grid
    steps²) before anything of its payload is encoded; at z = 1e-5 (default granularity) it answers."""
    from gpflow_fed.federated import DistributedDP
    from gpflow_fed.federated.protection.encoder import MIN_SHARE_VARIANCE, ClientEncoder, EncoderRefusal

    message = Message("c0", 0, "p", {"y": np.array([3.0, -4.0])}, weight=1.0)
    weak = DistributedDP(6e-7, clip_norm=10.0, honest_clients=1)
    assert float(weak.share_variance(2)) < MIN_SHARE_VARIANCE
    with pytest.raises(EncoderRefusal, match="share has variance"):
        ClientEncoder("c0", ClientPolicy()).prepare(
            message, Protection(differential_privacy=weak), "sum", 3, "t", bound={"y": 4.0}
        )
    enough = DistributedDP(1e-5, clip_norm=10.0, honest_clients=1)
    assert float(enough.share_variance(2)) >= MIN_SHARE_VARIANCE
    ClientEncoder("c0", ClientPolicy()).prepare(
        message, Protection(differential_privacy=enough), "sum", 3, "t", bound={"y": 4.0}
    )
