"""Issue 43 (twelfth round): FSGP's exact-mode ``"gradient"`` answer is exactly linear in the server's adjoints.

A fresh attacker asked ``"statistics"`` and ``"gradient"(θ_0, a)`` over all clients, then, in round 1, ``"gradient"``
at the same θ_0 with ``2a`` over the clients without one, and had that client's gradient ``(∂S_k/∂w)ᵀ a`` as
``G_1 − G_2/2`` to 1e-10 (the same flaw as FedBNR's ``"weights"`` in ``A⁻¹``, eleventh round). A client now answers
``"gradient"`` once per parameters (``FSGP._check_gradient_once``, recorded in its own ``client.state``): other
adjoints at parameters it answered before are refused, the same again is a retry. The honest parties are the
package's endpoint and encoder under the default policy (the eleventh round's federation).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gpflow_fed.federated import run
from gpflow_fed.federated.algorithms.fsgp.algorithm import GRADIENT_ANSWERED
from gpflow_fed.federated.engine.options import RunOptions
from gpflow_fed.federated.protection.request import Protection
from gpflow_fed.federated.runtimes.local import LocalRuntime
from tests.security.test_eleventh_attack_round import REFUSED, _dataset, _federation, _fsgp


def _round_zero(batched: bool):
    algorithm, owner, runtime, ids = _federation(_fsgp(), Protection())
    runtime.batched, runtime.min_batch = batched, 2
    state = algorithm.initial_state(owner.info)
    stats, _, _ = owner.run(state, 0, "statistics", ids, "train")
    _, first, _ = owner.run(stats, 0, "gradient", ids, "train")
    return algorithm, owner, runtime, ids, stats, first


@pytest.mark.parametrize("batched", [False, True])
def test_fsgp_gradient_with_scaled_adjoints_over_the_others_is_refused(batched):
    """The attack (``/tmp/attack43i/fsgp_adjoint_linear.py``): every party refuses the doubled adjoints at θ_0, in
    the per-client and the batched path (before the fix both sums were answered: the victim's gradient to 1e-10)."""
    _, owner, _, ids, stats, _ = _round_zero(batched)
    doubled = dataclasses.replace(stats, adjoints={k: 2 * v for k, v in stats.adjoints.items()})
    with pytest.raises(REFUSED, match="refused"):
        owner.run(doubled, 1, "gradient", ids[:-1], "train")


@pytest.mark.usefixtures("nearest_rounding")  # sums compared exactly: rounding to nearest
def test_control_the_same_adjoints_again_are_answered_with_the_same_sum():
    """A retry (the same parameters and adjoints, the same cohort, a later round) is answered: nothing new."""
    _, owner, runtime, ids, stats, first = _round_zero(False)
    _, again, excluded = owner.run(stats, 1, "gradient", ids, "train")
    assert not excluded
    for name in first.arrays:
        np.testing.assert_allclose(again[name], first[name], rtol=0, atol=1e-9)
    assert all(len(e.client.state[GRADIENT_ANSWERED]) == 1 for e in runtime.endpoints.values())


def test_an_honest_fsgp_exact_run_answers_one_gradient_per_round():
    """An honest run asks each round's gradient at that round's parameters: never refused, one record a round."""
    runtime = LocalRuntime(options=RunOptions(eval_every=2))
    result = run(_fsgp(rounds=4), _dataset(test=True), runtime=runtime)
    assert len(result.history) == 4 and np.isfinite(result.metrics["test_rmse"])
