"""PVI benchmark (issue 5, paper §6.2): DPO, CPO, fixed-Z, FedAvg-Z and global VI on real datasets.

Full protocol: K = 10 homogeneous splits, M = 100, M_k = min(0.8 N_k, 500), 100 communications, several
splits; a spatial dataset partitioned by region (the paper's regional experiment: ``--clients 32 --rounds 200
--max-pseudo 100``). Prints a Markdown table (test log-likelihood per point and
RMSE in standardised units, mean ± s.e. over splits; communications for DPO to come within 0.05 nats of
global VI) and saves convergence plots.

    python benchmarks/pvi.py                       # full protocol (hours on 2 cores)
    python benchmarks/pvi.py --quick --datasets boston --splits 1
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from provenance import save  # noqa: E402


def run_method(
    method: str, dataset: Any, rounds: int, M: int = 100, seed: int = 0, eval_every: int = 0, **options: Any
) -> Dict[str, Any]:
    """Train one of the paper's methods (:func:`~gpflow_fed.federated.algorithms.pvi.methods.make_pvi`); returns
    the test log-likelihood per point of the predictive mixture over (Z, β) (``ll``), RMSE (standardised units),
    and ``curve``: the same log-likelihood after every ``eval_every`` communications (default: one sweep, K;
    for ``"global"``, PVI on the pooled data as one client, only the final value).

    The curve is computed from the server state by a monitor (no extra client exchange), with the model
    :meth:`PVI.result <gpflow_fed.federated.algorithms.PVI.result>` returns, so it is the same quantity as ``ll``."""
    from gpflow_fed import metrics
    from gpflow_fed.data import FederatedDataset
    from gpflow_fed.federated import LocalRuntime, Protection, run
    from gpflow_fed.federated.algorithms.pvi.methods import make_pvi

    if method == "global":
        dataset = FederatedDataset([dataset.pooled()], test=dataset.test, name=dataset.name)
    every = int(eval_every) or (rounds if method == "global" else dataset.num_clients)
    alg = make_pvi(method, dataset.input_dim, rounds, M, seed, **options)
    Xt, Yt = dataset.test
    curve: List[float] = []

    def monitor(r: int, *, state: Any, algorithm: Any, **_: Any) -> None:
        if (r + 1) % every == 0 and r + 1 < rounds:
            curve.append(metrics.log_likelihood_per_point(algorithm.result(state), (Xt, Yt)))

    result = run(
        alg, dataset, runtime=LocalRuntime(protection=Protection(secure_aggregation=False)), monitor=monitor, seed=seed
    )
    ll = metrics.log_likelihood_per_point(result.model, (Xt, Yt))
    rmse = metrics.rmse(Yt, result.model.predict_y(Xt)[0].numpy())
    curve.append(ll)
    return {"ll": ll, "rmse": rmse, "curve": curve, "every": every, "seconds": result.seconds}


def report(curves: dict, datasets: list, methods: list, rounds: int, plot_prefix: str) -> None:
    """Print the Markdown table (mean ± s.e. over the splits that ran) and save one convergence plot per dataset.

    "comms to within 0.05" is, per split, the first evaluation (every K communications) at which a federated
    method's test log-likelihood is within 0.05 nats/point of global VI on the same split."""
    rows = []
    for name in datasets:
        for m in methods:
            runs = {k[2]: v for k, v in curves.items() if k[0] == name and k[1] == m}
            if not runs:
                continue
            ll = np.array([r["ll"] for r in runs.values()])
            rm = np.array([r["rmse"] for r in runs.values()])
            pm = lambda v: (
                f"{v.mean():.3f} ± {v.std(ddof=1) / np.sqrt(len(v)):.3f}" if len(v) > 1 else f"{v.mean():.3f}"
            )  # noqa: E731
            hits = []
            for split, r in runs.items():
                g = curves.get((name, "global", split))
                if m == "global" or g is None:
                    continue
                points = evaluation_points(r["every"], len(r["curve"]), rounds)
                close = [point for point, v in zip(points, r["curve"]) if v >= g["ll"] - 0.05]
                hits.append(str(close[0]) if close else "never")
            secs = np.mean([r["seconds"] for r in runs.values()])
            rows.append(f"| {name} | {m} | {len(runs)} | {pm(ll)} | {pm(rm)} | {','.join(hits)} | {secs:.0f} |")
    print(
        "| dataset | method | splits | test log-lik / point | RMSE (std. units) | comms to within 0.05 of global VI "
        "(per split) | seconds |"
    )
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print_curves(curves, datasets, methods, rounds)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # plotting is optional
        print(f"# plot skipped: {exc}", file=sys.stderr)
        return
    for name in datasets:
        fig, ax = plt.subplots(figsize=(6, 4))
        splits = sorted({k[2] for k in curves if k[0] == name})
        for i, m in enumerate(methods):
            mine = sorted(k[2] for k in curves if k[:2] == (name, m))
            runs = [curves[(name, m, s)] for s in mine]
            if not runs:
                continue
            label = m if mine == splits else f"{m} (split{'s' if len(mine) > 1 else ''} {', '.join(map(str, mine))})"
            if m == "global":
                g = np.mean([r["ll"] for r in runs])
                ax.axhline(g, color="k", label="global VI")
                ax.axhspan(g - 0.05, g, color="k", alpha=0.1, label="within 0.05 of global VI")
                continue
            c = np.mean([r["curve"] for r in runs], axis=0)
            ax.plot(evaluation_points(runs[0]["every"], len(c), rounds), c, f"C{i}o-", ms=3, label=label)
        ax.set_xlabel("communications")
        ax.set_ylabel("test log-likelihood / point")
        ax.set_title(f"{name} (mean over {len(splits)} split{'s' if len(splits) > 1 else ''})")
        ax.legend(fontsize=7)
        fig.savefig(f"{plot_prefix}_{name}.png", dpi=100, bbox_inches="tight")
        plt.close(fig)


