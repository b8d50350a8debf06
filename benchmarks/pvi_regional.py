"""PVI on regional clients: which cause keeps DPO short of global VI? (issue 34, finding 2; benchmarks/papers/pvi.md)

Each *variant* changes one thing of the default DPO run of ``benchmarks/pvi.py`` on ozone (10 k-means regions,
M = 100, 100 sequential communications, the same data, splits, seeds and evaluation every K communications):

``default``      the main table's DPO run, again, with the diagnostics below;
``precision100`` the paper's App. D literally: every initial client factor t_k⁰(Z), t_k⁰(log β) has precision 100
                 (``initial_factors="split"`` with q⁰'s variance 1 / (1 + 100 K), so that each of the K shares is
                 100; the ``split`` runs of the PVI page shared a total precision of 100 among the K factors);
``patience``     longer local runs and a less noisy objective: patience 200 (not 50), 5 Monte-Carlo samples per
                 Adam step (not 1);
``uniform_z``    the initial inducing means drawn uniformly over the box of the data's public bounds (latitude
                 −21.2…36.2, longitude −113.8…−56.2, month 1…72, ``load_ozone``'s documented grid), as the paper
                 does for its weather data, instead of N(0, I) in standardised units;
``short_month``  q(log β) started at a month lengthscale of 0.1 standardised units (≈ 2 months) instead of 1;
``damped``       the server applies half of every update (``damping=0.5``; the paper's PVI is undamped).

Per client update it saves (``updates``): the Adam steps taken, the jitter the update ended with, the clipped
cavity coordinates, the local free energy, the mean standard deviation of the updated q(Z), exp of q(log β)'s mean
(``beta``; ``--summarize`` prints it after the first K updates and after the last), and how many inducing means lie
nearest (latitude/longitude) to the updating client's own region before and after its update (does a client pull
inducing means toward its region?). Per communication (``rounds``): q(Z)'s spread and how many regions have an
inducing mean nearest to them. Every K communications: the test log-likelihood per point (``curve``), as
``pvi.py``. The JSON is saved after every update, so a stopped run keeps what it did.

**What counts as discriminating (written before any variant ran; the PVI page repeats it).** Per variant, on
splits s = 0, 1, 2 (at least three, each to 100 communications): d_s = ll(variant, s) − ll(default DPO, s), the
default from the saved main-table runs (``pvi_ozone*.json``), and g_s = ll(global VI, s) − ll(variant, s).

* **closes the gap**: g_s ≤ 0.05 on every split;
* **narrows the gap**: mean d ≥ +0.05 and d_s > 0 on every split;
* **widens the gap**: mean d ≤ −0.05 and d_s < 0 on every split;
* **no effect found**: anything else (|mean d| < 0.05, or signs that differ between splits);
* fewer than three finished splits: **not enough runs** (no verdict).

0.05 nats/point is the band the PVI page uses for "within reach of global VI" and twice the split-to-split sd
of the default's gap (0.023 over 5 splits). The variant with the largest mean d is then run at 32 regions (200
communications, M_k ≤ 100) on the saved 32-region splits 0, 1 and 4, judged by the same rule against
``pvi_ozone32_s*.json``.

    python benchmarks/pvi_regional.py --variants precision100 --splits 0 1 2 --out FILE.json
    python benchmarks/pvi_regional.py --summarize --out FILE.json [--also MORE.json ...]   # progress, verdicts
    python benchmarks/pvi_regional.py --quick --variants default,damped --splits 0 --out /tmp/pvi_regional.json
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from provenance import save  # noqa: E402

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
VARIANTS = ("default", "precision100", "patience", "uniform_z", "short_month", "damped")
#: the ozone grid's documented extent (``gpflow_fed.data.load_ozone``): latitude, longitude, month index
PUBLIC_BOX = ((-21.2, 36.2), (-113.8, -56.2), (1.0, 72.0))
SHORT_MONTH = 0.1  # standardised units; the month index's sd is ≈ 21, so ≈ 2 months
BAND = 0.05  # nats/point: the rule of the module docstring
#: the entries of q(log β) (``local.initial_log_beta``'s order for ozone's three inputs and a Gaussian likelihood)
BETA_NAMES = ("latitude lengthscale", "longitude lengthscale", "month lengthscale", "kernel variance", "noise variance")


def split_with_scaler(split: int, clients: int, max_points: int) -> Tuple[Any, Any]:
    """``real_split("ozone", ...)`` and the standardiser it applied (needed to map the public box)."""
    from gpflow_fed.data import load_dataset, real_split
    from gpflow_fed.data.partition import make_federated

    real = load_dataset("ozone")
    X, Y, coords = real.X, real.Y, real.coordinates
    if max_points and X.shape[0] > max_points:
        keep = np.sort(np.random.default_rng(0).choice(X.shape[0], max_points, replace=False))
        X, Y, coords = X[keep], Y[keep], coords[keep]
    raw = make_federated(
        X, Y, num_clients=clients, test_fraction=0.1, seed=split, name="ozone", partition="spatial", coordinates=coords
    )
    fed, scaler = raw.standardized()
    reference = real_split("ozone", split, clients, max_points)
    if not all(np.array_equal(a[0], b[0]) for a, b in zip(fed.clients, reference.clients)):
        raise RuntimeError("this script's ozone split differs from real_split's: update split_with_scaler")
    return fed, scaler


def build(variant: str, fed: Any, scaler: Any, a: argparse.Namespace, on_update: Any) -> Any:
    """The default DPO run of ``pvi.py`` (``make_pvi("dpo", ...)``) with the one change ``variant`` names."""
    from gpflow_fed.federated.algorithms.pvi.methods import make_pvi

    K, D = fed.num_clients, fed.input_dim
    options: Dict[str, Any] = dict(
        local_steps=a.local_steps,
        patience=a.patience,
        max_pseudo=a.max_pseudo,
        num_predict_samples=a.predict_samples,
        on_client_update=on_update,
    )
    if variant == "precision100":
        share = 1.0 / (1.0 + 100.0 * K)  # q⁰ = prior · Π_k t_k⁰ with every t_k⁰ of precision 100
        options.update(initial_factors="split", init_Z_var=share, init_rho_var=share)
    elif variant == "patience":
        options.update(patience=4 * a.patience, num_samples=5)
    elif variant == "damped":
        options.update(damping=0.5)
    elif variant not in ("default", "uniform_z", "short_month"):
        raise ValueError(f"unknown variant {variant!r}; choose from {VARIANTS}")
    algorithm = make_pvi("dpo", D, a.rounds, a.inducing, a.split, **options)
    if variant == "uniform_z":  # the same seed's draw, uniform over the public box in standardised units
        low, high = (np.array(bound) for bound in zip(*PUBLIC_BOX))
        low, high = (scaler.X_std.ravel() ** -1 * (b - scaler.X_mean.ravel()) for b in (low, high))
        algorithm.Z0 = np.random.default_rng(a.split).uniform(low, high, size=algorithm.Z0.shape)
    if variant == "short_month":
        lengthscales = np.ones(D)
        lengthscales[2] = SHORT_MONTH
        algorithm.kernel.lengthscales.assign(lengthscales)
    return algorithm


def run_variant(variant: str, a: argparse.Namespace, record: Dict[str, Any], flush: Any) -> None:
    """One variant on split ``a.split``: fills ``record`` (curve, ll, diagnostics) and calls ``flush`` after
    every client update and every evaluation."""
    from gpflow_fed import metrics
    from gpflow_fed.federated import LocalRuntime, Protection, run

    fed, scaler = split_with_scaler(a.split, a.clients, a.max_points)
    train = np.concatenate([X for X, _ in fed.clients])
    owner = np.concatenate([np.full(len(X), k) for k, (X, _) in enumerate(fed.clients)])

    def regions(means: np.ndarray) -> np.ndarray:
        """The region (client) whose training inputs are nearest to each inducing mean in latitude/longitude."""
        return owner[((means[:, None, :2] - train[None, :, :2]) ** 2).sum(-1).argmin(1)]

    before = {"means": None}
    updates: List[Dict[str, Any]] = record.setdefault("updates", [])
    rounds: List[Dict[str, Any]] = record.setdefault("rounds", [])
    curve: List[float] = record.setdefault("curve", [])

    def on_update(update: Any) -> None:
        worker = update.worker
        mean, var = worker.q_Z_moments()
        rho, _ = worker.q_rho_moments()
        k = int(update.client_id.rsplit("_", 1)[-1])  # LocalRuntime names client k "client_k"
        previous = algorithm.Z0 if before["means"] is None else before["means"]
        updates.append(
            {
                "client": k,
                "steps": update.metrics["local_steps"],
                "cavity_clipped": update.metrics["cavity_clipped"],
                "free_energy": update.metrics.get("free_energy"),
                "jitter": float(worker.jitter.numpy()),
                "qZ_std": float(np.sqrt(var).mean()),
                "beta": np.exp(rho).round(5).tolist(),
                "own_region_means_before": int((regions(previous) == k).sum()),
                "own_region_means_after": int((regions(mean) == k).sum()),
            }
        )
        record["seconds"] = time.perf_counter() - start
        flush()  # every update: late updates can run to the step cap for minutes each

    algorithm = build(variant, fed, scaler, a, on_update)
    Xt, Yt = fed.test
    every = fed.num_clients

    def monitor(r: int, *, state: Any, algorithm: Any, **_: Any) -> None:
        mean, var = state.qZ.moments()
        before["means"] = mean
        rounds.append({"round": r, "qZ_std": float(np.sqrt(var).mean()), "regions": len(set(regions(mean)))})
        if (r + 1) % every == 0 and r + 1 < a.rounds:
            curve.append(metrics.log_likelihood_per_point(algorithm.result(state), (Xt, Yt)))
            record["seconds"] = time.perf_counter() - start
            flush()

    start = time.perf_counter()
    result = run(
        algorithm,
        fed,
        runtime=LocalRuntime(protection=Protection(secure_aggregation=False)),
        monitor=monitor,
        seed=a.split,
    )
    record["ll"] = metrics.log_likelihood_per_point(result.model, (Xt, Yt))
    record["rmse"] = metrics.rmse(Yt, result.model.predict_y(Xt)[0].numpy())
    curve.append(record["ll"])
    record.update(every=every, seconds=result.seconds, finished=True)
    flush()


def saved_reference(clients: int) -> Dict[Tuple[str, int], float]:
    """The saved default-DPO and global-VI test log-likelihoods per split (``pvi.py``'s runs)."""
    pattern = "pvi_ozone32_s*.json" if clients == 32 else "pvi_ozone*.json"
    out: Dict[Tuple[str, int], float] = {}
    for path in sorted(glob.glob(os.path.join(RESULTS, pattern))):
        if "split_factors" in path or "trace" in path or (clients != 32 and "ozone32" in path):
            continue
        with open(path) as fh:
            saved = json.load(fh)
        for key, run in saved.get("runs", saved).items():
            name, method, split = key.split("|")
            if name == "ozone" and method in ("dpo", "global"):
                out[(method, int(split))] = run["ll"]
    return out


def verdict(runs: Dict[int, float], reference: Dict[Tuple[str, int], float]) -> Dict[str, Any]:
    """The rule of the module docstring for one variant's finished runs (split → test log-likelihood)."""
    splits = sorted(s for s in runs if ("dpo", s) in reference and ("global", s) in reference)
    d = np.array([runs[s] - reference[("dpo", s)] for s in splits])
    g = np.array([reference[("global", s)] - runs[s] for s in splits])
    out: Dict[str, Any] = {"splits": splits, "d": d.round(4).tolist(), "gap_to_global": g.round(4).tolist()}
    if len(splits) < 3:
        out["verdict"] = "not enough runs"
    elif np.all(g <= BAND):
        out["verdict"] = "closes the gap"
    elif d.mean() >= BAND and np.all(d > 0):
        out["verdict"] = "narrows the gap"
    elif d.mean() <= -BAND and np.all(d < 0):
        out["verdict"] = "widens the gap"
    else:
        out["verdict"] = "no effect found"
    if splits:
        out["mean_d"] = round(float(d.mean()), 4)
    return out


def saved_default_curves(clients: int) -> Dict[int, List[float]]:
    """The saved default DPO run's test log-likelihood after every K communications, per split."""
    pattern = "pvi_ozone32_s*.json" if clients == 32 else "pvi_ozone*.json"
    out: Dict[int, List[float]] = {}
    for path in sorted(glob.glob(os.path.join(RESULTS, pattern))):
        if "split_factors" in path or "trace" in path or (clients != 32 and "ozone32" in path):
            continue
        with open(path) as fh:
            saved = json.load(fh)
        for key, run in saved.get("runs", saved).items():
            name, method, split = key.split("|")
            if name == "ozone" and method == "dpo":
                out[int(split)] = run["curve"]
    return out


def progress(saved: Dict[str, Any], clients: int) -> List[Dict[str, Any]]:
    """Per saved run, finished or not: its curve against the default's at the same communications, and a digest
    of its per-update diagnostics. Prints one Markdown row each."""
    defaults = saved_default_curves(clients)
    rows = []
    print(
        "| run | communications | test log-lik (default DPO at the same point) | Adam steps per update (median, max) "
        "| updates with clipped cavities | largest jitter | q(Z) spread at the end | regions with an inducing mean "
        "| updates that added means to their own region | seconds |"
    )
    print("|---" * 10 + "|")
    for key, record in saved["runs"].items():
        split = int(key.split("|")[2])
        updates, rounds, curve = record.get("updates", []), record.get("rounds", []), record.get("curve", [])
        default = defaults.get(split, [])
        pairs = ", ".join(
            f"{v:.3f} ({default[i]:.3f})" if i < len(default) else f"{v:.3f}" for i, v in enumerate(curve)
        )
        steps = [u["steps"] for u in updates]
        row = {
            "run": key,
            "communications": len(rounds),
            "curve": curve,
            "default_curve": default[: len(curve)],
            "steps_median": float(np.median(steps)) if steps else float("nan"),
            "steps_max": max(steps, default=float("nan")),
            "clipped_updates": sum(u["cavity_clipped"] > 0 for u in updates),
            "max_jitter": max((u["jitter"] for u in updates), default=float("nan")),
            "qZ_std_end": rounds[-1]["qZ_std"] if rounds else float("nan"),
            "regions_end": rounds[-1]["regions"] if rounds else 0,
            "pulled_own_region": sum(u["own_region_means_after"] > u["own_region_means_before"] for u in updates),
            "seconds": record.get("seconds", float("nan")),
        }
        rows.append(row)
        print(
            f"| {key.replace('|', ' ')} | {row['communications']} | {pairs} | "
            f"{row['steps_median']:.0f}, {row['steps_max']:.0f} | "
            f"{row['clipped_updates']} of {len(updates)} | {row['max_jitter']:.0e} | {row['qZ_std_end']:.3f} | "
            f"{row['regions_end']} of {clients} | {row['pulled_own_region']} of {len(updates)} | {row['seconds']:.0f} |"
        )
    return rows


def hyperparameters(saved: Dict[str, Any], clients: int) -> List[Dict[str, Any]]:
    """Per saved run with at least K updates: exp of q(log β)'s mean (the SE-ARD lengthscales of latitude,
    longitude and month in standardised units, the kernel variance, the noise variance) after the first K
    updates (every region once) and after the last update. Prints one Markdown row each."""
    print("| run | after | " + " | ".join(BETA_NAMES) + " |")
    print("|---|---" + "|---" * len(BETA_NAMES) + "|")
    rows = []
    for key, record in saved["runs"].items():
        updates = record.get("updates", [])
        if len(updates) < clients:
            continue
        for after, update in ((f"{clients} updates", updates[clients - 1]), (f"{len(updates)} updates", updates[-1])):
            row = {"run": key, "after": after, **dict(zip(BETA_NAMES, update["beta"]))}
            rows.append(row)
            values = " | ".join(f"{row[name]:,.3g}" for name in BETA_NAMES)
            print(f"| {key.replace('|', ' ')} | {after} | {values} |")
    return rows


def summarize(saved: Dict[str, Any], clients: int) -> Dict[str, Dict[str, Any]]:
    """Per variant: its finished runs judged by :func:`verdict`; prints one Markdown row each."""
    reference = saved_reference(clients)
    finished: Dict[str, Dict[int, float]] = {}
    for key, record in saved["runs"].items():
        _, variant, split = key.split("|")
        if record.get("finished"):
            finished.setdefault(variant, {})[int(split)] = record["ll"]
    verdicts = {variant: verdict(runs, reference) for variant, runs in finished.items()}
    print("| variant | splits | d = variant − default DPO | global VI − variant | mean d | verdict |")
    print("|---|---|---|---|---|---|")
    for variant, v in verdicts.items():
        d, g = (", ".join(f"{x:+.3f}" for x in v[k]) for k in ("d", "gap_to_global"))
        print(f"| {variant} | {v['splits']} | {d} | {g} | {v.get('mean_d', float('nan')):+.3f} | {v['verdict']} |")
    return verdicts


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", default="precision100", help=f"comma-separated, of {','.join(VARIANTS)}")
    p.add_argument("--splits", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--inducing", type=int, default=100)
    p.add_argument("--max-pseudo", type=int, default=500)
    p.add_argument("--local-steps", type=int, default=5000)
    p.add_argument("--patience", type=int, default=50)
    p.add_argument("--predict-samples", type=int, default=100)
    p.add_argument("--max-points", type=int, default=4000)
    p.add_argument("--quick", action="store_true", help="M = 20, 20 communications, 200 local steps, 20 samples")
    p.add_argument("--out", required=True, help="JSON file (runs already in it are kept; a finished run is skipped)")
    p.add_argument("--summarize", action="store_true", help="print the verdicts of the finished runs in --out")
    p.add_argument(
        "--also",
        nargs="+",
        default=[],
        help="--summarize: more saved files whose runs are judged with --out's (a finished run replaces an unfinished "
        "one; two finished copies are refused)",
    )
    a = p.parse_args(argv)
    if a.quick:
        a.inducing, a.rounds, a.local_steps, a.predict_samples = 20, 20, 200, 20
    saved: Dict[str, Any] = {"runs": {}}
    if os.path.exists(a.out):
        with open(a.out) as fh:
            saved = json.load(fh)
    if a.summarize:
        for path in a.also:  # runs saved by separate processes (each file keeps its own provenance)
            with open(path) as fh:
                more = json.load(fh)["runs"]
            both = sorted(k for k in set(more) & set(saved["runs"]) if more[k].get("finished"))
            if any(saved["runs"][k].get("finished") for k in both):  # an unfinished copy gives way to a finished one
                raise SystemExit(f"{path} repeats finished runs of {a.out}: {both}")
            saved["runs"].update({k: r for k, r in more.items() if r.get("finished") or k not in saved["runs"]})
        progress(saved, a.clients)
        print()
        hyperparameters(saved, a.clients)
        print()
        summarize(saved, a.clients)
        return 0
    config = {k: getattr(a, k) for k in ("clients", "rounds", "inducing", "max_pseudo", "local_steps", "patience")}
    for variant in a.variants.split(","):
        if variant not in VARIANTS:
            raise SystemExit(f"unknown variant {variant!r}; choose from {VARIANTS}")
        for split in a.splits:
            key = f"ozone|{variant}|{split}"
            if saved["runs"].get(key, {}).get("finished"):
                continue
            record: Dict[str, Any] = {"config": dict(config, split=split)}
            saved["runs"][key] = record
            a.split = split
            flush = lambda: save(a.out, {"runs": saved["runs"]}, __file__, argv)  # noqa: E731
            run_variant(variant, a, record, flush)
            print(f"# {key}: ll {record['ll']:.4f} in {record['seconds']:.0f} s", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
