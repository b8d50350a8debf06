"""``gpflow-fed recycle``: fit local SVGPs and save them as a dictionary of recyclable models; later, in
another process and without the data, fit the Recyclable-GP ensemble from that dictionary.

* ``gpflow-fed recycle locals --dataset toy --out models.npz`` fits one SVGP per task of a generated dataset
  (toy: toy concatenation; 10k: 50 segments × 200 points), or per party of your own CSV (``--csv``, standardised
  with pooled moments, which are saved next to the models as ``<out>.standardizer.json``), and saves them (no
  data inside);
* ``gpflow-fed recycle ensemble models.npz --inducing 35 --out ensemble.npz [--evaluate toy | --csv ...]``
  loads the dictionary, fits the ensemble (EnsembleSVGP) and saves it as a one-model dictionary (so it can be
  recycled again: pyramids); --evaluate (or the held-out rows of --csv, same --seed and --test-fraction) gives
  test_rmse and test_nlpd.

Both print their result as one JSON line (--json: indented), and write TensorBoard scalars and a PNG under
--logdir.
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from .own_data import add_own_data_arguments, own_dataset

QUICK_MAXITER = 30
QUICK_POINTS = 100


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
    return args.maxiter if args.maxiter is not None else QUICK_MAXITER if args.quick else 200


def _own(args: argparse.Namespace) -> Optional[Tuple[Any, Any]]:
    """``(standardised dataset, standardizer)`` of ``--csv``, or ``None``."""
    own = own_dataset(args, args.test_fraction, args.seed)
    return None if own is None else own.standardized()


def _inducing_inputs(X: Any, M: int, seed: int) -> Any:
    """M inputs of one party: a grid for 1-D inputs, otherwise a random subset of its own rows (local data)."""
    import numpy as np

    if X.shape[1] == 1:
        return np.linspace(X.min(), X.max(), M)[:, None]
    rows = np.random.default_rng(seed).choice(X.shape[0], size=min(M, X.shape[0]), replace=False)
    return X[np.sort(rows)]


def _report(args: argparse.Namespace, payload: Dict[str, Any]) -> None:
    """One JSON line (machine-readable, as this command always printed); ``--json`` indents it."""
    print(json.dumps(payload, indent=2 if args.json else None))


def _plot(path: Path, models: Dict[str, Any], X: Any, Y: Any, title: str) -> str:
    from ..plotting import figure, plot_predictions

    fig = figure(figsize=(7, 4))
    ax = fig.subplots()
    plot_predictions(ax, models, X, Y)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return str(path)


def _locals(args: argparse.Namespace) -> int:
    if args.inducing < 1:
        raise ValueError(f"--inducing must be positive, got {args.inducing}")
    out = npz_path(args.out)
    logdir = Path(args.logdir)
    logdir.mkdir(parents=True, exist_ok=True)
    import gpflow
    import numpy as np
    from ..progress import tqdm

    from ..models import LocalSVGPTrainer, export_svgp, save_recyclable
    from ..monitor import write_scalars

    own = _own(args)
    if own is not None:
        dataset, scaler = own
        clients, label = dataset.clients, dataset.name
    else:
        data = _dataset(args.dataset, args.seed, args.points or (QUICK_POINTS if args.quick else 0))
        clients, label, scaler = data.clients, args.dataset, None
    kernel = gpflow.kernels.SquaredExponential(variance=args.variance, lengthscales=args.lengthscale)
    trainer = LocalSVGPTrainer(kernel, gpflow.likelihoods.Gaussian(1.0), maxiter=_maxiter(args))
    models, fitted, bounds = {}, {}, {}
    for k, (X, Y) in enumerate(tqdm(clients, desc="recycle locals", disable=args.json or args.no_progress)):
        model = trainer.fit(X, Y, _inducing_inputs(X, args.inducing, args.seed))
        name = f"task_{k}"
        models[name], fitted[name] = export_svgp(model, name=name), model
        bounds[f"{name}/elbo_per_point"] = float(model.elbo((X, Y)).numpy()) / X.shape[0]
    save_recyclable(out, models)
    if scaler is not None:
        _standardizer_path(out).write_text(
            json.dumps({k: np.asarray(getattr(scaler, k)).tolist() for k in ("X_mean", "X_std", "Y_mean", "Y_std")})
        )
    write_scalars(str(logdir / "locals"), bounds, step=0)
    X_all = np.concatenate([X for X, _ in clients])
    Y_all = np.concatenate([Y for _, Y in clients])
    shown = dict(list(fitted.items())[:5])
    plot = _plot(
        logdir / "recycle-locals.png",
        shown,
        X_all,
        Y_all,
        f"local SVGPs on {label} ({len(shown)} of {len(fitted)} shown)",
    )
    payload = {
        "saved": str(out),
        "models": len(models),
        "inducing_per_model": args.inducing,
        **bounds,
        "logdir": str(logdir),
        "plot": plot,
    }
    if scaler is not None:
        payload["standardizer"] = str(_standardizer_path(out))
    _report(args, payload)
    return 0


def _test_set(args: argparse.Namespace, models_path: Path) -> Optional[Tuple[Any, Any, str]]:
    """The evaluation set: a generated dataset's test split, or the held-out rows of ``--csv`` (standardised
    with the models' saved standardizer)."""
    import numpy as np

    own = own_dataset(args, args.test_fraction, args.seed)
    if own is not None:
        if own.test is None:
            raise ValueError("--csv evaluation needs held-out rows; use --test-fraction > 0")
        saved = _standardizer_path(models_path)
        if not saved.is_file():
            raise ValueError(f"{saved} not found: the models were not fitted with `recycle locals --csv`")
        s = {k: np.asarray(v) for k, v in json.loads(saved.read_text()).items()}
        X, Y = own.test
        return (X - s["X_mean"]) / s["X_std"], (Y - s["Y_mean"]) / s["Y_std"], own.name
    if args.evaluate:
        X, Y = _dataset(args.evaluate, args.seed).test
        return X, Y, args.evaluate
    return None


