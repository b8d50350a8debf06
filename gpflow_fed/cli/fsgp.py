"""``gpflow-fed fsgp``: federated sparse GP regression across parties, compared with its baselines.

The main job of the package (``make run``): load a dataset (default: Mauna Loa CO₂ from statsmodels,
nothing downloaded) and split it among K simulated clients, or read your own table (``--csv``, one client per
party), standardise it with moments agreed across the parties, train FSGP (Guo et al., FedAvg on the per-client
collapsed bound, eq. 9; prediction from summed statistics, eqs. 14–15) on the :class:`LocalRuntime` with a
progress bar, and print a table comparing

* FSGP (``mode="fedavg"``, the paper) and exact federated SGPR (``mode="exact"``: one Adam step per round on
  the global bound, from client sums); ``--mode`` picks the headline one (first row, plotted, saved),
* centralized SGPR on the pooled data (the oracle; its "bytes" are the raw data a client would upload),
* local-only SGPR (each client alone; the mean over clients, no bytes),
* FGP (FedAvg on per-client exact-GP marginal likelihoods, rBCM prediction),
* predicting the mean (the agreed μ_Y with variance σ_Y²),

by test RMSE, NLPD and 90 % interval coverage in the target's units (standardised RMSE and NLPD beside them),
wall time and bytes sent. Every model gets the same kernel, initial (θ, σ², Z) and the same number of gradient
steps; Z needs no client data (an even grid / Halton points over the standardised box [−2, 2]^D). The
defaults are :data:`gpflow_fed.fitting.DEFAULTS`, the ones ``gpflow_fed.fit`` uses: with ``--csv`` the headline
row is what ``fit`` returns for the same table and seed. TensorBoard events go to ``<logdir>/<method>``, a PNG to
``<logdir>/fsgp.png``, the headline model (raw inputs in, target units out) to ``--save``.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from ..fitting import DEFAULTS as FIT_DEFAULTS
from .datasets import KNOWN, SYNTHETIC, check_dataset, load_arrays
from .options import add_run_arguments, fraction, given, positive_float, positive_int, refuse_ignored, resolve
from .options import add_run_option_arguments, for_run, run_options
from .own_data import add_own_data_arguments, check_federation, check_own_data_arguments
from .options import standardized as _standardized

if TYPE_CHECKING:  # imported when a command runs, not when the CLI parses its arguments
    import gpflow
    import numpy as np

DATASETS = KNOWN
PARTITIONS = ("iid", "random_sizes", "sorted_chunks", "spatial")
MODES = ("fedavg", "exact")
_FSGP = FIT_DEFAULTS["fsgp"]
#: the defaults of ``make run``: K simulated clients and :data:`gpflow_fed.fitting.DEFAULTS` ``["fsgp"]``.
DEFAULTS = dict(
    clients=5, rounds=_FSGP["rounds"], local_steps=_FSGP["local_steps"], learning_rate=_FSGP["learning_rate"],
    client_fraction=1.0, inducing=_FSGP["num_inducing"],
)  # fmt: skip
#: ``--quick``: a smoke test (about 17 s of CPU time, see its help).
QUICK = dict(clients=3, rounds=5, local_steps=2, inducing=8)
QUICK_MAX_TRAIN = 300
#: initial noise variance σ² on standardized data (:data:`gpflow_fed.fitting.DEFAULTS`); the paper's σ = 0.1,
#: i.e. σ² = 0.01, is on its synthetic data's own scale (``benchmarks/fsgp.py`` reproduces that).
INITIAL_NOISE_VARIANCE = _FSGP["noise_variance"]
HEADLINE = {"fedavg": "FSGP (fedavg)", "exact": "exact federated SGPR"}


def register(subparsers: Any) -> None:
    """Add the ``fsgp`` subcommand to the ``gpflow-fed`` parser."""
    d = DEFAULTS
    parser = subparsers.add_parser(
        "fsgp",
        help="federated sparse GP regression (FSGP) across parties, with baselines",
        description=(
            "Split a dataset among K simulated clients (or read your own table, one client per party), train FSGP\n"
            "(FedAvg on per-client Titsias bounds) and exact federated SGPR on the local runtime, and compare them\n"
            "with centralized SGPR, local-only SGPR, FGP and predicting the mean (test RMSE, NLPD and coverage in\n"
            "the target's units, time, bytes sent). Writes TensorBoard events, fsgp.png and the model (--save)."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--dataset",
        choices=DATASETS,
        default=None,
        help="a dataset of `gpflow-fed datasets` (default co2: Mauna Loa CO₂ from statsmodels, extra 'data')",
    )
    parser.add_argument(
        "--partition", choices=PARTITIONS, default=None, help="how rows go to clients (default random_sizes)"
    )
    parser.add_argument(
        "--clients", type=positive_int, default=None, help=f"K simulated clients (default {d['clients']})"
    )
    parser.add_argument("--rounds", type=positive_int, default=None, help=f"R (default {d['rounds']})")
    parser.add_argument(
        "--local-steps", type=positive_int, default=None, help=f"P, Adam steps per round (default {d['local_steps']})"
    )
    parser.add_argument(
        "--learning-rate",
        type=positive_float,
        default=None,
        help=f"Adam learning rate λ (default {d['learning_rate']})",
    )
    parser.add_argument(
        "--client-fraction", type=fraction, default=None, help="ρ ∈ (0, 1]: max(⌈Kρ⌉, 1) clients per round (default 1)"
    )
    parser.add_argument("--inducing", "-M", type=positive_int, default=None, help=f"M (default {d['inducing']})")
    parser.add_argument("--mode", choices=MODES, default="fedavg", help="the headline FSGP mode (default fedavg)")
    add_run_arguments(parser, "runs/fsgp", "fsgp.png", quick_cpu=17)
    add_run_option_arguments(parser, checkpoints="; each federated run (fsgp-fedavg, fsgp-exact, fgp) in its subfolder")
    parser.description += (
        f"\n--quick: K={QUICK['clients']}, R={QUICK['rounds']}, P={QUICK['local_steps']}, M={QUICK['inducing']} "
        f"unless given; at most {QUICK_MAX_TRAIN} rows of a built-in dataset."
    )
    add_own_data_arguments(parser)
    parser.set_defaults(func=main, check=check)


def check(args: argparse.Namespace) -> None:
    """Everything about the options, the dataset and the table, before TensorFlow (see the package docstring)."""
    check_own_data_arguments(
        args,
        {
            "dataset": "--csv replaces --dataset",
            "clients": "with --csv every party of --party-column is one client",
            "partition": "with --csv the party column splits the rows",
        },
    )
    if args.csv is None:
        name = args.dataset or "co2"
        check_dataset("fsgp", name)
        if name in SYNTHETIC:
            refuse_ignored(args, {"test_fraction": f"{name} comes with its own test grid"})
    if args.mode == "exact" and given(args, "client_fraction") and args.client_fraction != 1:
        raise ValueError("--mode exact sums statistics over every client each round; drop --client-fraction")
    run_options(args)  # --resume without --checkpoint-dir, before TensorFlow
    settings = resolve(args, DEFAULTS, QUICK)
    check_federation(
        args, None if args.csv is not None else settings["clients"], client_fraction=args.client_fraction,
        inducing=settings["inducing"],
    )  # fmt: skip


@dataclass
class MethodResult:
    """One row of the comparison table; metrics in the target's units (and standardised)."""

    method: str
    test_rmse: float
    test_nlpd: float
    seconds: float
    bytes_sent: int
    test_mae: Optional[float] = None
    test_coverage_90: Optional[float] = None
    test_rmse_standardized: Optional[float] = None
    test_nlpd_standardized: Optional[float] = None


