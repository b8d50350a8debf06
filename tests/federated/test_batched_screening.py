"""The server screens a batched cohort's replies at once (issue 46, ``faults.value_faults``), with the same refusals.

FSGP's seven test clients (``tests/federated/algorithms/test_fsgp_batched.py``), every cohort batched, plain: after the
batched update, three clients' replies are spoiled (a NaN, an inf, a value beyond ``OVERFLOW_BOUND``) and one's metric
is NaN. Each is still refused and named with the per-reply reason, in every chunk of the stacked check, and only the
flagged replies are judged one by one.
"""

import math

import gpflow
import numpy as np
import pytest

from gpflow_fed.federated import ClientUpdateError, FaultPolicy, LocalRuntime, RunOptions, run
from gpflow_fed.federated.algorithms import FSGP
from gpflow_fed.federated.protocol import faults
from gpflow_fed.federated.protocol.messages import Message

from .algorithms.test_fsgp_batched import BATCHED, PLAIN, SIZES, _dataset, _Z

#: client → (payload or metric spoiled, its new value, the reason the server gives)
SPOILED = {
    "client_2": ("inducing_variable.Z", np.nan, "payload 'inducing_variable.Z' has NaN or inf values"),
    "client_4": ("kernel.variance", -np.inf, "payload 'kernel.variance' has NaN or inf values"),
    "client_5": ("inducing_variable.Z", 1e151, "payload 'inducing_variable.Z' has values beyond ±1e+150"),
    "client_6": ("metric", np.nan, "a metric is NaN or inf"),
}


class SpoiledBatch(FSGP):
    """FSGP whose batched training replies of :data:`SPOILED` clients are spoiled after the batch computed them."""

    def client_updates(self, clients, broadcast, memory_budget):
        self.batches = getattr(self, "batches", 0) + 1
        out = super().client_updates(clients, broadcast, memory_budget)
        if broadcast.phase != "train":
            return out
        for k, client in enumerate(clients):
            if client.id not in SPOILED:
                continue
            name, value, _ = SPOILED[client.id]
            reply = out[k]
            arrays, metrics = dict(reply.arrays), dict(reply.metrics)
            if name == "metric":
                metrics = {key: value for key in metrics} or {"local_bound": value}
            else:
                spoiled = np.array(arrays[name], dtype=np.float64)
                spoiled.flat[-1] = value  # one entry: the stacked check must see it in its row
                arrays[name] = spoiled
            out[k] = self.reply(client, broadcast, arrays, reply.weight, metrics)
        return out


def _algorithm():
    return SpoiledBatch(gpflow.kernels.SquaredExponential(lengthscales=[1.0, 1.2]), _Z(), 0.1, rounds=2)


def _judged_alone(monkeypatch):
    """Count the replies ``faults.value_fault`` judges one by one (after the stacked check flagged them)."""
    calls = []
    original = faults.value_fault

    def counted(reply):
        calls.append(reply.sender)
        return original(reply)

    monkeypatch.setattr(faults, "value_fault", counted)
    return calls


@pytest.mark.parametrize("stack_bytes", [faults.STACK_BYTES, 64, 200])
def test_a_non_finite_reply_in_a_batched_cohort_is_refused_and_named(monkeypatch, stack_bytes):
    """Excluded with the per-reply reasons in both rounds (the stack in one chunk, one row a chunk: Z is 4 × 2 float64,
    64 bytes, or three rows a chunk); the others are aggregated; only the four flagged replies of each round are
    judged one by one (a per-reply screen would judge all seven)."""
    monkeypatch.setattr(faults, "STACK_BYTES", stack_bytes)
    alone = _judged_alone(monkeypatch)
    runtime = LocalRuntime(**BATCHED, protection=PLAIN, options=RunOptions(faults=FaultPolicy(on_error="exclude")))
    result = run(_algorithm(), _dataset(), runtime=runtime, seed=2)
    assert result.algorithm.batches >= 2  # the updates were computed as a batch
    for entry in result.history:
        assert set(entry["excluded"]) == set(SPOILED)
        for cid, (_, _, reason) in SPOILED.items():
            assert entry["excluded"][cid].startswith(reason)
        assert entry["clients"] == len(SIZES) - len(SPOILED)
    assert sorted(alone) == sorted(list(SPOILED) * len(result.history))
    assert all(math.isfinite(float(np.max(np.abs(v)))) for v in result.state.params.values())


def test_the_default_policy_raises_naming_the_first_spoiled_client():
    runtime = LocalRuntime(**BATCHED, protection=PLAIN)
    with pytest.raises(ClientUpdateError, match="client 'client_2' failed in round 0, phase 'train'") as caught:
        run(_algorithm(), _dataset(), runtime=runtime, seed=2)
    assert caught.value.client_id == "client_2" and "NaN or inf" in str(caught.value.cause)


def test_value_faults_equals_value_fault_reply_by_reply(monkeypatch):
    """Replies of two layouts, NaN and inf in different rows and chunks, a complex payload, an empty one, integers:
    ``value_faults`` gives each reply exactly ``value_fault``'s verdict."""
    rng = np.random.default_rng(0)
    replies = []
    for k in range(40):
        arrays = {"w": rng.normal(size=(3, 2)), "n": np.arange(3), "e": np.zeros((0, 2))}
        if k % 2:
            arrays["c"] = np.array([1 + 2j, 3j])
        if k % 7 == 3:
            arrays["w"][k % 3, 1] = [np.nan, np.inf, -np.inf][k % 3]
        if k % 11 == 5:
            arrays["c"] = np.array([1j, complex(np.inf, 0)])
        if k % 13 == 6:
            arrays["w"][0, 0] = -2e150
        metrics = {"m": float("nan") if k % 17 == 8 else 1.0}
        replies.append(Message(f"c{k}", 0, "train", arrays, weight=1.0, metrics=metrics))
    for stack_bytes in (faults.STACK_BYTES, 48, 100):
        monkeypatch.setattr(faults, "STACK_BYTES", stack_bytes)
        found = faults.value_faults(replies)
        assert found == [faults.value_fault(r) for r in replies]
        assert sum(f is not None for f in found) >= 10
