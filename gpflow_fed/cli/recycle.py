"""``gpflow-fed recycle``: fit local SVGPs and save them as a dictionary of recyclable models; later, in
another process and without the data, fit the Recyclable-GP ensemble from that dictionary.

* ``gpflow-fed recycle locals --dataset toy --out models.npz`` fits one SVGP per task of a generated dataset
  (``toy``: toy concatenation; ``10k``: 50 segments × 200 points) and saves them (no data inside);
* ``gpflow-fed recycle ensemble models.npz --inducing 35 --out ensemble.npz [--evaluate toy]`` loads the
  dictionary, fits :class:`~gpflow_fed.models.EnsembleSVGP` and saves it as a one-model dictionary (so it can
  be recycled again: pyramids); ``--evaluate`` prints test NLPD/RMSE on that dataset's test set.
"""

from __future__ import annotations

import argparse
import json
import warnings
from typing import Any


def _dataset(name: str, seed: int, points: int = 0) -> Any:
    from ..data import distributed_segments, toy_concatenation

    if name == "toy":
        return toy_concatenation(seed=seed, num_per_task=points or 500)
    if name == "10k":
        return distributed_segments(seed=seed, num_per_segment=points or 200)
    raise ValueError(f"unknown dataset {name!r}; choose 'toy' or '10k'")


def _locals(args: argparse.Namespace) -> int:
    import gpflow
    import numpy as np

    from ..models import export_svgp, save_recyclable, train_local_svgp

    if args.inducing < 1:
        raise ValueError(f"--inducing must be positive, got {args.inducing}")
    data = _dataset(args.dataset, args.seed, args.points)
    models = {}
    for k, (X, Y) in enumerate(data.clients):
        Z = np.linspace(X.min(), X.max(), args.inducing)[:, None]
        kernel = gpflow.kernels.SquaredExponential(variance=args.variance, lengthscales=args.lengthscale)
        model = train_local_svgp(X, Y, Z, kernel, gpflow.likelihoods.Gaussian(1.0), maxiter=args.maxiter)
        models[f"task_{k}"] = export_svgp(model, name=f"task_{k}")
    save_recyclable(args.out, models)
    print(json.dumps({"saved": str(args.out), "models": len(models), "inducing_per_model": args.inducing}))
    return 0


def _ensemble(args: argparse.Namespace) -> int:
    import gpflow
    import numpy as np

    from .. import metrics
    from ..models import EnsembleSVGP, RecyclableWarning, load_recyclable, save_recyclable

    if args.inducing < 1:
        raise ValueError(f"--inducing must be positive, got {args.inducing}")
    models = load_recyclable(args.models)
    Z_all = np.concatenate([m.Z for m in models.values()])
    if Z_all.shape[1] != 1:
        raise ValueError("the CLI places Z_* on a 1-D grid; use the Python API for D > 1")
    Z = np.linspace(Z_all.min(), Z_all.max(), args.inducing)[:, None]
    kernel = gpflow.kernels.SquaredExponential(variance=args.variance, lengthscales=args.lengthscale)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RecyclableWarning)
        ensemble = EnsembleSVGP(models, kernel, Z)
    for w in caught:
        print(f"warning: {w.message}")
    bound = ensemble.fit(maxiter=args.maxiter, method=args.method)
    out = {"models": len(models), "elbo": bound}
    if args.out:
        save_recyclable(args.out, {"ensemble": ensemble.to_recyclable(name="ensemble")})
        out["saved"] = str(args.out)
    if args.evaluate:
        X, Y = _dataset(args.evaluate, args.seed).test
        mean, var = (t.numpy() for t in ensemble.predict_y(X))
        out.update(test_nlpd=metrics.nlpd(Y, mean, var), test_rmse=metrics.rmse(Y, mean))
    print(json.dumps(out))
    return 0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("recycle", help="Recyclable GPs: save local SVGPs, ensemble them later")
    sub = parser.add_subparsers(dest="recycle_command", metavar="STEP", required=True)
    loc = sub.add_parser("locals", help="fit one SVGP per task and save the dictionary")
    loc.add_argument("--dataset", default="toy", choices=("toy", "10k"))
    loc.add_argument("--inducing", type=int, default=15, help="M_k per local model")
    loc.add_argument("--points", type=int, default=0, help="points per task (default: the paper's 500 / 200)")
    loc.add_argument("--out", required=True)
    ens = sub.add_parser("ensemble", help="fit the ensemble from a saved dictionary (no data needed)")
    ens.add_argument("models", help="a .npz written by 'recycle locals' or save_recyclable")
    ens.add_argument("--inducing", type=int, default=35, help="M_* of the ensemble")
    ens.add_argument("--method", default="collapsed", choices=("collapsed", "alternate", "joint"))
    ens.add_argument("--out", default=None)
    ens.add_argument("--evaluate", default=None, choices=("toy", "10k"), help="print test metrics on this dataset")
    for p in (loc, ens):
        p.add_argument("--maxiter", type=int, default=200)
        p.add_argument("--variance", type=float, default=5.0, help="initial kernel variance")
        p.add_argument("--lengthscale", type=float, default=0.3, help="initial kernel lengthscale")
        p.add_argument("--seed", type=int, default=0)
    loc.set_defaults(func=_locals)
    ens.set_defaults(func=_ensemble)
