"""Attacks on secure aggregation through the runtimes: a cohort of one, and a server that knows the seed."""

import hashlib

import gpflow
import numpy as np
import pytest
import tensorflow as tf

from gpflow_fed.data import FederatedDataset
from gpflow_fed.federated import (
    Algorithm,
    DistributeRuntime,
    FaultPolicy,
    LocalRuntime,
    Protection,
    RoundFailedError,
    RunOptions,
    run,
)
from gpflow_fed.federated.protection.masking import SecureAggregation
from gpflow_fed.federated.protection.wire import FixedPoint


class Sum(Algorithm):
    """Sums each client's Y (a 'sum' phase); ``bad`` clients raise."""

    name = "sum"

    def __init__(self, rounds, client_fraction=1.0, bad=()):
        super().__init__(rounds, client_fraction)
        self.bad = bad

    def initial_state(self, info):
        return {"sums": []}

    def aggregation(self, phase):
        return "sum"

    def broadcast(self, state, round, phase):
        return {}

    def client_update(self, client, broadcast):
        if client.id in self.bad:
            raise RuntimeError("offline")
        return self.reply(client, broadcast, {"sum_y": np.sum(client.data[1], axis=0)})

    def server_update(self, state, aggregate):
        return {"sums": state["sums"] + [np.array(aggregate["sum_y"])]}

    def result(self, state):
        return gpflow.models.GPR((np.zeros((1, 1)), np.zeros((1, 1))), gpflow.kernels.Constant())


def _dataset(num_clients):
    rng = np.random.default_rng(0)
    return FederatedDataset([(rng.normal(size=(4, 1)), rng.normal(size=(4, 1))) for _ in range(num_clients)])


@pytest.mark.parametrize(
    "make_runtime",
    [
        lambda protection, **options: LocalRuntime(
            options=RunOptions(keep_payloads=True, **options), protection=protection
        ),
        lambda protection, **options: DistributeRuntime(
            tf.distribute.OneDeviceStrategy("/cpu:0"),
            options=RunOptions(keep_payloads=True, **options),
            protection=protection,
        ),
    ],
    ids=["local", "distribute"],
)
def test_a_cohort_of_one_is_refused_before_anything_is_sent(make_runtime):
    """ρ = 0.3 of K = 3 asks one client: its plain encoding would be the 'sum'."""
    runtime = make_runtime(Protection(secure_aggregation=True))
    with pytest.raises(RoundFailedError, match="min_cohort=2"):
        run(Sum(1, client_fraction=0.3), _dataset(3), runtime=runtime, seed=0)
    # exclusions that leave one client are refused the same way
    runtime = make_runtime(Protection(secure_aggregation=True), faults=FaultPolicy(on_error="exclude"))
    with pytest.raises(RoundFailedError, match="min_cohort"):
        run(Sum(1, bad=("client_1",)), _dataset(2), runtime=runtime, seed=0)
    # and the threshold is the user's to raise
    runtime = make_runtime(Protection(secure_aggregation=SecureAggregation(min_cohort=4)))
    with pytest.raises(RoundFailedError, match="min_cohort=4"):
        run(Sum(1), _dataset(3), runtime=runtime, seed=0)


def _old_pad(seed, context, a, b, size):
    """How the pads were derived from the run seed before key agreement (the attacker has the old code)."""
    text = "\x1f".join([str(seed), *(str(c) for c in context), *sorted((a, b))])
    words = np.frombuffer(hashlib.sha256(text.encode()).digest(), np.uint32)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(w) for w in words])))
    return rng.bit_generator.random_raw(size).astype(np.uint64)


def test_server_that_knows_the_seed_cannot_unmask_a_client():
    dataset = _dataset(4)
    result = run(
        Sum(1),
        dataset,
        runtime=LocalRuntime(options=RunOptions(keep_payloads=True), protection=Protection(secure_aggregation=True)),
        seed=0,
    )
    codec = SecureAggregation()
    target = next(m for m in result.ledger.messages if m.sender == "client_0" and m.phase.endswith("/masked_input"))
    truth = FixedPoint(codec.fractional_bits, 4).encode(np.sum(dataset.clients[0][1], axis=0))[0]
    cohort = [f"client_{k}" for k in range(4)]
    masked = target.arrays["a0"]  # the client's masked codes, one flat vector
    assert not np.isin(truth, masked).any()
    for seed in range(50):  # every pad the seed could give, with every sign
        pads = [_old_pad(seed, ("train", 0, "train"), "client_0", other, masked.size) for other in cohort[1:]]
        for signs in np.ndindex(*(2,) * len(pads)):
            guess = masked.copy()
            with np.errstate(over="ignore"):
                for sign, pad in zip(signs, pads):
                    guess = guess - pad if sign else guess + pad
            assert not np.isin(truth, guess).any()
    # the sum is still exact: only the total is revealed
    np.testing.assert_allclose(result.state["sums"][0], sum(np.sum(Y, axis=0) for _, Y in dataset.clients), atol=1e-8)