def resolve_settings(args: argparse.Namespace) -> Dict[str, Any]:
    """The effective settings: explicit options, else ``--quick`` values, else :data:`DEFAULTS`."""
    settings = resolve(args, DEFAULTS, QUICK)
    settings.update(
        dataset=args.dataset or "co2",
        partition=args.partition or "random_sizes",
        mode=args.mode,
        noise_variance=INITIAL_NOISE_VARIANCE,
        test_fraction=0.2 if args.test_fraction is None else float(args.test_fraction),
        seed=int(args.seed),
        quick=bool(args.quick),
        csv=getattr(args, "csv", None),
        party_column=getattr(args, "party_column", None),
        target=getattr(args, "target", None),
        features=getattr(args, "features", None),
    )
    if settings["csv"] is not None:
        settings["dataset"] = Path(settings["csv"]).stem
        for key in ("clients", "partition"):
            settings[key] = None  # one client per party
    return settings


def raw_dataset(settings: Dict[str, Any]) -> Tuple[Any, Tuple[str, str]]:
    """The :class:`~gpflow_fed.data.FederatedDataset` of the settings in the data's units, and axis labels.

    Real datasets hold out a random ``test_fraction``; the synthetic ones come with their own test grid.
    ``quick`` keeps at most :data:`QUICK_MAX_TRAIN` random training and test rows of a built-in dataset.
    """
    import numpy as np

    from ..data.partition import make_federated, split_indices

    if settings.get("csv") is not None:  # your own parties: no simulated split, no --quick row cap
        from ..data import federated_from_table

        own = federated_from_table(
            settings["csv"], party_column=settings["party_column"], target=settings["target"],
            features=settings.get("features"), test_fraction=settings["test_fraction"], seed=settings["seed"],
        )  # fmt: skip
        return own, ((settings.get("features") or ["input"])[0], settings["target"])
    X, Y, test, labels = load_arrays(settings["dataset"], settings["seed"])
    if settings["dataset"] == "co2":
        labels = ("year", "CO₂ (ppm)")
    if test is None:
        train, held_out = split_indices(X.shape[0], settings["test_fraction"], seed=settings["seed"])
        X, Y, test = X[train], Y[train], (X[held_out], Y[held_out])
    if settings["quick"]:
        rng = np.random.default_rng(settings["seed"])

        def cap(A: np.ndarray, B: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
            if A.shape[0] <= QUICK_MAX_TRAIN:
                return A, B
            keep = np.sort(rng.choice(A.shape[0], QUICK_MAX_TRAIN, replace=False))
            return A[keep], B[keep]

        X, Y = cap(X, Y)
        test = cap(*test)
    dataset = make_federated(
        X, Y, partition=settings["partition"], num_clients=settings["clients"], test=test, seed=settings["seed"],
        name=settings["dataset"],
    )  # fmt: skip
    return dataset, labels


def build_dataset(settings: Dict[str, Any]) -> Tuple[Any, Any]:
    """The standardized :class:`~gpflow_fed.data.FederatedDataset` of the settings, and its standardizer (the
    moments agreed across the clients, :meth:`FederatedDataset.standardized`)."""
    return _standardized(raw_dataset(settings)[0])


def make_kernel(dataset: str, scaler: Any) -> gpflow.kernels.Kernel:
    """The shared kernel, with θ initialised to ones as in the FSGP paper (§4).

    Squared exponential with ARD lengthscales (``gpflow_fed.fit``'s kernel); for ``co2`` plus a periodic
    component ``Periodic(SquaredExponential)`` whose period is fixed (not trained) at one year in standardized
    input units, ``1 / σ_X``: the seasonal cycle is known, and an exactly periodic component is captured by a
    few inducing points spread over the decades.

    :param dataset: the dataset name (see :data:`DATASETS`).
    :param scaler: the standardizer of the inputs (its ``X_std`` gives the period for ``co2``).
    """
    import numpy as np

    import gpflow

    input_dim = int(np.size(scaler.X_std))
    kernel = gpflow.kernels.SquaredExponential(variance=1.0, lengthscales=np.ones(input_dim))
    if dataset != "co2":
        return kernel
    seasonal = gpflow.kernels.Periodic(
        gpflow.kernels.SquaredExponential(variance=1.0, lengthscales=1.0), period=1.0 / float(scaler.X_std[0])
    )
    gpflow.set_trainable(seasonal.period, False)
    return kernel + seasonal


def run_federated(
    settings: Dict[str, Any],
    dataset: Any,
    kernel: gpflow.kernels.Kernel,
    mode: str,
    Z: np.ndarray,
    logdir: Path,
    options: Any,
) -> Any:
    """Train FSGP in ``mode`` on the LocalRuntime (built by :func:`gpflow_fed.fitting.algorithm`, as ``fit``
    does) with ``options`` (:class:`~gpflow_fed.federated.RunOptions`), logging every round to
    ``logdir/fsgp-<mode>``."""
    from ..federated import run
    from ..fitting import algorithm as fit_algorithm
    from ..monitor import federated_monitor

    fsgp = fit_algorithm(
        "fsgp", dataset.input_dim, settings["seed"], kernel, num_inducing=Z, rounds=settings["rounds"],
        local_steps=settings["local_steps"], learning_rate=settings["learning_rate"],
        noise_variance=settings.get("noise_variance", INITIAL_NOISE_VARIANCE),
        client_fraction=settings["client_fraction"] if mode == "fedavg" else 1.0, mode=mode,
    )  # fmt: skip
    fsgp.name = f"fsgp-{mode}"  # labels this run's progress bar (the two modes run one after the other)
    monitor = federated_monitor(str(logdir / f"fsgp-{mode}"))
    return run(fsgp, dataset, options=options, monitor=monitor, seed=settings["seed"])


def _row(label: str, models: List[Any], raw_test: Any, scaler: Any, seconds: float, sent: int) -> MethodResult:
    """Metrics of models trained on standardised data, in the target's units (averaged over several models)."""
    import numpy as np

    from ..evaluation import held_out_metrics
    from ..models import StandardizedModel

    scores = [held_out_metrics(StandardizedModel(m, scaler), raw_test, scaler) for m in models]
    mean = {k: float(np.mean([s[k] for s in scores])) for k in scores[0]}
    return MethodResult(label, seconds=float(seconds), bytes_sent=int(sent), **mean)


def compare(
    settings: Dict[str, Any], logdir: Path, progress: bool, options: Any = None
) -> Tuple[List[MethodResult], Dict[str, Any]]:
    """Run FSGP (both modes) and the baselines on the same data and initial values; return the table rows
    (headline mode first) and what the plot and the report need (``extras["baseline"]``: predicting the mean).

    Every method gets T = rounds × local_steps gradient steps: FSGP-fedavg R rounds of P local steps,
    exact federated SGPR T rounds of one Adam step, centralized and local-only SGPR T Adam steps, FGP R
    rounds of P local steps. The federated runs use ``options`` (:class:`~gpflow_fed.federated.RunOptions`, default
    ``RunOptions(progress=progress)``), each with its checkpoints in its own subfolder (:func:`.options.for_run`).
    """
    from ..baselines import centralized_sgpr, local_only_sgpr
    from ..evaluation import mean_baseline
    from ..federated import RunOptions, run
    from ..federated.algorithms import FGP
    from ..federated.algorithms.inducing_inputs import STANDARDISED_BOX, inducing_grid
    from ..fitting.checks import check_inducing
    from ..models import StandardizedModel
    from ..progress import tqdm

    options = RunOptions(progress=progress) if options is None else options
    raw, labels = raw_dataset(settings)
    check_inducing(settings["inducing"], raw.num_data, True, {"num_inducing": "--inducing"})  # before anything runs
    dataset, scaler = _standardized(raw)
    steps = settings["rounds"] * settings["local_steps"]
    Z = inducing_grid([STANDARDISED_BOX] * dataset.input_dim, settings["inducing"])  # no client data
    kernel = make_kernel(settings["dataset"], scaler)
    noise = settings.get("noise_variance", INITIAL_NOISE_VARIANCE)

    runs = {}
    exact_settings = dict(settings, rounds=steps)
    for mode in (settings["mode"], "exact" if settings["mode"] == "fedavg" else "fedavg"):
        mode_settings = settings if mode == "fedavg" else exact_settings
        runs[mode] = run_federated(mode_settings, dataset, kernel, mode, Z, logdir, for_run(options, f"fsgp-{mode}"))
    rows = [
        _row(HEADLINE[mode], [r.model], raw.test, scaler, r.seconds, r.ledger.total_bytes()) for mode, r in runs.items()
    ]
    lr = settings["learning_rate"]
    baselines = {}
    for label in tqdm(["centralized SGPR", "local-only SGPR"], desc="baselines", disable=not progress, leave=False):
        train = centralized_sgpr if label.startswith("centralized") else local_only_sgpr
        baselines[label] = train(dataset, kernel, Z, noise, steps, lr)
    fgp = FGP(kernel, noise, settings["rounds"], settings["local_steps"], lr, settings["client_fraction"])
    fgp.name = "FGP baseline"
    fgp_result = run(fgp, dataset, options=for_run(options, "fgp"), seed=settings["seed"])
    raw_bytes = int(sum(X.nbytes + Y.nbytes for X, Y in dataset.clients))
    central, local = baselines["centralized SGPR"], baselines["local-only SGPR"]
    rows.append(_row("centralized SGPR", [central.model], raw.test, scaler, central.seconds, raw_bytes))
    rows.append(
        _row(f"local-only SGPR (mean of {dataset.num_clients})", local.models, raw.test, scaler, local.seconds, 0)
    )
    rows.append(
        _row("FGP (rBCM)", [fgp_result.model], raw.test, scaler, fgp_result.seconds, fgp_result.ledger.total_bytes())
    )
    headline = HEADLINE[settings["mode"]]
    extras = {
        "baseline": MethodResult("predict the mean", seconds=0.0, bytes_sent=0, **mean_baseline(raw.test, scaler)),
        "raw": raw,
        "dataset": dataset,
        "scaler": scaler,
        "labels": labels,
        "history": runs[settings["mode"]].history,
        "model": StandardizedModel(runs[settings["mode"]].model, scaler),
        "models": {headline: runs[settings["mode"]].model, "centralized SGPR": central.model},
        "inducing": runs[settings["mode"]].model.inducing_variable.Z.numpy(),
    }
    return rows, extras


def _features(args: argparse.Namespace) -> Optional[List[str]]:
    table = getattr(args, "table", None)
    return None if table is None else list(table.features)


def format_table(rows: List[MethodResult]) -> str:
    """A Markdown table of the rows (see :func:`gpflow_fed.cli.report.format_table`)."""
    from .report import format_table as table

    return table([asdict(r) for r in rows])


def main(args: argparse.Namespace) -> int:
    """Run the ``fsgp`` subcommand; prints a table (or JSON with ``--json``) and returns 0."""
    from .report import dataset_info, dataset_unit, emit, payload

    settings = resolve_settings(args)
    logdir = Path(args.logdir)
    logdir.mkdir(parents=True, exist_ok=True)
    from ..evaluation import calibration_message
    from ..models import StandardizedModel, save_model
    from ..monitor import write_scalars
    from ..plotting import plot_run

    progress = not (args.no_progress or args.json)
    rows, extras = compare(settings, logdir, progress, run_options(args, progress=progress))
    rows.append(extras["baseline"])
    comparison = {f"{r.method}/{k}": float(getattr(r, k)) for r in rows for k in ("test_rmse", "test_nlpd", "seconds")}
    comparison.update({f"{r.method}/bytes_sent": float(r.bytes_sent) for r in rows})
    write_scalars(str(logdir / "comparison"), comparison, step=settings["rounds"])
    raw, scaler = extras["raw"], extras["scaler"]
    metric = "local_bound" if settings["mode"] == "fedavg" else "bound"
    inducing = extras["inducing"] * scaler.X_std + scaler.X_mean if raw.input_dim == 1 else None
    plot = plot_run(
        logdir / "fsgp.png",
        extras["history"],
        {label: StandardizedModel(model, scaler) for label, model in extras["models"].items()},
        raw.test,
        labels=extras["labels"],
        metric=metric,
        metric_label="mean local bound ELBO_k / N_k (eq. 9)" if metric == "local_bound" else "global bound ELBO / N",
        title=f"FSGP on {raw.name}: K={raw.num_clients}, M={settings['inducing']}, mode={settings['mode']}",
        inducing=inducing,
    )
    saved = save_model(extras["model"], args.save or logdir / "model.npz")
    results = [asdict(r) for r in rows]
    warning = calibration_message(results[0], int(raw.test[0].shape[0]), rows[0].method)
    own = settings.get("target")
    info = dataset_info(
        raw, features=_features(args), target=own, unit=None if own else dataset_unit(settings["dataset"])
    )
    report = payload(
        "fsgp",
        info,
        settings,
        results,
        [warning] if warning else [],
        {"logdir": str(logdir), "plot": str(plot), "model": str(saved)},
    )
    header = (
        f"{raw!r}\nmetrics in {info['units']} (std.: standardised); T = "
        f"{settings['rounds'] * settings['local_steps']} gradient steps each"
    )
    footer = f"TensorBoard: tensorboard --logdir {logdir}    plot: {plot}    model: {saved}"
    emit(args.json, report, header, footer)
    return 0
