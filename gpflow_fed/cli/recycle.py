"""``gpflow-fed recycle``: Recyclable GPs — fit local SVGPs, then the ensemble of them without the data.

* ``gpflow-fed recycle --csv FILE --party-column COL --target COL`` does it in one step: one SVGP per party
  (standardised with moments agreed across the parties), the ensemble (EnsembleSVGP) over them, test metrics in
  the target's units beside predicting the mean, and the ensemble saved as one model (raw inputs in, target units
  out; ``--save``); ``--dataset toy|10k`` instead of ``--csv`` runs the paper's generated tasks.
* ``gpflow-fed recycle locals ... --out models.npz`` fits one SVGP per task of a generated dataset (toy: toy
  concatenation; 10k: 50 segments × 200 points), or per party of your own CSV (``--csv``; the agreed moments are
  saved next to the models as ``<out>.standardizer.json``), and saves them (no data inside);
* ``gpflow-fed recycle ensemble models.npz --inducing 35 --out ensemble.npz [--evaluate toy | --csv ...]``
  later, in another process and without the data, loads the dictionary, fits the ensemble and saves it as a
  one-model dictionary (so it can be recycled again: pyramids); --evaluate (or the held-out rows of --csv, same
  --seed and --test-fraction) gives the test metrics, and --save the model.

Every form prints the commands' common JSON layout (--json) or a table like the other commands' (time, bytes
sent: the local models' arrays q_mu, q_sqrt and Z, what leaves the parties; the model's path under it), and
writes TensorBoard scalars and a PNG under --logdir. Local models are named by party (with --csv) or task_k.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from .datasets import KNOWN, RECYCLABLE, check_dataset
from .options import add_run_arguments, non_negative_int, positive_float, positive_int, refuse_ignored
from .own_data import add_own_data_arguments, check_federation, check_own_data_arguments, own_dataset
from .options import standardized as _standardized

QUICK_MAXITER = 30
QUICK_POINTS = 100
MAXITER = 200
LOCAL_INDUCING = 15
ENSEMBLE_INDUCING = 35


def _dataset(name: str, seed: int, points: int = 0) -> Any:
    from ..data import distributed_segments, toy_concatenation

    if name == "toy":
        return toy_concatenation(seed=seed, num_per_task=points or 500)
    if name == "10k":
        return distributed_segments(seed=seed, num_per_segment=points or 200)
    raise ValueError(f"unknown dataset {name!r}; choose 'toy' or '10k'")


def npz_path(out: str) -> Path:
    """Where ``numpy.savez(out)`` writes: ``out`` with ``.npz`` appended when missing; parents are created."""
    path = Path(out)
    if path.suffix != ".npz":
        path = path.with_name(path.name + ".npz")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _standardizer_path(models: Path) -> Path:
    return models.with_name(models.stem + ".standardizer.json")


def _maxiter(args: argparse.Namespace) -> int:
    return args.maxiter if args.maxiter is not None else QUICK_MAXITER if args.quick else MAXITER


def _inducing_inputs(X: Any, M: int, seed: int) -> Any:
    """M inputs of one party: a grid for 1-D inputs, otherwise a random subset of its own rows (local data: a
    local model never leaves its party with rows inside it; only its own fitted posterior does)."""
    import numpy as np

    if X.shape[1] == 1:
        return np.linspace(X.min(), X.max(), M)[:, None]
    rows = np.random.default_rng(seed).choice(X.shape[0], size=min(M, X.shape[0]), replace=False)
    return X[np.sort(rows)]


def _plot(path: Path, models: Dict[str, Any], X: Any, Y: Any, *, title: str) -> str:
    from ..plotting import figure, plot_predictions

    fig = figure(figsize=(7, 4))
    ax = fig.subplots()
    plot_predictions(ax, models, X, Y)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return str(path)


def _data(args: argparse.Namespace) -> Tuple[Any, Any, Optional[Any], List[str]]:
    """``(raw dataset or None, training clients as the local models see them, standardizer or None, names)``."""
    raw = own_dataset(args)
    if raw is not None:
        dataset, scaler = _standardized(raw)
        return raw, dataset, scaler, list(raw.names)
    data = _dataset(args.dataset or "toy", args.seed, args.points or (QUICK_POINTS if args.quick else 0))
    return data, data, None, [f"task_{k}" for k in range(data.num_clients)]


def _model_bytes(model: Any) -> int:
    """What a local model sends: its arrays q_mu, q_sqrt and Z (its kernel's few numbers aside)."""
    return int(model.q_mu.nbytes + model.q_sqrt.nbytes + model.Z.nbytes)


def _fit_locals(
    args: argparse.Namespace, dataset: Any, names: List[str], inducing: int
) -> Tuple[Dict, Dict, Dict, Dict]:
    """One SVGP per client: ``(recyclable models, fitted SVGPs, ELBO per point, seconds)``, keyed by name."""
    import gpflow

    from ..models import LocalSVGPTrainer, export_svgp
    from ..progress import tqdm

    kernel = gpflow.kernels.SquaredExponential(variance=args.variance, lengthscales=args.lengthscale)
    trainer = LocalSVGPTrainer(kernel, gpflow.likelihoods.Gaussian(1.0), maxiter=_maxiter(args))
    models, fitted, bounds, seconds = {}, {}, {}, {}
    pairs = list(zip(names, dataset.clients))
    for name, (X, Y) in tqdm(pairs, desc="recycle locals", disable=args.json or args.no_progress):
        start = time.perf_counter()
        model = trainer.fit(X, Y, _inducing_inputs(X, inducing, args.seed))
        models[name], fitted[name] = export_svgp(model, name=name), model
        seconds[name] = time.perf_counter() - start
        bounds[f"{name}/elbo_per_point"] = float(model.elbo((X, Y)).numpy()) / X.shape[0]
    return models, fitted, bounds, seconds


def _fit_ensemble(args: argparse.Namespace, models: Dict[str, Any], inducing: int) -> Tuple[Any, float, List[str]]:
    """The ensemble over ``models`` (Z_* from the local models' own inducing inputs: no data), its bound and any
    recyclability warnings."""
    import gpflow
    import numpy as np

    from ..models import EnsembleSVGP, RecyclableWarning

    Z_all = np.concatenate([m.Z for m in models.values()])
    if Z_all.shape[1] == 1:
        Z = np.linspace(Z_all.min(), Z_all.max(), inducing)[:, None]
    else:  # the local models' own inducing inputs (no data), thinned to M_*
        rows = np.random.default_rng(args.seed).choice(Z_all.shape[0], min(inducing, Z_all.shape[0]), replace=False)
        Z = Z_all[np.sort(rows)]
    kernel = gpflow.kernels.SquaredExponential(variance=args.variance, lengthscales=args.lengthscale)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RecyclableWarning)
        ensemble = EnsembleSVGP(models, kernel, Z)
    bound = float(ensemble.fit(maxiter=_maxiter(args), method=args.method))
    return ensemble, bound, [str(w.message) for w in caught]


