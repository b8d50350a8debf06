"""Flower runtime: wire-format round trips, the in-process Flower path against LocalRuntime, bad input, and
(slow) a real SuperLink + 2 SuperNodes on loopback running two FSGP rounds."""

import os
import gpflow
import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import Context, RecordDict  # noqa: E402

from gpflow_fed.federated import FederationInfo, LocalRuntime, Message, Protection, RunOptions, run  # noqa: E402
from gpflow_fed.federated.runtimes.flower import records  # noqa: E402
from gpflow_fed.federated.runtimes import make_clients  # noqa: E402
from gpflow_fed.federated.runtimes.base import client_seed, sampling_rng  # noqa: E402
from gpflow_fed.federated import register_algorithm_factory  # noqa: E402
from gpflow_fed.federated.engine.factories import TRUSTED_MODULES_ENV, registered_factories  # noqa: E402
from gpflow_fed.federated.runtimes.flower.client_app import describe_reply, load_client_data  # noqa: E402
from gpflow_fed.federated.runtimes.flower.deploy import LoopbackFederation, supernode_command, write_app  # noqa: E402
from gpflow_fed.federated.runtimes.flower.runtime import FlowerRuntime  # noqa: E402
from gpflow_fed.federated.runtimes.flower.testing import over_the_wire as _over_the_wire  # noqa: E402
from gpflow_fed.federated.runtimes.flower.app_config import run_config_defaults  # noqa: E402
from gpflow_fed.federated.runtimes.flower.server_app import FederationShape, FlowerServer  # noqa: E402

from tests.federated.helpers import FACTORY, flower_dataset as dataset, fsgp  # noqa: E402
from tests.federated.runtimes.flower_helpers import assert_matches_local  # noqa: E402
from tests.federated.runtimes.flower_helpers import loopback as _loopback, task_identity  # noqa: E402,F401

#: runs and runtimes compared bit for bit: the fixed point rounds to nearest (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("nearest_rounding")


def _message():
    rng = np.random.default_rng(0)
    return Message(
        sender="client_1",
        round=3,
        phase="adjoint/gradient",
        arrays={
            "kernel/variance": np.asarray(0.25),
            "Z": rng.normal(size=(4, 2)),
            "counts": np.arange(3, dtype=np.int32),
            "empty": np.zeros((0, 2)),
            "f32": rng.normal(size=(2, 2)).astype(np.float32),
        },
        weight=17.0,
        metrics={"bound": -1.25, "steps": 5.0},
    )


@pytest.mark.parametrize("purpose", records.PURPOSES)
def test_message_recorddict_round_trip_through_protobuf(purpose):
    message = _message()
    back, back_purpose = records.recorddict_to_message(_over_the_wire(records.message_to_recorddict(message, purpose)))
    assert back_purpose == purpose
    assert (back.sender, back.round, back.phase, back.weight) == (
        message.sender,
        message.round,
        message.phase,
        message.weight,
    )
    assert dict(back.metrics) == dict(message.metrics)
    assert list(back.arrays) == list(message.arrays)
    for name, array in message.arrays.items():
        assert back[name].dtype == array.dtype and back[name].shape == array.shape
        np.testing.assert_array_equal(back[name], array)
    assert back.nbytes == message.nbytes


def test_info_round_trip_and_client_seeds_match_make_clients():
    ds = dataset(sizes=(5, 7, 9))
    info = FederationInfo(("client_0", "client_1", "client_2"), {"client_0": 5, "client_1": 7, "client_2": 9}, 2, 1, 11)
    assert records.config_to_info(_over_the_wire(RecordDict({"i": records.info_to_config(info)}))["i"]) == info
    clients, rng = make_clients(ds, 11)
    assert [client_seed(11, k, 3) for k in range(3)] == [c.seed for c in clients]
    np.testing.assert_array_equal(sampling_rng(11, 3).integers(0, 10**9, 5), rng.integers(0, 10**9, 5))
    with pytest.raises(ValueError, match="outside"):
        client_seed(0, 3, 3)


