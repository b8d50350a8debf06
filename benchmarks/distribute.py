"""tf.distribute benchmark: FSGP per-round time under LocalRuntime and DistributeRuntime, side by side.

The CPU is split into ``--devices`` logical devices (before TensorFlow initialises them) and a
``MirroredStrategy`` over them runs the same FSGP job as ``LocalRuntime``: sequentially (``threads=False``),
and with one thread per replica (``threads=True``); a ``OneDeviceStrategy`` row separates the runtime's own
overhead from the cost of spreading clients over devices. Where TensorFlow sees a GPU, ``OneDeviceStrategy``
on the first GPU (and a ``MirroredStrategy`` over all GPUs when there are several) are added, so the GPU vs
CPU throughput comes from the same run. Each configuration runs ``--repeats`` times,
interleaved, and the table gives the median seconds per round (rounds after the first, so tracing is left
out), the ratio to LocalRuntime measured in the same run, and the largest relative difference of the
predictive mean from LocalRuntime's.

Usage: ``python benchmarks/distribute.py [--quick] [--clients K] [--points N_k] [--inducing M] [--rounds R]
[--local-steps P] [--mode fedavg|exact] [--devices R] [--repeats n]``.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Dict, List

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(argv: Any = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few seconds: K=4, N_k=100, M=10, R=3")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--points", type=int, default=400)
    parser.add_argument("--inducing", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--local-steps", type=int, default=20)
    parser.add_argument("--mode", choices=("fedavg", "exact"), default="fedavg")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick:
        args.clients, args.points, args.inducing, args.rounds, args.repeats = 4, 100, 10, 3, 1
    if args.devices < 1 or args.rounds < 2 or args.repeats < 1:
        raise ValueError("--devices and --repeats must be ≥ 1 and --rounds ≥ 2 (the first round is not timed)")

    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * args.devices)

    import gpflow
    import numpy as np

    from gpflow_fed.data import FederatedDataset
    from gpflow_fed.federated import DistributeRuntime, LocalRuntime, Protection, run
    from gpflow_fed.federated.algorithms import FSGP

    rng = np.random.default_rng(args.seed)
    K, N_k, M = args.clients, args.points, args.inducing
    X = rng.uniform(-3, 3, (K * N_k, 2))
    Y = np.sin(2 * X[:, :1]) * np.cos(X[:, 1:]) + 0.1 * rng.normal(size=(K * N_k, 1))
    dataset = FederatedDataset([(X[k * N_k : (k + 1) * N_k], Y[k * N_k : (k + 1) * N_k]) for k in range(K)])
    Z = X[rng.choice(len(X), M, replace=False)]
    Xs = rng.uniform(-3, 3, (200, 2))
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(args.devices)])
    one_device = tf.distribute.OneDeviceStrategy("/cpu:0")
    runtimes = {
        "LocalRuntime": lambda: LocalRuntime(protection=Protection(secure_aggregation=False)),
        "DistributeRuntime, OneDeviceStrategy (CPU:0)": lambda: DistributeRuntime(
            one_device, protection=Protection(secure_aggregation=False)
        ),
        f"DistributeRuntime, MirroredStrategy ({args.devices} CPUs)": lambda: DistributeRuntime(
            strategy, protection=Protection(secure_aggregation=False)
        ),
        f"DistributeRuntime, MirroredStrategy ({args.devices} CPUs), threads": lambda: DistributeRuntime(
            strategy, threads=True, protection=Protection(secure_aggregation=False)
        ),
    }
    gpus = [f"/gpu:{i}" for i, _ in enumerate(tf.config.list_logical_devices("GPU"))]
    if gpus:
        on_gpu = tf.distribute.OneDeviceStrategy(gpus[0])
        runtimes["DistributeRuntime, OneDeviceStrategy (GPU:0)"] = lambda: DistributeRuntime(
            on_gpu, protection=Protection(secure_aggregation=False)
        )
    if len(gpus) > 1:
        all_gpus = tf.distribute.MirroredStrategy(gpus)
        runtimes[f"DistributeRuntime, MirroredStrategy ({len(gpus)} GPUs)"] = lambda: DistributeRuntime(
            all_gpus, protection=Protection(secure_aggregation=False)
        )

    def job() -> FSGP:
        kernel = gpflow.kernels.SquaredExponential(lengthscales=[1.0, 1.0])
        return FSGP(
            kernel, Z, 0.1, rounds=args.rounds, local_steps=args.local_steps, learning_rate=0.05, mode=args.mode
        )

    seconds: Dict[str, List[float]] = {name: [] for name in runtimes}
    means: Dict[str, np.ndarray] = {}
    for _ in range(args.repeats):
        for name, make in runtimes.items():
            result = run(job(), dataset, runtime=make(), seed=args.seed)
            seconds[name].extend(entry["seconds"] for entry in result.history[1:])
            means[name] = result.model.predict_f(Xs)[0].numpy()

    reference = float(np.median(seconds["LocalRuntime"]))
    print(
        f"FSGP {args.mode}: K={K}, N_k={N_k}, M={M}, P={args.local_steps}, {args.rounds} rounds × {args.repeats} "
        "repeats"
    )
    print()
    print("| runtime | s / round (median) | ratio to LocalRuntime | max rel. diff. of predictive mean |")
    print("|---|---|---|---|")
    scale = np.max(np.abs(means["LocalRuntime"]))
    for name in runtimes:
        per_round = float(np.median(seconds[name]))
        diff = float(np.max(np.abs(means[name] - means["LocalRuntime"])) / scale)
        print(f"| {name} | {per_round:.4f} | {per_round / reference:.2f} | {diff:.1e} |")


if __name__ == "__main__":
    sys.exit(main())