def _evaluate(model: Any, raw_test: Any, scaler: Any, clients: Any) -> Tuple[List[Dict], Optional[str]]:
    """Rows of the ensemble and of predicting the mean (the agreed moments; computed from the clients' summaries
    for generated data, which the models see in its own units)."""
    from ..data.standardize import agreed_standardizer
    from .report import score_rows

    scaler = scaler or agreed_standardizer(clients)
    return score_rows(model, "Recyclable-GP ensemble", raw_test, scaler, int(raw_test[0].shape[0]))


def _finish(args: argparse.Namespace, report: Dict[str, Any], header: str) -> None:
    """Print the report with the other commands' footer: TensorBoard, the plot and the model (or dictionary)."""
    from .report import emit

    outputs = report["outputs"]
    files = [
        f"{label}: {outputs[key]}"
        for key, label in (
            ("plot", "plot"),
            ("model", "model"),
            ("local_models", "local models"),
            ("ensemble", "ensemble"),
        )
        if outputs.get(key)
    ]
    emit(args.json, report, header, "    ".join([f"TensorBoard: tensorboard --logdir {args.logdir}", *files]))


def _one_step(args: argparse.Namespace) -> int:
    """``recycle --csv ...`` / ``recycle --dataset toy``: locals, ensemble, metrics and the model, in one go."""
    from ..models import StandardizedModel, save_recyclable
    from ..models import save_model as save
    from ..monitor import write_scalars
    from .report import dataset_info, payload

    logdir = Path(args.logdir)
    logdir.mkdir(parents=True, exist_ok=True)
    raw, dataset, scaler, names = _data(args)
    start = time.perf_counter()
    models, fitted, bounds, _ = _fit_locals(args, dataset, names, args.local_inducing or LOCAL_INDUCING)
    ensemble, bound, notes = _fit_ensemble(args, models, args.inducing or ENSEMBLE_INDUCING)
    seconds = time.perf_counter() - start
    model = ensemble if scaler is None else StandardizedModel(ensemble, scaler)
    outputs: Dict[str, Any] = {"logdir": str(logdir)}
    if args.out:
        outputs["local_models"] = str(npz_path(args.out))
        save_recyclable(outputs["local_models"], models)
    rows, warning = _evaluate(model, raw.test, scaler, dataset.clients)
    sent = sum(_model_bytes(m) for m in models.values())
    rows[0].update(elbo=bound, local_elbo_per_point=bounds, seconds=float(seconds), bytes_sent=sent)
    rows[1].update(seconds=0.0, bytes_sent=0)
    write_scalars(str(logdir / "ensemble"), {"elbo": bound, **{k: rows[0][k] for k in ("test_rmse", "test_nlpd")}}, 0)
    outputs["plot"] = _plot(
        logdir / "recycle-ensemble.png", {"ensemble": model}, *raw.test,
        title=f"Recyclable-GP ensemble of {len(models)} local models on {raw.name} (test set)",
    )  # fmt: skip
    outputs["model"] = str(save(model, args.save or logdir / "model.npz"))
    settings = {
        "dataset": raw.name, "local_inducing": args.local_inducing or LOCAL_INDUCING,
        "inducing": args.inducing or ENSEMBLE_INDUCING, "maxiter": _maxiter(args), "method": args.method,
        "seed": args.seed,
    }  # fmt: skip
    features = list(args.table.features) if args.table is not None else None
    info = dataset_info(raw, features=features, target=args.target)
    report = payload("recycle", info, settings, rows, [*notes, *([warning] if warning else [])], outputs)
    units = info["units"]
    _finish(args, report, f"{raw!r}\n{len(models)} local models ({', '.join(names[:8])}); metrics in {units}")
    return 0


