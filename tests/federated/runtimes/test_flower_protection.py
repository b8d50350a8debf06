"""Secure aggregation and differential privacy on the Flower runtime: the same protocol as every runtime.

Checked against LocalRuntime: results must be bit-for-bit equal. Also: the ledger (only masked vectors and
public keys leave a client), faults screened before masking, each party's own policy (from its node config) refusing a
plain request, and the deployment path with restartable ClientApps and real SuperNodes.
"""

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import Context, RecordDict  # noqa: E402

from gpflow_fed.federated import (  # noqa: E402
    ClientPolicy,
    ClientUpdateError,
    DifferentialPrivacy,
    FaultPolicy,
    Protection,
    RoundFailedError,
    RunOptions,
    SecureAggregation,
    run,
)
from gpflow_fed.federated.runtimes.flower.runtime import FlowerRuntime  # noqa: E402
from gpflow_fed.federated.protection.wire import FixedPoint  # noqa: E402

from tests.federated.helpers import FACTORY, Faulty, FederatedMean, flower_dataset as fsgp_dataset, fsgp  # noqa: E402
from tests.federated.runtimes.flower_helpers import loopback as _loopback, task_identity  # noqa: E402,F401

#: runs and runtimes compared bit for bit: the fixed point rounds to nearest (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("nearest_rounding")

SECURE = Protection(secure_aggregation=True)


@pytest.mark.parametrize(
    "protection",
    [
        Protection(),
        SECURE,
        Protection(
            secure_aggregation=SecureAggregation(20, min_cohort=3, degree=4),
            differential_privacy=DifferentialPrivacy(1.5, 2.0, delta=1e-6, weight_bound=3.0, phases=("predict",)),
        ),
        Protection(differential_privacy=DifferentialPrivacy(0.8, 1.0, accountant="pld")),
    ],
)
def test_protection_survives_the_run_config(protection):
    config = protection.to_config()
    assert all(isinstance(v, (bool, int, float, str)) for v in config.values())  # Flower run-config values
    back = Protection.from_config(config)
    assert (back.secure, back.dp) == (protection.secure, protection.dp)


def test_an_insecure_noise_seed_never_travels_in_a_run_config():
    dp = DifferentialPrivacy(1.0, 1.0, insecure_noise_seed=1234)
    config = Protection(differential_privacy=dp).to_config()
    assert not any("seed" in key for key in config)
    assert Protection.from_config({**config, "dp-insecure-noise-seed": 1234}).dp.insecure_noise_seed is None


def _assert_same_predictions(a, b, X):
    for ours, ref in zip(a.model.predict_f(X), b.model.predict_f(X)):
        np.testing.assert_array_equal(ours.numpy(), ref.numpy())


@pytest.mark.parametrize("mode", ["fedavg", "exact"])
def test_secure_flower_equals_local_bit_for_bit(mode):
    ds = fsgp_dataset(sizes=(20, 25, 30))
    build = lambda: fsgp({"rounds": 2, "local-steps": 3})  # noqa: E731
    local_alg, flower_alg = build(), build()
    local_alg.mode = flower_alg.mode = mode
    local = run(local_alg, ds, protection=SECURE, seed=1)
    flower = run(
        flower_alg, ds, runtime=FlowerRuntime(), options=RunOptions(keep_payloads=True), protection=SECURE, seed=1
    )
    _assert_same_predictions(flower, local, ds.test[0])
    # what left the clients: the protocol's messages only (keys, encrypted shares, masked vectors, unmasking seeds)
    up = flower.ledger.select(direction="up")
    assert up and all("/secagg/" in e.phase for e in up)
    stages = {e.phase.split("/secagg/")[-1] for e in up}
    assert stages == {"advertise", "share", "store", "masked_input", "consistency", "unmask"}


