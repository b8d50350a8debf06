"""``gpflow-fed fedbnr``: train FedBNR (or FedBNR-KD) on a real dataset split as in the thesis, or on your own
CSV (one client per party), and print the global model's test_rmse, test_nlpd and calibration (standardised
units) and the bytes each phase sent; TensorBoard events and fedbnr.png go to --logdir.

Example: gpflow-fed fedbnr --dataset diabetes --clients 10 --rounds 20 --aggregation kd --alpha 1
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Dict

from .own_data import add_own_data_arguments, own_dataset

DEFAULTS = dict(rounds=20, local_steps=20, num_samples=50, hidden=50)
QUICK = dict(rounds=3, local_steps=5, num_samples=10, hidden=10)


def register(subparsers: Any) -> None:
    """Add the ``fedbnr`` subcommand."""
    p = subparsers.add_parser(
        "fedbnr", help="FedBNR: a global federated GP with a (deep) URK kernel", description=__doc__
    )
    d, q = DEFAULTS, QUICK
    p.add_argument("--dataset", default="diabetes", help="a name of `gpflow-fed datasets`")
    p.add_argument("--clients", type=int, default=10, help="K clients, two sorted chunks each")
    p.add_argument(
        "--rounds",
        type=int,
        default=None,
        help=f"phase-1 rounds, 0: phase 2 only (default {d['rounds']}; --quick {q['rounds']})",
    )
    p.add_argument(
        "--local-steps",
        type=int,
        default=None,
        help=f"Adam steps per client per round (default {d['local_steps']}; --quick {q['local_steps']})",
    )
    p.add_argument("--learning-rate", type=float, default=0.01)
    p.add_argument(
        "--num-samples",
        type=int,
        default=None,
        help=f"m random samples of the URK, L = 2m features (default {d['num_samples']}; --quick {q['num_samples']})",
    )
    p.add_argument(
        "--hidden",
        type=int,
        default=None,
        help=f"width of the extractor's hidden layer (default {d['hidden']}; --quick {q['hidden']})",
    )
    p.add_argument("--aggregation", choices=("fedavg", "kd"), default="fedavg")
    p.add_argument("--alpha", type=float, default=1.0, help="α of the distillation loss (eq. 3.4)")
    p.add_argument("--protocol", choices=("statistics", "two_step"), default="statistics")
    p.add_argument("--test-fraction", type=float, default=0.2, help="held-out rows of each party (--csv only)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--logdir", default="runs/fedbnr", help="TensorBoard events and fedbnr.png go here")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--quick", action="store_true", help="tiny settings for a smoke test (seconds)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    add_own_data_arguments(p)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    settings = {
        k: getattr(args, k) if getattr(args, k) is not None else (QUICK if args.quick else DEFAULTS)[k]
        for k in DEFAULTS
    }
    if args.clients < 1 or settings["rounds"] < 0 or settings["local_steps"] < 1:
        raise ValueError("--clients and --local-steps must be ≥ 1 and --rounds ≥ 0")
    if args.csv is not None and args.aggregation == "kd":
        raise ValueError(
            "--aggregation kd needs server-side distillation data, which --csv does not provide; "
            "use --aggregation fedavg"
        )
    logdir = Path(args.logdir)
    logdir.mkdir(parents=True, exist_ok=True)
    import numpy as np

    from .. import metrics
    from ..data import fedbnr_real_task, load_dataset
    from ..federated import LocalRuntime, run
    from ..federated.algorithms import FedBNR
    from ..kernels import deep_urk
    from ..monitor import federated_monitor, write_scalars
    from ..plotting import plot_run

    own = own_dataset(args, args.test_fraction, args.seed)
    distillation, header = None, ""
    if own is not None:
        if own.test is None:
            raise ValueError("FedBNR needs a test set to report metrics; use --test-fraction > 0")
        dataset = own.standardized()[0]
    else:
        real = load_dataset(args.dataset)
        task = fedbnr_real_task(real.X, real.Y, args.clients, seed=args.seed, name=args.dataset)
        dataset, distillation = task.dataset, task.distillation
        header = f"; sorted by feature {task.feature} (corr {task.correlation:+.3f})"
    kernel = deep_urk(
        dataset.input_dim, hidden=(settings["hidden"],), num_samples=settings["num_samples"], seed=args.seed
    )
    algorithm = FedBNR(
        kernel, noise_variance=0.5, prior_variance=1.0, rounds=settings["rounds"], local_steps=settings["local_steps"],
        aggregation=args.aggregation, distillation_data=distillation if args.aggregation == "kd" else None,
        alpha=args.alpha, learning_rate=args.learning_rate, protocol=args.protocol,
    )  # fmt: skip
    runtime = LocalRuntime(progress=not (args.json or args.no_progress))
    result = run(algorithm, dataset, runtime=runtime, monitor=federated_monitor(str(logdir / "fedbnr")), seed=args.seed)
    X_test, Y_test = dataset.test
    mean, var = (t.numpy() for t in result.model.predict_y(X_test))
    ece, mce = metrics.calibration_errors(Y_test, mean, var)
    values: Dict[str, float] = {
        "test_rmse": metrics.rmse(Y_test, mean),
        "test_nlpd": metrics.nlpd(Y_test, mean, var),
        "test_ece": ece,
        "test_mce": mce,
        "seconds": float(result.seconds),
    }
    write_scalars(str(logdir / "result"), values, step=settings["rounds"])
    curve = "neg_log_marginal_likelihood_per_point"
    plot = None
    if any(curve in h for h in result.history):
        plot = str(
            plot_run(
                logdir / "fedbnr.png",
                result.history,
                {f"FedBNR ({args.aggregation})": result.model},
                dataset.test,
                metric=curve,
                metric_label="negative log marginal likelihood per point",
                title=f"FedBNR on {dataset.name}: K={dataset.num_clients}, standardised units",
            )
        )
    bytes_up, shapes = {}, {}
    for phase in ("kernel", "scatter", "weights"):
        up = result.ledger.select(direction="up", phase=phase)
        if up:
            bytes_up[phase] = int(sum(e.nbytes for e in up))
            shapes[phase] = sorted({tuple(s for s in e.shapes) for e in up})[0]
    if args.json:
        print(
            json.dumps(
                {
                    "dataset": dataset.name,
                    "settings": settings,
                    **values,
                    "bytes_up": bytes_up,
                    "logdir": str(logdir),
                    "plot": plot,
                },
                indent=2,
            )
        )
    else:
        print(f"{dataset!r}{header}; metrics in standardised units")
        print("| metric | value |\n|---|---|")
        for name, value in values.items():
            print(f"| {name} | {value:.4f} |")
        for phase, nbytes in bytes_up.items():
            print(f"| bytes up, phase {phase} | {nbytes} (shapes {shapes[phase]}) |")
        print(f"TensorBoard: tensorboard --logdir {logdir}    plot: {plot}")
    return 0 if np.isfinite(mean).all() else 1
