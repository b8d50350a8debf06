"""The federated moments run (``Moments``, behind ``fit``'s and the CLI's standardisation): columns of any magnitude
under secure aggregation, the old raw sums to the bit in the clear, and what each client sends and accepts."""

import numpy as np
import pytest

from gpflow_fed.federated.protection.encoder import DITHER_CODES
from gpflow_fed.data import FederatedDataset
from gpflow_fed.federated import Client, LocalRuntime, Message, Protection
from gpflow_fed.fitting import standardize
from gpflow_fed.federated.protocol.algorithm import Aggregate, FederationInfo
from gpflow_fed.federated.algorithms.moments import EXPONENTS, MAGNITUDES_PHASE, MOMENTS_PHASE, Moments
from gpflow_fed.federated.protocol.messages import SERVER


def years_table(seed: int = 0, clients: int = 5, rows: int = 120) -> FederatedDataset:
    """Mauna Loa's shape: time in years (Σ x² ≈ 4·10⁶ per row) and a level near 350."""
    rng = np.random.default_rng(seed)
    parts = []
    for _ in range(clients):
        X = np.c_[1958 + 43 * rng.random(rows), 1e-3 * rng.standard_normal(rows)]
        parts.append((X, (330 + 40 * rng.random(rows))[:, None]))
    return FederatedDataset(parts)


def raw_moments(dataset: FederatedDataset):
    """The moments of the raw per-client sums, summed client by client (the previous one-exchange protocol)."""
    sums, squares, count = 0.0, 0.0, 0.0
    for X, Y in dataset.clients:
        A = np.c_[X, Y]
        sums, squares, count = sums + A.sum(axis=0), squares + (A**2).sum(axis=0), count + len(A)
    mean = sums / count
    std = np.sqrt(np.maximum(squares / count - mean**2, 0.0))
    return mean, np.where(std > 0, std, 1.0)


def columns(scaler):
    return np.r_[scaler.X_mean, scaler.Y_mean], np.r_[scaler.X_std, scaler.Y_std]


def test_in_the_clear_the_scaled_sums_give_the_raw_sums_moments_to_the_bit():
    dataset = years_table()
    _, scaler, _ = standardize(dataset, runtime=LocalRuntime(protection=Protection(secure_aggregation=False)))
    mean, std = columns(scaler)
    expected_mean, expected_std = raw_moments(dataset)
    np.testing.assert_array_equal(mean, expected_mean)
    np.testing.assert_array_equal(std, expected_std)


def test_secure_default_standardises_years_whose_raw_squares_overflow_the_fixed_point_range():
    dataset = years_table()
    # the raw protocol's payload: Σ x² of one client's years, beyond 2^31 / K (fractional_bits = 32, K = 5)
    assert (dataset.clients[0][0][:, 0] ** 2).sum() > 2.0**31 / 5
    _, scaler, result = standardize(dataset)  # secure aggregation: the library's default
    mean, std = columns(scaler)
    expected_mean, expected_std = raw_moments(dataset)
    # each party's sums carry its rounding noise (a Gaussian of DITHER_CODES codes of 2^-32) on columns scaled by
    # their power of two (2^11 for years): the mean's standard deviation is that times √K / N, allowed 8 times
    noise = DITHER_CODES * 2.0**-32 * 2.0**11 * np.sqrt(5) / 600
    np.testing.assert_allclose(mean, expected_mean, rtol=0, atol=1e-9 * expected_std.max() + 8 * noise)
    np.testing.assert_allclose(std, expected_std, rtol=1e-6)
    phases = [e.phase for e in result.ledger if not e.phase.count("/")]
    assert phases.index(MAGNITUDES_PHASE) < phases.index(MOMENTS_PHASE)


def test_each_client_sends_one_exponent_per_column_then_sums_on_the_broadcast_scale():
    dataset = years_table(clients=3, rows=10)
    result = standardize(dataset, runtime=LocalRuntime(protection=Protection(secure_aggregation=False)))[2]
    up = [e for e in result.ledger if e.direction == "up"]
    assert {(e.phase, e.names, e.shapes) for e in up} == {
        (MAGNITUDES_PHASE, ("exponents",), ((3, len(EXPONENTS)),)),
        (MOMENTS_PHASE, ("count", "sum", "sum_squares"), ((1,), (3,), (3,))),
    }
    down = {e.phase: e.names for e in result.ledger if e.direction == "down"}
    assert down == {MAGNITUDES_PHASE: (), MOMENTS_PHASE: ("scale",)}
    # the scales: 2^-E, E the largest exponent any client marked (years < 2^11, levels < 2^9)
    largest = np.max([np.abs(np.c_[X, Y]).max(axis=0) for X, Y in dataset.clients], axis=0)
    np.testing.assert_array_equal(result.state.scale, np.ldexp(1.0, -np.frexp(largest)[1]))


