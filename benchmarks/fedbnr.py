"""FedBNR benchmark: the thesis' real-data protocol (§3.2.2, Tables 3.1–3.4) and the phase-2 GEMM roofline.

Protocol per (dataset, K, seed): random 8:1:1 train/test/validation split, standardised; training rows sorted
by the feature most correlated with the target, cut into 2K chunks, two per client; FedBNR-KD distils on 80 %
of the validation rows. Methods: a centralized URK GP (BLR on the pooled data), FedBNR (avg+global),
FedBNR-KD (kd+global), the ablations local+local, local+global, avg+local, kd+local, FedAvg and FedProx
networks with the same extractor, and pFedGP-style personalised GPs. Metrics on the test set: RMSE, ECE,
MCE and the interval Brier score of §3.2.3 (mean over confidence levels p of (1[y ∈ CI_p] − p)²); methods
with one model per client report the mean over clients. One-sided Wilcoxon signed-rank tests across seeds
against FedBNR (RMSE, as Table 3.1) and against FedBNR-KD (ECE, as Table 3.2) mark ⇑/↑ (worse, p < 0.01 / 0.05)
and ⇓/↓ (better).

Differences from the thesis: fixed rounds and steps (no validation early stopping, no grid search), the
final model is scored (not the best round), and the datasets are those shipped by installed packages.

Three studies write JSON to ``benchmarks/results/`` after every seed:

* ``--study calibration``: FedBNR vs FedBNR-KD calibration (Table 3.2) with diagnostics — ECE over two level
  grids, signed coverage, the learnt σ², FedBNR-KD at α = 10 and a kernel-only distillation;
* ``--study thesis-schedule``: the thesis' schedule for FedBNR and FedBNR-KD — up to 100 rounds × 50 full-batch
  local steps, the global model scored after every round, early stopping after 5 rounds without a better
  validation RMSE, FedBNR-KD's α chosen on validation from ``--alphas``; reports the thesis' "minimum test RMSE"
  and the test RMSE of the validation-selected round;
* ``--study central-trace``: the methods table's centralized model, its training and test RMSE and σ² before
  training and after every ``--local-steps`` Adam steps (why it scores no better than the mean on diabetes).

    python benchmarks/fedbnr.py --quick --datasets concrete --clients 10 --seeds 3
    python benchmarks/fedbnr.py --gemm-only
    python benchmarks/fedbnr.py --study thesis-schedule --datasets diabetes --clients 10 --seeds 5
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from typing import Callable, Dict, List, Sequence, Tuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import gpflow  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from gpflow.keras import tf_keras  # noqa: E402
from scipy import stats  # noqa: E402

from gpflow_fed import metrics  # noqa: E402
from gpflow_fed.federated.algorithms import FedAvgNN, FedBNR, PersonalisedGP  # noqa: E402
from gpflow_fed.federated.algorithms.distillation import distillation_loss  # noqa: E402
from gpflow_fed.data import fedbnr_real_task, load_dataset  # noqa: E402
from gpflow_fed.federated import run  # noqa: E402
from gpflow_fed.training.adam import CompiledAdam  # noqa: E402
from gpflow_fed.federated.algorithms.fedbnr import negative_log_marginal_likelihood_per_point  # noqa: E402
from gpflow_fed.kernels import DeepKernel, deep_urk, mlp  # noqa: E402
from gpflow_fed.models import BayesianLinearRegression, blr_statistics  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fedbnr_ablations import last_layers, learn_kernels, plain_runtime  # noqa: E402
from fedbnr_records import pool_method_records  # noqa: E402
from provenance import save  # noqa: E402

METHODS = (
    "central",
    "fedbnr",
    "fedbnr-kd",
    "local+local",
    "local+global",
    "avg+local",
    "kd+local",
    "fedavg",
    "fedprox",
    "pfedgp",
)


def score(Y: np.ndarray, mean: np.ndarray, var: np.ndarray) -> Dict[str, float]:
    """RMSE, ECE, MCE and the interval Brier score (§3.2.3) of Gaussian predictions."""
    ece, mce = metrics.calibration_errors(Y, mean, var)
    levels, _ = metrics.interval_coverage(Y, mean, var)
    z = stats.norm.ppf((1 + levels) / 2)
    inside = (np.abs(Y - mean).ravel()[None, :] <= z[:, None] * np.sqrt(var).ravel()[None, :]).astype(float)
    probs = np.broadcast_to(levels[:, None], inside.shape)
    return {"rmse": metrics.rmse(Y, mean), "ece": ece, "mce": mce, "brier": metrics.brier(inside, probs)}


def mean_score(predictors: Sequence[Callable], test: Tuple[np.ndarray, np.ndarray]) -> Dict[str, float]:
    X, Y = test
    rows = [score(Y, *(t.numpy() if hasattr(t, "numpy") else t for t in p(X))) for p in predictors]
    return {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}


def run_methods(task, methods: Sequence[str], cfg: argparse.Namespace, seed: int) -> Dict[str, Dict[str, float]]:
    ds = task.dataset
    D = ds.input_dim
    kernel = lambda: deep_urk(D, hidden=(cfg.hidden,), num_samples=cfg.num_samples, seed=seed)  # noqa: E731
    common = dict(
        noise_variance=0.5,
        prior_variance=1.0,
        rounds=cfg.rounds,
        local_steps=cfg.local_steps,
        learning_rate=cfg.lr,
        compile=not cfg.eager,
    )
    out: Dict[str, Dict[str, float]] = {}
    trained: Dict[str, List[BayesianLinearRegression]] = {}

    def phase1(kind: str) -> List[BayesianLinearRegression]:
        if kind not in trained:
            extra = (
                dict(distillation_data=task.distillation, alpha=cfg.alpha, kd_steps=cfg.kd_steps)
                if kind == "kd"
                else {}
            )
            trained[kind] = learn_kernels(kind, ds, seed=seed, kernel=kernel(), **common, **extra)
        return trained[kind]

    for method in methods:
        t0 = time.perf_counter()
        if method == "central":
            model, trainer = central_model(task, cfg, seed)
            trainer.fit(max(cfg.rounds * cfg.local_steps, 1), trainer.initial_state(), *ds.pooled())
            models = [model]
        elif method in ("fedbnr", "fedbnr-kd", "local+local", "local+global", "avg+local", "kd+local"):
            name = {"fedbnr": "avg+global", "fedbnr-kd": "kd+global"}.get(method, method)
            kind, layer = name.split("+")
            models = last_layers(layer, phase1(kind), ds, seed=seed)
        elif method in ("fedavg", "fedprox"):
            head = lambda: tf_keras.layers.Dense(
                1, dtype=gpflow.default_float(), kernel_initializer=tf_keras.initializers.GlorotUniform(seed=seed + 7)
            )  # noqa: E731
            factory = lambda: tf_keras.Sequential([mlp(5, (cfg.hidden,), seed=seed), head()])  # noqa: E731
            mu = cfg.proximal_mu if method == "fedprox" else 0.0
            fedavg = FedAvgNN(factory, cfg.rounds, cfg.local_steps, cfg.lr, proximal_mu=mu)
            models = [run(fedavg, ds, runtime=plain_runtime(), seed=seed).model]
        elif method == "pfedgp":
            deep = DeepKernel(gpflow.kernels.SquaredExponential(), mlp(5, (cfg.hidden,), seed=seed), input_dim=D)
            Z = np.random.default_rng(seed).normal(size=(cfg.num_inducing, D))
            personal_gp = PersonalisedGP(deep, Z, 0.5, cfg.rounds, cfg.local_steps, cfg.lr)
            model = run(personal_gp, ds, runtime=plain_runtime(), seed=seed).model
            noise = model.likelihood.variance.numpy()

            def personal(X: np.ndarray, c: int) -> Tuple[np.ndarray, np.ndarray]:
                mean, var = model.predict_client(c, X)
                return mean.numpy(), var.numpy() + noise  # predictive y of client c's own GP

            models = [lambda X, c=c: personal(X, c) for c in range(model.num_clients)]
        else:
            raise ValueError(f"unknown method {method!r}; choose from {METHODS}")
        predictors = [m.predict_y if hasattr(m, "predict_y") else m for m in models]
        out[method] = mean_score(predictors, ds.test)
        out[method]["seconds"] = time.perf_counter() - t0
        print(
            f"  {method:13s} " + " ".join(f"{k}={v:.3f}" for k, v in out[method].items()), file=sys.stderr, flush=True
        )
    return out


class KernelOnlyDistillation(FedBNR):
    """FedBNR-KD whose server distils only the kernel θ: σ² and λ² stay at the clients' FedAvg mean. A diagnostic,
    not the thesis' method (its eq. 3.4 step updates θ, σ and λ): it isolates the effect of fitting σ² and λ² by
    the marginal likelihood of the small server set (X_kd, y_kd)."""

    def _distillation_worker(self):  # type: ignore[no-untyped-def]
        worker = super()._distillation_worker()
        model = worker.model
        gpflow.set_trainable(model.likelihood.variance, False)
        gpflow.set_trainable(model.prior_variance, False)
        loss = lambda X, Y, target: distillation_loss(model, target, self.alpha, data=(X, Y))  # noqa: E731
        trainer = CompiledAdam(model.trainable_variables, loss, self.learning_rate, compile=self.compile)
        return dataclasses.replace(worker, trainer=trainer)


def fedbnr_algorithm(task, variant: str, cfg: argparse.Namespace, seed: int, alpha: float) -> FedBNR:
    """FedBNR (``"fedbnr"``), FedBNR-KD (``"fedbnr-kd"``) or :class:`KernelOnlyDistillation` (``"kd-theta"``) with
    the benchmark's kernel and schedule (``cfg.rounds`` × ``cfg.local_steps``, ``cfg.kd_steps``)."""
    kernel = deep_urk(task.dataset.input_dim, hidden=(cfg.hidden,), num_samples=cfg.num_samples, seed=seed)
    options = dict(noise_variance=0.5, prior_variance=1.0, rounds=cfg.rounds, local_steps=cfg.local_steps)
    options.update(learning_rate=cfg.lr, compile=not cfg.eager)
    if variant == "fedbnr":
        return FedBNR(kernel, **options)
    kd = dict(aggregation="kd", distillation_data=task.distillation, alpha=alpha, kd_steps=cfg.kd_steps)
    return (KernelOnlyDistillation if variant == "kd-theta" else FedBNR)(kernel, **options, **kd)