def test_the_server_sees_neither_payloads_nor_their_encodings(dataset):  # noqa: F811
    options = RunOptions(keep_payloads=True)
    flower = run(FederatedMean(2), dataset, runtime=FlowerRuntime(), options=options, protection=SECURE, seed=0)
    local = run(FederatedMean(2), dataset, protection=SECURE, seed=0)
    plain = run(FederatedMean(2), dataset, seed=0)
    assert flower.model.mean == local.model.mean == pytest.approx(plain.model.mean, rel=1e-9)
    wire = b"".join(a.tobytes() for m in flower.ledger.messages if m.sender != "server" for a in m.arrays.values())
    codec = SecureAggregation()
    for k, (_, Y) in enumerate(dataset.clients):
        for secret in (Y.sum(0), np.array([float(len(Y))])):
            assert secret.tobytes() not in wire
            assert FixedPoint(codec.fractional_bits, 4).encode(secret)[0].tobytes() not in wire
    masked = [m for m in flower.ledger.messages if m.sender != "server" and m.phase.endswith("/masked_input")]
    assert len(masked) == 2 * dataset.num_clients
    assert len({m.arrays["a0"].tobytes() for m in masked}) == len(masked)


@pytest.mark.parametrize("secure", [False, True])
def test_differential_privacy_on_flower_equals_local_runtime(dataset, secure):  # noqa: F811
    dp = DifferentialPrivacy(noise_multiplier=1.2, clip_norm=5.0, weight_bound=10.0, insecure_noise_seed=5)
    protection = Protection(secure_aggregation=secure, differential_privacy=dp)
    local = run(FederatedMean(3), dataset, protection=protection, seed=4)
    options = RunOptions(keep_payloads=True)
    flower = run(FederatedMean(3), dataset, runtime=FlowerRuntime(), options=options, protection=protection, seed=4)
    assert flower.model.mean == local.model.mean
    assert flower.privacy == local.privacy and flower.privacy["epsilon"] > 0
    assert [h["epsilon"] for h in flower.history] == [h["epsilon"] for h in local.history]
    if not secure:  # the server sees each client's clipped payload, of norm at most C
        for m in flower.ledger.messages:
            if m.sender != "server":
                assert np.sqrt(sum(np.sum(a**2) for a in m.arrays.values())) <= dp.clip_norm + 1e-12


def test_dp_alone_runs_fsgp_on_flower(dataset):  # noqa: F811
    """DP caps each client's weight; the server checks the capped weight, not N_k (issue 32, finding 4)."""
    ds = fsgp_dataset(sizes=(20, 25, 30))
    dp = DifferentialPrivacy(noise_multiplier=0.5, clip_norm=50.0, weight_bound=1.0, insecure_noise_seed=1)
    protection = Protection(differential_privacy=dp)
    local = run(fsgp({"rounds": 2}), ds, protection=protection, seed=2)
    flower = run(fsgp({"rounds": 2}), ds, runtime=FlowerRuntime(), protection=protection, seed=2)
    _assert_same_predictions(flower, local, ds.test[0])


@pytest.mark.parametrize(
    "kind, reason",
    [
        ("raise", "answers no protected exchange again in this run"),  # one generic refusal, then none
        ("shape", "payload shapes differ"),
    ],
)
def test_faulty_clients_are_excluded_before_masking(dataset, kind, reason):  # noqa: F811
    options = RunOptions(faults=FaultPolicy(on_error="exclude"))
    local = run(Faulty(2, kind), dataset, options=options, protection=SECURE, seed=0)
    flower = run(Faulty(2, kind), dataset, runtime=FlowerRuntime(), options=options, protection=SECURE, seed=0)
    assert flower.model.mean == local.model.mean
    for entry in flower.history:
        assert list(entry["excluded"]) == ["client_1"] and reason in entry["excluded"]["client_1"]
        assert entry["clients"] == 3


def test_secure_phase_needs_two_clients(dataset):  # noqa: F811
    one = type(dataset)(clients=dataset.clients[:1], test=dataset.test)
    with pytest.raises(RoundFailedError, match="min_cohort=2.*to train on one party's data alone"):
        run(FederatedMean(1), one, runtime=FlowerRuntime(), protection=SECURE, seed=0)
    # (a "collect" phase is sent as it is under secure aggregation: test_secure_aggregation.py)


