"""Recyclable GPs benchmark: ensemble of recycled SVGPs vs PoE/GPoE/BCM/rBCM experts and a single SVGP, and
(optionally) the authors' PyTorch code on the same data. Prints one Markdown table.

Settings (spec ``recyclable-gp.md`` §6.2):

* ``toy``: toy concatenation, K = 5 × 500 points, M_k = 15, M_* = 35;
* ``10k``: distributed, K = 50 segments × 200 points, M_k = 3, M_* = 35; ``--trials N`` trials (seeds 0..N−1, the
  paper's 10 by default), each with the default local fits and the plain ones (degenerate-fit checks off), their
  ensembles and committees, and a pooled SVGP; mean ± sd saved to ``benchmarks/results/recyclable_10k.json``
  after every trial (``--resume`` continues a saved protocol);
* ``100k``: the same with 5 overlapping replicas × 50 segments × 400 points (K = 250), default local fits only
  (``recyclable_100k.json``);
* ``pyramid``: ``--pyramid-replicas R`` overlapping replicas of the 10k data (N = R · 10 000, K = 50R local models)
  joined in groups of 10 at every level (§3.2), next to one flat ensemble over all K local models;
* ``speed``: the previous local fit (a new SVGP per task, L-BFGS, NatGrad step) against :class:`LocalSVGPTrainer`
  on the toy tasks, and two ensemble fits, side by side in one process;
* ``sunspots``: monthly sunspots, y = log(1 + s) mean-centred, x = linspace(0, 100, N), K = 50 segments of width 2,
  80/20 split per segment, M_k = 6, M_* = 90.

The one-seed settings (toy, pyramid, sunspots) are saved to ``benchmarks/results/recyclable_<setting>.json``
(pyramid: ``recyclable_pyramid_r<R>.json``).

NLPD is against noisy test targets; RMSE/MAE against the latent function (synthetic) or the targets (sunspots).
``--peer-python PY --peer-src DIR`` also runs pmorenoz/RecyclableGP through ``benchmarks/peer/recyclable_gp_driver.py``
on the same data (its own local models, and separately ours) and reports its NLPD (with its fixed σ = 1 and with our
noise) and its ensemble-fit wall time next to ours (10k: on the first ``--peer-trials`` trials).
``--quick``: 10k only, 2 trials, no peer; saved to ``runs/bench/recyclable_10k_quick.json``.

Usage: ``python benchmarks/recyclable.py --settings speed,toy,10k,100k,pyramid,sunspots [--seed 0] [--trials N]
[--pyramid-replicas R]``
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
from gpflow_fed.models import EnsembleSVGP, LocalSVGPTrainer, RecyclableWarning, export_svgp, fit_pyramid  # noqa: E402
from gpflow_fed.models import train_local_svgp  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from provenance import command, save  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
Row = Dict[str, object]
Clients = List[Tuple[np.ndarray, np.ndarray]]


#: the local-fit checks off (the previous default's "plain" local fits: no degenerate fit is refitted)
PLAIN_CHECKS: Dict[str, float] = {"collapse_snr": 0.0, "max_lengthscale_ratio": 0.0}


def _se(variance: float, lengthscale: float) -> gpflow.kernels.Kernel:
    return gpflow.kernels.SquaredExponential(variance=variance, lengthscales=lengthscale)


def _scores(
    Y: np.ndarray, F: np.ndarray, mean: np.ndarray, var: np.ndarray, inside: np.ndarray | None = None
) -> Dict[str, float]:
    """NLPD against the noisy targets Y; RMSE and MAE against f. With ``inside`` (a boolean mask of the test
    points within ``[lo, hi]``, the training inputs' range in the distributed settings) also the RMSE inside and
    outside it: on 10k's [−0.5, 5.5] a sixth of the test points lie beyond the data, where f (amplitude up to
    7.5) can only be extrapolated."""
    scores = {"nlpd": metrics.nlpd(Y, mean, var), "rmse": metrics.rmse(F, mean), "mae": metrics.mae(F, mean)}
    if inside is not None:
        scores["rmse_in_range"] = metrics.rmse(F[inside], mean[inside])
        scores["rmse_outside"] = metrics.rmse(F[~inside], mean[~inside]) if (~inside).any() else float("nan")
    return scores


def _in_range(X_test: np.ndarray, cfg: dict) -> np.ndarray:
    """The test points within ``[cfg["lo"], cfg["hi"]]`` (the range of the ensemble's inducing inputs)."""
    return (X_test[:, 0] >= cfg["lo"]) & (X_test[:, 0] <= cfg["hi"])


def _local_models(
    clients: Clients,
    M_k: int,
    kernel: Tuple[float, float],
    noise: float,
    maxiter: int,
    checks: Dict[str, float] | None = None,
) -> Tuple[list, float, int]:
    """All local models with one :class:`LocalSVGPTrainer` (one compiled L-BFGS loop for every task); also returns
    the fit time and how many degenerate fits were refitted. ``checks``: the trainer's ``collapse_snr`` and
    ``max_lengthscale_ratio`` (default: the library's; :data:`PLAIN_CHECKS`: both off)."""
    t0 = time.perf_counter()
    trainer = LocalSVGPTrainer(_se(*kernel), gpflow.likelihoods.Gaussian(noise), maxiter=maxiter, **(checks or {}))
    recs = []
    for k, (X, Y) in enumerate(clients):
        Z = np.linspace(X.min(), X.max(), M_k)[:, None]
        recs.append(export_svgp(trainer.fit(X, Y, Z), name=f"task_{k}"))
    return recs, time.perf_counter() - t0, trainer.num_refitted


def _stock_local_models(
    clients: Clients, M_k: int, kernel: Tuple[float, float], noise: float, maxiter: int
) -> Tuple[list, float]:
    """The previous local fit, for the speed comparison: a new ``gpflow.models.SVGP`` per task, L-BFGS on its ELBO
    (``Scipy``, compiled per model), then GPflow's ``NaturalGradient`` step with γ = 1 (kept only if it succeeds)."""
    t0 = time.perf_counter()
    models = []
    for X, Y in clients:
        Z = np.linspace(X.min(), X.max(), M_k)[:, None]
        model = gpflow.models.SVGP(
            _se(*kernel),
            gpflow.likelihoods.Gaussian(noise),
            gpflow.inducing_variables.InducingPoints(Z),
            num_data=X.shape[0],
        )
        gpflow.optimizers.Scipy().minimize(
            model.training_loss_closure((X, Y)), model.trainable_variables, options={"maxiter": maxiter}
        )
        before = (model.q_mu.numpy(), model.q_sqrt.numpy())
        try:
            gpflow.optimizers.NaturalGradient(gamma=1.0).minimize(
                model.training_loss_closure((X, Y), compile=False), [(model.q_mu, model.q_sqrt)]
            )
        except Exception:  # noqa: BLE001 — GPflow raises InvalidArgumentError when the Cholesky fails
            model.q_mu.assign(before[0])
            model.q_sqrt.assign(before[1])
        models.append(model)
    return models, time.perf_counter() - t0


def speed_rows(seed: int) -> List[Row]:
    """Step-1 comparison on the toy task, side by side in one process: previous vs current local fits
    (total seconds, mean local ELBO), and the ensemble fit (first fit includes tracing; the second is a
    new model of the same shape)."""
    d = toy_concatenation(seed=seed)
    clients = list(d.clients)
    kernel, M_k = (5.0, 0.3), 15
    rows: List[Row] = []
    stock, t_stock = _stock_local_models(clients, M_k, kernel, 1.0, 200)
    recs, t_new, _ = _local_models(clients, M_k, kernel, 1.0, 200)
    elbo_stock = np.mean([float(m.elbo(c).numpy()) for m, c in zip(stock, clients)])
    elbo_new = np.mean([float(r.to_svgp().elbo(c).numpy()) for r, c in zip(recs, clients)])
    for label, t, e in (
        ("previous: SVGP + L-BFGS per model, NatGrad step", t_stock, elbo_stock),
        ("LocalSVGPTrainer (one compiled loop, collapsed bound, closed-form q)", t_new, elbo_new),
    ):
        rows.append({"what": "5 local models (toy)", "method": label, "seconds": t, "value": e})
    for attempt in ("first", "second"):
        t0 = time.perf_counter()
        ens = EnsembleSVGP(recs, _se(*kernel), np.linspace(0.0, 5.5, 35)[:, None])
        bound = ens.fit(maxiter=200)
        rows.append(
            {
                "what": "ensemble fit (toy)",
                "method": f"EnsembleSVGP.fit, {attempt} model",
                "seconds": time.perf_counter() - t0,
                "value": bound,
            }
        )
    return rows


def _ensemble(recs: list, cfg: dict) -> Tuple[EnsembleSVGP, float]:
    """The recycled ensemble over ``recs`` (collapsed bound, then closed-form q) and its fit time."""
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecyclableWarning)
        ens = EnsembleSVGP(recs, _se(*cfg["kernel"]), np.linspace(cfg["lo"], cfg["hi"], cfg["M"])[:, None])
        ens.fit(maxiter=cfg["maxiter"], method="collapsed")
    return ens, time.perf_counter() - t0


