"""FSGP (FedAvg) with 20 % faulty clients in every round: excluded with a logged reason, and the final model
is as good as the fault-free run's (issue 7, "Faults and recovery")."""

import logging

import gpflow
import numpy as np
import pytest

from gpflow_fed.data import FederatedDataset, fsgp_synthetic_1
from gpflow_fed.data.partition import iid_partition
from gpflow_fed.federated import RunOptions, Protection, FaultPolicy, run
from gpflow_fed.federated.algorithms import FSGP, initial_inducing_inputs

K, FAULTY, ROUNDS = 10, 2, 12  # 20 % of the clients fail in every training round
KINDS = ("raise", "nan", "shape")
REASONS = {"raise": "raised RuntimeError: simulated crash", "nan": "NaN or inf", "shape": "payload shapes differ"}


class FaultyFSGP(FSGP):
    """FSGP whose clients fail in a seeded random 20 % of the clients of every training round.

    A faulty client either crashes before doing any work, or finishes its update and sends a payload with NaN
    inducing inputs, or one with a wrongly shaped kernel variance. ``injected[(round, client)]`` records each.
    """

    def __init__(self, *args, fault_seed=0, **kwargs):
        super().__init__(*args, **kwargs)
        self.fault_seed = fault_seed
        self.injected = {}

    def _fault(self, round, client_id):
        rng = np.random.default_rng([self.fault_seed, round])
        faulty = rng.choice(K, size=FAULTY, replace=False)
        kinds = rng.choice(len(KINDS), size=FAULTY)
        by_client = {f"client_{k}": KINDS[i] for k, i in zip(faulty, kinds)}
        return by_client.get(client_id)

    def client_update(self, client, broadcast):
        kind = self._fault(broadcast.round, client.id) if broadcast.phase == "train" else None
        if kind is not None:
            self.injected[(broadcast.round, client.id)] = kind
        if kind == "raise":
            raise RuntimeError("simulated crash")
        reply = super().client_update(client, broadcast)
        if kind is None:
            return reply
        arrays = dict(reply.arrays)
        if kind == "nan":
            arrays["inducing_variable.Z"] = np.full_like(arrays["inducing_variable.Z"], np.nan)
        else:
            arrays["kernel.variance"] = np.zeros(2)
        return self.reply(client, broadcast, arrays, reply.weight, reply.metrics)


@pytest.fixture(scope="module")
def dataset():
    data = fsgp_synthetic_1(seed=0, num_train=300, num_test=100)
    parts = iid_partition(len(data.X_train), K, seed=0)
    return FederatedDataset(
        clients=[(data.X_train[p], data.Y_train[p]) for p in parts], test=(data.X_test, data.Y_test), name="fsgp-1"
    )


def _algorithm(cls, dataset):
    Z = initial_inducing_inputs(np.concatenate([X for X, _ in dataset.clients]), 15, seed=0)
    return cls(gpflow.kernels.SquaredExponential(), Z, 0.5, rounds=ROUNDS, local_steps=3, learning_rate=0.1)


def test_twenty_percent_faulty_clients_are_excluded_and_rmse_stays_within_five_percent(dataset, caplog):
    plain = Protection(secure_aggregation=False)  # the ledger below reads each client's payload
    clean = run(_algorithm(FSGP, dataset), dataset, protection=plain, seed=0)
    faulty_algorithm = _algorithm(FaultyFSGP, dataset)
    options = RunOptions(faults=FaultPolicy(on_error="exclude", min_clients=K - FAULTY))
    with caplog.at_level(logging.WARNING, logger="gpflow_fed.federated"):
        faulty = run(faulty_algorithm, dataset, options=options, protection=plain, seed=0)

    # the faults were injected (every kind, 20 % of the clients in every round) ...
    injected = faulty.algorithm.injected  # recorded by the run's own bound copy
    assert len(injected) == FAULTY * ROUNDS and set(injected.values()) == set(KINDS)
    # ... and exactly those clients were excluded, each with the reason of its fault, and logged
    for entry in faulty.history:
        r = entry["round"]
        expected = {cid: kind for (rr, cid), kind in injected.items() if rr == r}
        assert set(entry["excluded"]) == set(expected) and entry["clients"] == K - FAULTY
        for cid, kind in expected.items():
            assert REASONS[kind] in entry["excluded"][cid]
            assert any(f"round {r}," in m and cid in m and REASONS[kind] in m for m in caplog.messages)
        assert len(faulty.ledger.select(direction="up", round=r, phase="train")) == K - FAULTY + (
            sum(kind != "raise" for kind in expected.values())
        )  # a crashed client sends nothing; the others' bad payloads reach the ledger but not the sum
    assert "excluded" not in clean.history[0]

    # the exclusions changed the training (so the comparison below is not trivially equal) ...
    assert not np.allclose(faulty.state.params["inducing_variable.Z"], clean.state.params["inducing_variable.Z"])
    # ... the fault-free run learned something, and the faulty run ends within 5 % of its test RMSE
    initial = run(
        FSGP(
            gpflow.kernels.SquaredExponential(),
            _algorithm(FSGP, dataset).inducing_variable.Z.numpy(),
            0.5,
            rounds=0,
            local_steps=3,
            learning_rate=0.1,
        ),
        dataset,
        protection=plain,
        seed=0,
    )
    assert clean.metrics["test_rmse"] < 0.9 * initial.metrics["test_rmse"]
    assert faulty.metrics["test_rmse"] == pytest.approx(clean.metrics["test_rmse"], rel=0.05)
    assert np.isfinite(faulty.metrics["test_nlpd"])