def test_bad_wire_content_and_factory_specs_are_named():
    with pytest.raises(ValueError, match="lacks the record"):
        records.recorddict_to_message(RecordDict({}))
    with pytest.raises(TypeError, match="gpflow_fed Message"):
        records.message_to_recorddict({"a": 1})
    with pytest.raises(ValueError, match="purpose"):
        records.message_to_recorddict(_message(), "upload")
    with pytest.raises(TypeError, match="string"):
        records.load_factory(None)
    with pytest.raises(TypeError, match="not an Algorithm"):
        register_algorithm_factory(dict, name="test:dict")
        records.build_algorithm("test:dict", {})


@pytest.mark.parametrize(
    "spec",
    [
        "subprocess:run",
        "os:system",
        "builtins:eval",
        "gpflow_fed_no_such_module:f",
        "tests.federated.helpers:nothing",
        "no_colon",
    ],
)
def test_unregistered_factory_is_neither_imported_nor_called(spec, monkeypatch):
    """A run config is written by whoever submits the run: naming any importable callable must not run it."""
    import sys

    monkeypatch.delitem(sys.modules, "gpflow_fed_no_such_module", raising=False)
    imported = set(sys.modules)
    with pytest.raises(ValueError, match="not a registered algorithm factory"):
        records.build_algorithm(spec, {})
    assert set(sys.modules) - imported == set()
    assert FACTORY in registered_factories()


def test_client_node_config_is_checked(tmp_path):
    X, Y = np.zeros((4, 2)), np.ones((4, 1))
    np.savez(tmp_path / "ok.npz", X=X, Y=Y)
    np.savez(tmp_path / "bad.npz", inputs=X)

    def context(cfg):
        return Context(run_id=1, node_id=2, node_config=cfg, state=RecordDict(), run_config={})

    index, X2, Y2 = load_client_data(context({"data": str(tmp_path / "ok.npz"), "client-index": 1}))
    assert index == 1 and X2.shape == (4, 2) and Y2.shape == (4, 1) and X2.dtype == gpflow.default_float()
    cfg = describe_reply(context({"data": str(tmp_path / "ok.npz"), "client-index": 1}))["describe"]
    assert dict(cfg) == {"client-index": 1, "num-data": 4, "input-dim": 2, "output-dim": 1}
    with pytest.raises(ValueError, match="lacks 'data'"):
        load_client_data(context({"client-index": 0}))
    with pytest.raises(ValueError, match="no such file"):
        load_client_data(context({"data": str(tmp_path / "missing.npz"), "client-index": 0}))
    with pytest.raises(ValueError, match="'X'"):
        load_client_data(context({"data": str(tmp_path / "bad.npz"), "client-index": 0}))
    with pytest.raises(ValueError, match="client-index"):
        load_client_data(context({"data": str(tmp_path / "ok.npz"), "client-index": -1}))


def test_runtime_and_server_arguments_are_checked(tmp_path):
    with pytest.raises(TypeError, match="FaultPolicy"):
        FlowerRuntime(options=RunOptions(faults="exclude"))
    with pytest.raises(TypeError, match="Algorithm"):
        FlowerServer(object())
    with pytest.raises(ValueError, match="seed"):
        FlowerServer(fsgp({}), seed=-1)
    with pytest.raises(ValueError, match="timeout"):
        FlowerServer(fsgp({}), timeout=0)
    with pytest.raises(ValueError, match="factory"):
        write_app(str(tmp_path), "not-a-spec")
    with pytest.raises(TypeError, match="run-config values"):
        write_app(str(tmp_path), FACTORY, {"bad": [1, 2]})
    # FSGP's own validation runs on the federation's shape (the server has no data)
    with pytest.raises(ValueError, match="inducing points exceed"):
        fsgp({}).validate(FederationShape((2, 2), 2, 1))


