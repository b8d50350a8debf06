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