def run_setting(
    name: str, clients: Clients, test: Tuple[np.ndarray, np.ndarray, np.ndarray], cfg: dict
) -> Tuple[List[Row], list]:
    """Our ensemble (default local fits) against committees and a single pooled SVGP. With
    ``cfg["local_variants"]`` also the ensemble and committees over the plain local fits (both checks off, the
    previous default)."""
    X_test, Y_test, F_test = test
    inside = _in_range(X_test, cfg)
    rows: List[Row] = []
    fits = {"default": _local_models(clients, cfg["M_k"], cfg["kernel"], cfg["noise"], cfg["local_maxiter"])}
    if cfg.get("local_variants"):
        fits["plain"] = _local_models(
            clients, cfg["M_k"], cfg["kernel"], cfg["noise"], cfg["local_maxiter"], PLAIN_CHECKS
        )
    labels = {
        "default": "default local fits (degenerate ones refitted)",
        "plain": "plain local fits (checks off)",
    }
    recs = fits["default"][0]
    for key, (local_recs, t_local, refitted) in fits.items():
        ens, t_ens = _ensemble(local_recs, cfg)
        mean, var = (t.numpy() for t in ens.predict_y(X_test))
        rows.append(
            {
                "setting": name,
                "method": f"Recyclable ensemble (ours), {labels[key]}",
                **_scores(Y_test, F_test, mean, var, inside),
                "fit_s": t_ens,
                "local_s": t_local,
                "refitted": refitted,
                "noise": float(ens.likelihood.variance.numpy()),
                "bound": float(ens.elbo().numpy()),
            }
        )
    # expert baselines: exact-GP experts (optional) and the SVGP local models as experts
    experts = [(f"SVGP experts, {labels[k]}", [r.to_svgp() for r in fits[k][0]], fits[k][1]) for k in fits]
    if cfg.get("gpr_experts", True):
        t0 = time.perf_counter()
        gpr = fit_gpr_experts(clients, _se(*cfg["kernel"]), cfg["noise"], maxiter=cfg["local_maxiter"])
        experts.insert(0, ("GPR experts", gpr, time.perf_counter() - t0))
    for label, models, t_fit in experts:
        for rule in COMBINATION_RULES:
            committee = ExpertCommittee(models, rule=rule)
            mean, var = (t.numpy() for t in committee.predict_y(X_test))
            if np.all(var > 0) and np.all(np.isfinite(var)):
                scores = _scores(Y_test, F_test, mean, var, inside)
            else:  # BCM's precision can turn negative far from the data: no NLPD
                scores = dict(_scores(Y_test, F_test, mean, np.ones_like(var), inside), nlpd=float("nan"))
            rows.append(
                {
                    "setting": name,
                    "method": f"{rule} ({label})",
                    **scores,
                    "fit_s": float("nan"),
                    "local_s": t_fit,
                }
            )
    # a single SVGP on the pooled data with M = M_*
    X = np.concatenate([c[0] for c in clients])
    Y = np.concatenate([c[1] for c in clients])
    Z_star = np.linspace(cfg["lo"], cfg["hi"], cfg["M"])[:, None]
    t0 = time.perf_counter()
    single = train_local_svgp(
        X, Y, Z_star, _se(*cfg["kernel"]), gpflow.likelihoods.Gaussian(cfg["noise"]), maxiter=cfg["maxiter"]
    )
    t_single = time.perf_counter() - t0
    mean, var = (t.numpy() for t in single.predict_y(X_test))
    rows.append(
        {
            "setting": name,
            "method": f"single SVGP, pooled data (M={cfg['M']})",
            **_scores(Y_test, F_test, mean, var, inside),
            "fit_s": t_single,
            "local_s": float("nan"),
        }
    )
    return rows, recs


