"""``gpflow-fed pvi``: federated sparse GP by PVI (DPO, CPO, fixed-Z, FedAvg-Z or global VI) on a dataset or
your own CSV; prints test_rmse and test_nlpd (standardised units), writes TensorBoard events and pvi.png
under --logdir."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .own_data import add_own_data_arguments, own_dataset

DEFAULTS = dict(rounds=20, inducing=20, local_steps=500, max_points=0)
QUICK = dict(rounds=6, inducing=8, local_steps=50, max_points=300)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``pvi`` subcommand."""
    parser = subparsers.add_parser("pvi", help="PVI for sparse GPs with q(Z) and DPO factors", description=__doc__)
    parser.add_argument(
        "--dataset", default="toy", help="'toy' (five-partition task) or a name from `gpflow-fed datasets`"
    )
    parser.add_argument("--method", default="dpo", choices=["dpo", "cpo", "fixed", "fedavg", "global"])
    parser.add_argument("--clients", type=int, default=10, help="K for real datasets (iid clients; regional for ozone)")
    d, q = DEFAULTS, QUICK
    parser.add_argument(
        "--max-points",
        type=int,
        default=None,
        help=f"random subset of at most this many rows, 0: all (default {d['max_points']}; --quick {q['max_points']})",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help=f"communications, one client update each (default {d['rounds']}; --quick {q['rounds']})",
    )
    parser.add_argument(
        "--inducing", "-M", type=int, default=None, help=f"M (default {d['inducing']}; --quick {q['inducing']})"
    )
    parser.add_argument(
        "--local-steps",
        type=int,
        default=None,
        help=f"optimizer steps per client update (default {d['local_steps']}; --quick {q['local_steps']})",
    )
    parser.add_argument("--test-fraction", type=float, default=0.2, help="held-out rows of each party (--csv only)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--logdir", default="runs/pvi", help="TensorBoard events and pvi.png go here")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--quick", action="store_true", help="tiny settings for a smoke test (seconds)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    add_own_data_arguments(parser)
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Train one PVI method and report its test metrics."""
    settings = {
        k: getattr(args, k) if getattr(args, k) is not None else (QUICK if args.quick else DEFAULTS)[k]
        for k in DEFAULTS
    }
    if settings["rounds"] < 1 or settings["inducing"] < 1 or args.clients < 1 or settings["max_points"] < 0:
        raise ValueError("--rounds, --inducing and --clients must be ≥ 1 and --max-points ≥ 0")
    if settings["local_steps"] < 1:
        raise ValueError(f"--local-steps must be ≥ 1, got {settings['local_steps']}")
    logdir = Path(args.logdir)
    logdir.mkdir(parents=True, exist_ok=True)
    from ..data import FederatedDataset, pvi_five_partition_toy, real_split
    from ..federated import LocalRuntime, run
    from ..federated.algorithms.pvi.methods import make_pvi
    from ..monitor import federated_monitor, write_scalars
    from ..plotting import plot_run

    own = own_dataset(args, args.test_fraction, args.seed)
    if own is not None:
        dataset = own.standardized()[0]
    elif args.dataset == "toy":
        dataset = pvi_five_partition_toy(seed=args.seed).standardized()[0]
    else:
        dataset = real_split(args.dataset, args.seed, args.clients, settings["max_points"])
    if dataset.test is None:
        raise ValueError("PVI needs a test set to report metrics; use --test-fraction > 0")
    if args.method == "global":  # global VI: one client holding the pooled data (the paper's reference)
        dataset = FederatedDataset([dataset.pooled()], test=dataset.test, name=dataset.name)
    algorithm = make_pvi(
        args.method,
        dataset.input_dim,
        settings["rounds"],
        settings["inducing"],
        args.seed,
        local_steps=settings["local_steps"],
    )
    runtime = LocalRuntime(progress=not (args.json or args.no_progress))
    monitor = federated_monitor(str(logdir / f"pvi-{args.method}"))
    result = run(algorithm, dataset, runtime=runtime, monitor=monitor, seed=args.seed)
    metrics = {k: float(result.metrics[k]) for k in ("test_rmse", "test_nlpd")}
    write_scalars(str(logdir / "result"), metrics, step=settings["rounds"])
    plot = plot_run(
        logdir / "pvi.png",
        result.history,
        {f"PVI ({args.method})": result.model},
        dataset.test,
        metric="free_energy",
        metric_label="client's local free energy",
        title=f"PVI ({args.method}) on {dataset.name}: K={dataset.num_clients}, "
        f"M={settings['inducing']}, standardised units",
    )
    payload = {
        "dataset": dataset.name,
        "method": args.method,
        "settings": settings,
        **metrics,
        "seconds": float(result.seconds),
        "bytes_sent": int(result.ledger.total_bytes()),
        "logdir": str(logdir),
        "plot": str(plot),
    }
    if args.json:
        print(json.dumps(payload, indent=2))
    else:
        print(f"{dataset!r}; metrics in standardised units")
        print("| method | test RMSE | test NLPD | time (s) | bytes sent |\n|---|---:|---:|---:|---:|")
        print(
            f"| PVI ({args.method}) | {metrics['test_rmse']:.4f} | {metrics['test_nlpd']:.4f} | "
            f"{payload['seconds']:.2f} | {payload['bytes_sent']:,} |"
        )
        print(f"TensorBoard: tensorboard --logdir {logdir}    plot: {plot}")
    return 0
