"""A cohort's FedAvg replies checked together (issue 46): the same verdicts as one reply at a time."""

import numpy as np
import pytest

from gpflow_fed.federated.algorithms.fsgp import checks
from gpflow_fed.federated.algorithms.fsgp.checks import adam_displacement_bound, displacement_fault, displacement_faults
from gpflow_fed.federated.protocol.faults import FaultPolicy, screen
from gpflow_fed.federated.protocol.messages import Message
from gpflow_fed.federated.protocol.transport import Response

LR, STEPS, ROUND = 0.05, 3, 2


def _cohort(rng):
    broadcast = {"Z": rng.normal(size=(5, 2)), "variance": np.array(0.3), "empty": np.zeros((0, 2))}
    move = adam_displacement_bound(LR, STEPS, ROUND)
    replies = []
    for _ in range(40):
        replies.append({k: v + rng.uniform(-0.9, 0.9, size=np.shape(v)) * move for k, v in broadcast.items()})
    replies[3]["Z"] = replies[3]["Z"] + 2 * move  # beyond the box
    replies[7]["variance"] = np.array(np.nan)  # not a number: not judged a move (value_faults refuses it first)
    replies[11]["Z"] = np.zeros((4, 2))  # another shape: judged on its own
    del replies[13]["variance"]  # a missing name: not judged here
    replies[17]["variance"] = np.array(0.3 - 1.5 * move)
    replies[21]["Z"] = replies[21]["Z"].astype(np.float32)  # another dtype, the same numbers
    return broadcast, replies


@pytest.mark.parametrize("stack_bytes", [1 << 26, 48])  # 48 bytes: every chunk holds one reply
def test_the_cohort_check_gives_each_reply_its_own_verdict(monkeypatch, stack_bytes):
    monkeypatch.setattr(checks, "STACK_BYTES", stack_bytes)
    broadcast, replies = _cohort(np.random.default_rng(0))
    alone = [displacement_fault(r, broadcast, LR, STEPS, ROUND) for r in replies]
    together = displacement_faults(replies, broadcast, LR, STEPS, ROUND)
    assert together == alone
    assert [i for i, v in enumerate(together) if v is not None] == [3, 11, 17]
    assert "'Z' moved further" in together[3] and "'variance' moved further" in together[17]
    assert together[11] == "its 'Z' has shape (4, 2), not the broadcast's (5, 2)"  # was a broadcasting ValueError


def test_screening_asks_the_algorithm_once_for_the_whole_cohort():
    calls = []

    def verify(messages):
        calls.append([m.sender for m in messages])
        return ["no" if m.sender == "b" else None for m in messages]

    cohort = ["a", "b", "c"]
    responses = {c: Response(Message(c, 0, "train", {"x": np.ones(2)}, weight=1.0)) for c in cohort}
    good, excluded = screen(FaultPolicy(on_error="exclude"), 0, "train", cohort, responses, verify=verify)
    assert calls == [cohort] and good == ["a", "c"] and excluded == {"b": "no"}