def _locals(args: argparse.Namespace) -> int:
    out = npz_path(args.out)
    logdir = Path(args.logdir)
    logdir.mkdir(parents=True, exist_ok=True)
    import numpy as np

    from ..models import save_recyclable
    from ..monitor import write_scalars
    from .report import dataset_info, payload

    raw, dataset, scaler, names = _data(args)
    models, fitted, bounds, seconds = _fit_locals(args, dataset, names, args.inducing)
    save_recyclable(out, models)
    outputs: Dict[str, Any] = {"local_models": str(out), "logdir": str(logdir)}
    if scaler is not None:
        _standardizer_path(out).write_text(
            json.dumps({k: np.asarray(getattr(scaler, k)).tolist() for k in ("X_mean", "X_std", "Y_mean", "Y_std")})
        )
        outputs["standardizer"] = str(_standardizer_path(out))
    write_scalars(str(logdir / "locals"), bounds, step=0)
    X_all = np.concatenate([X for X, _ in dataset.clients])
    Y_all = np.concatenate([Y for _, Y in dataset.clients])
    shown = dict(list(fitted.items())[:5])
    outputs["plot"] = _plot(
        logdir / "recycle-locals.png", shown, X_all, Y_all,
        title=f"local SVGPs on {raw.name} ({len(shown)} of {len(fitted)} shown"
        + (", standardised units)" if scaler is not None else ")"),
    )  # fmt: skip
    rows = [
        {
            "method": name,
            "elbo_per_point": bounds[f"{name}/elbo_per_point"],
            "seconds": float(seconds[name]),
            "bytes_sent": _model_bytes(models[name]),
        }
        for name in names
    ]
    settings = {"dataset": raw.name, "inducing_per_model": args.inducing, "maxiter": _maxiter(args), "seed": args.seed}
    features = list(args.table.features) if args.table is not None else None
    info = dataset_info(raw, features=features, target=args.target)
    report = payload("recycle locals", info, settings, rows, [], outputs)
    _finish(args, report, f"saved {len(models)} local models ({', '.join(names[:8])}) to {out}")
    return 0