def run_peer(
    args: argparse.Namespace, name: str, clients: Clients, test: tuple, cfg: dict, recs: list, ours: Row
) -> List[Row]:
    """The authors' code on the same data and, separately, on our local models (``benchmarks/peer/``); its
    ensemble-fit wall time next to ours from the same process. Its NLPD is given with its fixed σ = 1 and
    with our ensemble's noise variance."""
    X_test, Y_test, F_test = test
    with tempfile.TemporaryDirectory() as tmp:
        arrays = {f"X{k}": X for k, (X, _) in enumerate(clients)}
        arrays.update({f"Y{k}": Y for k, (_, Y) in enumerate(clients)})
        for k, r in enumerate(recs):
            arrays.update(
                {
                    f"q_mu{k}": r.q_mu,
                    f"q_sqrt{k}": r.q_sqrt,
                    f"Z{k}": r.Z,
                    f"variance{k}": r.kernel["variance"],
                    f"lengthscale{k}": r.kernel["lengthscales"][0],
                }
            )
        np.savez(os.path.join(tmp, "data.npz"), K=len(clients), lo=cfg["lo"], hi=cfg["hi"], X_test=X_test, **arrays)
        out = os.path.join(tmp, "out.json")
        subprocess.run(
            [
                args.peer_python,
                args.peer_driver,
                args.peer_src,
                os.path.join(tmp, "data.npz"),
                name,
                out,
                "--local-iters",
                str(args.peer_local_iters),
            ],
            check=True,
        )
        with open(out) as f:
            res = json.load(f)
    # our ensemble fit once more, right after the peer's run, so that both are timed at about the same load
    t_again = _ensemble(recs, cfg)[1]
    print(
        f"[{name}] our ensemble fit again after the peer: {t_again:.2f} s (before it: {ours['fit_s']:.2f} s)",
        file=sys.stderr,
        flush=True,
    )
    ours = dict(ours, fit_s=max(ours["fit_s"], t_again))  # ratios below use the slower of our two fits
    rows: List[Row] = []
    for key, label, local_s in (
        ("own", f"its own local VEM ({res['local_iters']} EM its)", res["local_seconds"]),
        ("ours", "our local models", float("nan")),
    ):
        if key not in res:
            continue
        if "error" in res[key]:
            print(
                f"[{name}] peer ensemble fit on {label} failed after {res[key]['ensemble_seconds']:.2f} s: "
                f"{res[key]['error']}",
                file=sys.stderr,
                flush=True,
            )
            rows.append(
                {
                    "setting": name,
                    "method": f"pmorenoz/RecyclableGP ensemble on {label}: failed",
                    "nlpd": float("nan"),
                    "rmse": float("nan"),
                    "mae": float("nan"),
                    "fit_s": res[key]["ensemble_seconds"],
                    "local_s": local_s,
                }
            )
            continue
        mean, var = np.array(res[key]["mean"])[:, None], np.array(res[key]["var"])[:, None]
        # the label names the rule, never the value, so that the summary pools the trials of one method
        for s2, s2_label in ((res["sigma"] ** 2, "σ=1 fixed"), (ours["noise"], "σ² as ours")):
            rows.append(
                {
                    "setting": name,
                    "method": f"pmorenoz/RecyclableGP ensemble on {label}, {s2_label}",
                    "noise_variance": float(s2),
                    **_scores(Y_test, F_test, mean, var + s2, _in_range(X_test, cfg)),
                    "fit_s": res[key]["ensemble_seconds"],
                    "local_s": local_s,
                    "our_fit_s": ours["fit_s"],
                    "speed_ratio": res[key]["ensemble_seconds"] / ours["fit_s"],
                }
            )
        print(
            f"[{name}] peer ensemble fit on {label}: {res[key]['ensemble_seconds']:.2f} s vs ours "
            f"{ours['fit_s']:.2f} s → ratio {res[key]['ensemble_seconds'] / ours['fit_s']:.1f}×; its final bound "
            f"(its KL(p‖q)) {res[key]['bound']:.2f}, ours {ours['bound']:.2f}",
            file=sys.stderr,
            flush=True,
        )
    return rows