def calibration_scores(model: BayesianLinearRegression, test: Tuple[np.ndarray, np.ndarray]) -> Dict[str, float]:
    """RMSE and the calibration of ``model.predict_y`` on ``test`` under several readings of the thesis' ECE (which
    it describes only in words): ``ece`` (levels 0.05, …, 0.95), ``ece99`` (levels 0.01, …, 0.99), ``signed``
    (mean over levels of coverage − p: negative = over-confident), ``gap95`` (coverage of the 95 % interval − 0.95),
    and the learnt σ² and λ²."""
    X, Y = test
    mean, var = (t.numpy() for t in model.predict_y(X))
    levels, coverage = metrics.interval_coverage(Y, mean, var)
    fine = np.round(np.arange(1, 100) / 100, 2)
    _, coverage95 = metrics.interval_coverage(Y, mean, var, levels=[0.95])
    return {
        "rmse": metrics.rmse(Y, mean),
        "ece": metrics.ece(Y, mean, var),
        "ece99": metrics.ece(Y, mean, var, levels=fine),
        "signed": float(np.mean(coverage - levels)),
        "gap95": float(coverage95[0] - 0.95),
        "noise_variance": float(model.likelihood.variance.numpy()),
        "prior_variance": float(model.prior_variance.numpy()),
    }


