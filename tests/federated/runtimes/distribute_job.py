"""The jobs of ``test_distribute.py``, and the script that runs them under a tf.distribute strategy.

``python -m tests.federated.runtimes.distribute_job mirrored OUT.json`` runs every job under a MirroredStrategy over two
logical CPU devices; ``python -m tests.federated.runtimes.distribute_job mwms OUT.json --index i --ports p0,p1`` runs
the FSGP jobs as worker ``i`` of a two-worker MultiWorkerMirroredStrategy on 127.0.0.1, with the other
worker's clients blanked (zeros). Logical devices and
``TF_CONFIG`` must be set before TensorFlow initialises its devices, hence a separate process. The test
runs the same jobs under LocalRuntime and compares the JSON summaries.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Any, Callable, Dict, Tuple

MWMS_JOBS = ("fsgp_fedavg", "fsgp_exact", "toy_collect", "fsgp_exact_secure")


def build_jobs() -> Dict[str, Tuple[Callable[[], Any], Any, Dict[str, Any]]]:
    """``{name: (algorithm factory, dataset, DistributeRuntime keywords)}``; every job runs with seed 3."""
    import gpflow
    import numpy as np

    from gpflow_fed.data import FederatedDataset
    from gpflow_fed.federated import FaultPolicy, Protection, RunOptions
    from gpflow_fed.federated.algorithms import FSGP, PVI, FedBNR, Recycle
    from gpflow_fed.kernels import URK
    from gpflow_fed.federated import DifferentialPrivacy

    from tests.federated.helpers import FederatedMean
    from tests.federated.helpers import Faulty

    import tensorflow as tf

    class DeviceMean(FederatedMean):
        """FederatedMean that records the device each client's update ran on."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.devices: Dict[str, str] = {}

        def client_update(self, client, broadcast):
            self.devices[client.id] = tf.zeros([]).device
            return super().client_update(client, broadcast)

    class CollectedMean(DeviceMean):
        """DeviceMean whose server reads every client's message (a ``"collect"`` phase)."""

        def aggregation(self, phase):
            return "collect"

        def server_update(self, state, aggregate):
            messages = aggregate.messages
            mean = sum(float(m["sum_y"][0]) for m in messages) / sum(float(m["n"][0]) for m in messages)
            return {"mean": mean, "seen": state["seen"] + (aggregate.senders,), "weights": [m.weight for m in messages]}

    rng = np.random.default_rng(0)
    sizes = (20, 35, 45, 30, 25)
    X = rng.uniform(-3, 3, (sum(sizes), 2))
    Y = np.sin(X[:, :1]) * np.cos(X[:, 1:]) + 0.1 * rng.normal(size=(sum(sizes), 1))
    cuts = np.cumsum((0,) + sizes)
    fsgp_data = FederatedDataset([(X[a:b], Y[a:b]) for a, b in zip(cuts, cuts[1:])], test=(X[:15], Y[:15]))
    Z = np.random.default_rng(1).uniform(-3, 3, (8, 2))

    def fsgp(mode: str, fraction: float) -> Callable[[], Any]:
        kernel = gpflow.kernels.SquaredExponential(variance=1.0, lengthscales=[1.0, 1.0])
        return lambda: FSGP(
            kernel, Z, 0.1, rounds=3, local_steps=5, learning_rate=0.05, client_fraction=fraction, mode=mode
        )

    toy_rng = np.random.default_rng(5)
    toy = FederatedDataset(
        [(toy_rng.normal(size=(n, 2)), toy_rng.normal(loc=k, size=(n, 1))) for k, n in enumerate([5, 7, 9, 11])],
        test=(toy_rng.normal(size=(6, 2)), toy_rng.normal(size=(6, 1))),
    )
    one = FederatedDataset([toy.clients[2]], test=toy.test)

    # the other algorithms, small: FedBNR (both aggregations), PVI (DPO over q(Z), CPO), Recycle
    def fedbnr(aggregation: str) -> Callable[[], Any]:
        kd = {"distillation_data": (X[:20], Y[:20]), "kd_steps": 3} if aggregation == "kd" else {}
        return lambda: FedBNR(
            URK(2, num_samples=6, seed=0),
            0.5,
            1.0,
            rounds=2,
            local_steps=3,
            learning_rate=0.05,
            aggregation=aggregation,
            **kd,
        )

    def pvi(param: str) -> Callable[[], Any]:
        inducing = {"dpo": "distribution", "cpo": "fixed"}[param]
        return lambda: PVI(
            gpflow.kernels.SquaredExponential(lengthscales=[1.0, 1.0]),
            Z[:5],
            gpflow.likelihoods.Gaussian(0.1),
            param,
            rounds=2,  # sequential: clients 0 and 1 (one replica each under MirroredStrategy); each new client's
            local_steps=4,  # fit is traced anew, so a round costs about a second and more rounds check nothing more
            learn_inducing=inducing,
            num_predict_samples=2,
        )

    def recycle() -> Any:
        return Recycle(
            gpflow.kernels.SquaredExponential(lengthscales=[1.0, 1.0]),
            Z,
            num_local_inducing=4,
            local_maxiter=5,
            maxiter=5,
        )

    exclude = FaultPolicy(on_error="exclude")
    dp = DifferentialPrivacy(noise_multiplier=1.1, clip_norm=5.0, weight_bound=10.0, insecure_noise_seed=5)
    return {
        "fsgp_fedavg": (fsgp("fedavg", 0.6), fsgp_data, {"options": RunOptions(eval_every=2)}),
        "fsgp_exact": (fsgp("exact", 1.0), fsgp_data, {"placement": "blocks", "threads": True}),
        # sampling over a fixed-point broadcast (the mean's state stops changing after round 0): under masking a
        # client refuses the same broadcast for a second cohort (threat model), so this parity job runs plain
        "toy_mean": (
            lambda: DeviceMean(3, client_fraction=0.75),
            toy,
            {"protection": Protection(secure_aggregation=False)},
        ),
        "toy_collect": (lambda: CollectedMean(2), toy, {"placement": "blocks"}),
        "toy_nan": (lambda: Faulty(2, "nan", bad=("client_1",)), toy, {"options": RunOptions(faults=exclude)}),
        "toy_shape": (lambda: Faulty(2, "shape", bad=("client_2",)), toy, {"options": RunOptions(faults=exclude)}),
        "toy_one_client": (lambda: FederatedMean(2), one, {"protection": Protection(secure_aggregation=False)}),
        "toy_raise": (lambda: Faulty(1, "raise", bad=("client_3",)), toy, {}),
        "toy_secure_dp": (
            lambda: Faulty(2, "nan", bad=("client_1",)),
            toy,
            {
                "options": RunOptions(faults=exclude),
                "protection": Protection(secure_aggregation=True, differential_privacy=dp),
            },
        ),
        "fsgp_exact_secure": (
            fsgp("exact", 1.0),
            fsgp_data,
            {"placement": "blocks", "protection": Protection(secure_aggregation=True)},
        ),
        # OS-random DP noise and sampling: the workers must agree on them (the chief's server secret)
        "toy_dp_os": (
            lambda: FederatedMean(3, client_fraction=0.5),
            toy,
            {"protection": Protection(differential_privacy=DifferentialPrivacy(noise_multiplier=1.0, clip_norm=5.0))},
        ),
        "fedbnr_fedavg": (fedbnr("fedavg"), fsgp_data, {}),
        "fedbnr_kd": (fedbnr("kd"), fsgp_data, {"placement": "blocks"}),
        "pvi_dpo": (pvi("dpo"), fsgp_data, {}),
        "pvi_cpo": (pvi("cpo"), fsgp_data, {}),
        "recycle": (recycle, fsgp_data, {}),
    }


