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

``--objectives fgp`` does the same for FGP, the paper's baseline: its FedAvg seeks a stationary point of
Σ_k log N(y_k | 0, K_kk + σ²I), the clients' exact-GP marginal likelihoods at the shared (θ, σ²). L-BFGS maximises
that sum from the sweep's start and the clients' exact GPs at the optimum predict by the robust BCM, as FGP's
committee does: FGP trained to convergence, whatever the number of rounds its stopping rule allowed.

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

from gpflow_fed.models.experts import ExpertCommittee  # noqa: E402
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


FGP_OPTIMUM = "fgp_optimum_lbfgs"
OBJECTIVES = ("sgpr", "fgp")


def fgp_optimum_run(dataset: FederatedDataset, maxiter: int) -> Dict:
    """FGP's objective Σ_k log N(y_k | 0, K_kk + σ²I) maximised by L-BFGS from the sweep's start (every θ = 1,
    σ² = 0.01; the clients' exact GPs share one kernel and likelihood), predicting with the robust BCM of the
    clients' exact GPs at the optimum: test RMSE/NLPD, the objective per training point and σ² there."""
    start = time.perf_counter()
    kernel = _kernel(dataset.input_dim)
    experts = [gpflow.models.GPR((X, Y), kernel, noise_variance=INITIAL_NOISE_VARIANCE) for X, Y in dataset.clients]
    for expert in experts[1:]:
        expert.likelihood = experts[0].likelihood

    def objective() -> tf.Tensor:
        return tf.add_n([expert.log_marginal_likelihood() for expert in experts])

    iterations = maximise(objective, experts[0].trainable_variables, maxiter)
    metrics = evaluate_model(ExpertCommittee(experts, rule="rbcm"), dataset.test)
    return {
        "method": FGP_OPTIMUM,
        "rmse": metrics["test_rmse"],
        "nlpd": metrics["test_nlpd"],
        "fgp_objective_per_point": float(objective()) / dataset.num_data,
        "noise_variance": float(experts[0].likelihood.variance.numpy()),
        "iterations": iterations,
        "seconds": time.perf_counter() - start,
    }


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
        "fgp_optimum": (FGP_OPTIMUM, None),
        "fgp": ("fgp_rbcm", None),
        "fgp_minus_fgp_optimum": ("fgp_rbcm", FGP_OPTIMUM),
        "client_sum_minus_fgp_optimum": (client_sum, FGP_OPTIMUM),
    }


def _groups(rows: Sequence[Dict]) -> List[Tuple[str, int | None]]:
    """The (dataset, M) pairs of ``rows``, M = None for FGP's rows (FGP has no inducing points), in table order."""
    return sorted({(r["dataset"], r.get("M")) for r in rows}, key=lambda g: (g[0], -1 if g[1] is None else g[1]))


def paired(rows: Sequence[Dict], sweep: Sequence[Dict], optimizer: str = "lbfgs") -> List[Dict]:
    """Mean ± sd over seeds per (dataset, M) of every :func:`column_pairs` entry; ``fsgp``, ``sgpr`` and ``fgp`` come
    from the sweep's runs. A run without an M (FGP's) pairs at every M. A column is left out where a run of one of
    its seeds is missing."""
    rmse = {(r["dataset"], r["seed"], r.get("M"), r["method"]): r["rmse"] for r in [*sweep, *rows]}

    def lookup(name: str, seed: int, M: int | None, method: str) -> float | None:
        return rmse.get((name, seed, M, method), rmse.get((name, seed, None, method)))

    out = []
    for name, M in _groups(rows):
        seeds = sorted({r["seed"] for r in rows if (r["dataset"], r.get("M")) == (name, M)})
        for column, (a, b) in column_pairs(optimizer).items():
            if any(lookup(name, s, M, m) is None for s in seeds for m in (a, b) if m):
                continue
            values = [lookup(name, s, M, a) - (lookup(name, s, M, b) if b else 0.0) for s in seeds]
            sd = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
            out.append({"dataset": name, "M": M, "column": column, "n": len(values),
                        "mean": float(np.mean(values)), "sd": sd})  # fmt: skip
    return out