CALIBRATION_VARIANTS = ("fedbnr", "fedbnr-kd", "fedbnr-kd α=10", "kd-theta")


def calibration_study(task, cfg: argparse.Namespace, seed: int) -> Dict[str, Dict[str, float]]:
    """Table 3.2's question, FedBNR vs FedBNR-KD calibration, with the diagnostics of :func:`calibration_scores`:
    FedBNR, FedBNR-KD at ``cfg.alpha`` and at α = 10 (the top of the thesis' grid, Table A.1) and
    :class:`KernelOnlyDistillation` at ``cfg.alpha``."""
    out = {}
    for variant in CALIBRATION_VARIANTS:
        alpha = 10.0 if variant.endswith("α=10") else cfg.alpha
        algorithm = fedbnr_algorithm(task, variant.split(" ")[0], cfg, seed, alpha)
        out[variant] = calibration_scores(
            run(algorithm, task.dataset, runtime=plain_runtime(), seed=seed).model, task.dataset.test
        )
        print(f"  {variant:15s} " + " ".join(f"{k}={v:.3f}" for k, v in out[variant].items()), file=sys.stderr)
    return out


def central_model(task, cfg: argparse.Namespace, seed: int) -> Tuple[BayesianLinearRegression, CompiledAdam]:
    """The methods table's centralized model, untrained (the URK GP on the pooled training rows, σ² = 0.5,
    λ² = 1), and the Adam trainer of its per-point negative log marginal likelihood."""
    ds = task.dataset
    kernel = deep_urk(ds.input_dim, hidden=(cfg.hidden,), num_samples=cfg.num_samples, seed=seed)
    model = BayesianLinearRegression(ds.pooled(), kernel, 0.5, 1.0)
    loss = lambda X, Y: negative_log_marginal_likelihood_per_point(model, X, Y)  # noqa: E731
    return model, CompiledAdam(model.trainable_variables, loss, cfg.lr, compile=not cfg.eager)


