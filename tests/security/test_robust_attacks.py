"""Poisoning a "mean" phase, written as a malicious client; each asserts that RobustAggregation holds.

The honest clients send FSGP-like parameters (three arrays); 1 to 3 of 10 clients send them +30 or +1e6
on every coordinate and claim a weight of 1e12. Controls show the attacks move the plain weighted mean, and
that they succeed once more clients are malicious than ``trim`` allows (the documented limit).
"""

import numpy as np
import pytest

from gpflow_fed.federated.protection.robust import RobustAggregation

K = 10


def honest_clients(seed=0):
    rng = np.random.default_rng(seed)
    arrays = [
        {"Z": rng.normal(size=(5, 2)), "q_mu": rng.normal(size=(5, 1)), "log_variance": rng.normal(size=())}
        for _ in range(K)
    ]
    sizes = rng.integers(50, 150, size=K).astype(float)
    return arrays, sizes


def poison(arrays, sizes, bad, shift, weight=1e12):
    arrays, sizes = list(arrays), np.array(sizes)
    for k in bad:
        arrays[k] = {n: v + shift for n, v in arrays[k].items()}
        sizes[k] = weight
    return arrays, sizes


def within_honest_range(result, honest):
    for name, value in result.items():
        stack = np.stack([h[name] for h in honest])
        if np.any(value < stack.min(axis=0)) or np.any(value > stack.max(axis=0)):
            return False
    return True


def plain_mean(arrays, weights):
    return {n: np.average(np.stack([a[n] for a in arrays]), axis=0, weights=weights) for n in arrays[0]}


@pytest.mark.parametrize("method", ["median", "trimmed_mean"])
@pytest.mark.parametrize("num_bad", [1, 2, 3])
@pytest.mark.parametrize("shift", [30.0, 1e6])
@pytest.mark.parametrize("clip_norm", [None, 1.0])
def test_poisoned_update_with_inflated_weight_stays_in_the_honest_range(method, num_bad, shift, clip_norm):
    arrays, sizes = honest_clients(num_bad)
    bad = list(range(1, 1 + num_bad))
    honest = [a for k, a in enumerate(arrays) if k not in bad]
    poisoned, weights = poison(arrays, sizes, bad, shift)
    assert not within_honest_range(plain_mean(poisoned, weights), honest)  # control: the attack works on a mean
    result = RobustAggregation(method, trim=0.3, clip_norm=clip_norm).reduce(poisoned, weights)
    assert within_honest_range(result, honest)
    assert result["Z"].shape == (5, 2) and result["log_variance"].shape == ()


@pytest.mark.parametrize("method", ["median", "trimmed_mean"])
def test_control_more_attackers_than_trim_break_through(method):
    """trim = 0.1 tolerates one malicious client of 10; two with inflated weights move the result."""
    arrays, sizes = honest_clients(7)
    robust = RobustAggregation(method, trim=0.1)
    assert within_honest_range(robust.reduce(*poison(arrays, sizes, [0], 1e6)), arrays[1:])
    assert not within_honest_range(robust.reduce(*poison(arrays, sizes, [0, 1], 1e6)), arrays[2:])


def test_median_resists_a_minority_with_honest_weights_without_trimming():
    """With weights the server registered (not claimed), the median needs no trim for 4 of 10 attackers."""
    arrays, _ = honest_clients(3)
    bad = [0, 2, 4, 6]
    honest = [a for k, a in enumerate(arrays) if k not in bad]
    poisoned, _ = poison(arrays, np.ones(K), bad, 1e6, weight=1.0)
    assert within_honest_range(RobustAggregation("median", trim=0.0).reduce(poisoned, np.ones(K)), honest)


def test_clipping_bounds_the_influence_of_an_untrimmed_attacker():
    """Without trimming, clipping to C keeps the result within C of the coordinate-wise median."""
    arrays, sizes = honest_clients(5)
    poisoned, weights = poison(arrays, sizes, [0], 1e6)
    center = np.median(np.stack([np.concatenate([np.ravel(a[n]) for n in sorted(a)]) for a in poisoned]), axis=0)
    result = RobustAggregation("trimmed_mean", trim=0.0, clip_norm=0.5).reduce(poisoned, weights)
    flat = np.concatenate([np.ravel(result[n]) for n in sorted(result)])
    assert np.linalg.norm(flat - center) <= 0.5 + 1e-12
    unclipped = RobustAggregation("trimmed_mean", trim=0.0).reduce(poisoned, weights)
    assert np.max(np.abs(unclipped["Z"])) > 1e5  # control
