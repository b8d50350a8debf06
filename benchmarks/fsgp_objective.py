"""Which objective explains FSGP's gap to centralized SGPR (BENCHMARKS.md § FSGP)?

FSGP's FedAvg (Guo et al., Alg. 1 and eq. 9) averages the clients' w = (θ, σ², Z) after local steps on their own
Titsias bounds, so it seeks a stationary point of the client-sum bound

    Σ_k ELBO_k(w) = Σ_k [log N(y_k | 0, Q_kk + σ²I) − tr(K_kk − Q_kk) / (2σ²)],   Q_kk = K_ku K_uu⁻¹ K_uk,

which drops the cross-client blocks Q_kl (k ≠ l) that the pooled bound ELBO(w; D) (Titsias 2009, eq. 9 of the
FSGP paper for K = 1) keeps. This script maximises both bounds with one optimiser from the
FSGP sweep's initial values (every θ = 1, σ² = 0.01, the sweep's Z for that seed and M, the sweep's partition),
predicts with the pooled SGPR posterior at each optimum (as FSGP's final ``AggregatedSGPR`` does: eqs. 14–15),
and pairs the test RMSE by seed with FSGP's and centralized SGPR's in ``benchmarks/results/fsgp_sweep.json``.
If the client-sum optimum scores like FSGP, the gap belongs to the objective, not to FedAvg's dynamics (client
sampling, local steps, Adam).

The optimiser (``--optimizer``): ``lbfgs``, L-BFGS to convergence (at most ``--maxiter`` iterations), or ``adam``,
the sweep's centralized-SGPR protocol (tf_keras Adam, λ = 0.1, at most P·R = 4,500 steps, stopped by the same
plateau rule), so that ``pooled_adam`` repeats the sweep's SGPR run and ``client_sum_adam`` differs from it only in
the bound. Adam is for sets where L-BFGS from this start falls into the all-noise optimum (deliveries).

Usage: ``python benchmarks/fsgp_objective.py [--quick] [--datasets ...] [--ms ...] [--seeds ...]``; results in
``benchmarks/results/fsgp_objective.json`` (``--quick``: ``runs/bench/fsgp_objective_quick.json``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Dict, List, Sequence, Tuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import gpflow  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fsgp import (  # noqa: E402
    INITIAL_NOISE_VARIANCE,
    LEARNING_RATE,
    LOCAL_STEPS,
    OUT as SWEEP,
    ROUNDS,
    SETTINGS,
    TOLERANCE,
    WINDOW,
    _kernel,
    _load,
    make_dataset,
)
from provenance import save  # noqa: E402

from gpflow_fed.baselines.sgpr import train_adam  # noqa: E402
from gpflow_fed.data import FederatedDataset  # noqa: E402
from gpflow_fed.federated import Plateau  # noqa: E402
from gpflow_fed.federated.algorithms import initial_inducing_inputs  # noqa: E402
from gpflow_fed.metrics import evaluate_model  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "results", "fsgp_objective.json")
QUICK_OUT = os.path.join(os.path.dirname(HERE), "runs", "bench", "fsgp_objective_quick.json")


def shared_sgpr_models(dataset: FederatedDataset, Z: np.ndarray) -> Tuple[gpflow.models.SGPR, List[gpflow.models.SGPR]]:
    """The pooled SGPR and one SGPR per client, all sharing one kernel, likelihood and inducing variable (the
    sweep's initial values), so that both bounds are functions of the same w."""
    kernel = _kernel(dataset.input_dim)
    inducing = gpflow.inducing_variables.InducingPoints(Z.copy())
    pooled = gpflow.models.SGPR(dataset.pooled(), kernel, inducing, noise_variance=INITIAL_NOISE_VARIANCE)
    clients = []
    for X, Y in dataset.clients:
        model = gpflow.models.SGPR((X, Y), kernel, inducing, noise_variance=INITIAL_NOISE_VARIANCE)
        model.likelihood = pooled.likelihood
        clients.append(model)
    return pooled, clients


def client_sum_bound(clients: Sequence[gpflow.models.SGPR]) -> tf.Tensor:
    """Σ_k ELBO_k(w): the sum of the clients' Titsias bounds at the shared w."""
    return tf.add_n([model.elbo() for model in clients])


OPTIMIZERS = ("lbfgs", "adam")


class _NegativeBound:
    """What :func:`train_adam` needs of a model: the shared variables and the loss −bound."""

    def __init__(self, bound, variables: Sequence[tf.Variable]) -> None:
        self.bound, self.trainable_variables = bound, tuple(variables)

    def training_loss(self) -> tf.Tensor:
        return -self.bound()


def maximise(bound, variables: Sequence[tf.Variable], maxiter: int, optimizer: str = "lbfgs", N: int = 1) -> int:
    """Maximise ``bound`` over ``variables``: L-BFGS (at most ``maxiter`` iterations) or the sweep's Adam protocol
    on −bound / N (the N training points); returns the iterations or steps taken."""
    if optimizer == "adam":
        stopping = Plateau(LOCAL_STEPS * WINDOW, TOLERANCE)  # the sweep's centralized SGPR, as in sparse_runs
        return train_adam(_NegativeBound(bound, variables), N, LOCAL_STEPS * ROUNDS, LEARNING_RATE, stopping)
    result = gpflow.optimizers.Scipy().minimize(lambda: -bound(), variables, options={"maxiter": maxiter})
    return int(result.nit)


def objective_runs(dataset: FederatedDataset, M: int, seed: int, maxiter: int, optimizer: str = "lbfgs") -> List[Dict]:
    """Both bounds maximised from the sweep's start with ``optimizer`` (:data:`OPTIMIZERS`); per optimum: test
    RMSE/NLPD of the pooled SGPR posterior and both bounds per training point."""
    rows = []
    Z = initial_inducing_inputs(dataset.pooled()[0], M, seed=seed)  # the sweep's Z for (seed, M)
    N = dataset.num_data
    for method in (f"pooled_{optimizer}", f"client_sum_{optimizer}"):
        start = time.perf_counter()
        pooled, clients = shared_sgpr_models(dataset, Z)
        bound = pooled.elbo if method.startswith("pooled") else (lambda: client_sum_bound(clients))
        iterations = maximise(bound, pooled.trainable_variables, maxiter, optimizer, N)
        metrics = evaluate_model(pooled, dataset.test)
        rows.append(
            {
                "method": method,
                "M": M,
                "rmse": metrics["test_rmse"],
                "nlpd": metrics["test_nlpd"],
                "pooled_bound_per_point": float(pooled.elbo()) / N,
                "client_sum_bound_per_point": float(client_sum_bound(clients)) / N,
                "noise_variance": float(pooled.likelihood.variance.numpy()),
                "iterations": iterations,
                "seconds": time.perf_counter() - start,
            }
        )
    return rows


def column_pairs(optimizer: str) -> Dict[str, Tuple[str, str | None]]:
    """Column → (method a, method b): the RMSE of a, or the paired difference a − b (same dataset, seed and M)."""
    client_sum, pooled = f"client_sum_{optimizer}", f"pooled_{optimizer}"
    return {
        client_sum: (client_sum, None),
        pooled: (pooled, None),
        "fsgp": ("fsgp", None),
        "sgpr": ("sgpr", None),
        "fsgp_minus_client_sum": ("fsgp", client_sum),
        "client_sum_minus_pooled": (client_sum, pooled),
        "fsgp_minus_sgpr": ("fsgp", "sgpr"),
    }


def paired(rows: Sequence[Dict], sweep: Sequence[Dict], optimizer: str = "lbfgs") -> List[Dict]:
    """Mean ± sd over seeds per (dataset, M) of every :func:`column_pairs` entry; ``fsgp`` and ``sgpr`` come from the
    sweep's runs. A column is left out where the sweep lacks a run of one of its seeds."""
    rmse = {(r["dataset"], r["seed"], r["M"], r["method"]): r["rmse"] for r in [*sweep, *rows] if "M" in r}
    out = []
    for name, M in sorted({(r["dataset"], r["M"]) for r in rows}):
        seeds = sorted({r["seed"] for r in rows if (r["dataset"], r["M"]) == (name, M)})
        for column, (a, b) in column_pairs(optimizer).items():
            needed = [(name, s, M, m) for s in seeds for m in (a, b) if m]
            if not all(key in rmse for key in needed):
                continue
            values = [rmse[name, s, M, a] - (rmse[name, s, M, b] if b else 0.0) for s in seeds]
            sd = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
            out.append({"dataset": name, "M": M, "column": column, "n": len(values),
                        "mean": float(np.mean(values)), "sd": sd})  # fmt: skip
    return out


def table(summary: Sequence[Dict]) -> str:
    """Markdown: one row per (dataset, M), test RMSE mean ± sd over n seeds per column of :func:`paired`."""
    columns = list(dict.fromkeys(r["column"] for r in summary))
    cells = {(r["dataset"], r["M"], r["column"]): r for r in summary}
    lines = ["| dataset | M | n | " + " | ".join(columns) + " |", "|---|---|---|" + "---|" * len(columns)]
    for name, M in sorted({(r["dataset"], r["M"]) for r in summary}):
        n = cells[name, M, columns[0]]["n"]
        text = [f"{c['mean']:.4f} ± {c['sd']:.4f}" if c else "" for c in (cells.get((name, M, k)) for k in columns)]
        lines.append(f"| {name} | {M} | {n} | " + " | ".join(text) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="synthetic 1, M = 10, one seed")
    parser.add_argument("--datasets", nargs="+", choices=tuple(SETTINGS), default=None)
    parser.add_argument("--ms", nargs="+", type=int, default=None, help="M values (default 10 25 50 100)")
    parser.add_argument("--seeds", nargs="+", type=int, default=None, help="seeds (default 0 1 2 3 4)")
    parser.add_argument("--maxiter", type=int, default=2000, help="L-BFGS iterations at most")
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default="lbfgs", help="lbfgs, or the sweep's SGPR Adam")
    parser.add_argument("--out", default=None, help=f"JSON of the runs (default {os.path.relpath(OUT)})")
    args = parser.parse_args(list(argv))
    datasets = args.datasets or (["synthetic1"] if args.quick else ["concrete", "synthetic1"])
    Ms = args.ms or ([10] if args.quick else [10, 25, 50, 100])
    seeds = args.seeds if args.seeds is not None else ([0] if args.quick else [0, 1, 2, 3, 4])
    out = args.out or (QUICK_OUT if args.quick else OUT)
    sweep = _load(SWEEP)
    rows: List[Dict] = []
    summary: List[Dict] = []
    for name in datasets:
        for seed in seeds:
            dataset = make_dataset(name, seed)
            for M in Ms:
                for r in objective_runs(dataset, M, seed, args.maxiter, args.optimizer):
                    rows.append({"dataset": name, "seed": seed, **r})
                    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in rows[-1].items()}, flush=True)
            summary = paired(rows, sweep, args.optimizer)
            save(out, {"maxiter": args.maxiter, "optimizer": args.optimizer,
                       "sweep": os.path.relpath(SWEEP, os.path.dirname(HERE)),
                       "summary": summary, "runs": rows}, __file__, list(argv))  # fmt: skip
    print("\nTest RMSE, mean ± sd over seeds (fsgp, sgpr: benchmarks/results/fsgp_sweep.json; *_minus_*: by seed)\n")
    print(table(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