def _saved_standardizer(models_path: Path) -> Any:
    import numpy as np

    from ..data.standardize import Standardizer

    saved = _standardizer_path(models_path)
    if not saved.is_file():
        raise ValueError(f"{saved} not found: the models were not fitted with `recycle locals --csv`")
    from ..untrusted_files import read_json

    try:
        s = {k: np.asarray(v, dtype=float) for k, v in read_json(saved, "standardiser", max_depth=4).items()}
        return Standardizer(s["X_mean"], s["X_std"], s["Y_mean"], s["Y_std"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{saved}: not a standardiser written by `recycle locals --csv` ({exc})") from None


def _ensemble(args: argparse.Namespace) -> int:
    logdir = Path(args.logdir)
    logdir.mkdir(parents=True, exist_ok=True)
    from ..models import StandardizedModel, load_recyclable, save_recyclable
    from ..models import save_model as save
    from ..monitor import write_scalars
    from .report import dataset_info, method_row, payload

    models_path = Path(args.models)
    models = load_recyclable(models_path)
    start = time.perf_counter()
    ensemble, bound, notes = _fit_ensemble(args, models, args.inducing)
    seconds = time.perf_counter() - start
    outputs: Dict[str, Any] = {"logdir": str(logdir)}
    if args.out:
        outputs["ensemble"] = str(npz_path(args.out))
        save_recyclable(outputs["ensemble"], {"ensemble": ensemble.to_recyclable(name="ensemble")})
    raw = own_dataset(args)
    scaler = None
    if raw is not None:
        if raw.test is None:
            raise ValueError("--csv evaluation needs held-out rows; use --test-fraction > 0")
        scaler = _saved_standardizer(models_path)
    elif args.evaluate:
        raw = _dataset(args.evaluate, args.seed)
    model = ensemble if scaler is None else StandardizedModel(ensemble, scaler)
    sent = sum(_model_bytes(m) for m in models.values())
    rows, warning = [method_row("Recyclable-GP ensemble", {"elbo": bound})], None
    if raw is not None:
        rows, warning = _evaluate(model, raw.test, scaler, raw.clients)
        rows[0]["elbo"] = bound
        rows[1].update(seconds=0.0, bytes_sent=0)
        outputs["plot"] = _plot(
            logdir / "recycle-ensemble.png", {"ensemble": model}, *raw.test,
            title=f"Recyclable-GP ensemble of {len(models)} models on {raw.name} (test set)",
        )  # fmt: skip
    rows[0].update(seconds=float(seconds), bytes_sent=sent)
    outputs["model"] = str(save(model, args.save or logdir / "model.npz"))
    write_scalars(str(logdir / "ensemble"), {k: v for k, v in rows[0].items() if isinstance(v, float)}, step=0)
    settings = {"models": len(models), "inducing": args.inducing, "maxiter": _maxiter(args), "method": args.method}
    features = list(args.table.features) if args.table is not None else None
    info = None if raw is None else dataset_info(raw, features=features, target=args.target)
    report = payload("recycle ensemble", info, settings, rows, [*notes, *([warning] if warning else [])], outputs)
    _finish(args, report, f"ensemble of {len(models)} recyclable models from {models_path}")
    return 0


def _check_one_step(args: argparse.Namespace) -> None:
    if args.csv is None:
        check_dataset("recycle", args.dataset or "toy")
    check_own_data_arguments(args, {"dataset": "--csv replaces --dataset", "points": "--csv uses every row"})
    if args.csv is None:
        refuse_ignored(args, {"test_fraction": "the generated tasks have their own test set"})
    check_federation(args, None)  # the parties of --csv agree their moments under secure aggregation


def _check_ensemble(args: argparse.Namespace) -> None:
    if args.evaluate and args.csv:
        raise ValueError("give --evaluate or --csv, not both")
    check_own_data_arguments(args)
    models = Path(args.models)
    if not models.is_file():
        raise FileNotFoundError(2, "No such file" if not models.exists() else "Not a file", str(models))


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--maxiter",
        type=positive_int,
        default=None,
        help=f"L-BFGS iterations (default {MAXITER}; --quick {QUICK_MAXITER})",
    )
    p.add_argument("--variance", type=positive_float, default=5.0, help="initial kernel variance")
    p.add_argument("--lengthscale", type=positive_float, default=0.3, help="initial kernel lengthscale")
    add_run_arguments(p, "runs/recycle", "the PNGs", quick_cpu=15)
    add_own_data_arguments(p)


def register(subparsers: Any) -> None:
    """Add the ``recycle`` subcommand: one step, or its two steps."""
    parser = subparsers.add_parser(
        "recycle", help="Recyclable GPs: local SVGPs, then their ensemble without the data", description=__doc__
    )
    parser.add_argument("--dataset", default=None, choices=KNOWN, help="toy or 10k (the paper's tasks; default toy)")
    parser.add_argument(
        "--points",
        type=non_negative_int,
        default=None,
        help=f"points per generated task (0: 500 / 200; --quick {QUICK_POINTS})",
    )
    parser.add_argument(
        "--local-inducing", type=positive_int, default=None, help=f"M_k per local model (default {LOCAL_INDUCING})"
    )
    parser.add_argument(
        "--inducing", type=positive_int, default=None, help=f"M_* of the ensemble (default {ENSEMBLE_INDUCING})"
    )
    parser.add_argument("--method", default="collapsed", choices=("collapsed", "alternate", "joint"))
    parser.add_argument("--out", default=None, help="also save the local models' dictionary to this .npz")
    _common(parser)
    parser.set_defaults(func=_one_step, check=_check_one_step)
    sub = parser.add_subparsers(dest="recycle_command", metavar="STEP")
    loc = sub.add_parser("locals", help="fit one SVGP per task (or party) and save the dictionary")
    loc.add_argument("--dataset", default=None, choices=KNOWN, help="toy or 10k (default toy)")
    loc.add_argument("--inducing", type=positive_int, default=LOCAL_INDUCING, help="M_k per local model")
    loc.add_argument(
        "--points",
        type=non_negative_int,
        default=None,
        help=f"points per task (0: the paper's 500 / 200; --quick {QUICK_POINTS})",
    )
    loc.add_argument("--out", required=True, help="the .npz to write (.npz appended if missing; folders created)")
    _common(loc)
    ens = sub.add_parser("ensemble", help="fit the ensemble from a saved dictionary (no data needed)")
    ens.add_argument("models", help="a .npz written by 'recycle locals' or save_recyclable")
    ens.add_argument("--inducing", type=positive_int, default=ENSEMBLE_INDUCING, help="M_* of the ensemble")
    ens.add_argument("--method", default="collapsed", choices=("collapsed", "alternate", "joint"))
    ens.add_argument("--out", default=None, help="save the ensemble to this .npz (.npz appended if missing)")
    ens.add_argument("--evaluate", default=None, choices=RECYCLABLE, help="test metrics on this dataset")
    _common(ens)
    loc.set_defaults(func=_locals, check=_check_one_step)
    ens.set_defaults(func=_ensemble, check=_check_ensemble)
