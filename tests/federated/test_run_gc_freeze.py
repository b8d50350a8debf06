"""A run freezes what its first round made out of the garbage collector's way, and unfreezes it when it ends (issue 46).

``engine.loop._LongLived``: from round 1 on the collector skips round 0's objects (``gc.freeze``); the run's values are
those of a run that never freezes; ``gc.get_freeze_count()`` is back to what it was after the run, also when the run
ends with an exception; a caller's own frozen objects are left frozen.
"""

import gc

import numpy as np
import pytest

from gpflow_fed.federated import LocalRuntime, run
from gpflow_fed.federated.engine import loop

from .algorithms.test_fsgp_batched import BATCHED, PLAIN, _dataset, _fsgp


class Stop(Exception):
    """Raised by a monitor to end a run mid-way."""


@pytest.fixture(autouse=True)
def _small_federations_freeze(monkeypatch):
    """These runs have 8 clients: freeze them as the loop freezes a federation of FREEZE_MIN_CLIENTS."""
    monkeypatch.setattr(loop, "FREEZE_MIN_CLIENTS", 1)


def _run(counts, stop_at=None):
    """A three-round batched FSGP run recording ``gc.get_freeze_count()`` after each round (raising at ``stop_at``)."""

    def monitor(r, **_):
        counts.append(gc.get_freeze_count())
        if r == stop_at:
            raise Stop(r)

    return run(_fsgp(), _dataset(), runtime=LocalRuntime(**BATCHED, protection=PLAIN), seed=2, monitor=monitor)


def _values(result):
    history = [{k: v for k, v in h.items() if k != "seconds"} for h in result.history]
    return history, {k: np.asarray(v) for k, v in result.state.params.items()}, result.ledger.entries


def test_rounds_after_the_first_run_frozen_with_the_same_result_and_the_count_restored(monkeypatch):
    assert gc.get_freeze_count() == 0, "this test needs a process with nothing frozen"
    counts = []
    frozen = _run(counts)
    assert counts[0] == 0 and all(c > 0 for c in counts[1:])  # round 0 unfrozen, rounds 1 and 2 frozen
    assert gc.get_freeze_count() == 0

    monkeypatch.setattr(loop._LongLived, "freeze", lambda self: None)  # the same run, never frozen
    plain_counts = []
    plain = _run(plain_counts)
    assert plain_counts == [0, 0, 0]
    (h1, p1, l1), (h2, p2, l2) = _values(frozen), _values(plain)
    assert h1 == h2 and l1 == l2
    for key, value in p2.items():
        np.testing.assert_array_equal(p1[key], value, err_msg=key)


def test_the_count_is_restored_when_a_round_raises():
    assert gc.get_freeze_count() == 0, "this test needs a process with nothing frozen"
    counts = []
    with pytest.raises(Stop):
        _run(counts, stop_at=1)
    assert counts == [0, counts[1]] and counts[1] > 0  # frozen when the exception left the run
    assert gc.get_freeze_count() == 0


def test_a_callers_frozen_objects_stay_frozen_and_the_run_freezes_nothing_more():
    """``gc.unfreeze`` would release every frozen object, the caller's too: a run that finds some freezes nothing (the
    count only falls, as frozen objects the run no longer holds are freed) and unfreezes nothing."""
    assert gc.get_freeze_count() == 0, "this test needs a process with nothing frozen"
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        counts = []
        _run(counts)
        assert len(counts) == 3 and all(0 < c <= before for c in counts)
        assert 0 < gc.get_freeze_count() <= before
    finally:
        gc.unfreeze()


def test_a_federation_below_the_threshold_freezes_nothing(monkeypatch):
    """Below ``FREEZE_MIN_CLIENTS`` a run never freezes (its collections are cheap, the one before freezing is not)."""
    monkeypatch.setattr(loop, "FREEZE_MIN_CLIENTS", len(_dataset().clients) + 1)
    counts = []
    _run(counts)
    assert counts == [0, 0, 0]
