"""``gpflow-fed fedbnr``: train FedBNR (or FedBNR-KD) on a real dataset split as in the thesis and print the
global model's test metrics and the bytes each phase sent.

Example: ``gpflow-fed fedbnr --dataset diabetes --clients 10 --rounds 20 --aggregation kd --alpha 1``.
"""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    """Add the ``fedbnr`` subcommand."""
    p = subparsers.add_parser("fedbnr", help="FedBNR: a global federated GP with a (deep) URK kernel", description=__doc__)
    p.add_argument("--dataset", default="diabetes", help="a name of `gpflow-fed datasets` (default: diabetes)")
    p.add_argument("--clients", type=int, default=10, help="K clients, two sorted chunks each (default 10)")
    p.add_argument("--rounds", type=int, default=20, help="phase-1 rounds (0: phase 2 only)")
    p.add_argument("--local-steps", type=int, default=20, help="Adam steps per client per round")
    p.add_argument("--learning-rate", type=float, default=0.01)
    p.add_argument("--num-samples", type=int, default=50, help="m random samples of the URK (L = 2m features)")
    p.add_argument("--hidden", type=int, default=50, help="width of the extractor's hidden layer")
    p.add_argument("--aggregation", choices=("fedavg", "kd"), default="fedavg")
    p.add_argument("--alpha", type=float, default=1.0, help="α of the distillation loss (eq. 3.4)")
    p.add_argument("--protocol", choices=("statistics", "two_step"), default="statistics")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    import numpy as np

    from .. import metrics
    from ..data import fedbnr_real_task, load_dataset
    from ..federated import run
    from ..federated.algorithms import FedBNR
    from ..kernels import deep_urk

    if args.clients < 1 or args.rounds < 0 or args.local_steps < 1:
        raise ValueError("--clients and --local-steps must be ≥ 1 and --rounds ≥ 0")
    real = load_dataset(args.dataset)
    task = fedbnr_real_task(real.X, real.Y, args.clients, seed=args.seed, name=args.dataset)
    kernel = deep_urk(real.X.shape[1], hidden=(args.hidden,), num_samples=args.num_samples, seed=args.seed)
    algorithm = FedBNR(
        kernel, noise_variance=0.5, prior_variance=1.0, rounds=args.rounds, local_steps=args.local_steps,
        aggregation=args.aggregation, distillation_data=task.distillation if args.aggregation == "kd" else None,
        alpha=args.alpha, learning_rate=args.learning_rate, protocol=args.protocol,
    )
    result = run(algorithm, task.dataset, seed=args.seed)
    X_test, Y_test = task.dataset.test
    mean, var = (t.numpy() for t in result.model.predict_y(X_test))
    ece, mce = metrics.calibration_errors(Y_test, mean, var)
    print(f"{task.dataset!r}; sorted by feature {task.feature} (corr {task.correlation:+.3f})")
    print("| metric | value |\n|---|---|")
    for name, value in [("test RMSE (standardised)", metrics.rmse(Y_test, mean)), ("test NLPD", metrics.nlpd(Y_test, mean, var)),
                        ("ECE", ece), ("MCE", mce), ("seconds", result.seconds)]:
        print(f"| {name} | {value:.4f} |")
    for phase in ("kernel", "scatter", "weights"):
        up = result.ledger.select(direction="up", phase=phase)
        if up:
            sizes = sorted({tuple(s for s in e.shapes) for e in up})
            print(f"| bytes up, phase {phase} | {sum(e.nbytes for e in up)} (shapes {sizes[0]}) |")
    return 0 if np.isfinite(mean).all() else 1