def pyramid_rows(args: argparse.Namespace, cfg: dict, test: tuple, ten_k_models: list | None) -> List[Row]:
    """The distributed task with ``--pyramid-replicas`` R (N = R · 50 · 200): local models, then the pyramid
    (groups of 10 at every level, §3.2) and, for comparison, one flat ensemble over all local models."""
    R = args.pyramid_replicas
    if R == 1 and ten_k_models is not None:
        recs, t_local = ten_k_models, float("nan")
    else:
        d = distributed_segments(replicas=R, seed=args.seed)
        recs, t_local, _ = _local_models(list(d.clients), cfg["M_k"], cfg["kernel"], cfg["noise"], cfg["local_maxiter"])
    K, rows = len(recs), []
    levels, n = [K], K
    while n > 1:
        n = -(-n // 10)
        levels.append(n)
    Z_star = np.linspace(cfg["lo"], cfg["hi"], cfg["M"])[:, None]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecyclableWarning)
        t0 = time.perf_counter()
        top = fit_pyramid(recs, 10, _se(*cfg["kernel"]), Z_star, maxiter=cfg["maxiter"])
        t_pyr = time.perf_counter() - t0
        t0 = time.perf_counter()
        flat = EnsembleSVGP(recs, _se(*cfg["kernel"]), Z_star)
        flat.fit(maxiter=cfg["maxiter"])
        t_flat = time.perf_counter() - t0
    setting = f"pyramid N={K * 200:,} (K={K})"
    for model, label, t in (
        (top, f"Recyclable pyramid ({' → '.join(map(str, levels))})", t_pyr),
        (flat, f"flat ensemble over all {K}", t_flat),
    ):
        mean, var = (t_.numpy() for t_ in model.predict_y(test[0]))
        rows.append(
            {
                "setting": setting,
                "method": label,
                **_scores(test[1], test[2], mean, var),
                "fit_s": t,
                "local_s": t_local,
            }
        )
    return rows


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