def test_write_app_and_supernode_command(tmp_path):
    path = write_app(str(tmp_path), FACTORY, {"seed": 3, "rounds": 2, "output": "/tmp/out"})
    import tomllib

    with open(os.path.join(path, "pyproject.toml"), "rb") as f:
        spec = tomllib.load(f)
    assert spec["tool"]["flwr"]["app"]["components"] == {
        "serverapp": "gpflow_fed.federated.runtimes.flower.server_app:app",
        "clientapp": "gpflow_fed.federated.runtimes.flower.client_app:app",
    }
    given = {"algorithm": FACTORY, "seed": 3, "rounds": 2, "output": "/tmp/out"}
    assert spec["tool"]["flwr"]["app"]["config"] == {**run_config_defaults(), **given}
    command = supernode_command("127.0.0.1:9092", 9110, "/data/a b.npz", 1)
    assert command[-1] == 'data="/data/a b.npz" client-index=1'


def _assert_same_run(flower, local, Xs):
    for ours, ref in zip(flower.model.predict_f(Xs), local.model.predict_f(Xs)):
        np.testing.assert_allclose(ours.numpy(), ref.numpy(), rtol=1e-10, atol=1e-12)
    assert [
        (e.sender, e.receiver, e.round, e.phase, e.purpose, e.names, e.shapes, e.nbytes) for e in flower.ledger
    ] == [(e.sender, e.receiver, e.round, e.phase, e.purpose, e.names, e.shapes, e.nbytes) for e in local.ledger]
    strip = lambda h: [{k: v for k, v in e.items() if k != "seconds"} for e in h]  # noqa: E731
    assert strip(flower.history) == strip(local.history)
    assert flower.metrics == pytest.approx(local.metrics, rel=1e-10)


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_in_process_flower_matches_local_runtime(fraction):
    ds = dataset(sizes=(20, 25, 30))
    config = {"rounds": 3, "local-steps": 4, "client-fraction": fraction}
    local = run(fsgp(config), ds, runtime=LocalRuntime(), seed=5)
    flower = run(fsgp(config), ds, runtime=FlowerRuntime(), seed=5)
    _assert_same_run(flower, local, ds.test[0])
    assert [h["clients"] for h in flower.history] == [3 if fraction == 1.0 else 2] * 3


def test_in_process_client_error_is_reported_with_the_client():
    from gpflow_fed.federated import ClientUpdateError

    with pytest.raises(ClientUpdateError, match="client_1.*raised an error"):  # on a protected phase: no message
        run(_failing(fsgp({"rounds": 1}), "client_1", 0), dataset(), runtime=FlowerRuntime(), seed=0)
    plain = Protection(secure_aggregation=False)
    with pytest.raises(ClientUpdateError, match="client_1.*diverged"):
        run(_failing(fsgp({"rounds": 1}), "client_1", 0), dataset(), runtime=FlowerRuntime(), protection=plain, seed=0)


def _failing(algorithm, client_id, round):
    """``algorithm`` whose ``client_update`` raises for ``client_id`` in ``round`` (every party's bound copy too: the
    class changes, so ``Algorithm.bind``'s copies keep it)."""

    class Failing(type(algorithm)):
        def client_update(self, client, broadcast):
            if client.id == client_id and broadcast.round == round:
                raise FloatingPointError("diverged")
            return super().client_update(client, broadcast)

    algorithm.__class__ = Failing
    return algorithm


def test_excluded_faulty_client_matches_local_runtime():
    from gpflow_fed.federated import FaultPolicy
    from gpflow_fed.federated import FlowerRuntime as Exported

    assert Exported is FlowerRuntime
    ds = dataset(sizes=(20, 25, 30))
    policy = FaultPolicy(on_error="exclude", min_clients=2)
    # in the clear, a client that failed once answers again (on a protected phase it would stop for the run)
    plain = Protection(secure_aggregation=False)
    local = run(
        _failing(fsgp({"rounds": 3}), "client_1", 1),
        ds,
        runtime=LocalRuntime(options=RunOptions(faults=policy), protection=plain),
        seed=2,
    )
    flower = run(
        _failing(fsgp({"rounds": 3}), "client_1", 1),
        ds,
        runtime=FlowerRuntime(options=RunOptions(faults=policy), protection=plain),
        seed=2,
    )
    assert (
        set(flower.history[1]["excluded"]) == {"client_1"} and "diverged" in flower.history[1]["excluded"]["client_1"]
    )
    assert [h["clients"] for h in flower.history] == [h["clients"] for h in local.history] == [3, 2, 3]
    for ours, ref in zip(flower.model.predict_f(ds.test[0]), local.model.predict_f(ds.test[0])):
        np.testing.assert_allclose(ours.numpy(), ref.numpy(), rtol=1e-10, atol=1e-12)
    assert flower.ledger.total_bytes() == local.ledger.total_bytes()


