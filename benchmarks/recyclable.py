"""Recyclable GPs benchmark: ensemble of recycled SVGPs vs PoE/GPoE/BCM/rBCM experts and a single SVGP, and
(optionally) the authors' PyTorch code on the same data. Prints one Markdown table.

Settings (spec ``recyclable-gp.md`` §6.2):

* ``toy``: toy concatenation, K = 5 × 500 points, M_k = 15, M_* = 35;
* ``10k``: distributed, K = 50 segments × 200 points, M_k = 3, M_* = 35;
* ``pyramid``: the 50 local models of ``10k`` joined in groups of 10, then the 5 ensembles joined (§3.2);
* ``sunspots``: monthly sunspots, y = log(1 + s) mean-centred, x = linspace(0, 100, N), K = 50 segments of width 2,
  80/20 split per segment, M_k = 6, M_* = 90.

NLPD is against noisy test targets; RMSE/MAE against the latent function (synthetic) or the targets (sunspots).
``--peer-python PY --peer-src DIR`` also runs pmorenoz/RecyclableGP through a scratch driver
(``--peer-driver``) on the same data and reports its NLPD (its fixed σ = 1) and ensemble-fit wall time.

Usage: ``python benchmarks/recyclable.py --settings toy,10k,pyramid,sunspots [--seed 0]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Tuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import gpflow  # noqa: E402
import numpy as np  # noqa: E402
import warnings  # noqa: E402

from gpflow_fed import metrics  # noqa: E402
from gpflow_fed.baselines import COMBINATION_RULES, ExpertCommittee, fit_gpr_experts  # noqa: E402
from gpflow_fed.data import distributed_segments, load_dataset, smooth_function, smooth_function_bias  # noqa: E402
from gpflow_fed.data import toy_concatenation  # noqa: E402
from gpflow_fed.models import EnsembleSVGP, RecyclableWarning, export_svgp, fit_pyramid, train_local_svgp  # noqa: E402

Row = Dict[str, object]
Clients = List[Tuple[np.ndarray, np.ndarray]]


def _se(variance: float, lengthscale: float) -> gpflow.kernels.Kernel:
    return gpflow.kernels.SquaredExponential(variance=variance, lengthscales=lengthscale)


def _scores(Y: np.ndarray, F: np.ndarray, mean: np.ndarray, var: np.ndarray) -> Dict[str, float]:
    return {"nlpd": metrics.nlpd(Y, mean, var), "rmse": metrics.rmse(F, mean), "mae": metrics.mae(F, mean)}


def _local_models(clients: Clients, M_k: int, kernel: Tuple[float, float], noise: float, maxiter: int) -> Tuple[list, float]:
    t0 = time.perf_counter()
    recs = []
    for k, (X, Y) in enumerate(clients):
        Z = np.linspace(X.min(), X.max(), M_k)[:, None]
        model = train_local_svgp(X, Y, Z, _se(*kernel), gpflow.likelihoods.Gaussian(noise), maxiter=maxiter)
        recs.append(export_svgp(model, name=f"task_{k}"))
    return recs, time.perf_counter() - t0


def run_setting(name: str, clients: Clients, test: Tuple[np.ndarray, np.ndarray, np.ndarray], cfg: dict) -> Tuple[List[Row], list]:
    X_test, Y_test, F_test = test
    rows: List[Row] = []
    recs, t_local = _local_models(clients, cfg["M_k"], cfg["kernel"], cfg["noise"], cfg["local_maxiter"])
    Z_star = np.linspace(cfg["lo"], cfg["hi"], cfg["M"])[:, None]
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecyclableWarning)
        ens = EnsembleSVGP(recs, _se(*cfg["kernel"]), Z_star)
        ens.fit(maxiter=cfg["maxiter"], method="collapsed")
    t_ens = time.perf_counter() - t0
    mean, var = (t.numpy() for t in ens.predict_y(X_test))
    rows.append({"setting": name, "method": "Recyclable ensemble (ours)", **_scores(Y_test, F_test, mean, var),
                 "fit_s": t_ens, "local_s": t_local})
    # expert baselines: exact-GP experts and the SVGP local models as experts
    t0 = time.perf_counter()
    gpr = fit_gpr_experts(clients, _se(*cfg["kernel"]), cfg["noise"], maxiter=cfg["local_maxiter"])
    t_gpr = time.perf_counter() - t0
    svgps = [r.to_svgp() for r in recs]
    for label, experts, t_fit in (("GPR", gpr, t_gpr), ("SVGP", svgps, t_local)):
        for rule in COMBINATION_RULES:
            committee = ExpertCommittee(experts, rule=rule)
            mean, var = (t.numpy() for t in committee.predict_y(X_test))
            if np.all(var > 0) and np.all(np.isfinite(var)):
                scores = _scores(Y_test, F_test, mean, var)
            else:  # BCM's precision can turn negative far from the data: no NLPD
                scores = dict(_scores(Y_test, F_test, mean, np.ones_like(var)), nlpd=float("nan"))
            rows.append({"setting": name, "method": f"{rule} ({label} experts)", **scores, "fit_s": float("nan"),
                         "local_s": t_fit})
    # a single SVGP on the pooled data with M = M_*
    X = np.concatenate([c[0] for c in clients])
    Y = np.concatenate([c[1] for c in clients])
    t0 = time.perf_counter()
    single = train_local_svgp(X, Y, Z_star, _se(*cfg["kernel"]), gpflow.likelihoods.Gaussian(cfg["noise"]), maxiter=cfg["maxiter"])
    t_single = time.perf_counter() - t0
    mean, var = (t.numpy() for t in single.predict_y(X_test))
    rows.append({"setting": name, "method": f"single SVGP, pooled data (M={cfg['M']})",
                 **_scores(Y_test, F_test, mean, var), "fit_s": t_single, "local_s": float("nan")})
    return rows, recs


def run_peer(args: argparse.Namespace, name: str, clients: Clients, test: tuple, lo: float, hi: float) -> Row:
    X_test, Y_test, F_test = test
    with tempfile.TemporaryDirectory() as tmp:
        arrays = {f"X{k}": X for k, (X, _) in enumerate(clients)}
        arrays.update({f"Y{k}": Y for k, (_, Y) in enumerate(clients)})
        np.savez(os.path.join(tmp, "data.npz"), K=len(clients), lo=lo, hi=hi, X_test=X_test, **arrays)
        out = os.path.join(tmp, "out.json")
        subprocess.run([args.peer_python, args.peer_driver, args.peer_src, os.path.join(tmp, "data.npz"),
                        "toy" if name == "toy" else "10k", out], check=True, capture_output=True)
        res = json.load(open(out))
    mean, var = np.array(res["mean"])[:, None], np.array(res["var"])[:, None] + res["sigma"] ** 2
    return {"setting": name, "method": "pmorenoz/RecyclableGP (PyTorch, σ=1 fixed)", **_scores(Y_test, F_test, mean, var),
            "fit_s": res["ensemble_seconds"], "local_s": res["local_seconds"]}


def sunspots_tasks(seed: int) -> Tuple[Clients, tuple]:
    data = load_dataset("sunspots")
    y = np.log1p(data.Y)
    y = y - y.mean()
    x = np.linspace(0.0, 100.0, y.shape[0])[:, None]
    rng = np.random.default_rng(seed)
    clients, tests = [], []
    for k in range(50):
        idx = np.flatnonzero((x[:, 0] > 2 * k) & (x[:, 0] < 2 * (k + 1)))
        idx = rng.permutation(idx)
        cut = int(round(0.8 * idx.size))
        clients.append((x[np.sort(idx[:cut])], y[np.sort(idx[:cut])]))
        tests.append(idx[cut:])
    t = np.sort(np.concatenate(tests))
    return clients, (x[t], y[t], y[t])


def main(argv: List[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", default="toy,10k,pyramid,sunspots")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--peer-python", default=None)
    parser.add_argument("--peer-src", default=None)
    parser.add_argument("--peer-driver", default=None)
    args = parser.parse_args(argv)
    settings = args.settings.split(",")
    rows = _Printer()
    ten_k_models = None
    for name in settings:
        if name == "toy":
            d = toy_concatenation(seed=args.seed)
            test = (d.test[0], d.test[1], smooth_function_bias(d.test[0]))
            cfg = dict(M_k=15, M=35, lo=0.0, hi=5.5, kernel=(5.0, 0.3), noise=1.0, local_maxiter=200, maxiter=200)
        elif name in ("10k", "pyramid"):
            d = distributed_segments(seed=args.seed)
            test = (d.test[0], d.test[1], smooth_function(d.test[0]))
            cfg = dict(M_k=3, M=35, lo=0.0, hi=5.0, kernel=(5.0, 0.3), noise=1.0, local_maxiter=200, maxiter=200)
        elif name == "sunspots":
            clients, test = sunspots_tasks(args.seed)
            cfg = dict(M_k=6, M=90, lo=0.0, hi=100.0, kernel=(1.0, 0.2), noise=0.01, local_maxiter=200, maxiter=200)
        else:
            raise ValueError(f"unknown setting {name!r}")
        if name == "pyramid":
            if ten_k_models is None:
                ten_k_models = _local_models(d.clients, cfg["M_k"], cfg["kernel"], cfg["noise"], cfg["local_maxiter"])[0]
            t0 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RecyclableWarning)
                top = fit_pyramid(ten_k_models, 10, _se(*cfg["kernel"]), np.linspace(0, 5, 35)[:, None], maxiter=200)
            mean, var = (t.numpy() for t in top.predict_y(test[0]))
            rows.append({"setting": "pyramid 10k (50 → 5 → 1)", "method": "Recyclable pyramid (ours)",
                         **_scores(*test, mean, var), "fit_s": time.perf_counter() - t0, "local_s": float("nan")})
            continue
        clients = d.clients if name != "sunspots" else clients
        new_rows, recs = run_setting(name, list(clients), test, cfg)
        rows += new_rows
        if name == "10k":
            ten_k_models = recs
        if args.peer_python and name in ("toy", "10k"):
            rows.append(run_peer(args, name, list(clients), test, cfg["lo"], cfg["hi"]))
        print(f"[done {name}]", file=sys.stderr, flush=True)


class _Printer(list):
    """Collects rows and prints each as a Markdown table row as soon as it is added (header first)."""

    def __init__(self) -> None:
        super().__init__()
        print("| setting | method | NLPD | RMSE | MAE | ensemble fit (s) | local/expert fit (s) |")
        print("|---|---|---|---|---|---|---|", flush=True)

    def append(self, r: Row) -> None:
        super().append(r)
        print(f"| {r['setting']} | {r['method']} | {r['nlpd']:.3f} | {r['rmse']:.3f} | {r['mae']:.3f} | "
              f"{r['fit_s']:.2f} | {r['local_s']:.1f} |", flush=True)

    def __iadd__(self, new: List[Row]) -> "_Printer":
        for r in new:
            self.append(r)
        return self


if __name__ == "__main__":
    main()