def summarise(rows: List[Row]) -> List[Row]:
    """Mean ± sd over trials (``seed``) of every method's NLPD, RMSE, MAE, fit times and speed ratio."""
    summary: List[Row] = []
    for method in dict.fromkeys(r["method"] for r in rows):
        group = [r for r in rows if r["method"] == method]
        out: Row = {"method": method, "trials": len(group), "seeds": [r.get("seed") for r in group]}
        for key in (
            "nlpd",
            "rmse",
            "rmse_in_range",
            "rmse_outside",
            "mae",
            "fit_s",
            "local_s",
            "refitted",
            "speed_ratio",
        ):
            values = np.array([r[key] for r in group if key in r], dtype=float)
            if values.size:
                sd = float(values.std(ddof=1)) if values.size > 1 else float("nan")
                out[key] = {"mean": float(values.mean()), "sd": sd}
        summary.append(out)
    return summary


def _print_summary(name: str, summary: List[Row]) -> None:
    def cell(r: Row, key: str, fmt: str) -> str:
        v = r.get(key)
        return "" if v is None else f"{v['mean']:{fmt}} ± {v['sd']:{fmt}}"

    print(f"\n{name}: mean ± sd over trials\n")
    print(
        "| method | trials | NLPD | RMSE | RMSE in [lo, hi] | RMSE outside | MAE | ensemble fit (s) "
        "| speed ratio (peer / ours) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in summary:
        print(
            f"| {r['method']} | {r['trials']} | {cell(r, 'nlpd', '.3f')} | {cell(r, 'rmse', '.3f')} | "
            f"{cell(r, 'rmse_in_range', '.3f')} | {cell(r, 'rmse_outside', '.3f')} | "
            f"{cell(r, 'mae', '.3f')} | {cell(r, 'fit_s', '.2f')} | {cell(r, 'speed_ratio', '.1f')} |",
            flush=True,
        )


def _distributed_cfg(name: str) -> dict:
    """Experiment (ii): 10k = 50 segments × 200 points, 100k = 5 overlapping replicas × 50 segments × 400."""
    return dict(
        M_k=3,
        M=35,
        lo=0.0,
        hi=5.0,
        kernel=(5.0, 0.3),
        noise=1.0,
        local_maxiter=200,
        maxiter=200,
        gpr_experts=False,  # the SVGP local models are the exact collapsed optimum: same committees, 2× cheaper
        local_variants=name == "10k",
        data=dict(num_per_segment=400, replicas=5) if name == "100k" else {},
    )


def run_trials(args: argparse.Namespace, name: str, rows: "_Printer") -> list:
    """``args.trials`` trials (seeds 0..N−1) of a distributed setting; the authors' code on the first
    ``args.peer_trials`` of them. Saves the rows and the summary after every trial. Returns trial 0's models."""
    cfg = _distributed_cfg(name)
    trial_rows: List[Row] = []
    commands: List[str] = []
    first = None
    results = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "runs", "bench")
    if not args.quick:  # a smoke run never lands among the saved protocol runs
        results = RESULTS
    path = args.out or os.path.join(results, f"recyclable_{name}{'_quick' if args.quick else ''}.json")
    if args.resume and os.path.exists(path):  # continue an interrupted protocol from its saved trials
        with open(path) as f:
            saved = json.load(f)
        trial_rows, commands = saved["rows"], saved.get("commands", [saved["command"]])
        rows += trial_rows
    commands.append(command(__file__))
    for seed in range(len({r["seed"] for r in trial_rows}), args.trials):
        d = distributed_segments(seed=seed, **cfg["data"])
        test = (d.test[0], d.test[1], smooth_function(d.test[0]))
        new_rows, recs = run_setting(name, list(d.clients), test, cfg)
        first = recs if first is None else first
        if args.peer_python and name == "10k" and seed < args.peer_trials:
            new_rows += run_peer(args, name, list(d.clients), test, cfg, recs, new_rows[0])
        for r in new_rows:
            r["seed"] = seed
        rows += new_rows
        trial_rows += new_rows
        payload = {"setting": name, "config": cfg, "trials_done": seed + 1, "commands": commands}
        save(path, {**payload, "summary": summarise(trial_rows), "rows": trial_rows}, __file__)
        print(f"[{name}] trial {seed} done, saved {path}", file=sys.stderr, flush=True)
    summary = summarise(trial_rows)
    _print_summary(name, summary)
    return first


