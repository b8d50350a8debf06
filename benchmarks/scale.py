"""FSGP at scale: per-round seconds with K = 100 and K = 1,000 clients of a few points each.

FSGP (FedAvg, every client every round, P = 3 local Adam steps, λ = 0.1, M = 50, squared-exponential
kernel) on FSGP synthetic dataset 1 (eq. 18) with ``K × N_k`` training points split iid. Every run's rounds
are timed by ``LocalRuntime`` (``history[r]["seconds"]``, wall clock) and by this process's CPU time (read
by a monitor after every round; on a machine shared with other work the CPU time is the better estimate
of the unloaded wall time, since the clients run on one thread): round 0 includes each client's set-up and the
tracing of the compiled client functions, later rounds are the steady state. The final ``"predict"``
exchange (every client's statistics) is timed separately. Each round is split into the time inside
``client_update`` (the clients' own work), inside ``server_update``, and the rest (the runtime: messages,
ledger, fault screening, reduction), so the runtime's per-message overhead is visible.

``shared`` is the package's FSGP: one :class:`~gpflow_fed.federated.algorithms.fsgp.worker.SGPRClientWorker` whose
compiled functions (traced once per run) take each client's data, w and Adam state as arguments.
``per-client`` re-creates the previous implementation for comparison: every client builds its own SGPR, its
own ``tf_keras`` Adam and its own compiled training loop (traced once per client), and computes its final
statistics eagerly. It runs only for ``--baseline-clients`` (tracing 1,000 loops takes tens of minutes).

Usage: ``python benchmarks/scale.py [--clients 100 1000] [--baseline-clients 100] [--rounds 4] [--quick]``;
prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any, Dict, List

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import gpflow  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from gpflow.keras import tf_keras  # noqa: E402

from gpflow_fed.data import FederatedDataset, fsgp_synthetic_1  # noqa: E402
from gpflow_fed.data.partition import iid_partition  # noqa: E402
from gpflow_fed.federated import LocalRuntime, Protection, run  # noqa: E402
from gpflow_fed.federated.algorithms import FSGP, initial_inducing_inputs  # noqa: E402
from gpflow_fed.federated.algorithms.fsgp.statistics import sgpr_statistics  # noqa: E402
from gpflow_fed.training.adam import adam_steps  # noqa: E402


class TimedFSGP(FSGP):
    """FSGP that adds up the seconds spent in ``client_update`` and ``server_update`` per round."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.client_seconds: Dict[int, float] = {}
        self.server_seconds: Dict[int, float] = {}

    def client_update(self, client: Any, broadcast: Any) -> Any:
        start = time.perf_counter()
        try:
            return super().client_update(client, broadcast)
        finally:
            key = broadcast.round
            self.client_seconds[key] = self.client_seconds.get(key, 0.0) + time.perf_counter() - start

    def setup_client(self, client: Any, state: Any) -> None:
        start = time.perf_counter()
        super().setup_client(client, state)
        key = -1  # set-up is part of the first exchange a client joins; counted with its round below
        self.client_seconds[key] = self.client_seconds.get(key, 0.0) + time.perf_counter() - start

    def server_update(self, state: Any, aggregate: Any) -> Any:
        start = time.perf_counter()
        try:
            return super().server_update(state, aggregate)
        finally:
            key = aggregate.round
            self.server_seconds[key] = self.server_seconds.get(key, 0.0) + time.perf_counter() - start


class PerClientFSGP(TimedFSGP):
    """The previous FSGP client path: a model, an Adam and a compiled loop of its own for every client."""

    def setup_client(self, client: Any, state: Any) -> None:
        start = time.perf_counter()
        X, Y = (tf.constant(a) for a in client.data)
        model = gpflow.models.SGPR(
            (X, Y),
            kernel=gpflow.utilities.deepcopy(self.kernel),
            inducing_variable=gpflow.utilities.deepcopy(self.inducing_variable),
            noise_variance=self.noise_variance,
        )
        optimizer = tf_keras.optimizers.Adam(learning_rate=self.learning_rate)
        trainable = model.trainable_variables
        optimizer.build(trainable)
        num_data = tf.constant(float(client.num_data), gpflow.default_float())

        @tf.function(autograph=False)
        def train() -> tf.Tensor:
            adam_steps(lambda: model.training_loss() / num_data, trainable, optimizer, self.local_steps)
            return model.elbo() / num_data

        client.model, client.optimizer = model, optimizer
        client.state["per_client"] = (X, Y, train)
        self.client_seconds[-1] = self.client_seconds.get(-1, 0.0) + time.perf_counter() - start

    def client_update(self, client: Any, broadcast: Any) -> Any:
        start = time.perf_counter()
        try:
            assert self._shared is not None
            X, Y, train = client.state["per_client"]
            self._shared.assign(client.model, {k: broadcast[k] for k in self._shared.keys})
            weight = float(client.num_data)
            if broadcast.phase == "train":
                bound = float(train().numpy())
                return self.reply(client, broadcast, self._shared.read(client.model), weight, {"bound": bound})
            stats = sgpr_statistics(client.model.kernel, client.model.inducing_variable, X, Y)
            return self.reply(client, broadcast, {k: v.numpy() for k, v in stats._asdict().items()}, weight)
        finally:
            key = broadcast.round
            self.client_seconds[key] = self.client_seconds.get(key, 0.0) + time.perf_counter() - start


