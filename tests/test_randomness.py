"""Protective randomness comes from the OS (secrets), never from numpy's global state or a run seed."""

import numpy as np
import pytest

from gpflow_fed import randomness
from gpflow_fed.randomness import new_run_id, protective_rng, protective_seed_sequence


def test_seed_sequence_entropy_comes_from_secrets(monkeypatch):
    calls = []

    def fake_randbits(bits):
        calls.append(bits)
        return 12345

    monkeypatch.setattr(randomness.secrets, "randbits", fake_randbits)
    assert protective_seed_sequence().entropy == 12345
    assert calls == [128]


def test_default_draws_differ_between_calls_even_after_seeding_numpy():
    np.random.seed(0)
    first = protective_seed_sequence().entropy
    np.random.seed(0)
    second = protective_seed_sequence().entropy
    assert first != second
    assert 0 <= first < 2**128
    assert not np.array_equal(protective_rng().normal(size=8), protective_rng().normal(size=8))


def test_insecure_seed_is_reproducible_and_distinct():
    assert np.array_equal(protective_rng(7).normal(size=5), protective_rng(7).normal(size=5))
    assert not np.array_equal(protective_rng(7).normal(size=5), protective_rng(8).normal(size=5))
    assert protective_seed_sequence(np.int64(3)).entropy == 3


@pytest.mark.parametrize("bad, error", [(True, TypeError), (1.5, TypeError), ("0", TypeError), (-1, ValueError)])
def test_insecure_seed_is_validated(bad, error):
    with pytest.raises(error, match="insecure_seed"):
        protective_seed_sequence(bad)
    with pytest.raises(error, match="insecure_seed"):
        protective_rng(bad)


def test_run_ids_are_16_fresh_bytes():
    ids = {new_run_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(isinstance(i, bytes) and len(i) == 16 for i in ids)
