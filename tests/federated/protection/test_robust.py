"""Robust aggregation: exact against numpy on small cases, weights honoured, inputs validated."""

import numpy as np
import pytest
from scipy import stats

from gpflow_fed.federated.protection.robust import RobustAggregation, weighted_median


def clients(values):
    """One client per row of ``values`` [K, P], as {"a": first column(s), "b": the rest}."""
    return [{"a": np.array(row[:1]), "b": np.array(row[1:]).reshape(-1, 1)} for row in np.asarray(values)]


def flat(result):
    return np.concatenate([result["a"].ravel(), result["b"].ravel()])


@pytest.mark.parametrize("K", [1, 2, 5, 6])
def test_weighted_median_with_equal_weights_is_numpys_median(K):
    values = np.random.default_rng(K).normal(size=(K, 7))
    np.testing.assert_array_equal(weighted_median(values, np.ones_like(values)), np.median(values, axis=0))


@pytest.mark.parametrize("seed", range(5))
def test_weighted_median_with_integer_weights_is_the_median_of_repeated_values(seed):
    rng = np.random.default_rng(seed)
    values = rng.normal(size=(6, 4))
    w = rng.integers(0, 5, size=6)
    w[0] = max(w[0], 1)
    expected = [np.median(np.repeat(values[:, j], w)) for j in range(4)]
    np.testing.assert_array_equal(weighted_median(values, np.broadcast_to(w[:, None], values.shape)), expected)


def test_weighted_median_needs_positive_weight():
    with pytest.raises(ValueError, match="positive weight"):
        weighted_median(np.ones((3, 2)), np.zeros((3, 2)))
    with pytest.raises(ValueError, match="same"):
        weighted_median(np.ones((3, 2)), np.ones((3, 1)))


@pytest.mark.parametrize("K", [3, 4, 10])
def test_median_without_trim_is_numpys_median(K):
    values = np.random.default_rng(K).normal(size=(K, 5))
    out = RobustAggregation("median", trim=0.0).reduce(clients(values), [1.0] * K)
    assert out["a"].shape == (1,) and out["b"].shape == (4, 1)
    np.testing.assert_array_equal(flat(out), np.median(values, axis=0))


@pytest.mark.parametrize("K, trim", [(10, 0.1), (10, 0.2), (7, 0.3), (20, 0.25)])
def test_trimmed_mean_with_equal_weights_is_scipys_trim_mean(K, trim):
    values = np.random.default_rng(K).normal(size=(K, 5))
    out = RobustAggregation("trimmed_mean", trim=trim).reduce(clients(values), [2.0] * K)
    np.testing.assert_allclose(flat(out), stats.trim_mean(values, trim, axis=0), rtol=1e-14, atol=1e-15)


def test_trimmed_mean_without_trim_is_the_weighted_mean():
    rng = np.random.default_rng(1)
    values, w = rng.normal(size=(6, 5)), rng.uniform(1, 10, size=6)
    out = RobustAggregation("trimmed_mean", trim=0.0).reduce(clients(values), w)
    np.testing.assert_allclose(flat(out), np.average(values, axis=0, weights=w), rtol=1e-12, atol=1e-15)


def test_weights_are_honoured_among_the_kept_values():
    rng = np.random.default_rng(2)
    values, w = rng.normal(size=(10, 3)), rng.uniform(1, 10, size=10)
    out = flat(RobustAggregation("trimmed_mean", trim=0.2).reduce(clients(values), w))
    for j in range(3):
        kept = np.argsort(values[:, j], kind="stable")[2:8]
        np.testing.assert_allclose(out[j], np.average(values[kept, j], weights=w[kept]), rtol=1e-12, atol=1e-15)
    # a heavy client decides the weighted median; with equal weights it would not
    values = np.array([[0.0], [1.0], [2.0], [3.0], [4.0]])
    heavy = [1.0, 1.0, 1.0, 1.0, 10.0]
    one = [{"x": v} for v in values]
    assert RobustAggregation("median", trim=0.0).reduce(one, heavy)["x"][0] == 4.0
    assert RobustAggregation("median", trim=0.0).reduce(one, [1.0] * 5)["x"][0] == 2.0
    assert RobustAggregation("median", trim=0.2).reduce(one, heavy)["x"][0] == 2.0  # 4.0 is trimmed first
    assert RobustAggregation("median", trim=0.0).reduce(one, [1.0, 1.0, 0.0, 1.0, 1.0])["x"][0] == 2.0  # (1 + 3) / 2