def central_trace(task, cfg: argparse.Namespace, seed: int) -> Dict[str, object]:
    """The methods table's ``central`` model (:func:`central_model`, ``cfg.rounds · cfg.local_steps`` Adam
    steps), scored on its training rows and on the test set before training and after every ``cfg.local_steps``
    steps: does the pooled deep kernel overfit?"""
    X, Y = task.dataset.pooled()
    X_test, Y_test = task.dataset.test
    model, trainer = central_model(task, cfg, seed)
    state = trainer.initial_state()

    def rmse(X: np.ndarray, Y: np.ndarray) -> float:
        return metrics.rmse(Y, model.predict_y(X)[0].numpy())

    per_step = []
    for r in range(cfg.rounds + 1):
        if r:
            _, state = trainer.fit(cfg.local_steps, state, X, Y)
        per_step.append(
            {
                "step": r * cfg.local_steps,
                "train_rmse": rmse(X, Y),
                "test_rmse": rmse(X_test, Y_test),
                "noise_variance": float(model.likelihood.variance.numpy()),
            }
        )
    first, last = per_step[0], per_step[-1]
    return {
        "train_rmse_start": first["train_rmse"],
        "train_rmse_end": last["train_rmse"],
        "test_rmse_start": first["test_rmse"],
        "test_rmse_end": last["test_rmse"],
        "min_test_rmse": min(row["test_rmse"] for row in per_step),
        "noise_variance_end": last["noise_variance"],
        "per_step": per_step,
    }


class _EarlyStop(Exception):
    """Raised by the monitor of :func:`thesis_schedule` to end a run whose validation RMSE stopped improving."""


def thesis_schedule(task, variant: str, cfg: argparse.Namespace, seed: int, alpha: float) -> Dict[str, object]:
    """One run under the thesis' schedule (§3.2.2): up to ``cfg.rounds`` rounds of ``cfg.local_steps`` full-batch
    local steps; after every round the global model (phase 2 with that round's kernel, σ² and λ², i.e. the BLR on
    the pooled training rows) is scored on the validation and test sets; the run stops when the validation RMSE
    has not improved for ``cfg.patience`` rounds. FedBNR validates on the whole validation set, FedBNR-KD on the
    20 % it does not distil on. Returns the per-round scores, the thesis' "minimum test RMSE" over the rounds,
    and the test RMSE and ECE of the round with the smallest validation RMSE."""
    algorithm = fedbnr_algorithm(task, variant, cfg, seed, alpha)
    ds = task.dataset
    val = task.validation
    if variant == "fedbnr":
        val = tuple(np.concatenate(pair) for pair in zip(task.distillation, task.validation))
    pooled = BayesianLinearRegression(ds.pooled(), gpflow.utilities.deepcopy(algorithm.kernel), 0.5, 1.0)
    rounds: List[Dict[str, float]] = []

    def monitor(r: int, state, **_: object) -> None:  # type: ignore[no-untyped-def]
        algorithm.shared.assign(pooled, dict(state.values))
        scores = calibration_scores(pooled, ds.test)
        rounds.append({"val_rmse": metrics.rmse(val[1], pooled.predict_y(val[0])[0].numpy()), **scores})
        best = int(np.argmin([row["val_rmse"] for row in rounds]))
        if len(rounds) - 1 - best >= cfg.patience:
            raise _EarlyStop

    t0 = time.perf_counter()
    try:
        run(algorithm, ds, runtime=plain_runtime(), monitor=monitor, seed=seed)
    except _EarlyStop:
        pass
    best = int(np.argmin([row["val_rmse"] for row in rounds]))
    return {
        "alpha": alpha,
        "rounds_run": len(rounds),
        "best_val_round": best + 1,
        "val_rmse": rounds[best]["val_rmse"],
        "min_test_rmse": float(min(row["rmse"] for row in rounds)),
        "selected_test_rmse": rounds[best]["rmse"],
        "selected_ece": rounds[best]["ece"],
        "selected_signed": rounds[best]["signed"],
        "selected_noise_variance": rounds[best]["noise_variance"],
        "seconds": time.perf_counter() - t0,
        "per_round": rounds,
    }