def test_server_app_with_restarted_client_apps_matches_local_runtime(tmp_path, task_identity):
    """The ServerApp's main (run config, result files) over ClientApps that keep state only on disk."""
    from gpflow_fed.federated.runtimes.flower.deploy import read_result
    from gpflow_fed.federated.runtimes.flower.server_app import app as server_app

    ds = dataset()
    local = run(fsgp({"rounds": 2}), ds, runtime=LocalRuntime(), seed=4)
    config = {"algorithm": FACTORY, "seed": 4, "rounds": 2, "output": str(tmp_path / "out"), "num-clients": 2}
    grid, test = _loopback(tmp_path, ds, config, task_identity)
    config["test-data"] = test
    server_app(grid, Context(run_id=task_identity, node_id=1, node_config={}, state=RecordDict(), run_config=config))
    out = read_result(str(tmp_path / "out"))
    assert_matches_local(out, local, ds.test[0])
    assert out["record"]["metrics"] == pytest.approx(local.metrics, rel=1e-10)
    assert sorted(os.listdir(tmp_path / "state" / f"run-{task_identity}")) == [
        "node-1001-client_1",
        "node-1002-client_0",
    ]


def test_server_app_runs_the_shared_round_loop_with_evaluation_and_checkpoints(tmp_path, task_identity):
    """The ServerApp runs the round loop every runtime shares: eval_every and server checkpoints, as LocalRuntime."""
    from gpflow_fed.federated.runtimes.flower.deploy import read_result
    from gpflow_fed.federated.runtimes.flower.server_app import app as server_app

    ds = dataset()
    local = run(fsgp({"rounds": 3}), ds, runtime=LocalRuntime(options=RunOptions(eval_every=1)), seed=4)
    config = {
        "algorithm": FACTORY,
        "seed": 4,
        "rounds": 3,
        "output": str(tmp_path / "out"),
        "num-clients": 2,
        "eval-every": 1,
        "checkpoint-dir": str(tmp_path / "ckpt"),
    }
    grid, test = _loopback(tmp_path, ds, config, task_identity)
    config["test-data"] = test
    server_app(grid, Context(run_id=task_identity, node_id=1, node_config={}, state=RecordDict(), run_config=config))
    history = read_result(str(tmp_path / "out"))["record"]["history"]
    assert [h["test_rmse"] for h in history] == pytest.approx([h["test_rmse"] for h in local.history], rel=1e-10)
    assert {"checkpoint.json", "round-2"} <= set(os.listdir(tmp_path / "ckpt"))  # the latest round is saved
    assert [e["purpose"] for e in read_result(str(tmp_path / "out"))["record"]["ledger"]].count("evaluate") == sum(
        e.purpose == "evaluate" for e in local.ledger
    )


def test_server_app_failure_is_written_for_the_caller(tmp_path, task_identity):
    from gpflow_fed.federated.runtimes.flower.server_app import app as server_app

    ds = dataset()
    config = {"algorithm": "tests.federated.helpers:nothing", "output": str(tmp_path / "out")}
    grid, _ = _loopback(tmp_path, ds, config, task_identity)
    with pytest.raises(ValueError, match="not a registered algorithm factory"):
        server_app(
            grid, Context(run_id=task_identity, node_id=1, node_config={}, state=RecordDict(), run_config=config)
        )
    assert "not a registered algorithm factory" in (tmp_path / "out" / "error.json").read_text()
    # duplicate client indices are refused before any training, naming the fix
    for context in grid.contexts.values():
        context.node_config = {**context.node_config, "client-index": 0}
    config["algorithm"] = FACTORY
    with pytest.raises(ValueError, match="distinct indices 0 … 1"):
        server_app(
            grid, Context(run_id=task_identity, node_id=1, node_config={}, state=RecordDict(), run_config=config)
        )