def test_clipping_moves_each_client_to_within_clip_norm_of_the_median():
    rng = np.random.default_rng(3)
    values = rng.normal(size=(5, 4))
    values[4] += 100.0
    C = 0.5
    center = np.median(values, axis=0)
    deviation = values - center
    norms = np.linalg.norm(deviation, axis=1)
    clipped = center + deviation * np.minimum(1.0, C / norms)[:, None]
    w = rng.uniform(1, 2, size=5)
    out = RobustAggregation("trimmed_mean", trim=0.0, clip_norm=C).reduce(clients(values), w)
    np.testing.assert_allclose(flat(out), np.average(clipped, axis=0, weights=w), rtol=1e-13)
    assert np.linalg.norm(flat(out) - center) <= C
    # without clipping the outlier drags the mean far away
    plain = RobustAggregation("trimmed_mean", trim=0.0).reduce(clients(values), w)
    assert np.linalg.norm(flat(plain) - center) > 10


@pytest.mark.parametrize(
    "kwargs, error, word",
    [
        ({"method": "mean"}, ValueError, "method"),
        ({"trim": 0.5}, ValueError, "trim"),
        ({"trim": -0.1}, ValueError, "trim"),
        ({"trim": True}, TypeError, "trim"),
        ({"trim": "0.1"}, TypeError, "trim"),
        ({"clip_norm": 0.0}, ValueError, "clip_norm"),
        ({"clip_norm": float("inf")}, ValueError, "clip_norm"),
        ({"clip_norm": True}, TypeError, "clip_norm"),
    ],
)
def test_settings_are_validated(kwargs, error, word):
    with pytest.raises(error, match=word):
        RobustAggregation(**kwargs)


def test_trimmed_counts_clients():
    assert [RobustAggregation(trim=t).trimmed(10) for t in (0.0, 0.1, 0.29, 0.3, 0.49)] == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="positive int"):
        RobustAggregation().trimmed(0)


def test_reduce_validates_its_inputs():
    robust = RobustAggregation()
    good = [{"x": np.zeros(2)}, {"x": np.ones(2)}]
    with pytest.raises(ValueError, match="non-empty"):
        robust.reduce([], [])
    with pytest.raises(ValueError, match="expected names"):
        robust.reduce([{"x": np.zeros(2)}, {"y": np.zeros(2)}], [1, 1])
    with pytest.raises(ValueError, match="shape"):
        robust.reduce([{"x": np.zeros(2)}, {"x": np.zeros(3)}], [1, 1])
    with pytest.raises(ValueError, match="client 1's 'x' has NaN"):
        robust.reduce([{"x": np.zeros(2)}, {"x": np.array([0.0, np.inf])}], [1, 1])
    with pytest.raises(ValueError, match="complex"):
        robust.reduce([{"x": np.zeros(2)}, {"x": np.array([0.0, 1j])}], [1, 1])
    with pytest.raises(ValueError, match="2 weights"):
        robust.reduce(good, [1.0])
    for bad in ([1.0, -1.0], [0.0, 0.0], [1.0, np.nan]):
        with pytest.raises(ValueError, match="weights"):
            robust.reduce(good, bad)
    three = [{"x": np.zeros(1)}, {"x": np.ones(1)}, {"x": np.ones(1)}]  # only the trimmed client has weight
    with pytest.raises(ValueError, match="no client with positive weight"):
        RobustAggregation("trimmed_mean", trim=0.34).reduce(three, [1, 0, 0])
    with pytest.raises(ValueError, match="positive weight"):
        RobustAggregation("median", trim=0.34).reduce(three, [1, 0, 0])
    out = RobustAggregation("trimmed_mean", trim=0.0).reduce([{"x": np.zeros(1)}, {"x": np.ones(1)}], [1, 0])
    assert out["x"][0] == 0.0