def wilcoxon_mark(values: np.ndarray, reference: np.ndarray) -> str:
    """⇑/↑: significantly larger (worse) than the reference, p < 0.01 / 0.05 (one-sided); ⇓/↓ smaller."""
    diff = values - reference
    if len(diff) < 2 or np.allclose(diff, 0):
        return ""
    for alternative, marks in (("greater", ("⇑", "↑")), ("less", ("⇓", "↓"))):
        p = stats.wilcoxon(values, reference, alternative=alternative).pvalue
        if p < 0.01:
            return marks[0]
        if p < 0.05:
            return marks[1]
    return ""


def gemm_roofline(num_data: int, num_features: int, repeats: int) -> List[Tuple[str, float, float, float]]:
    """Phase-2 statistics (``blr_statistics``: ΦᵀΦ, Φᵀy, yᵀy) against a plain ``tf.matmul(Φ, Φ, transpose_a)``
    of the same shapes, timed back to back in the same process ``repeats`` times; also features + statistics
    of a deep URK against the same matmul. Returns (name, best seconds, GFLOP/s at the best time, median over
    repeats of the paired ratio t_matmul / t)."""
    dtype = gpflow.default_float()
    rng = np.random.default_rng(0)
    Phi = tf.constant(rng.normal(size=(num_data, num_features)), dtype=dtype)
    Y = tf.constant(rng.normal(size=(num_data, 1)), dtype=dtype)
    X = tf.constant(rng.normal(size=(num_data, 8)), dtype=dtype)
    kernel = deep_urk(8, hidden=(50,), num_samples=num_features // 2, seed=0)
    matmul = tf.function(lambda A: tf.linalg.matmul(A, A, transpose_a=True))
    statistics = tf.function(lambda A, B: blr_statistics(A, B))
    end_to_end = tf.function(lambda A, B: blr_statistics(kernel.features(A), B))

    def timed(fn: Callable, *args: tf.Tensor) -> float:
        t0 = time.perf_counter()
        out = fn(*args)
        (out["phi_t_phi"] if isinstance(out, dict) else out).numpy()
        return time.perf_counter() - t0

    calls = [(matmul, (Phi,)), (statistics, (Phi, Y)), (end_to_end, (X, Y))]
    for fn, args in calls:
        timed(fn, *args)  # trace and warm up
    # interleaved: each repeat times the three computations back to back, so they see the same machine load
    times = np.array([[timed(fn, *args) for fn, args in calls] for _ in range(repeats)])  # [repeats, 3]
    flops = 2.0 * num_data * num_features**2
    names = ["plain matmul ΦᵀΦ (roofline)", "phase-2 statistics (ΦᵀΦ, Φᵀy, yᵀy)", "deep-URK features + statistics"]
    paired = np.median(times[:, :1] / times, axis=0)  # median over repeats of t_matmul / t_computation
    return [
        (name, float(times[:, i].min()), flops / times[:, i].min() / 1e9, float(paired[i]))
        for i, name in enumerate(names)
    ]


def print_table(task, K: int, methods: Sequence[str], results: Dict[str, Dict[str, List[float]]]) -> None:
    """The Markdown table of one (dataset, K) over the seeds in ``results`` (every method must have them all)."""
    sizes = task.dataset.client_sizes
    num_seeds = len(results[methods[0]]["rmse"])
    print(
        f"#### {task.dataset.name} (N_train={task.dataset.num_data}, test={len(task.dataset.test[0])}, K={K}, "
        f"N_k≈{np.mean(sizes):.1f} (min {min(sizes)}), sort-feature corr {task.correlation:+.2f}, {num_seeds} seeds)\n"
    )
    print("| method | RMSE | ECE | MCE | Brier | seconds/seed |\n|---|---|---|---|---|---|")
    # Table 3.1 tests RMSE against FedBNR, Table 3.2 ECE against FedBNR-KD
    references = {
        metric: np.array(results[ref][metric]) if ref in results else None
        for metric, ref in (("rmse", "fedbnr"), ("ece", "fedbnr-kd"))
    }
    sem = lambda a: a.std(ddof=1) / np.sqrt(len(a)) if len(a) > 1 else float("nan")  # noqa: E731
    for method in methods:
        r = {k: np.array(v) for k, v in results[method].items()}
        marks = {
            metric: ""
            if ref is None or method == {"rmse": "fedbnr", "ece": "fedbnr-kd"}[metric]
            else wilcoxon_mark(r[metric], ref)
            for metric, ref in references.items()
        }
        print(
            f"| {method} | {r['rmse'].mean():.3f} ± {sem(r['rmse']):.3f}{marks['rmse']} | "
            f"{r['ece'].mean():.3f} ± {sem(r['ece']):.3f}{marks['ece']} | "
            f"{r['mce'].mean():.3f} | {r['brier'].mean():.3f} | {r['seconds'].mean():.1f} |"
        )
    total = sum(np.sum(results[m]["seconds"]) for m in methods) / num_seeds
    print(f"\nAll methods: {total:.1f} s per seed.\n", flush=True)


def summarize_logs(paths: Sequence[str], methods: Sequence[str]) -> None:
    """Re-print the tables of runs from their stderr logs (``<dataset> K=<K> seed=<s>`` and one line per method),
    keeping the seeds in which all of ``methods`` finished: the summary of interrupted runs, or of runs that
    covered different seeds (``--seed-start``) of the same (dataset, K)."""
    runs: Dict[Tuple[str, int], Dict[int, Dict[str, Dict[str, float]]]] = {}
    current = None
    for line in (line for path in paths for line in open(path)):
        head = line.split()
        if len(head) == 3 and head[1].startswith("K=") and head[2].startswith("seed="):
            current = (head[0], int(head[1][2:])), int(head[2][5:])
            runs.setdefault(current[0], {})[current[1]] = {}
        elif current is not None and line.startswith("  ") and "rmse=" in line:
            method, *pairs = line.split()
            runs[current[0]][current[1]][method] = {k: float(v) for k, v in (p.split("=") for p in pairs)}
    print_tables(runs, methods)


def summarize_records(paths: Sequence[str], methods: Sequence[str]) -> None:
    """Re-print the tables from the JSON files that ``--out`` wrote (one record per dataset, K and seed), pooling
    their seeds as :func:`summarize_logs` does; a file that reran some methods replaces their scores
    (:func:`fedbnr_records.pool_method_records`)."""
    print_tables(pool_method_records(paths), methods)


def print_tables(runs: Dict[Tuple[str, int], Dict[int, Dict[str, Dict[str, float]]]], methods: Sequence[str]) -> None:
    """:func:`print_table` per (dataset, K) of ``runs`` (seed → method → scores), over the seeds where every one of
    ``methods`` has a score."""
    for (name, K), by_seed in runs.items():
        complete = sorted(s for s, rows in by_seed.items() if list(rows) == list(methods))
        if not complete:
            continue
        real = load_dataset(name)
        results = {m: {k: [by_seed[s][m][k] for s in complete] for k in by_seed[complete[0]][m]} for m in methods}
        print_table(fedbnr_real_task(real.X, real.Y, K, seed=complete[-1], name=name), K, methods, results)


def summarize_study(study: str, records: List[Dict[str, object]]) -> None:
    """Print the Markdown table of a study's records: mean ± sd over seeds per (dataset, K, method)."""
    keys = {
        "calibration": ("rmse", "ece", "ece99", "signed", "gap95", "noise_variance"),
        "central-trace": (
            "train_rmse_start",
            "train_rmse_end",
            "test_rmse_start",
            "test_rmse_end",
            "min_test_rmse",
            "noise_variance_end",
        ),
        "thesis-schedule": (
            "min_test_rmse",
            "selected_test_rmse",
            "selected_ece",
            "selected_signed",
            "rounds_run",
            "alpha",
            "seconds",
        ),
    }[study]
    print(f"| dataset | K | method | seeds | {' | '.join(keys)} |\n|{'---|' * (4 + len(keys))}")
    groups: Dict[Tuple[str, int], Dict[str, List[Dict[str, float]]]] = {}
    for record in records:
        for method, row in record["methods"].items():  # type: ignore[union-attr]
            groups.setdefault((record["dataset"], record["K"]), {}).setdefault(method, []).append(row)
    for (name, K), by_method in groups.items():
        for method, rows in by_method.items():
            cells = []
            for key in keys:
                if key == "alpha" and method != "fedbnr-kd":  # FedBNR has no α
                    cells.append("—")
                    continue
                values = np.array([row[key] for row in rows], dtype=float)
                cells.append(f"{values.mean():.3f} ± {values.std(ddof=1) if len(values) > 1 else 0:.3f}")
            print(f"| {name} | {K} | {method} | {len(rows)} | {' | '.join(cells)} |")
    print(flush=True)


def run_study(args: argparse.Namespace) -> int:
    """``--study calibration``, ``thesis-schedule`` or ``central-trace`` over datasets × K × seeds; saves after
    every seed."""
    if args.study == "thesis-schedule":
        args.rounds, args.local_steps = (3, 5) if args.quick else (100, 50)
        args.kd_steps = 5 if args.quick else 50
    elif args.quick:
        args.rounds, args.local_steps, args.kd_steps = 3, 5, 5
    if args.quick:
        args.num_samples, args.hidden, args.patience = 10, 10, 1
    alphas = [float(a) for a in args.alphas.split(",")]
    out = args.out or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "results", f"fedbnr_{args.study.replace('-', '_')}.json"
    )
    records: List[Dict[str, object]] = []
    if args.append and os.path.exists(out):  # keep the saved runs of other datasets, K or seeds
        with open(out) as f:
            records = json.load(f)["records"]
    config = {k: getattr(args, k) for k in ("rounds", "local_steps", "kd_steps", "num_samples", "hidden", "lr")}
    config.update(alpha=args.alpha, patience=args.patience, alphas=alphas)
    for name in args.datasets.split(","):
        real = load_dataset(name)
        for K in (int(k) for k in args.clients.split(",")):
            for seed in range(args.seed_start, args.seed_start + args.seeds):
                task = fedbnr_real_task(real.X, real.Y, K, seed=seed, name=name)
                print(f"{name} K={K} seed={seed}", file=sys.stderr, flush=True)
                if args.study == "calibration":
                    methods: Dict[str, object] = calibration_study(task, args, seed)
                elif args.study == "central-trace":
                    methods = {"central": central_trace(task, args, seed)}
                else:
                    methods = {"fedbnr": thesis_schedule(task, "fedbnr", args, seed, args.alpha)}
                    grid = [thesis_schedule(task, "fedbnr-kd", args, seed, a) for a in alphas]
                    methods["fedbnr-kd"] = min(grid, key=lambda row: row["val_rmse"])  # α by validation
                    methods["fedbnr-kd"]["grid"] = [{k: v for k, v in g.items() if k != "per_round"} for g in grid]
                    for method, row in methods.items():
                        print(
                            f"  {method}: "
                            + " ".join(f"{k}={v}" for k, v in row.items() if k not in ("per_round", "grid")),
                            file=sys.stderr,
                            flush=True,
                        )
                records = [r for r in records if (r["dataset"], r["K"], r["seed"]) != (name, K, seed)]
                records.append(
                    {
                        "dataset": name,
                        "K": K,
                        "seed": seed,
                        "correlation": task.correlation,
                        "num_train": task.dataset.num_data,
                        "methods": methods,
                    }
                )
                save(out, {"study": args.study, "config": config, "records": records}, __file__)
    summarize_study(args.study, records)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", default="diabetes,concrete,ames")
    parser.add_argument("--clients", default="10,100", help="comma-separated K values")
    parser.add_argument("--seeds", type=int, default=10, help="how many seeds")
    parser.add_argument(
        "--seed-start", type=int, default=0, help="the first seed (seeds seed-start, seed-start+1, ...)"
    )
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--quick", action="store_true", help="rounds=5, local_steps=10, kd_steps=10, m=25, hidden=20")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--local-steps", type=int, default=20)
    parser.add_argument("--kd-steps", type=int, default=20)
    parser.add_argument("--num-samples", type=int, default=50, help="m (the thesis: 50)")
    parser.add_argument("--num-inducing", type=int, default=50, help="pFedGP's M (the thesis: 50)")
    parser.add_argument("--hidden", type=int, default=50)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--alpha", type=float, default=1.0)
    parser.add_argument("--proximal-mu", type=float, default=0.1)
    parser.add_argument("--eager", action="store_true", help="FedBNR's local and server steps without tf.function")
    parser.add_argument("--gemm-only", action="store_true")
    parser.add_argument("--no-gemm", action="store_true", help="skip the roofline measurement")
    parser.add_argument(
        "--summarize",
        metavar="LOG",
        nargs="+",
        help="print the tables of (possibly interrupted) runs from their stderr logs, pooling their seeds",
    )
    parser.add_argument(
        "--study",
        choices=("calibration", "thesis-schedule", "central-trace"),
        help="calibration: FedBNR vs FedBNR-KD calibration diagnostics (Table 3.2); thesis-schedule: early-stopped "
        "runs of FedBNR and FedBNR-KD (α chosen on validation from --alphas), minimum and validation-selected test "
        "RMSE; central-trace: the pooled URK GP's training and test RMSE every --local-steps steps. Each writes a "
        "JSON file (--out) after every seed.",
    )
    parser.add_argument("--patience", type=int, default=5, help="thesis-schedule: rounds without validation gain")
    parser.add_argument("--alphas", default="0.5,2,5,10", help="thesis-schedule: FedBNR-KD's α grid (Table A.1)")
    parser.add_argument("--append", action="store_true", help="add to the records already in --out")
    parser.add_argument(
        "--out",
        help="with --study: the study's JSON file (default benchmarks/results/fedbnr_<study>.json); without: the "
        "methods table's JSON file (every seed's scores, saved after each seed; none by default)",
    )
    parser.add_argument(
        "--from-json",
        metavar="JSON",
        nargs="+",
        help="print the methods tables from the files --out wrote (without --study), pooling their seeds",
    )
    parser.add_argument("--gemm-shape", default="20000,1000", help="N,L of the roofline measurement")
    parser.add_argument("--gemm-repeats", type=int, default=10, help="timings per computation (the best is kept)")
    args = parser.parse_args(argv)
    if args.summarize:
        summarize_logs(args.summarize, [m for m in args.methods.split(",") if m])
        return 0
    if args.from_json:
        summarize_records(args.from_json, [m for m in args.methods.split(",") if m])
        return 0
    if args.study:
        return run_study(args)
    if args.quick:
        args.rounds, args.local_steps, args.kd_steps, args.num_samples, args.hidden = 5, 10, 10, 25, 20

    if not args.no_gemm:
        n, L = (int(v) for v in args.gemm_shape.split(","))
        rows = gemm_roofline(n, L, repeats=args.gemm_repeats)
        print(f"### Phase-2 statistics vs GEMM (N={n}, L={L}, float64, {os.cpu_count()} CPU threads visible)\n")
        print(
            "| computation | best seconds | GFLOP/s (2NL², best) | ratio of best times | median paired ratio "
            "|\n|---|---|---|---|---|"
        )
        for name, t, gflops, paired in rows:
            print(f"| {name} | {t:.4f} | {gflops:.1f} | {rows[0][1] / t:.2f} | {paired:.2f} |")
        print()
    if args.gemm_only:
        return 0

    methods = [m for m in args.methods.split(",") if m]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        raise ValueError(f"unknown methods {unknown}; choose from {METHODS}")
    print(
        f"### Real-data protocol: rounds={args.rounds}, local_steps={args.local_steps}, kd_steps={args.kd_steps}, "
        f"m={args.num_samples}, hidden={args.hidden}, M={args.num_inducing}, seeds={args.seeds}\n"
    )
    records: List[Dict[str, object]] = []
    config = {k: getattr(args, k) for k in ("rounds", "local_steps", "kd_steps", "num_samples", "hidden", "lr")}
    config.update(alpha=args.alpha, num_inducing=args.num_inducing, proximal_mu=args.proximal_mu)
    for name in args.datasets.split(","):
        real = load_dataset(name)
        for K in (int(k) for k in args.clients.split(",")):
            results: Dict[str, Dict[str, List[float]]] = {m: {} for m in methods}
            task = None
            for seed in range(args.seed_start, args.seed_start + args.seeds):
                task = fedbnr_real_task(real.X, real.Y, K, seed=seed, name=name)
                print(f"{name} K={K} seed={seed}", file=sys.stderr, flush=True)
                scores = run_methods(task, methods, args, seed)
                for method, row in scores.items():
                    for k, v in row.items():
                        results[method].setdefault(k, []).append(v)
                if args.out:  # every seed, so that an interrupted run keeps what it finished
                    records.append({"dataset": name, "K": K, "seed": seed, "methods": scores})
                    save(args.out, {"study": "methods", "config": config, "records": records}, __file__)
            print_table(task, K, methods, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