def evaluation_points(every: int, count: int, rounds: int) -> list:
    """The communications after which a curve's ``count`` values were taken: every ``every``, the last after all
    ``rounds``."""
    return [min(every * (i + 1), rounds) for i in range(count)]


def print_curves(curves: dict, datasets: list, methods: list, rounds: int) -> None:
    """A Markdown table of every run's test log-likelihood after each evaluation (every ``every`` communications,
    the last after all ``rounds``), with global VI's final value."""
    runs = [(d, m, k[2]) for d in datasets for m in methods if m != "global" for k in sorted(curves) if k[:2] == (d, m)]
    if not runs:
        return
    every = curves[runs[0]]["every"]
    width = max(len(curves[r]["curve"]) for r in runs)
    print()
    print("| run | " + " | ".join(map(str, evaluation_points(every, width, rounds))) + " | global VI |")
    print("|---" * (width + 2) + "|")
    for d, m, split in runs:
        values = [f"{v:.3f}" for v in curves[(d, m, split)]["curve"]] + [""] * (
            width - len(curves[(d, m, split)]["curve"])
        )
        g = curves.get((d, "global", split))
        print(f"| {d} {m} s{split} | " + " | ".join(values) + f" | {'' if g is None else format(g['ll'], '.3f')} |")


def main(argv=None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--datasets",
        default=None,
        help="comma-separated names (ozone: regional clients); default boston,concrete,diabetes,ozone "
        "(--quick: boston,diabetes)",
    )
    p.add_argument("--methods", default="dpo,cpo,fixed,fixed_dpo,fedavg,global")
    p.add_argument("--splits", type=int, default=5)
    p.add_argument("--first-split", type=int, default=0, help="run splits first-split .. first-split + splits − 1")
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--inducing", type=int, default=100)
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--local-steps", type=int, default=5000)
    p.add_argument("--fedavg-steps", type=int, default=100, help="J of Alg. 1 (the paper: 1,000)")
    p.add_argument("--patience", type=int, default=50, help="early-stopping patience of each local update")
    p.add_argument(
        "--max-pseudo", type=int, default=500, help="cap on a client's pseudo-points: M_k = min(0.8 N_k, cap)"
    )
    p.add_argument("--predict-samples", type=int, default=100)
    p.add_argument(
        "--init-noise", type=float, default=0.1, help="initial mean of q(σ_n²) (1.0 = the spec's literal log β = 0)"
    )
    p.add_argument(
        "--initial-factors",
        choices=("prior", "split"),
        default="prior",
        help="PVI's initial Z/β factors: split = the paper's q⁰ = prior·Π t_k⁰ (Alg. 2 line 2); prior = t_k⁰ ≡ 1",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="one split of boston and diabetes, M=20, 20 communications, 200 local steps, 20 prediction samples",
    )
    p.add_argument(
        "--max-points", type=int, default=4000, help="random subset of at most this many points per dataset (0: all)"
    )
    p.add_argument(
        "--global-rounds",
        type=int,
        default=20,
        help="rounds of global VI (K = 1, each a local update of at most --local-steps Adam steps); "
        "0: rounds // clients",
    )
    p.add_argument(
        "--plot-prefix", default="benchmarks/pvi_convergence", help="one PNG per dataset: <prefix>_<dataset>.png"
    )
    p.add_argument("--json", default="", help="also write every run (curves included) to this JSON file")
    p.add_argument(
        "--from-json", default="", help="comma-separated JSON files of earlier runs: print the table and plots only"
    )
    a = p.parse_args(argv)
    if a.from_json:
        curves = {}
        for path in a.from_json.split(","):
            with open(path) as fh:
                saved = json.load(fh)
            runs = saved.get("runs", saved)  # files written before provenance hold the runs at the top level
            curves.update({tuple(k.split("|")[:2]) + (int(k.split("|")[2]),): v for k, v in runs.items()})
        names = list(dict.fromkeys(k[0] for k in curves))
        report(
            curves, names, [m for m in a.methods.split(",") if any(k[1] == m for k in curves)], a.rounds, a.plot_prefix
        )
        return 0
    if a.quick:
        a.inducing, a.rounds, a.local_steps, a.fedavg_steps, a.predict_samples = 20, 20, 200, 100, 20
        a.splits, a.global_rounds, a.datasets = 1, 2, a.datasets or "boston,diabetes"
    a.datasets = a.datasets or "boston,concrete,diabetes,ozone"
    from gpflow_fed.data import real_split

    methods = a.methods.split(",")
    curves = {}
    for name in a.datasets.split(","):
        for split in range(a.first_split, a.first_split + a.splits):
            fed = real_split(name, split, a.clients, a.max_points)
            for m in methods:
                rounds = (a.global_rounds or max(1, a.rounds // a.clients)) if m == "global" else a.rounds
                out = run_method(
                    m,
                    fed,
                    rounds,
                    a.inducing,
                    split,
                    local_steps=a.local_steps,
                    fedavg_steps=a.fedavg_steps,
                    patience=a.patience,
                    max_pseudo=a.max_pseudo,
                    num_predict_samples=a.predict_samples,
                    init_noise=a.init_noise,
                    initial_factors=a.initial_factors,
                )
                curves[(name, m, split)] = out
                if a.json:
                    save(a.json, {"runs": {f"{k[0]}|{k[1]}|{k[2]}": v for k, v in curves.items()}}, __file__)
                print(
                    f"# {name} split {split} {m}: ll {out['ll']:.4f} rmse {out['rmse']:.4f} {out['seconds']:.0f}s",
                    file=sys.stderr,
                    flush=True,
                )
    report(curves, a.datasets.split(","), methods, a.rounds, a.plot_prefix)
    return 0


if __name__ == "__main__":
    sys.exit(main())
