"""``gpflow-fed pvi``: federated sparse GP by PVI (DPO, CPO, fixed-Z, FedAvg-Z or global VI) on a dataset or
your own CSV; prints test RMSE, NLPD and 90 % coverage in the target's units beside predicting the mean, writes
TensorBoard events and pvi.png under --logdir and the model (raw inputs in, target units out) to --save.
Defaults are those of gpflow_fed.fit(method="pvi")."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..fitting import DEFAULTS as FIT_DEFAULTS
from .datasets import KNOWN, check_dataset
from .options import add_run_arguments, non_negative_int, positive_int, refuse_ignored, resolve
from .options import add_run_option_arguments, run_options
from .own_data import add_own_data_arguments, check_federation, check_own_data_arguments, own_dataset
from .options import standardized as _standardized

_PVI = FIT_DEFAULTS["pvi"]
DEFAULTS = dict(rounds=_PVI["rounds"], inducing=_PVI["num_inducing"], local_steps=_PVI["local_steps"], max_points=0)
QUICK = dict(rounds=6, inducing=8, local_steps=50, max_points=300)
METHODS = ["dpo", "cpo", "fixed", "fedavg", "global"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``pvi`` subcommand."""
    parser = subparsers.add_parser("pvi", help="PVI for sparse GPs with q(Z) and DPO factors", description=__doc__)
    parser.add_argument(
        "--dataset",
        default=None,
        choices=KNOWN,
        help="'toy' (the paper's five-partition task, default) or a real dataset of `gpflow-fed datasets`",
    )
    parser.add_argument("--method", default="dpo", choices=METHODS)
    parser.add_argument(
        "--clients",
        type=positive_int,
        default=None,
        help="K for real datasets (iid clients; regional for ozone; default 10)",
    )
    d, q = DEFAULTS, QUICK
    parser.add_argument(
        "--max-points",
        type=non_negative_int,
        default=None,
        help=f"random subset of a real dataset, 0: all (default {d['max_points']}; --quick {q['max_points']})",
    )
    parser.add_argument(
        "--rounds",
        type=positive_int,
        default=None,
        help=f"communications, one client update each (default {d['rounds']}; --quick {q['rounds']})",
    )
    parser.add_argument(
        "--inducing",
        "-M",
        type=positive_int,
        default=None,
        help=f"M (default {d['inducing']}; --quick {q['inducing']})",
    )
    parser.add_argument(
        "--local-steps",
        type=positive_int,
        default=None,
        help=f"optimizer steps per client update (default {d['local_steps']}; --quick {q['local_steps']})",
    )
    add_run_arguments(parser, "runs/pvi", "pvi.png", quick_cpu=16)
    add_run_option_arguments(parser)
    add_own_data_arguments(parser)
    parser.set_defaults(func=main, check=check)


def check(args: argparse.Namespace) -> None:
    """Options, dataset and table, before TensorFlow."""
    run_options(args)  # --resume without --checkpoint-dir
    check_own_data_arguments(
        args,
        {
            "dataset": "--csv replaces --dataset",
            "clients": "with --csv every party of --party-column is one client",
            "max_points": "--csv uses every row of the table",
        },
    )
    if args.csv is not None:
        check_federation(args, None)
        return
    name = args.dataset or "toy"
    check_dataset("pvi", name)
    if name == "toy":
        own = "the toy task has its own 5 partitions, size and test set"
        refuse_ignored(args, {"clients": own, "max_points": own, "test_fraction": own})
    else:
        refuse_ignored(args, {"test_fraction": "PVI's real-data protocol holds out 10 % (real_split)"})
        check_federation(args, args.clients or 10)


def main(args: argparse.Namespace) -> int:
    """Train one PVI method and report its test metrics."""
    settings = resolve(args, DEFAULTS, QUICK)
    logdir = Path(args.logdir)
    logdir.mkdir(parents=True, exist_ok=True)
    from ..data import FederatedDataset, pvi_five_partition_toy, real_split
    from ..federated import run
    from ..fitting import algorithm
    from ..models import StandardizedModel, save_model
    from ..monitor import federated_monitor, write_scalars
    from ..plotting import plot_run
    from .report import dataset_info, dataset_unit, emit, payload, score_rows

    name = args.dataset or "toy"
    raw = own_dataset(args)
    if raw is None:
        clients = args.clients or 10
        if name == "toy":
            raw = pvi_five_partition_toy(seed=args.seed)
        else:
            raw = real_split(name, args.seed, clients, settings["max_points"], standardize=False)
    dataset, scaler = _standardized(raw)
    if args.method == "global":  # global VI: one client holding the pooled data (the paper's reference)
        dataset = FederatedDataset([dataset.pooled()], test=dataset.test, name=dataset.name)
    pvi = algorithm(
        "pvi", dataset.input_dim, args.seed, variant=args.method, rounds=settings["rounds"],
        num_inducing=settings["inducing"], local_steps=settings["local_steps"],
    )  # fmt: skip
    options = run_options(args, progress=not (args.json or args.no_progress))
    monitor = federated_monitor(str(logdir / f"pvi-{args.method}"))
    result = run(pvi, dataset, options=options, monitor=monitor, seed=args.seed)
    model = StandardizedModel(result.model, scaler)
    label = f"PVI ({args.method})"
    rows, warning = score_rows(
        model, label, raw.test, scaler, int(raw.test[0].shape[0]),
        seconds=float(result.seconds), bytes_sent=int(result.ledger.total_bytes()),
    )  # fmt: skip
    write_scalars(str(logdir / "result"), {k: rows[0][k] for k in ("test_rmse", "test_nlpd")}, step=settings["rounds"])
    plot = plot_run(
        logdir / "pvi.png",
        result.history,
        {label: model},
        raw.test,
        metric="free_energy",
        metric_label="client's local free energy",
        title=f"PVI ({args.method}) on {raw.name}: K={dataset.num_clients}, M={settings['inducing']}",
    )
    saved = save_model(model, args.save or logdir / "model.npz")
    settings.update(dataset=raw.name, method=args.method, seed=args.seed, clients=dataset.num_clients)
    if args.csv is not None or name == "toy":
        settings.pop("max_points")  # it applies to real datasets only
    info = dataset_info(
        raw, features=list(args.table.features) if args.table else None, target=args.target,
        unit=None if args.csv is not None else dataset_unit(name),
    )  # fmt: skip
    report = payload(
        "pvi",
        info,
        settings,
        rows,
        [warning] if warning else [],
        {"logdir": str(logdir), "plot": str(plot), "model": str(saved)},
    )
    emit(
        args.json, report, f"{raw!r}\nmetrics in {info['units']} (std.: standardised)",
        f"TensorBoard: tensorboard --logdir {logdir}    plot: {plot}    model: {saved}",
    )  # fmt: skip
    return 0