@pytest.mark.slow
def test_superlink_and_two_supernodes_on_loopback_match_local_runtime(tmp_path):
    """Two FSGP rounds on Flower's Deployment Engine (real processes, HTTP on 127.0.0.1) equal LocalRuntime."""
    ds = dataset()
    local = run(fsgp({"rounds": 2}), ds, runtime=LocalRuntime(), seed=3)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    with LoopbackFederation(
        str(tmp_path), ds, env={"PYTHONPATH": root, TRUSTED_MODULES_ENV: "tests.federated.helpers"}
    ) as federation:
        out = federation.run(FACTORY, {"seed": 3, "rounds": 2}, timeout=400)
    mean, var = local.model.predict_f(ds.test[0])
    np.testing.assert_allclose(out["predictions"]["mean"], mean.numpy(), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(out["predictions"]["var"], var.numpy(), rtol=1e-6, atol=1e-9)
    ref = {k: np.asarray(v) for k, v in gpflow.utilities.read_values(local.model).items()}
    assert set(out["parameters"]) == set(ref)
    for key, value in ref.items():
        np.testing.assert_allclose(out["parameters"][key], value, rtol=1e-6, atol=1e-9, err_msg=key)
    ledger = out["record"]["ledger"]
    assert [(e["sender"], e["receiver"], e["phase"], e["purpose"], e["nbytes"]) for e in ledger] == [
        (e.sender, e.receiver, e.phase, e.purpose, e.nbytes) for e in local.ledger
    ]
    assert [h["local_bound"] for h in out["record"]["history"]] == pytest.approx(
        [h["local_bound"] for h in local.history], rel=1e-8
    )


@pytest.mark.parametrize(
    "job",
    [
        "fedbnr_fedavg",
        pytest.param("fedbnr_kd", marks=pytest.mark.slow),  # FedBNR on Flower: fedbnr_fedavg in the default suite
        "pvi_dpo",
        pytest.param("pvi_cpo", marks=pytest.mark.slow),  # PVI on Flower: pvi_dpo in the default suite
        "recycle",
    ],
)
def test_in_process_flower_runs_every_algorithm_as_local_runtime(job, local_job_summary):
    """FedBNR (FedAvg and KD), PVI (DPO, CPO) and Recycle run unchanged through the Flower adapters (every
    message through RecordDict and back) and give LocalRuntime's run: history, ledger, predictions.

    The LocalRuntime run (default protection, seed 3) is the session's shared one (``tests/federated/conftest.py``,
    also ``test_distribute.py``'s oracle); the Flower summary goes through JSON as that one did."""
    import json

    from tests.federated.runtimes.distribute_job import build_jobs, summarize

    factory, data, kwargs = build_jobs()[job]
    assert not {k for k in kwargs if k != "placement"}  # the shared run is LocalRuntime() with no other keywords
    local = local_job_summary(job)
    flower = json.loads(json.dumps(summarize(run(factory(), data, runtime=FlowerRuntime(), seed=3))))
    assert flower["ledger"] == local["ledger"]
    assert flower["history"] == local["history"]
    np.testing.assert_allclose(flower["predict_f"], local["predict_f"], rtol=1e-10, atol=1e-12)


def test_client_state_on_disk_is_verified_before_it_is_restored(tmp_path):
    """A ClientApp's own state between messages carries a manifest: tampered files are refused, naming them."""
    from gpflow_fed.federated import Client
    from gpflow_fed.federated.runtimes.flower.client_app import _restore_client, _save_client

    client = Client("client_0", (np.zeros((3, 1)), np.zeros((3, 1))), seed=1)
    client.state["factor"] = np.arange(4.0)
    directory = str(tmp_path / "node")
    _save_client(directory, client)
    again = Client("client_0", (np.zeros((3, 1)), np.zeros((3, 1))), seed=1)
    assert _restore_client(directory, again)
    np.testing.assert_array_equal(again.state["factor"], np.arange(4.0))
    with open(os.path.join(directory, "arrays.npz"), "ab") as f:
        f.write(b"tampered")
    with pytest.raises(ValueError, match="arrays.npz"):
        _restore_client(directory, Client("client_0", (np.zeros((3, 1)), np.zeros((3, 1))), seed=1))
