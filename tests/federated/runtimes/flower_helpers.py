"""Flower test helpers: the task identity a ServerApp runs under, and a grid of restartable ClientApps."""

import pytest


@pytest.fixture
def task_identity():
    """Flower builds messages for the task of this process; set one as a SuperLink's ServerApp task would."""
    from flwr.supercore.task_identity import TaskIdentity

    previous = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 77, 1, 1
    yield 77
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = previous


def loopback(tmp_path, ds, run_config, run_id):
    """A grid of restartable ClientApps: every message rebuilds its client from the state on disk."""
    from gpflow_fed.federated.runtimes.flower.client_app import make_client_app
    from gpflow_fed.federated.runtimes.flower.deploy import write_client_data
    from gpflow_fed.federated.runtimes.flower.runtime import LoopbackGrid

    from gpflow_fed.federated.protection.identity import write_federation

    paths, test = write_client_data(str(tmp_path / "data"), ds)
    keys, roster = write_federation(str(tmp_path / "identity"), [f"client_{k}" for k in range(len(paths))])
    # each party's own policy matches the run's request here (a test of parity, not of the policy)
    policy = {"secure-aggregation": bool(run_config.get("secure-aggregation", False)), "roster": roster}
    configs = [
        {
            "data": p,
            "client-index": k,
            "state-dir": str(tmp_path / "state"),
            "signing-key": keys[f"client_{k}"],
            **policy,
        }
        for k, p in enumerate(paths)
    ]
    return LoopbackGrid(make_client_app(), configs[::-1], run_config, run_id), test


def assert_matches_local(out, local, X_test):
    """A Flower run's ``result.json`` (``out``, as ``deploy.read_result`` reads it) equals ``local`` (a
    ``FederatedResult``): predictions at ``X_test`` and parameters to 1e-10, the bounds' history exactly, the bytes."""
    import gpflow
    import numpy as np

    mean, var = local.model.predict_f(X_test)
    np.testing.assert_allclose(out["predictions"]["mean"], mean.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(out["predictions"]["var"], var.numpy(), rtol=1e-10, atol=1e-12)
    for key, value in gpflow.utilities.read_values(local.model).items():
        np.testing.assert_allclose(out["parameters"][key], np.asarray(value), rtol=1e-10, atol=1e-12, err_msg=key)
    assert [h["local_bound"] for h in out["record"]["history"]] == [h["local_bound"] for h in local.history]
    assert sum(e["nbytes"] for e in out["record"]["ledger"]) == local.ledger.total_bytes()
