"""The pace of a Flower run (``flower.pace``): exchanges per job and round read off its stages, the server's progress
line; and the ServerApp's pull loop (``flower.transport.exchange``), which waits for a stage's last reply."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Dict, List

import pytest

pytest.importorskip("flwr")

from gpflow_fed.federated.runtimes.flower.pace import expected_exchanges, job_shape, round_line  # noqa: E402
from gpflow_fed.federated.runtimes.flower.transport import exchange  # noqa: E402

PROTOCOL = ["masked_input", "consistency", "unmask"]


def _groups(purpose: str, rounds: int, phases: List[str], setup: bool) -> List[str]:
    """Groups as the transport names them: ``purpose/round/phase/update``, ``purpose/round/phase/secagg/s/s``."""
    stages = ("advertise", "share", "store")
    groups = [f"{purpose}/0/{phases[0]}/secagg/{s}/{s}" for s in stages] if setup else []
    for r in range(rounds):
        for p in phases:
            groups += [f"{purpose}/{r}/{p}/update"] + [f"{purpose}/{r}/{p}/secagg/{s}/{s}" for s in PROTOCOL]
    return groups


def test_a_jobs_shape_and_its_expected_exchanges():
    moments = _groups("final", 1, ["magnitudes", "moments"], setup=True)
    assert job_shape(moments) == (3, 4.0) and job_shape([]) == (0, 1.0)
    assert job_shape(["train/0/train/update", "train/1/train/update"]) == (0, 1.0)  # plain sums: one stage each
    # R = 5 rounds of one phase and one final phase, at the moments' shape: 3 + (5 + 1) × 4
    assert expected_exchanges([1] * 5, 1, 3, 4.0) == 27


def test_a_rounds_progress_line_says_what_is_left():
    first = _groups("train", 1, ["train"], setup=True)  # round 1 holds the set-up
    line = round_line(0, 10, 4, first, [2.0] * len(first), final_phases=1)
    # 9 rounds left of 4 exchanges and 1 final phase of 4: 40 exchanges of 2 s
    assert line == "round 1/10: 4 clients, 7 exchanges, 14.0 s (2.0 s each); about 1.3 min left (40 exchanges)"
    assert round_line(9, 10, 4, [], [], 1) == "round 10/10: 4 clients, 0 exchanges, 0.0 s"


class _Grid:
    """A grid double whose replies arrive on the given pull (``late``: {message id: pulls before it answers})."""

    def __init__(self, late: Dict[str, int]) -> None:
        self.late = dict(late)
        self.pulls = 0

    def push_messages(self, messages: List[str]) -> List[str]:
        return [m if m != "lost" else "" for m in messages]  # a message not pushed has no id

    def pull_messages(self, ids: set) -> List[SimpleNamespace]:
        self.pulls += 1
        ready = [m for m in sorted(ids) if self.late[m] < self.pulls]
        return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=m)) for m in ready]


def test_the_pull_loop_waits_for_the_last_reply_or_the_timeout():
    grid = _Grid({"a": 0, "b": 3})
    started = time.perf_counter()
    replies = exchange(grid, ["a", "b"], poll=0.01)  # type: ignore[arg-type]  # the double's messages are ids
    assert [r.metadata.reply_to_message_id for r in replies] == ["a", "b"] and grid.pulls == 4
    assert time.perf_counter() - started < 1.0  # 0.01 s between pulls, not Flower's 3 s
    grid = _Grid({"a": 0, "b": 10**6, "lost": 0})
    replies = exchange(grid, ["a", "b", "lost"], timeout=0.2, poll=0.05)  # type: ignore[arg-type]
    assert [r.metadata.reply_to_message_id for r in replies] == ["a"]  # b never answered; "lost" was never pushed
    with pytest.raises(ValueError, match="poll"):
        exchange(grid, [], poll=0)  # type: ignore[arg-type]
