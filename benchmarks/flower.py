"""FSGP on Flower: wall time of the same run on LocalRuntime and on the Flower paths, side by side.

Rows (each the same FSGP job with the same seed; ``max |Δ mean|`` is against LocalRuntime's predictions):

* ``LocalRuntime``;
* ``FlowerRuntime``: in-process Flower nodes, messages through Flower's protobuf encoding;
* ``ServerApp + restarted ClientApps``: the real ServerApp ``main`` over a loopback grid whose ClientApps keep
  their state only on disk, as on a SuperNode (every message rebuilds and restores the client);
* ``Deployment Engine`` (with ``--deployment``): ``flower-superlink`` + one ``flower-supernode`` per client
  on 127.0.0.1, submitted with ``flwr run``.

With ``--secure``, instead: the cost of secure aggregation, LocalRuntime's pairwise masking against
Flower's SecAgg+ (in-process nodes), each next to the same runtime without it: seconds, bytes sent by the
clients, and the largest difference of the predictive means from LocalRuntime's masked run.

    .venv/bin/python benchmarks/flower.py [--rounds 2] [--clients 2] [--deployment | --secure]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Mapping

import gpflow
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from gpflow_fed.data import FederatedDataset  # noqa: E402
from gpflow_fed.federated import LocalRuntime, Protection, register_algorithm_factory, run  # noqa: E402
from gpflow_fed.federated.algorithms import FSGP  # noqa: E402
from gpflow_fed.federated.engine.factories import TRUSTED_MODULES_ENV  # noqa: E402

#: the factory's registered name; every Flower party imports this module (PYTHONPATH = benchmarks/, and
#: $GPFLOW_FED_ALGORITHM_MODULES names it), which registers it
FACTORY = "flower:fsgp_job"


def fsgp_job(run_config: Mapping[str, Any]) -> FSGP:
    """FSGP fedavg, M = 10, D = 2, with ``rounds`` and ``local-steps`` from the run config."""
    Z = np.random.default_rng(1).uniform(-3, 3, (10, 2))
    kernel = gpflow.kernels.SquaredExponential(lengthscales=[1.0, 1.0])
    return FSGP(
        kernel,
        Z,
        0.1,
        rounds=int(run_config.get("rounds", 2)),
        local_steps=int(run_config.get("local-steps", 10)),
        learning_rate=0.05,
    )


register_algorithm_factory(fsgp_job, name=FACTORY)


def make_dataset(clients: int, per_client: int = 100, seed: int = 0) -> FederatedDataset:
    rng = np.random.default_rng(seed)
    N = clients * per_client
    X = rng.uniform(-3, 3, (N + 50, 2))
    Y = np.sin(X[:, :1]) * np.cos(X[:, 1:]) + 0.1 * rng.normal(size=(N + 50, 1))
    return FederatedDataset(
        [(X[k * per_client : (k + 1) * per_client], Y[k * per_client : (k + 1) * per_client]) for k in range(clients)],
        test=(X[N:], Y[N:]),
    )


def _timed(fn: Callable[[], Any]) -> tuple:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--deployment", action="store_true", help="also run the Deployment Engine (minutes)")
    parser.add_argument("--secure", action="store_true", help="compare secure aggregation on LocalRuntime and Flower")
    args = parser.parse_args()
    if args.secure:
        return secure_costs(args.clients, args.rounds)

    from flwr.app import Context, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from gpflow_fed.federated import FlowerRuntime
    from gpflow_fed.federated.runtimes.flower.client_app import make_client_app
    from gpflow_fed.federated.runtimes.flower.deploy import LoopbackFederation, read_result, write_client_data
    from gpflow_fed.federated.runtimes.flower.runtime import LoopbackGrid
    from gpflow_fed.federated.runtimes.flower.server_app import app as server_app

    ds = make_dataset(args.clients)
    config: Dict[str, Any] = {"rounds": args.rounds}
    seed = 0
    Xs = ds.test[0]
    local, t_local = _timed(
        lambda: run(
            fsgp_job(config), ds, runtime=LocalRuntime(protection=Protection(secure_aggregation=False)), seed=seed
        )
    )
    reference = local.model.predict_f(Xs)[0].numpy()
    rows: List[tuple] = [("LocalRuntime", t_local, 0.0)]

    flower, t_flower = _timed(
        lambda: run(
            fsgp_job(config), ds, runtime=FlowerRuntime(protection=Protection(secure_aggregation=False)), seed=seed
        )
    )
    rows.append(
        (
            "FlowerRuntime (in-process nodes, protobuf)",
            t_flower,
            float(np.abs(flower.model.predict_f(Xs)[0].numpy() - reference).max()),
        )
    )

    with tempfile.TemporaryDirectory() as tmp:
        paths, test = write_client_data(os.path.join(tmp, "data"), ds)
        run_config = {
            "algorithm": FACTORY,
            "seed": seed,
            **config,
            "output": os.path.join(tmp, "out"),
            "test-data": test,
        }
        nodes = [{"data": p, "client-index": k, "state-dir": os.path.join(tmp, "state")} for k, p in enumerate(paths)]
        sys.path.insert(0, HERE)
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
        grid = LoopbackGrid(make_client_app(), nodes, run_config, 1)
        context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config=run_config)
        _, t_app = _timed(lambda: server_app(grid, context))
        mean = read_result(os.path.join(tmp, "out"))["predictions"]["mean"]
        rows.append(("ServerApp + restarted ClientApps (state on disk)", t_app, float(np.abs(mean - reference).max())))

        if args.deployment:
            env = {"PYTHONPATH": os.pathsep.join([HERE, ROOT]), TRUSTED_MODULES_ENV: "flower"}
            with LoopbackFederation(os.path.join(tmp, "deploy"), ds, env=env) as federation:
                out, t_dep = _timed(lambda: federation.run(FACTORY, {"seed": seed, **config}, timeout=900))
            rows.append(
                (
                    "Deployment Engine (SuperLink + SuperNodes, flwr run)",
                    t_dep,
                    float(np.abs(out["predictions"]["mean"] - reference).max()),
                )
            )

    exchanges = args.rounds + 1 + 1  # rounds, the final 'predict' phase, and 'describe' on Flower
    print(
        f"FSGP fedavg, K = {args.clients} clients × 100 points, M = 10, {args.rounds} rounds × 10 local Adam steps "
        f"({exchanges} exchanges on Flower)\n"
    )
    print("| runtime | seconds | × LocalRuntime | max abs Δ mean vs LocalRuntime |")
    print("|---|---|---|---|")
    for name, seconds, delta in rows:
        print(f"| {name} | {seconds:.2f} | {seconds / t_local:.1f} | {delta:.1e} |")
    return 0


def secure_costs(clients: int, rounds: int) -> int:
    """The ``--secure`` table (module docstring)."""
    from gpflow_fed.federated import FlowerRuntime

    ds = make_dataset(clients)
    config: Dict[str, Any] = {"rounds": rounds}
    Xs = ds.test[0]
    runs = [
        ("LocalRuntime", lambda: LocalRuntime(protection=Protection(secure_aggregation=False))),
        ("LocalRuntime, pairwise masking", lambda: LocalRuntime(protection=Protection(secure_aggregation=True))),
        ("FlowerRuntime", lambda: FlowerRuntime(protection=Protection(secure_aggregation=False))),
        ("FlowerRuntime, SecAgg+", lambda: FlowerRuntime(protection=Protection(secure_aggregation=True))),
    ]
    run(
        fsgp_job(config), ds, runtime=LocalRuntime(protection=Protection(secure_aggregation=False)), seed=0
    )  # warm-up: TensorFlow's first-use costs
    rows = []
    for name, runtime in runs:
        result, seconds = _timed(lambda: run(fsgp_job(config), ds, runtime=runtime(), seed=0))
        rows.append((name, seconds, result.ledger.total_bytes(direction="up"), result.model.predict_f(Xs)[0].numpy()))
    reference = rows[1][3]
    print(f"FSGP fedavg, K = {clients} clients × 100 points, M = 10, {rounds} rounds × 10 local Adam steps\n")
    print("| runtime | seconds | bytes sent by the clients | max abs Δ mean vs LocalRuntime, pairwise masking |")
    print("|---|---|---|---|")
    for name, seconds, up, mean in rows:
        print(f"| {name} | {seconds:.2f} | {up:,} | {float(np.abs(mean - reference).max()):.1e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
