"""``gpflow-fed fedbnr``: train FedBNR (or FedBNR-KD) on a real dataset split as in the thesis, or on your own
CSV (one client per party), and print the global model's test RMSE, NLPD, 90 % coverage (target units) and
calibration (ECE, MCE) beside predicting the mean, and the bytes each phase sent; TensorBoard events and
fedbnr.png go to --logdir, the model (raw inputs in, target units out) to --save. Defaults are those of
gpflow_fed.fit(method="fedbnr").

Example: gpflow-fed fedbnr --dataset diabetes --clients 10 --rounds 20 --aggregation kd --alpha 1
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Dict

from ..fitting import DEFAULTS as FIT_DEFAULTS
from .datasets import KNOWN, check_dataset
from .options import add_run_arguments, non_negative_float, non_negative_int, positive_float, positive_int
from .options import add_run_option_arguments, refuse_ignored, resolve, run_options
from .own_data import add_own_data_arguments, check_federation, check_own_data_arguments, own_dataset
from .options import standardized as _standardized

_FEDBNR = FIT_DEFAULTS["fedbnr"]
DEFAULTS = {k: _FEDBNR[k] for k in ("rounds", "local_steps", "num_samples", "hidden", "learning_rate")}
QUICK = dict(rounds=3, local_steps=5, num_samples=10, hidden=10)


def register(subparsers: Any) -> None:
    """Add the ``fedbnr`` subcommand."""
    p = subparsers.add_parser(
        "fedbnr", help="FedBNR: a global federated GP with a (deep) URK kernel", description=__doc__
    )
    d, q = DEFAULTS, QUICK
    p.add_argument(
        "--dataset", default=None, choices=KNOWN, help="a dataset of `gpflow-fed datasets` (default diabetes)"
    )
    p.add_argument("--clients", type=positive_int, default=None, help="K clients, two sorted chunks each (default 10)")
    p.add_argument(
        "--rounds",
        type=non_negative_int,
        default=None,
        help=f"phase-1 rounds, 0: phase 2 only (default {d['rounds']}; --quick {q['rounds']})",
    )
    p.add_argument(
        "--local-steps",
        type=positive_int,
        default=None,
        help=f"Adam steps per client per round (default {d['local_steps']}; --quick {q['local_steps']})",
    )
    p.add_argument("--learning-rate", type=positive_float, default=None, help=f"Adam λ (default {d['learning_rate']})")
    p.add_argument(
        "--num-samples",
        type=positive_int,
        default=None,
        help=f"m random samples of the URK, L = 2m features (default {d['num_samples']}; --quick {q['num_samples']})",
    )
    p.add_argument(
        "--hidden",
        type=positive_int,
        default=None,
        help=f"width of the extractor's hidden layer (default {d['hidden']}; --quick {q['hidden']})",
    )
    p.add_argument("--aggregation", choices=("fedavg", "kd"), default="fedavg")
    p.add_argument(
        "--alpha", type=non_negative_float, default=None, help="α of the distillation loss (eq. 3.4; default 1)"
    )
    p.add_argument("--protocol", choices=("statistics", "two_step"), default="statistics")
    add_run_arguments(p, "runs/fedbnr", "fedbnr.png", quick_cpu=11)
    add_run_option_arguments(p)
    add_own_data_arguments(p)
    p.set_defaults(func=_run, check=check)


def check(args: argparse.Namespace) -> None:
    """Options, dataset and table, before TensorFlow."""
    run_options(args)  # --resume without --checkpoint-dir
    check_own_data_arguments(
        args,
        {"dataset": "--csv replaces --dataset", "clients": "with --csv every party of --party-column is one client"},
    )
    if args.csv is not None and args.aggregation == "kd":
        raise ValueError(
            "--aggregation kd needs server-side distillation data, which --csv does not provide; "
            "use --aggregation fedavg"
        )
    if args.aggregation != "kd":
        refuse_ignored(args, {"alpha": "α weighs the distillation loss of --aggregation kd"})
    if args.csv is None:
        check_dataset("fedbnr", args.dataset or "diabetes")
        refuse_ignored(args, {"test_fraction": "the thesis' protocol holds out 10 % of a dataset"})
    check_federation(args, None if args.csv is not None else args.clients or 10)


def _run(args: argparse.Namespace) -> int:
    settings = resolve(args, DEFAULTS, QUICK)
    logdir = Path(args.logdir)
    logdir.mkdir(parents=True, exist_ok=True)
    import numpy as np

    from .. import metrics
    from ..data import FederatedDataset, fedbnr_real_task
    from ..federated import run
    from ..fitting import algorithm
    from ..models import StandardizedModel, save_model
    from ..monitor import federated_monitor, write_scalars
    from ..plotting import plot_run
    from .datasets import load_arrays
    from .report import dataset_info, dataset_unit, emit, payload, score_rows

    raw = own_dataset(args)
    distillation, header = None, ""
    if raw is not None:
        if raw.test is None:
            raise ValueError("FedBNR needs a test set to report metrics; use --test-fraction > 0")
        dataset, scaler = _standardized(raw)
    else:
        name = args.dataset or "diabetes"
        X, Y, _, _ = load_arrays(name, args.seed)
        task = fedbnr_real_task(X, Y, args.clients or 10, seed=args.seed, name=name)
        dataset, distillation, scaler = task.dataset, task.distillation, task.standardizer
        raw = FederatedDataset(
            [(x * scaler.X_std + scaler.X_mean, scaler.inverse_transform(y)) for x, y in dataset.clients],
            test=(dataset.test[0] * scaler.X_std + scaler.X_mean, scaler.inverse_transform(dataset.test[1])),
            name=name,
        )
        header = f"; sorted by feature {task.feature} (corr {task.correlation:+.3f})"
    fedbnr = algorithm(
        "fedbnr", dataset.input_dim, args.seed, rounds=settings["rounds"], local_steps=settings["local_steps"],
        hidden=settings["hidden"], num_samples=settings["num_samples"], learning_rate=settings["learning_rate"],
        aggregation=args.aggregation, distillation_data=distillation if args.aggregation == "kd" else None,
        alpha=1.0 if args.alpha is None else args.alpha, protocol=args.protocol,
    )  # fmt: skip
    options = run_options(args, progress=not (args.json or args.no_progress))
    result = run(fedbnr, dataset, options=options, monitor=federated_monitor(str(logdir / "fedbnr")), seed=args.seed)
    model = StandardizedModel(result.model, scaler)
    X_test, Y_test = raw.test
    mean, var = (t.numpy() for t in model.predict_y(X_test))
    ece, mce = metrics.calibration_errors(Y_test, mean, var)
    bytes_up: Dict[str, int] = {}
    shapes: Dict[str, Any] = {}
    for phase in ("kernel", "scatter", "weights"):  # with its secure-aggregation stages ("scatter/secagg/…")
        up = [e for e in result.ledger.select(direction="up") if e.phase.split("/")[0] == phase]
        masked = [e for e in up if e.phase.endswith("/secagg/masked_input")]
        if up:
            bytes_up[phase] = int(sum(e.nbytes for e in up))
            shapes[phase] = [list(s) for s in sorted({tuple(s for s in e.shapes) for e in masked or up})[0]]
    label = f"FedBNR ({args.aggregation})"
    rows, warning = score_rows(
        model, label, raw.test, scaler, int(X_test.shape[0]), test_ece=ece, test_mce=mce,
        seconds=float(result.seconds), bytes_sent=int(result.ledger.total_bytes()), bytes_up_by_phase=bytes_up,
        shapes_by_phase=shapes,
    )  # fmt: skip
    write_scalars(str(logdir / "result"), {k: rows[0][k] for k in ("test_rmse", "test_nlpd")}, step=settings["rounds"])
    curve = "neg_log_marginal_likelihood_per_point"
    plot = None
    if any(curve in h for h in result.history):
        plot = str(
            plot_run(
                logdir / "fedbnr.png", result.history, {label: model}, raw.test, metric=curve,
                metric_label="negative log marginal likelihood per point",
                title=f"FedBNR on {raw.name}: K={dataset.num_clients}",
            )
        )  # fmt: skip
    saved = save_model(model, args.save or logdir / "model.npz")
    settings.update(dataset=raw.name, clients=dataset.num_clients, aggregation=args.aggregation,
                    protocol=args.protocol, seed=args.seed)  # fmt: skip
    features = list(args.table.features) if args.table is not None else None
    unit = None if args.csv is not None else dataset_unit(args.dataset or "diabetes")
    info = dataset_info(raw, features=features, target=args.target, unit=unit)
    report = payload(
        "fedbnr", info, settings, rows,
        [warning] if warning else [], {"logdir": str(logdir), "plot": plot, "model": str(saved)},
    )  # fmt: skip
    lines = [f"| bytes up, phase {p} | {n} (shapes {shapes[p]}) |" for p, n in bytes_up.items()]
    footer = "\n".join(
        [f"test ECE {ece:.4f}, MCE {mce:.4f}", "| phase | bytes up |", "|---|---|", *lines,
         f"TensorBoard: tensorboard --logdir {logdir}    plot: {plot}    model: {saved}"]
    )  # fmt: skip
    emit(args.json, report, f"{raw!r}{header}\nmetrics in {info['units']} (std.: standardised)", footer)
    return 0 if np.isfinite(mean).all() else 1