def bound_client(rows: np.ndarray):
    algorithm = Moments()
    X, Y = rows[:, :-1], rows[:, -1:]
    info = FederationInfo(("a",), {"a": len(rows)}, input_dim=X.shape[1], output_dim=1, seed=0)
    return algorithm.bind(info), Client("a", (X, Y), seed=0)


def down(phase: str, **arrays) -> Message:
    return Message(SERVER, 0, phase, arrays, weight=0.0)


def test_a_client_marks_its_largest_magnitudes_exponent_and_refuses_a_scale_that_is_not_a_power_of_two():
    algorithm, client = bound_client(np.array([[3.0, 0.0, -1500.0], [-5.0, 0.0, 2.0], [1.0, 0.0, 1.0]]))
    exponents = algorithm.client_update(client, down(MAGNITUDES_PHASE))["exponents"]
    assert exponents.sum(axis=1).tolist() == [1.0, 1.0, 1.0]
    # |a| ≤ 5 < 2^3; zeros mark the smallest exponent; 1500 < 2^11
    assert [EXPONENTS[i] for i in exponents.argmax(axis=1)] == [3, EXPONENTS[0], 11]
    reply = algorithm.client_update(client, down(MOMENTS_PHASE, scale=np.ldexp(1.0, -np.array([3, 0, 11]))))
    np.testing.assert_array_equal(reply["sum"], np.array([-1.0 / 8, 0.0, -1497.0 / 2048]))
    for scale, match in (
        (np.array([0.3, 1.0, 1.0]), "powers of two"),
        (np.array([1.0, 1.0]), "3 positive finite"),
        (np.array([1.0, np.inf, 1.0]), "3 positive finite"),
        (np.ldexp(1.0, np.array([0, 0, 70])), "powers of two"),
    ):
        with pytest.raises(ValueError, match=match):
            algorithm.client_update(client, down(MOMENTS_PHASE, scale=scale))
    with pytest.raises(ValueError, match="exactly 'scale'"):
        algorithm.client_update(client, down(MOMENTS_PHASE, scale=np.ones(3), extra=np.ones(3)))
    with pytest.raises(ValueError, match="carries arrays"):
        algorithm.client_update(client, down(MAGNITUDES_PHASE, scale=np.ones(3)))


def test_values_beyond_the_exponents_range_are_refused_with_what_to_do():
    algorithm, client = bound_client(np.array([[1e20, 1.0], [2.0, 1.0], [3.0, 0.0]]))
    with pytest.raises(ValueError, match="magnitude ≥ 2\\^64; rescale it first"):
        algorithm.client_update(client, down(MAGNITUDES_PHASE))


def test_the_server_refuses_exponents_that_are_not_one_per_column_and_client():
    algorithm, client = bound_client(np.array([[1.0, 2.0], [2.0, 1.0], [3.0, 0.0]]))
    good = algorithm.client_update(client, down(MAGNITUDES_PHASE))
    assert algorithm.check_reply(None, MAGNITUDES_PHASE, good, 3) is None
    for forged in (2 * good["exponents"], np.zeros_like(good["exponents"]), 0.5 * np.ones_like(good["exponents"])):
        message = Message("a", 0, MAGNITUDES_PHASE, {"exponents": forged}, weight=3.0)
        assert algorithm.check_reply(None, MAGNITUDES_PHASE, message, 3) is not None


def test_a_masked_sum_whose_count_is_not_the_senders_registered_sizes_is_refused():
    """A client that inflates its count under masking (its sums consistent) would shrink every mean and spread."""
    algorithm = Moments().bind(FederationInfo(("a", "b"), {"a": 4, "b": 6}, input_dim=1, output_dim=1, seed=0))
    rows = np.arange(20.0).reshape(10, 2) / 32
    sums = {"sum": rows.sum(axis=0), "sum_squares": (rows**2).sum(axis=0)}
    honest = Aggregate(0, MOMENTS_PHASE, {"count": np.array([10.0]), **sums}, 10.0, ("a", "b"))
    assert algorithm.check_sum(None, honest) is None
    inflated = Aggregate(0, MOMENTS_PHASE, {"count": np.array([10.0 + 1e6]), **sums}, 10.0, ("a", "b"))
    assert "registered 10 points" in algorithm.check_sum(None, inflated)