def table(summary: Sequence[Dict]) -> str:
    """Markdown: one row per (dataset, M), test RMSE mean ± sd over n seeds per column of :func:`paired`."""
    columns = list(dict.fromkeys(r["column"] for r in summary))
    cells = {(r["dataset"], r["M"], r["column"]): r for r in summary}
    lines = ["| dataset | M | n | " + " | ".join(columns) + " |", "|---|---|---|" + "---|" * len(columns)]
    for name, M in _groups(summary):
        n = next(r["n"] for r in summary if (r["dataset"], r["M"]) == (name, M))
        text = [f"{c['mean']:.4f} ± {c['sd']:.4f}" if c else "" for c in (cells.get((name, M, k)) for k in columns)]
        lines.append(f"| {name} | {'–' if M is None else M} | {n} | " + " | ".join(text) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="synthetic 1, M = 10, one seed")
    parser.add_argument("--datasets", nargs="+", choices=tuple(SETTINGS), default=None)
    parser.add_argument("--ms", nargs="+", type=int, default=None, help="M values (default 10 25 50 100)")
    parser.add_argument("--seeds", nargs="+", type=int, default=None, help="seeds (default 0 1 2 3 4)")
    parser.add_argument("--maxiter", type=int, default=2000, help="L-BFGS iterations at most")
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default="lbfgs", help="lbfgs, or the sweep's SGPR Adam")
    objectives_help = "sgpr: FSGP's client-sum and the pooled bound per M (default); fgp: FGP's objective"
    parser.add_argument("--objectives", nargs="+", choices=OBJECTIVES, default=["sgpr"], help=objectives_help)
    pair_help = "saved runs of this script to pair with (their client-sum runs: --optimizer's)"
    parser.add_argument("--pair-with", nargs="+", default=[], metavar="JSON", help=pair_help)
    parser.add_argument("--out", default=None, help=f"JSON of the runs (default {os.path.relpath(OUT)})")
    parser.add_argument("--summarize", action="store_true", help="run nothing: print the table of --pair-with's runs")
    args = parser.parse_args(list(argv))
    datasets = args.datasets or (["synthetic1"] if args.quick else ["concrete", "synthetic1"])
    Ms = args.ms or ([10] if args.quick else [10, 25, 50, 100])
    seeds = args.seeds if args.seeds is not None else ([0] if args.quick else [0, 1, 2, 3, 4])
    out = args.out or (QUICK_OUT if args.quick else OUT)
    if args.summarize and not args.pair_with:
        parser.error("--summarize prints the runs of --pair-with's files: name at least one")
    for path in args.pair_with:
        if not os.path.exists(path):
            parser.error(f"--pair-with: no file {path}")
    sweep, earlier = _load(SWEEP), [r for path in args.pair_with for r in _load(path)]
    rows: List[Dict] = []
    summary: List[Dict] = paired(earlier, sweep, args.optimizer) if args.summarize else []
    for name in [] if args.summarize else datasets:
        for seed in seeds:
            dataset = make_dataset(name, seed)
            new = [fgp_optimum_run(dataset, args.maxiter)] if "fgp" in args.objectives else []
            for M in Ms if "sgpr" in args.objectives else ():
                new += objective_runs(dataset, M, seed, args.maxiter, args.optimizer)
            for r in new:
                rows.append({"dataset": name, "seed": seed, **r})
                print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in rows[-1].items()}, flush=True)
            summary = paired([*earlier, *rows], sweep, args.optimizer)
            save(out, {"maxiter": args.maxiter, "optimizer": args.optimizer, "objectives": args.objectives,
                       "sweep": os.path.relpath(SWEEP, os.path.dirname(HERE)), "pair_with": args.pair_with,
                       "summary": summary, "runs": rows}, __file__, list(argv))  # fmt: skip
    print(
        "\nTest RMSE, mean ± sd over seeds (fsgp, sgpr, fgp: benchmarks/results/fsgp_sweep.json; *_minus_*: by seed)\n"
    )
    print(table(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