def summarize(result: Any) -> Dict[str, Any]:
    """Everything compared between runtimes, as JSON-able values (no wall times)."""
    import numpy as np

    out: Dict[str, Any] = {
        "history": [{k: v for k, v in entry.items() if k != "seconds"} for entry in result.history],
        "ledger": [list(dataclasses.astuple(e)) for e in result.ledger.entries],
        "metrics": result.metrics,
    }
    if result.privacy is not None:
        out["privacy"] = result.privacy
    state = result.state
    if isinstance(state, dict) and _jsonable(state):  # the toy algorithms: the state is the result
        out["state"] = state
    else:
        if hasattr(state, "params"):
            out["params"] = {k: np.asarray(v).tolist() for k, v in state.params.items()}
        Xs = np.random.default_rng(7).uniform(-4, 4, (11, 2))
        mean, var = result.model.predict_f(Xs)
        out["predict_f"] = [mean.numpy().tolist(), var.numpy().tolist()]
    return out


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except TypeError:
        return False
    return True


def blank_remote(dataset: Any, runtime: Any, worker: int) -> Any:
    """``dataset`` with the clients of other workers' replicas replaced by zeros of the same shape."""
    import numpy as np

    from gpflow_fed.data import FederatedDataset

    K = dataset.num_clients
    clients = [
        (X, Y) if runtime.replica_of(k, K) == worker else (np.zeros_like(X), np.zeros_like(Y))
        for k, (X, Y) in enumerate(dataset.clients)
    ]
    return FederatedDataset(clients, test=dataset.test)


def run_jobs(strategy: Any, names: Any, worker: Any = None) -> Dict[str, Any]:
    """Each named job under ``DistributeRuntime(strategy)``; a ClientUpdateError is recorded as its text.

    :param worker: this process's index under MultiWorkerMirroredStrategy (one replica a worker): the other
        workers' clients are blanked, so a result equal to LocalRuntime's shows they were never read here.
    """
    from gpflow_fed.federated import ClientUpdateError, DistributeRuntime, run

    jobs = build_jobs()
    out: Dict[str, Any] = {"replicas": strategy.num_replicas_in_sync}
    for name in names:
        factory, dataset, kwargs = jobs[name]
        algorithm = factory()
        runtime = DistributeRuntime(strategy, **kwargs)
        if worker is not None:
            dataset = blank_remote(dataset, runtime, worker)
        try:
            result = run(algorithm, dataset, runtime=runtime, seed=3)
        except ClientUpdateError as exc:
            out[name] = {"error": str(exc)}
            continue
        out[name] = summarize(result)
        if hasattr(result.algorithm, "devices"):  # recorded by the run's own bound copy
            out[name]["devices"] = result.algorithm.devices
    return out


def main(argv: Any = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("strategy", choices=("mirrored", "mwms"))
    parser.add_argument("out")
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--ports", default="")
    parser.add_argument("--jobs", nargs="*", default=None, help="only these jobs (default: all of the strategy's)")
    args = parser.parse_args(argv)
    if args.strategy == "mwms":
        workers = [f"127.0.0.1:{p}" for p in args.ports.split(",")]
        os.environ["TF_CONFIG"] = json.dumps(
            {"cluster": {"worker": workers}, "task": {"type": "worker", "index": args.index}}
        )
    import tensorflow as tf

    if args.strategy == "mirrored":
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        names = list(build_jobs())
    else:
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING
        )
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
        names = list(MWMS_JOBS)
    names = names if args.jobs is None else list(args.jobs)
    summary = run_jobs(strategy, names, worker=args.index if args.strategy == "mwms" else None)
    with open(args.out, "w") as f:
        json.dump(summary, f)


if __name__ == "__main__":
    sys.exit(main())
