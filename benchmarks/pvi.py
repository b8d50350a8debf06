"""PVI benchmark (issue 5, paper §6.2): DPO, CPO, fixed-Z, FedAvg-Z and global VI on real datasets.

Full protocol: K = 10 homogeneous splits, M = 100, M_k = min(0.8 N_k, 500), 100 communications, several
splits; a spatial dataset partitioned by region. Prints a Markdown table (test log-likelihood per point and
RMSE in standardised units, mean ± s.e. over splits; communications for DPO to come within 0.05 nats of
global VI) and saves convergence plots.

    python benchmarks/pvi.py                       # full protocol (hours on 2 cores)
    python benchmarks/pvi.py --quick --datasets boston --splits 1
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np


def main(argv=None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", default="boston,concrete,ozone", help="comma-separated names (ozone/weather: spatial partition)")
    p.add_argument("--methods", default="dpo,cpo,fixed,fedavg,global")
    p.add_argument("--splits", type=int, default=5)
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--inducing", type=int, default=100)
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--local-steps", type=int, default=5000)
    p.add_argument("--fedavg-steps", type=int, default=1000)
    p.add_argument("--patience", type=int, default=50, help="early-stopping patience of each local update")
    p.add_argument("--predict-samples", type=int, default=100)
    p.add_argument("--init-noise", type=float, default=0.1, help="initial mean of q(σ_n²) (1.0 = the spec's literal log β = 0)")
    p.add_argument("--quick", action="store_true", help="M=20, 20 communications, 200 local steps, 20 prediction samples")
    p.add_argument("--max-points", type=int, default=0, help="random subset of at most this many points per dataset (0: all)")
    p.add_argument("--plot", default="benchmarks/pvi_convergence.png")
    a = p.parse_args(argv)
    if a.quick:
        a.inducing, a.rounds, a.local_steps, a.fedavg_steps, a.predict_samples = 20, 20, 200, 100, 20
    from gpflow_fed.data import load_dataset, make_federated
    from gpflow_fed.federated.algorithms.pvi_experiment import run_method, standardise

    methods = a.methods.split(",")
    rows, curves = [], {}
    for name in a.datasets.split(","):
        real = load_dataset(name)
        Xr, Yr, coords = real.X, real.Y, real.coordinates
        if a.max_points and Xr.shape[0] > a.max_points:
            keep = np.sort(np.random.default_rng(0).choice(Xr.shape[0], a.max_points, replace=False))
            Xr, Yr, coords = Xr[keep], Yr[keep], None if coords is None else coords[keep]
        spatial = real.coordinates is not None and name in ("ozone", "weather")
        res = {m: [] for m in methods}
        for split in range(a.splits):
            kw = dict(partition="spatial", coordinates=coords) if spatial else dict(partition="iid")
            fed = standardise(make_federated(Xr, Yr, num_clients=a.clients, test_fraction=0.1, seed=split, name=name, **kw))
            for m in methods:
                out = run_method(m, fed, a.rounds, a.inducing, split, local_steps=a.local_steps, fedavg_steps=a.fedavg_steps, patience=a.patience,
                                 num_predict_samples=a.predict_samples, init_noise=a.init_noise)
                res[m].append(out)
                curves[(name, m, split)] = out["curve"]
                print(f"# {name} split {split} {m}: ll {out['ll']:.4f} rmse {out['rmse']:.4f} {out['seconds']:.0f}s", file=sys.stderr, flush=True)
        for m in methods:
            ll = np.array([r["ll"] for r in res[m]])
            rm = np.array([r["rmse"] for r in res[m]])
            pm = lambda v: f"{v.mean():.3f} ± {v.std(ddof=1) / np.sqrt(len(v)):.3f}" if len(v) > 1 else f"{v.mean():.3f}"  # noqa: E731
            reach = ""
            if m == "dpo" and "global" in res:
                hits = []
                for s, r in enumerate(res["dpo"]):
                    target = res["global"][s]["ll"] - 0.05
                    idx = [i for i, v in enumerate(r["curve"]) if v >= target]
                    hits.append((idx[0] + 1) * a.clients if idx else None)
                reach = ",".join("never" if h is None else str(h) for h in hits)
            secs = np.mean([r["seconds"] for r in res[m]])
            rows.append(f"| {name} | {m} | {pm(ll)} | {pm(rm)} | {reach} | {secs:.0f} |")
    print("| dataset | method | test log-lik / point | RMSE (std. units) | comms to within 0.05 of global VI | seconds |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for (name, m, split), c in curves.items():
            if split == 0 and m != "global":
                ax.plot(a.clients * (1 + np.arange(len(c))), c, label=f"{name} {m}")
        ax.set_xlabel("communications")
        ax.set_ylabel("test log-likelihood / point")
        ax.legend(fontsize=7)
        fig.savefig(a.plot, dpi=100, bbox_inches="tight")
    except Exception as exc:  # plotting is optional
        print(f"# plot skipped: {exc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