def _ensemble(args: argparse.Namespace) -> int:
    if args.inducing < 1:
        raise ValueError(f"--inducing must be positive, got {args.inducing}")
    if args.evaluate and args.csv:
        raise ValueError("give --evaluate or --csv, not both")
    logdir = Path(args.logdir)
    logdir.mkdir(parents=True, exist_ok=True)
    import gpflow
    import numpy as np

    from .. import metrics
    from ..models import EnsembleSVGP, RecyclableWarning, load_recyclable, save_recyclable
    from ..monitor import write_scalars

    models_path = Path(args.models)
    models = load_recyclable(models_path)
    test = _test_set(args, models_path)
    Z_all = np.concatenate([m.Z for m in models.values()])
    if Z_all.shape[1] == 1:
        Z = np.linspace(Z_all.min(), Z_all.max(), args.inducing)[:, None]
    else:  # the local models' own inducing inputs (no data), thinned to M_*
        rows = np.random.default_rng(args.seed).choice(
            Z_all.shape[0], min(args.inducing, Z_all.shape[0]), replace=False
        )
        Z = Z_all[np.sort(rows)]
    kernel = gpflow.kernels.SquaredExponential(variance=args.variance, lengthscales=args.lengthscale)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RecyclableWarning)
        ensemble = EnsembleSVGP(models, kernel, Z)
    for w in caught:
        print(f"warning: {w.message}")
    bound = float(ensemble.fit(maxiter=_maxiter(args), method=args.method))
    payload: Dict[str, Any] = {"models": len(models), "elbo": bound}
    if args.out:
        out = npz_path(args.out)
        save_recyclable(out, {"ensemble": ensemble.to_recyclable(name="ensemble")})
        payload["saved"] = str(out)
    plot = None
    if test is not None:
        X, Y, name = test
        mean, var = (t.numpy() for t in ensemble.predict_y(X))
        payload.update(test_rmse=metrics.rmse(Y, mean), test_nlpd=metrics.nlpd(Y, mean, var))
        plot = _plot(
            logdir / "recycle-ensemble.png",
            {"ensemble": ensemble},
            X,
            Y,
            f"Recyclable-GP ensemble of {len(models)} models on {name} (test set)",
        )
    write_scalars(str(logdir / "ensemble"), {k: v for k, v in payload.items() if isinstance(v, float)}, step=0)
    payload.update(logdir=str(logdir), plot=plot)
    _report(args, payload)
    return 0


def register(subparsers: Any) -> None:
    """Add the ``recycle`` subcommand and its two steps."""
    parser = subparsers.add_parser(
        "recycle", help="Recyclable GPs: save local SVGPs, ensemble them later", description=__doc__
    )
    sub = parser.add_subparsers(dest="recycle_command", metavar="STEP", required=True)
    loc = sub.add_parser("locals", help="fit one SVGP per task (or party) and save the dictionary")
    loc.add_argument("--dataset", default="toy", choices=("toy", "10k"))
    loc.add_argument("--inducing", type=int, default=15, help="M_k per local model")
    loc.add_argument(
        "--points", type=int, default=0, help=f"points per task (0: the paper's 500 / 200; --quick {QUICK_POINTS})"
    )
    loc.add_argument("--out", required=True, help="the .npz to write (.npz appended if missing; folders created)")
    ens = sub.add_parser("ensemble", help="fit the ensemble from a saved dictionary (no data needed)")
    ens.add_argument("models", help="a .npz written by 'recycle locals' or save_recyclable")
    ens.add_argument("--inducing", type=int, default=35, help="M_* of the ensemble")
    ens.add_argument("--method", default="collapsed", choices=("collapsed", "alternate", "joint"))
    ens.add_argument("--out", default=None, help="save the ensemble to this .npz (.npz appended if missing)")
    ens.add_argument("--evaluate", default=None, choices=("toy", "10k"), help="test metrics on this dataset")
    for p in (loc, ens):
        p.add_argument(
            "--maxiter", type=int, default=None, help=f"L-BFGS iterations (default 200; --quick {QUICK_MAXITER})"
        )
        p.add_argument("--variance", type=float, default=5.0, help="initial kernel variance")
        p.add_argument("--lengthscale", type=float, default=0.3, help="initial kernel lengthscale")
        p.add_argument("--test-fraction", type=float, default=0.2, help="held-out rows of each party (--csv only)")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--logdir", default="runs/recycle", help="TensorBoard scalars and the PNG go here")
        p.add_argument("--json", action="store_true", help="indent the JSON result (one line without)")
        p.add_argument("--quick", action="store_true", help="tiny settings for a smoke test (seconds)")
        p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
        add_own_data_arguments(p)
    loc.set_defaults(func=_locals)
    ens.set_defaults(func=_ensemble)
