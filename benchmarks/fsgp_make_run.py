"""``make run``'s comparison (``gpflow-fed fsgp``: Mauna Loa CO₂, K = 5, R = 50, P = 3, M = 30) over seeds.

One ``make run`` prints one seed, where FGP (0.0269) beat FSGP (0.0285) in test RMSE. This script runs the same
comparison (:func:`gpflow_fed.cli.fsgp.compare`, the CLI's own code and defaults) for several seeds and, with
``--inducing``, several M, so that the gap can be split as in BENCHMARKS.md's FSGP section: FSGP − centralized
SGPR (what FedAvg's client-sum objective costs) and centralized SGPR − FGP (what a sparse model at this M costs
against exact local GPs). Every method gets the same kernel, initial values and R·P gradient steps.

Usage: ``python benchmarks/fsgp_make_run.py [--seeds 0 1 2 3 4] [--inducing 30 100] [--rounds 50]
[--out benchmarks/results/fsgp_make_run.json]``; ``--quick`` runs the CLI's smoke settings.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from provenance import save  # noqa: E402

from gpflow_fed.cli.fsgp import DEFAULTS, INITIAL_NOISE_VARIANCE, QUICK, compare  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "fsgp_make_run.json")
#: the table's method labels (``compare``'s rows) → short names; local-only SGPR's label names K
SHORT = {"FSGP (fedavg)": "fsgp", "exact federated SGPR": "fsgp_exact", "centralized SGPR": "sgpr", "FGP (rBCM)": "fgp"}
#: paired (same seed and M) RMSE differences: (a, b) → a − b
PAIRS = (("fsgp", "fgp"), ("sgpr", "fgp"), ("fsgp", "sgpr"))


def settings_for(seed: int, inducing: int, rounds: int, quick: bool) -> Dict:
    """``make run``'s settings (the CLI's defaults; with ``quick`` its ``--quick`` ones) with this seed, M and R."""
    settings = dict(DEFAULTS, **(QUICK if quick else {}))
    settings.update(inducing=inducing, rounds=rounds, dataset="co2", partition="random_sizes", mode="fedavg",
                    test_fraction=0.2, seed=seed, quick=quick, csv=None)  # fmt: skip
    return settings


def one_run(seed: int, inducing: int, rounds: int, quick: bool) -> List[Dict]:
    """The comparison's rows for one seed and M: test RMSE, NLPD and seconds per method."""
    with tempfile.TemporaryDirectory() as logdir:  # the CLI's TensorBoard events are not kept
        rows, _ = compare(settings_for(seed, inducing, rounds, quick), Path(logdir), progress=False)
    return [
        {"seed": seed, "M": inducing, "method": SHORT.get(r.method, "sgpr_local"), "rmse": r.test_rmse,
         "nlpd": r.test_nlpd, "seconds": r.seconds}
        for r in rows
    ]  # fmt: skip


def summarize(runs: Sequence[Dict]) -> List[Dict]:
    """Mean ± sd over seeds per (M, method), and the :data:`PAIRS` differences paired by seed."""
    out: List[Dict] = []
    for M in sorted({r["M"] for r in runs}):
        rmse = {(r["seed"], r["method"]): r["rmse"] for r in runs if r["M"] == M}
        columns = {m: [v for (_, mm), v in rmse.items() if mm == m] for m in sorted({m for _, m in rmse})}
        for a, b in PAIRS:
            columns[f"{a}_minus_{b}"] = [rmse[s, a] - rmse[s, b] for s, m in rmse if m == a and (s, b) in rmse]
        for name, values in columns.items():
            sd = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
            negative = sum(v < 0 for v in values) if "_minus_" in name else None
            out.append({"M": M, "method": name, "n": len(values), "rmse_mean": float(np.mean(values)), "rmse_sd": sd,
                        "negative": negative})  # fmt: skip
    return out


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--inducing", nargs="+", type=int, default=[DEFAULTS["inducing"]], help="M values")
    parser.add_argument("--rounds", type=int, default=DEFAULTS["rounds"], help="R (make run: 50)")
    parser.add_argument("--quick", action="store_true", help="the CLI's --quick settings (≤ 300 rows), 2 seeds, M = 8")
    parser.add_argument("--out", default=OUT, help="JSON file of the runs and summary")
    args = parser.parse_args(list(argv))
    if args.quick:
        args.seeds, args.rounds, args.inducing = args.seeds[:2], QUICK["rounds"], [QUICK["inducing"]]
        if args.out == OUT:
            args.out = OUT.replace(".json", "_quick.json")
    runs: List[Dict] = []
    for M in args.inducing:
        for seed in args.seeds:
            new = one_run(seed, M, args.rounds, args.quick)
            print(*new, sep="\n", flush=True)
            runs += new
            made = settings_for(seed, M, args.rounds, args.quick)
            settings = {k: made[k] for k in ("rounds", "local_steps", "learning_rate", "clients", "client_fraction")}
            settings.update(initial_noise_variance=INITIAL_NOISE_VARIANCE, quick=args.quick)
            save(args.out, {"settings": settings, "summary": summarize(runs), "runs": runs}, __file__, list(argv))
    print("\n| M | method | n | test RMSE (mean ± sd) | seeds where negative |\n|---|---|---|---|---|")
    for row in summarize(runs):
        negative = "" if row["negative"] is None else f"{row['negative']} of {row['n']}"
        value = f"{row['rmse_mean']:.4f} ± {row['rmse_sd']:.4f}"
        print(f"| {row['M']} | {row['method']} | {row['n']} | {value} | {negative} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
