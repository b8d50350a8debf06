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
