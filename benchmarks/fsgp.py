"""FSGP benchmark (Guo et al. §4): FSGP vs centralized SGPR vs FGP over the number of inducing points M.

For each dataset and seed (the seed draws the client sizes, the noise of the synthetic data, the train/test split
of the real data, Z and the sampled clients) it trains, from the paper's initial values (every θ = 1, σ = 0.1,
i.e. σ² = 0.01, Z a random subset of the pooled X; P = 3 local Adam steps, λ = 0.1, ``max(⌈Kρ⌉, 1)`` clients a
round):

* per M: FSGP (FedAvg) and centralized SGPR on the pooled data;
* once (no M): FGP, FedAvg over the clients' exact-GP likelihoods, predicting with the robust BCM (a committee of
  every client's GP, stronger than the FGP paper's prediction; the FSGP paper does not say which predictor its
  FGP used), with the product of experts (PoE) and with each client's own expert alone (the FGP paper's
  personalised prediction), scored two ways from per-client records saved with the run (each client's training
  size N_k, test rows n_k, squared-error sum SSE_k, RMSE_k and NLPD_k): ``fgp_local``, the unweighted mean of the
  clients' RMSEs, as the FGP paper's supplement scores its devices (§2, NASA data:
  RMSE = (1/K) Σ_k √(SSE_k / |D_k,test|)), and ``fgp_local_weighted``, each client weighted by its size
  (:func:`size_weighted_rmse`), so that a 2-point client counts 2/N of the score, not 1/K; where
  N ≤ ``--exact-max`` also centralized exact GPR (L-BFGS to convergence), the best any of these can do.
  ``--methods`` runs a subset (``--methods fgp`` rescoring FGP alone).

Stopping rule (instead of the paper's fixed T = 5,000 rounds): a :class:`~gpflow_fed.federated.Plateau`, i.e.
training stops when the mean objective over the last ``--window`` rounds (FSGP: the sampled clients' averaged
bound F_k; FGP: their per-point log-likelihood) changed by less than ``--tolerance`` relative to the window
before, or after ``--rounds`` rounds. Centralized SGPR uses the same rule on its loss with windows of
P·``--window`` steps and at most P·``--rounds`` steps. The rounds/steps taken are saved.

FGP's exact-GP cost: the largest client's kernel matrix (8·N_k² bytes, against FSGP's 8·M·N_k for C_{MN_k}) and
each method's mean wall seconds per round, measured in the same process.

Results go to ``benchmarks/results/fsgp_sweep.json`` (``--out``): every (dataset, seed, method, M) run, merged
with the runs already in the file, and mean ± sd over seeds per (dataset, M, method) with the paired
difference FSGP − FGP. Usage: ``python benchmarks/fsgp.py [--quick] [--datasets ...] [--ms ...] [--seeds ...]``;
seeds run in parallel into their own ``--out`` files join the sweep with ``--merge FILE ...`` (runs nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Dict, List, Sequence, Tuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import gpflow  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from provenance import command, save  # noqa: E402

from gpflow_fed.baselines import centralized_sgpr  # noqa: E402
from gpflow_fed.models.experts import ExpertCommittee  # noqa: E402
from gpflow_fed.data import FederatedDataset, fsgp_synthetic_1, fsgp_synthetic_2, load_dataset, make_federated  # noqa: E402
from gpflow_fed.federated import LocalRuntime, Plateau, Protection, run  # noqa: E402
from gpflow_fed.federated.algorithms import FGP, FSGP, initial_inducing_inputs  # noqa: E402
from gpflow_fed.metrics import evaluate_model  # noqa: E402

LOCAL_STEPS, LEARNING_RATE = 3, 0.1  # the paper's P and λ
ROUNDS, WINDOW, TOLERANCE = 1500, 50, 1e-3  # defaults of --rounds, --window and --tolerance
INITIAL_NOISE_STD = 0.1  # the paper's initial σ (a standard deviation): σ² = 0.01
INITIAL_NOISE_VARIANCE = INITIAL_NOISE_STD**2
#: dataset -> (K, ρ, max − min client size): the paper's K, Kρ and imbalance for its three experiments; concrete
#: (N = 824 training points, not in the paper) gets K = 10, Kρ = 5 and an imbalance of 100
SETTINGS: Dict[str, Tuple[int, float, int]] = {
    "synthetic1": (5, 0.4, 59),
    "synthetic2": (10, 0.5, 634),
    "concrete": (10, 0.5, 100),
    "deliveries": (10, 0.5, 1299),
}
#: what ``--methods`` can run: FGP (scored by rBCM, PoE and its clients alone), centralized exact GPR, and
#: ``sparse``, FSGP with centralized SGPR at every M
METHODS = ("fgp", "gpr_exact", "sparse")
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "fsgp_sweep.json")


def make_dataset(name: str, seed: int) -> FederatedDataset:
    """The federated dataset ``name`` of :data:`SETTINGS` for ``seed``: the synthetic sets in their own units
    (as the paper), the real ones standardised by their training rows, 20 % held out for testing."""
    K, _, imbalance = SETTINGS[name]
    if name.startswith("synthetic"):
        data = fsgp_synthetic_1(seed) if name == "synthetic1" else fsgp_synthetic_2(seed)
        X, Y, test = data.X_train, data.Y_train, (data.X_test, data.Y_test)
    else:
        real = load_dataset(name)
        order = np.random.default_rng(seed).permutation(real.num_data)
        cut = int(round(0.8 * real.num_data))
        train, held = order[:cut], order[cut:]
        mx, sx = real.X[train].mean(0), real.X[train].std(0)
        my, sy = real.Y[train].mean(0), real.Y[train].std(0)
        sx[sx == 0] = 1.0
        X, Y = (real.X[train] - mx) / sx, (real.Y[train] - my) / sy
        test = ((real.X[held] - mx) / sx, (real.Y[held] - my) / sy)
    return make_federated(
        X,
        Y,
        partition="random_sizes",
        num_clients=K,
        imbalance=imbalance,
        min_size=2,
        test=test,
        seed=seed,
        name=name,
    )  # min_size=2: FSGP refuses a one-point client, whose (x, y) its statistics would reveal (Theorem 1)


def _kernel(D: int) -> gpflow.kernels.Kernel:
    return gpflow.kernels.SquaredExponential(variance=1.0, lengthscales=[1.0] * D)


def _per_round(history: Sequence[Dict[str, Any]]) -> float:
    return float(np.mean([h["seconds"] for h in history]))


def fgp_runs(dataset: FederatedDataset, rho: float, rounds: int, stopping: Plateau, seed: int) -> List[Dict]:
    """FGP trained once, predicting with rBCM, PoE and each client's expert alone; FGP's exact-GP footprint."""
    D, cpu_start = dataset.input_dim, time.process_time()
    fgp = run(FGP(_kernel(D), INITIAL_NOISE_VARIANCE, rounds, LOCAL_STEPS, LEARNING_RATE, rho, stopping=stopping),
              dataset, runtime=LocalRuntime(protection=Protection(secure_aggregation=False)), seed=seed)  # fmt: skip
    cpu_seconds = time.process_time() - cpu_start  # the process's CPU time (all threads) of FGP's training
    experts = fgp.model.experts
    largest = max(dataset.client_sizes)
    common: Dict[str, Any] = {"rounds": len(fgp.history), "seconds": fgp.seconds, "cpu_seconds": cpu_seconds,
                              "seconds_per_round": _per_round(fgp.history)}  # fmt: skip
    common["largest_client"] = largest
    common["kernel_matrix_bytes"] = 8 * largest**2  # the O(N_k²) memory of its Cholesky, O(N_k³) time
    out = [{"method": "fgp_rbcm", "rmse": fgp.metrics["test_rmse"], "nlpd": fgp.metrics["test_nlpd"], **common}]
    poe = evaluate_model(ExpertCommittee(experts, rule="poe"), dataset.test)
    out.append({"method": "fgp_poe", "rmse": poe["test_rmse"], "nlpd": poe["test_nlpd"], **common})
    clients = client_records(experts, dataset)
    weighted = size_weighted_rmse(clients)
    out.append({"method": "fgp_local", "rmse": float(np.mean([c["rmse"] for c in clients])),
                "nlpd": float(np.mean([c["nlpd"] for c in clients])), **common, "clients": clients})  # fmt: skip
    out.append({"method": "fgp_local_weighted", "rmse": weighted["rmse"], "nlpd": weighted["nlpd"], **common,
                "clients": clients})  # fmt: skip
    return out


def client_records(experts: Sequence[gpflow.models.GPR], dataset: FederatedDataset) -> List[Dict[str, Any]]:
    """Each client's own expert (an exact GP on that client's data) scored on the test rows: its training size
    ``n_train`` (N_k, the rows it conditions on), the test rows it answers ``n_test`` (n_k; here every client answers
    the shared test set, n_k = L), the sum of squared errors ``sse`` = Σ_l (t_l − y_l)² = n_k·RMSE_k², its ``rmse``
    (FSGP eq. 20) and ``nlpd``."""
    n_test = int(dataset.test[1].shape[0])
    records = []
    for expert in experts:
        scores = evaluate_model(expert, dataset.test)
        rmse = scores["test_rmse"]
        records.append({"n_train": int(expert.data[0].shape[0]), "n_test": n_test, "sse": n_test * rmse**2,
                        "rmse": rmse, "nlpd": scores["test_nlpd"]})  # fmt: skip
    return records


def size_weighted_rmse(clients: Sequence[Dict[str, Any]]) -> Dict[str, float]:
    """The per-client predictor's score with each client weighted by its size N_k (``n_train``)::

        RMSE_w = √( Σ_k N_k · SSE_k / n_k  /  Σ_k N_k ),      NLPD_w = Σ_k N_k · NLPD_k / Σ_k N_k,

    i.e. client k's mean squared error MSE_k = SSE_k / n_k weighted by N_k, then the root. It is FSGP eq. 20's
    pooled RMSE √(Σ_k SSE_k / Σ_k n_k) over a test set in which client k answers a share of the rows proportional
    to its size (equal to it when n_k = c·N_k). Every client here answers the shared test set (n_k = L), where
    weighting by test rows would weight the clients equally; so the size is the training size. The unweighted
    ``fgp_local`` is (1/K) Σ_k RMSE_k."""
    if not clients:
        raise ValueError("no clients")
    sizes = np.array([c["n_train"] for c in clients], dtype=float)
    rows = np.array([c["n_test"] for c in clients], dtype=float)
    if np.any(sizes <= 0) or np.any(rows <= 0):
        raise ValueError("every client needs a positive training size and test rows")
    mse = np.array([c["sse"] for c in clients]) / rows
    nlpd = np.array([c["nlpd"] for c in clients])
    return {
        "rmse": float(np.sqrt(np.sum(sizes * mse) / sizes.sum())),
        "nlpd": float(np.sum(sizes * nlpd) / sizes.sum()),
    }


def exact_gpr_run(dataset: FederatedDataset) -> Dict:
    """Centralized exact GPR on the pooled data from the same initial values, L-BFGS to convergence."""
    start = time.perf_counter()
    X, Y = dataset.pooled()
    model = gpflow.models.GPR((X, Y), _kernel(dataset.input_dim), noise_variance=INITIAL_NOISE_VARIANCE)
    opt = gpflow.optimizers.Scipy().minimize(model.training_loss, model.trainable_variables, options={"maxiter": 500})
    metrics = evaluate_model(model, dataset.test)
    return {"method": "gpr_exact", "rmse": metrics["test_rmse"], "nlpd": metrics["test_nlpd"],
            "iterations": int(opt.nit), "seconds": time.perf_counter() - start}  # fmt: skip


def sparse_runs(dataset: FederatedDataset, rho: float, M: int, rounds: int, stopping: Plateau, seed: int) -> List[Dict]:
    """FSGP (FedAvg) and centralized SGPR at M inducing points, from the same Z."""
    D = dataset.input_dim
    Z = initial_inducing_inputs(dataset.pooled()[0], M, seed=seed)
    fsgp = FSGP(_kernel(D), Z, INITIAL_NOISE_VARIANCE, rounds, LOCAL_STEPS, LEARNING_RATE, rho, stopping=stopping)
    fed = run(
        fsgp, dataset, runtime=LocalRuntime(protection=Protection(secure_aggregation=False)), seed=seed
    )  # the paper's plain sums
    steps = Plateau(LOCAL_STEPS * stopping.window, stopping.tolerance)
    central = centralized_sgpr(
        dataset, _kernel(D), Z, INITIAL_NOISE_VARIANCE, LOCAL_STEPS * rounds, LEARNING_RATE, steps
    )
    return [
        {"method": "fsgp", "M": M, "rmse": fed.metrics["test_rmse"], "nlpd": fed.metrics["test_nlpd"],
         "rounds": len(fed.history), "seconds": fed.seconds, "seconds_per_round": _per_round(fed.history),
         "c_mn_bytes": 8 * M * max(dataset.client_sizes)},
        {"method": "sgpr", "M": M, "rmse": central.metrics["test_rmse"], "nlpd": central.metrics["test_nlpd"],
         "steps": central.steps, "seconds": central.seconds},
    ]  # fmt: skip


def _stats(dataset: str, M: int, method: str, values: Sequence[float]) -> Dict:
    sd = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
    return {"dataset": dataset, "M": M, "method": method, "n": len(values), "rmse_mean": float(np.mean(values)),
            "rmse_sd": sd}  # fmt: skip


#: paired (same seed) RMSE differences: (method a, method b, name of a − b)
PAIRS = (
    ("fsgp", "fgp_rbcm", "fsgp_minus_fgp"),
    ("fsgp", "fgp_local", "fsgp_minus_fgp_local"),  # the FGP paper's per-client prediction, clients unweighted
    ("fsgp", "fgp_local_weighted", "fsgp_minus_fgp_local_weighted"),  # … weighted by client size
    ("sgpr", "fgp_rbcm", "sgpr_minus_fgp"),
    ("fsgp", "sgpr", "fsgp_minus_sgpr"),
)


def summarize(runs: Sequence[Dict]) -> List[Dict]:
    """Mean ± sd over seeds per (dataset, M, method); the M-free methods are repeated at every M of the dataset;
    the :data:`PAIRS` rows are paired (same seed) RMSE differences, e.g. ``fsgp_minus_fgp`` = FSGP − FGP-rBCM."""
    rows: List[Dict] = []
    for name in sorted({r["dataset"] for r in runs}):
        mine = [r for r in runs if r["dataset"] == name]
        for M in sorted({r["M"] for r in mine if "M" in r}):
            cell = [r for r in mine if r.get("M", M) == M]
            for method in sorted({r["method"] for r in cell}):
                rows.append(_stats(name, M, method, [r["rmse"] for r in cell if r["method"] == method]))
            rmse = {(r["seed"], r["method"]): r["rmse"] for r in cell}
            for a, b, label in PAIRS:
                diffs = [rmse[s, a] - rmse[s, b] for s, m in rmse if m == a and (s, b) in rmse]
                if diffs:
                    rows.append(_stats(name, M, label, diffs))
    return rows


COLUMNS = (
    "fsgp",
    "sgpr",
    "fgp_rbcm",
    "fgp_poe",
    "fgp_local",
    "fgp_local_weighted",
    "gpr_exact",
    *(label for _, _, label in PAIRS),
)


def table(runs: Sequence[Dict], datasets: Sequence[str]) -> str:
    """The Markdown table of :func:`summarize` (test RMSE mean ± sd over n seeds), one row per (dataset, M)."""
    summary = {(r["dataset"], r["M"], r["method"]): r for r in summarize(runs)}
    lines = ["| dataset | M | n | " + " | ".join(COLUMNS) + " |", "|---|---|---|" + "---|" * len(COLUMNS)]
    for name, M in sorted({(d, M) for d, M, _ in summary if d in datasets}):
        cells = [summary.get((name, M, c)) for c in COLUMNS]
        n = summary[(name, M, "fsgp")]["n"] if (name, M, "fsgp") in summary else 0
        text = [f"{c['rmse_mean']:.4f} ± {c['rmse_sd']:.4f}" if c else "" for c in cells]
        lines.append(f"| {name} | {M} | {n} | " + " | ".join(text) + " |")
    return "\n".join(lines)


def cost_table(runs: Sequence[Dict], datasets: Sequence[str]) -> str:
    """FGP's exact-GP cost against FSGP's, per dataset: the largest client's matrix bytes (8·N_k² vs 8·M·N_k),
    mean wall seconds per round and rounds to the stopping rule (means over seeds, same processes)."""
    lines = [
        "| dataset | method | M | largest N_k | matrix bytes | s / round | rounds |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in datasets:
        mine = [r for r in runs if r["dataset"] == name and r["method"] in ("fgp_rbcm", "fsgp")]
        for method, M in sorted({(r["method"], r.get("M", 0)) for r in mine}):
            cell = [r for r in mine if r["method"] == method and r.get("M", 0) == M]
            largest = max(r.get("largest_client", 0) or r["c_mn_bytes"] // (8 * M) for r in cell)
            nbytes = np.mean([r.get("kernel_matrix_bytes", r.get("c_mn_bytes", 0)) for r in cell])
            per_round, rounds = np.mean([r["seconds_per_round"] for r in cell]), np.mean([r["rounds"] for r in cell])
            label = "FGP (N_k × N_k)" if method == "fgp_rbcm" else "FSGP (M × N_k)"
            lines.append(
                f"| {name} | {label} | {M or ''} | {largest} | {nbytes:,.0f} | {per_round:.3f} | {rounds:.0f} |"
            )
    return "\n".join(lines)


def _load(path: str) -> List[Dict]:
    if not os.path.exists(path):
        return []
    with open(path) as fh:
        return list(json.load(fh).get("runs", []))


def _merge(old: Sequence[Dict], new: Sequence[Dict]) -> List[Dict]:
    def key(r: Dict) -> Tuple:
        return (r["dataset"], r["seed"], r["method"], r.get("M"))

    fresh = {key(r) for r in new}
    return [r for r in old if key(r) not in fresh] + list(new)


def _save(path: str, runs: Sequence[Dict], rounds: int, args: argparse.Namespace, argv: Sequence[str]) -> None:
    save(path, {"settings": _settings(rounds, args), "summary": summarize(runs), "runs": list(runs)}, __file__,
         list(argv))  # fmt: skip


def _merge_files(
    out: str, paths: Sequence[str], rounds: int, args: argparse.Namespace, argv: Sequence[str]
) -> List[Dict]:
    """Merge the runs of ``paths`` into ``out``; refuse a file (``out`` too) whose settings differ from this
    invocation's, so that the merged file's settings describe every run in it. Returns the merged runs."""
    expected, runs = _settings(rounds, args), []
    for path in [out, *paths] if os.path.exists(out) else paths:
        with open(path) as fh:
            record = json.load(fh)
        if record.get("settings") != expected:
            raise SystemExit(f"{path}: settings {record.get('settings')} differ from {expected}")
        runs = _merge(runs, record["runs"])  # each run keeps the command that made it
    _save(out, runs, rounds, args, argv)
    return runs


def _settings(rounds: int, args: argparse.Namespace) -> Dict[str, Any]:
    return {
        "cap_rounds": rounds,
        "local_steps": LOCAL_STEPS,
        "learning_rate": LEARNING_RATE,
        "initial_noise_variance": INITIAL_NOISE_VARIANCE,
        "window": args.window,
        "tolerance": args.tolerance,
    }


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="synthetic 1 only, M ∈ {10, 25}, 2 seeds, ≤ 300 rounds")
    parser.add_argument("--datasets", nargs="+", choices=tuple(SETTINGS), default=None)
    parser.add_argument("--ms", nargs="+", type=int, default=None, help="M values (default 10 25 50 100)")
    parser.add_argument("--seeds", nargs="+", type=int, default=None, help="seeds (default 0 1 2 3 4)")
    parser.add_argument("--rounds", type=int, default=None, help=f"cap on rounds R (default {ROUNDS}, quick 300)")
    parser.add_argument("--window", type=int, default=WINDOW, help="rounds per window of the stopping rule")
    parser.add_argument("--tolerance", type=float, default=TOLERANCE, help="relative change that stops training")
    parser.add_argument("--exact-max", type=int, default=1000, help="largest N for centralized exact GPR")
    parser.add_argument("--no-fgp", action="store_true", help="skip FGP and exact GPR (e.g. when adding M values)")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=METHODS,
                        help="what to run: fgp (its rBCM, PoE and per-client scores), gpr_exact, sparse (FSGP and "
                        "SGPR at every M); default all")  # fmt: skip
    parser.add_argument("--out", default=OUT, help="JSON file to merge the runs into")
    parser.add_argument("--summarize", action="store_true", help="run nothing: print the table of --out's runs")
    merge = "run nothing: merge these files' runs (e.g. seeds run in parallel) into --out"
    parser.add_argument("--merge", nargs="+", default=(), metavar="JSON", help=merge)
    fgp_from = "print the table with FGP's runs from this saved file (e.g. the sweep, for runs of another length)"
    parser.add_argument("--fgp-from", default=None, metavar="JSON", help=fgp_from)
    args = parser.parse_args(list(argv))
    if args.fgp_from is not None and not os.path.exists(args.fgp_from):
        parser.error(f"--fgp-from: no file {args.fgp_from}")
    datasets = args.datasets or (["synthetic1"] if args.quick else list(SETTINGS))
    Ms = args.ms or ([10, 25] if args.quick else [10, 25, 50, 100])
    seeds = args.seeds if args.seeds is not None else ([0, 1] if args.quick else [0, 1, 2, 3, 4])
    rounds = args.rounds if args.rounds is not None else (300 if args.quick else ROUNDS)
    stopping = Plateau(args.window, args.tolerance)
    methods = [m for m in args.methods if not (args.no_fgp and m in ("fgp", "gpr_exact"))]
    if args.quick and args.out == OUT:
        args.out = OUT.replace(".json", "_quick.json")  # a smoke run never overwrites the protocol's runs
    print(
        f"cap R = {rounds} rounds, P = {LOCAL_STEPS}, λ = {LEARNING_RATE}, σ²₀ = {INITIAL_NOISE_VARIANCE}; {stopping}"
    )
    runs = _merge_files(args.out, args.merge, rounds, args, argv) if args.merge else _load(args.out)
    for name in [] if args.summarize or args.merge else datasets:
        K, rho, _ = SETTINGS[name]
        for seed in seeds:
            dataset = make_dataset(name, seed)
            sizes = dataset.client_sizes
            base = {"dataset": name, "seed": seed, "N": dataset.num_data, "K": K, "rho": rho,
                    "size_spread": int(max(sizes) - min(sizes)), "command": command(__file__, list(argv))}  # fmt: skip
            new: List[Dict] = []
            if "fgp" in methods:
                new += fgp_runs(dataset, rho, rounds, stopping, seed)
            if "gpr_exact" in methods and dataset.num_data <= args.exact_max:
                new.append(exact_gpr_run(dataset))
            for M in Ms if "sparse" in methods else []:
                new += sparse_runs(dataset, rho, M, rounds, stopping, seed)
            for r in new:
                r.update(base)
                shown = {
                    k: (round(v, 4) if isinstance(v, float) else v)
                    for k, v in r.items()
                    if k not in ("command", "clients")
                }
                print(shown, flush=True)
            runs = _merge(runs, new)
            _save(args.out, runs, rounds, args, argv)
    fgp = [r for r in _load(args.fgp_from) if r["method"].startswith("fgp_")] if args.fgp_from else []
    if args.fgp_from and not fgp:
        parser.error(f"--fgp-from: {args.fgp_from} holds no FGP runs")
    source = f"; FGP's runs from {args.fgp_from}" if fgp else ""
    print(f"\nTest RMSE, mean ± sd over seeds (*_minus_*: paired by seed; fgp = FGP with rBCM{source})\n")
    shown = (args.datasets or list(SETTINGS)) if args.summarize or args.merge else datasets
    print(table([*(r for r in runs if not r["method"].startswith("fgp_")), *fgp] if fgp else runs, shown))
    print("\nFGP's exact-GP cost against FSGP's (means over seeds)\n")
    print(cost_table(runs, shown))
    return 0


if __name__ == "__main__":
    start = time.perf_counter()
    status = main(sys.argv[1:])
    print(f"\ntotal wall time {time.perf_counter() - start:.0f} s")
    sys.exit(status)