def main(argv: List[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", default="toy,10k,pyramid,sunspots")
    parser.add_argument("--seed", type=int, default=0, help="seed of the single-trial settings")
    parser.add_argument("--trials", type=int, default=10, help="10k/100k: trials with seeds 0..N-1 (paper: 10)")
    parser.add_argument("--quick", action="store_true", help="10k only, 2 trials, no peer (a few minutes)")
    parser.add_argument("--resume", action="store_true", help="10k/100k: keep the saved trials, run the rest")
    parser.add_argument(
        "--out",
        default=None,
        help="JSON of the one distributed setting run (default benchmarks/results/recyclable_<setting>.json; "
        "with --quick runs/bench/recyclable_10k_quick.json); with --resume, the trials to continue",
    )
    parser.add_argument("--peer-python", default=None)
    parser.add_argument("--peer-src", default=None)
    parser.add_argument("--peer-trials", type=int, default=3, help="10k trials that also run the authors' code")
    parser.add_argument(
        "--peer-driver", default=os.path.join(os.path.dirname(__file__), "peer", "recyclable_gp_driver.py")
    )
    parser.add_argument("--peer-local-iters", type=int, default=15, help="the authors' local VEM iterations")
    parser.add_argument(
        "--pyramid-replicas",
        type=int,
        default=1,
        help="pyramid data: replicas × 50 segments × 200 points (1: the 10k models)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.settings, args.trials, args.peer_python = "10k", 2, None
    if args.trials < 1 or args.peer_trials < 0:
        parser.error("--trials must be ≥ 1 and --peer-trials ≥ 0")
    if args.out and len([s for s in args.settings.split(",") if s in ("10k", "100k")]) != 1:
        parser.error("--out needs exactly one distributed setting (10k or 100k)")
    settings = args.settings.split(",")
    if "speed" in settings:
        print("| step | method | seconds | mean local ELBO / ensemble bound |\n|---|---|---|---|", flush=True)
        for r in speed_rows(args.seed):
            print(f"| {r['what']} | {r['method']} | {r['seconds']:.2f} | {r['value']:.2f} |", flush=True)
        settings = [s for s in settings if s != "speed"]
        if not settings:
            return
        print()
    rows = _Printer()
    ten_k_models = None
    for name in settings:
        if name in ("10k", "100k"):
            models = run_trials(args, name, rows)
            ten_k_models = models if name == "10k" else ten_k_models
            continue
        if name == "toy":
            d = toy_concatenation(seed=args.seed)
            clients, test = list(d.clients), (d.test[0], d.test[1], smooth_function_bias(d.test[0]))
            cfg = dict(M_k=15, M=35, lo=0.0, hi=5.5, kernel=(5.0, 0.3), noise=1.0, local_maxiter=200, maxiter=200)
        elif name == "pyramid":
            d = distributed_segments(seed=args.seed)
            new_rows = pyramid_rows(
                args, _distributed_cfg("10k"), (d.test[0], d.test[1], smooth_function(d.test[0])), ten_k_models
            )
            rows += new_rows
            _save_single(args, f"pyramid_r{args.pyramid_replicas}", new_rows)
            continue
        elif name == "sunspots":
            clients, test = sunspots_tasks(args.seed)
            cfg = dict(M_k=6, M=90, lo=0.0, hi=100.0, kernel=(1.0, 0.2), noise=0.01, local_maxiter=200, maxiter=200)
        else:
            raise ValueError(f"unknown setting {name!r}")
        new_rows, recs = run_setting(name, clients, test, cfg)
        rows += new_rows
        if args.peer_python and name == "toy":
            peer_rows = run_peer(args, name, clients, test, cfg, recs, new_rows[0])
            rows += peer_rows
            new_rows += peer_rows
        _save_single(args, name, new_rows)
        print(f"[done {name}]", file=sys.stderr, flush=True)


def _save_single(args: argparse.Namespace, name: str, rows: List[Row]) -> None:
    """The rows of a one-seed setting (toy, pyramid, sunspots) in ``benchmarks/results/recyclable_<name>.json``."""
    save(
        os.path.join(RESULTS, f"recyclable_{name}.json"),
        {"setting": name, "seed": args.seed, "rows": [dict(r, seed=args.seed) for r in rows]},
        __file__,
    )


class _Printer(list):
    """Collects rows and prints each as a Markdown table row as soon as it is added (header first)."""

    def __init__(self) -> None:
        super().__init__()
        print("| setting | method | NLPD | RMSE | MAE | ensemble fit (s) | local/expert fit (s) |")
        print("|---|---|---|---|---|---|---|", flush=True)

    def append(self, r: Row) -> None:
        super().append(r)
        print(
            f"| {r['setting']} | {r['method']} | {r['nlpd']:.3f} | {r['rmse']:.3f} | {r['mae']:.3f} | "
            f"{r['fit_s']:.2f} | {r['local_s']:.1f} |",
            flush=True,
        )

    def __iadd__(self, new: List[Row]) -> "_Printer":
        for r in new:
            self.append(r)
        return self


if __name__ == "__main__":
    main()