def test_a_party_whose_policy_requires_masking_refuses_a_plain_request(dataset):  # noqa: F811
    """The run config (the server's request) asks for plain sums; every party's node config requires secure
    aggregation, so each refuses and nothing of its payload leaves it."""
    runtime = FlowerRuntime(client_policy=ClientPolicy(secure_aggregation=True))
    with pytest.raises(ClientUpdateError, match="requires secure aggregation"):
        run(
            FederatedMean(1),
            dataset,
            runtime=runtime,
            options=RunOptions(keep_payloads=True),
            protection=Protection(secure_aggregation=False),
            seed=0,
        )


def test_server_app_runs_secure_aggregation_from_the_run_config(tmp_path, task_identity):  # noqa: F811
    """The deployment path: ServerApp and restartable ClientApps (state on disk, keys in Context.state)."""
    from gpflow_fed.federated.runtimes.flower.deploy import read_result
    from gpflow_fed.federated.runtimes.flower.server_app import app as server_app

    ds = fsgp_dataset()
    local = run(fsgp({"rounds": 2}), ds, protection=SECURE, seed=4)
    config = {
        "algorithm": FACTORY,
        "seed": 4,
        "rounds": 2,
        "output": str(tmp_path / "out"),
        "num-clients": 2,
        **SECURE.to_config(),
    }
    grid, test = _loopback(tmp_path, ds, config, task_identity)
    config["test-data"] = test
    server_app(grid, Context(run_id=task_identity, node_id=1, node_config={}, state=RecordDict(), run_config=config))
    mean, _ = local.model.predict_f(ds.test[0])
    np.testing.assert_array_equal(read_result(str(tmp_path / "out"))["predictions"]["mean"], mean.numpy())
    for state_dir in (tmp_path / "state").rglob("*"):  # no key reached the disk
        if state_dir.is_file():
            assert b"private" not in state_dir.read_bytes()


@pytest.mark.slow  # real SuperLink and SuperNode processes (≈ 4.5 min); the loopback tests above run the same apps
def test_secure_aggregation_on_a_superlink_and_two_supernodes(tmp_path):
    """Secure aggregation between real processes: the SuperNodes keep their keys and kept encodings in their Context
    between messages, and the result equals LocalRuntime's.

    In the default suite (about 3.5 minutes on 2 cores): it is also the test of Flower's Deployment Engine with a
    real SuperLink and SuperNodes (one round); the two-round plain run is the slow
    ``test_flower.py::test_superlink_and_two_supernodes_on_loopback_match_local_runtime``."""
    import os

    from gpflow_fed.federated.runtimes.flower.deploy import LoopbackFederation

    ds = fsgp_dataset()
    local = run(fsgp({"rounds": 1}), ds, protection=SECURE, seed=3)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    settings = {"seed": 3, "rounds": 1, **SECURE.to_config()}
    with LoopbackFederation(
        str(tmp_path), ds, env={"PYTHONPATH": root, "GPFLOW_FED_ALGORITHM_MODULES": "tests.federated.helpers"}
    ) as federation:
        out = federation.run(FACTORY, settings, timeout=580)
    mean, var = local.model.predict_f(ds.test[0])
    np.testing.assert_allclose(out["predictions"]["mean"], mean.numpy(), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(out["predictions"]["var"], var.numpy(), rtol=1e-6, atol=1e-9)
    up = [e for e in out["record"]["ledger"] if e["receiver"] == "server"]
    assert up and all("/secagg/" in e["phase"] for e in up)


def test_every_field_of_the_party_policy_reaches_its_node_config(dataset):  # noqa: F811
    """FlowerRuntime writes each party's whole policy into its node config (ClientPolicy.to_node_config): a run
    asking for 24 fractional bits gives parties policies of 24 bits, which they read back. (The node config once
    left out ``fractional-bits``: every party read 32 and refused the request.)"""
    protection = Protection(secure_aggregation=SecureAggregation(fractional_bits=24))
    flower = run(FederatedMean(1), dataset, runtime=FlowerRuntime(), protection=protection, seed=0)
    local = run(FederatedMean(1), dataset, protection=protection, seed=0)
    assert flower.history[0]["clients"] == dataset.num_clients
    assert flower.model.mean == local.model.mean