def federation(num_clients: int, points: int, seed: int) -> FederatedDataset:
    data = fsgp_synthetic_1(seed=seed, num_train=num_clients * points)
    parts = iid_partition(len(data.X_train), num_clients, seed=seed)
    return FederatedDataset(
        clients=[(data.X_train[p], data.Y_train[p]) for p in parts], test=(data.X_test, data.Y_test), name="fsgp-1"
    )


def measure(cls: type, dataset: FederatedDataset, args: argparse.Namespace) -> Dict[str, Any]:
    X = np.concatenate([X for X, _ in dataset.clients])
    Z = initial_inducing_inputs(X, args.inducing, seed=args.seed)
    algorithm = cls(gpflow.kernels.SquaredExponential(), Z, 0.1, rounds=args.rounds, local_steps=3, learning_rate=0.1)
    cpu = [time.process_time()]

    def monitor(round: int, **_: Any) -> None:  # after every round: this process's CPU seconds so far
        cpu.append(time.process_time())

    result = run(
        algorithm,
        dataset,
        runtime=LocalRuntime(protection=Protection(secure_aggregation=False)),
        monitor=monitor,
        seed=args.seed,
    )
    cpu_rounds = np.diff(cpu)
    rounds = [h["seconds"] for h in result.history]
    setup = algorithm.client_seconds.get(-1, 0.0)
    client = [algorithm.client_seconds.get(r, 0.0) for r in range(args.rounds)]
    server = [algorithm.server_seconds.get(r, 0.0) for r in range(args.rounds)]
    runtime = [t - c - s for t, c, s in zip(rounds, client, server)]
    runtime[0] -= setup  # every client is set up in round 0 (all take part)
    steady = slice(1, None)
    K = dataset.num_clients
    return {
        "first": rounds[0],
        "setup": setup,
        "steady": float(np.mean(rounds[steady])),
        "first_cpu": float(cpu_rounds[0]),
        "steady_cpu": float(np.mean(cpu_rounds[steady])),
        "client_ms": 1e3 * float(np.mean(client[steady])) / K,
        "runtime_ms": 1e3 * float(np.mean(runtime[steady])) / K,
        "server_s": float(np.mean(server[steady])),
        "final": result.seconds - sum(rounds),
        "total": result.seconds,
        "rmse": result.metrics["test_rmse"],
        "params": result.state.params,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--baseline-clients", type=int, nargs="*", default=[100])
    parser.add_argument("--points", type=int, default=15, help="N_k, training points per client")
    parser.add_argument("--inducing", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="K = 20 only, both paths, 2 rounds (a smoke test)")
    args = parser.parse_args()
    if args.quick:
        args.clients, args.baseline_clients, args.rounds = [20], [20], 2
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (round 0 is reported apart from the steady state)")

    print(
        f"FSGP fedavg, N_k = {args.points}, M = {args.inducing}, P = 3, every client every round, "
        f"R = {args.rounds}; threads: OMP {os.environ.get('OMP_NUM_THREADS', 'default')}, "
        f"TF intra-op {os.environ.get('TF_NUM_INTRAOP_THREADS', 'default')}; machine load average at start "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores\n"
    )
    print(
        "| K | client path | round 0 (s) | round 0, CPU (s) | of which set-up (s) | steady round (s) "
        "| steady round, CPU (s) | client_update per client (ms) | runtime per client (ms) | server_update (s) "
        "| final predict phase (s) | whole run (s) | test RMSE |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    loads: List[str] = []
    notes: List[str] = []
    for K in args.clients:
        dataset = federation(K, args.points, args.seed)
        results: Dict[str, Dict[str, Any]] = {}
        paths: List[tuple] = [("shared", TimedFSGP)]
        if K in args.baseline_clients:
            paths.append(("per-client", PerClientFSGP))
        for label, cls in paths:
            m = measure(cls, dataset, args)
            results[label] = m
            print(
                f"| {K} | {label} | {m['first']:.2f} | {m['first_cpu']:.2f} | {m['setup']:.2f} | {m['steady']:.2f} "
                f"| {m['steady_cpu']:.2f} | {m['client_ms']:.2f} "
                f"| {m['runtime_ms']:.2f} | {m['server_s']:.3f} | {m['final']:.2f} | {m['total']:.1f} "
                f"| {m['rmse']:.4f} |",
                flush=True,
            )
        loads.append(f"{os.getloadavg()[0]:.1f} after K = {K}")
        if len(results) == 2:
            gap = max(
                float(np.max(np.abs(results["shared"]["params"][k] - results["per-client"]["params"][k])))
                for k in results["shared"]["params"]
            )
            notes.append(
                f"K = {K}: largest difference of the final parameters, shared vs per-client: {gap:.2e}; speed-up of "
                f"round 0: {results['per-client']['first'] / results['shared']['first']:.1f}x, of a steady round: "
                f"{results['per-client']['steady'] / results['shared']['steady']:.2f}x, of the final phase: "
                f"{results['per-client']['final'] / results['shared']['final']:.1f}x"
            )
    print("\n" + "\n".join(notes + [f"load average: {', '.join(loads)}"]))


if __name__ == "__main__":
    main()
