"""``gpflow-fed fsgp``: federated sparse GP regression across simulated clients, compared with its baselines.

The main job of the package (``make run``): load a dataset (default: Mauna Loa CO₂ from statsmodels,
nothing downloaded), split it among K simulated clients, train FSGP (Guo et al., FedAvg on the per-client
collapsed bound, eq. 9; prediction from summed statistics, eqs. 14–15) on the :class:`LocalRuntime` with a
progress bar, and print a table comparing

* FSGP (``mode="fedavg"``, the paper) and exact federated SGPR (``mode="exact"``: one Adam step per round on
  the global bound, from client sums); ``--mode`` picks the headline one (first row, plotted),
* centralized SGPR on the pooled data (the oracle; its "bytes" are the raw data a client would upload),
* local-only SGPR (each client alone; the mean over clients, no bytes),
* FGP (FedAvg on per-client exact-GP marginal likelihoods, rBCM prediction),

by test RMSE, NLPD, wall time and bytes sent. Every model gets the same kernel, initial (θ, σ, Z) and the
same number of gradient steps. TensorBoard events go to ``<logdir>/<method>`` and a PNG to
``<logdir>/fsgp.png``.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from .own_data import add_own_data_arguments, check_own_data_arguments

if TYPE_CHECKING:  # imported when a command runs, not when the CLI parses its arguments
    import gpflow
    import numpy as np

DATASETS = ("co2", "diabetes", "synthetic1", "synthetic2")
PARTITIONS = ("iid", "random_sizes", "sorted_chunks", "spatial")
MODES = ("fedavg", "exact")
#: the defaults of ``make run`` (a few minutes on 2 CPU cores) and of ``--quick`` (seconds).
DEFAULTS = dict(clients=5, rounds=50, local_steps=3, learning_rate=0.05, client_fraction=1.0, inducing=30)
QUICK = dict(clients=3, rounds=5, local_steps=2, inducing=8)
QUICK_MAX_TRAIN = 300


def _checked(cast: Callable[[str], Any], expected: str, check: Callable[[Any], bool]) -> Callable[[str], Any]:
    """An argparse ``type=``: ``cast(text)`` that must satisfy ``check``; errors say what was ``expected``."""

    def parse(text: str) -> Any:
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not check(value):
            raise argparse.ArgumentTypeError(f"must be {expected}, got {text}")
        return value

    return parse


_positive_int = _checked(int, "a positive integer", lambda v: v >= 1)
_non_negative_int = _checked(int, "a non-negative integer", lambda v: v >= 0)
_positive_float = _checked(float, "a positive finite number", lambda v: math.isfinite(v) and v > 0)
_fraction = _checked(float, "a number in (0, 1] (the fraction ρ of clients per round)", lambda v: 0 < v <= 1)
_open_fraction = _checked(float, "a number in (0, 1)", lambda v: 0 < v < 1)


def register(subparsers: Any) -> None:
    """Add the ``fsgp`` subcommand to the ``gpflow-fed`` parser."""
    d = DEFAULTS
    parser = subparsers.add_parser(
        "fsgp",
        help="federated sparse GP regression (FSGP) across simulated clients, with baselines",
        description=(
            "Split a dataset among K simulated clients, train FSGP (FedAvg on per-client Titsias bounds) and exact\n"
            "federated SGPR on the local runtime, and compare them with centralized SGPR, local-only SGPR and FGP\n"
            "(test RMSE, NLPD, time, bytes sent). Writes TensorBoard events and fsgp.png under --logdir."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--dataset", choices=DATASETS, default="co2", help="co2: Mauna Loa CO₂ from statsmodels (default co2)"
    )
    parser.add_argument(
        "--partition",
        choices=PARTITIONS,
        default="random_sizes",
        help="how rows go to clients (default random_sizes)",
    )
    parser.add_argument("--clients", type=_positive_int, default=None, help=f"K (default {d['clients']})")
    parser.add_argument("--rounds", type=_positive_int, default=None, help=f"R (default {d['rounds']})")
    parser.add_argument(
        "--local-steps",
        type=_positive_int,
        default=None,
        help=f"P, Adam steps per round (default {d['local_steps']})",
    )
    parser.add_argument(
        "--learning-rate",
        type=_positive_float,
        default=d["learning_rate"],
        help=f"Adam learning rate λ (default {d['learning_rate']})",
    )
    parser.add_argument(
        "--client-fraction",
        type=_fraction,
        default=d["client_fraction"],
        help="ρ ∈ (0, 1]: max(⌈Kρ⌉, 1) clients per round (default 1)",
    )
    parser.add_argument("--inducing", "-M", type=_positive_int, default=None, help=f"M (default {d['inducing']})")
    parser.add_argument("--mode", choices=MODES, default="fedavg", help="the headline FSGP mode (default fedavg)")
    parser.add_argument(
        "--test-fraction",
        type=_open_fraction,
        default=0.2,
        help="rows of a real dataset held out for testing (default 0.2)",
    )
    parser.add_argument("--seed", type=_non_negative_int, default=0, help="seed of split, Z and sampling (default 0)")
    parser.add_argument(
        "--logdir", default="runs/fsgp", help="TensorBoard events and the PNG plot go here (default runs/fsgp)"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=(
            f"tiny settings for a smoke test (K={QUICK['clients']}, R={QUICK['rounds']}, P={QUICK['local_steps']}, "
            f"M={QUICK['inducing']} unless given; at most {QUICK_MAX_TRAIN} rows)"
        ),
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    add_own_data_arguments(parser)
    parser.set_defaults(func=main)


@dataclass
class MethodResult:
    """One row of the comparison table."""

    method: str
    test_rmse: float
    test_nlpd: float
    seconds: float
    bytes_sent: int


def resolve_settings(args: argparse.Namespace) -> Dict[str, Any]:
    """The effective settings: explicit options, else ``--quick`` values, else :data:`DEFAULTS`."""
    settings: Dict[str, Any] = {}
    for key in ("clients", "rounds", "local_steps", "inducing"):
        value = getattr(args, key)
        if value is None:
            value = QUICK[key] if args.quick else DEFAULTS[key]
        settings[key] = int(value)
    settings.update(
        dataset=args.dataset,
        partition=args.partition,
        learning_rate=float(args.learning_rate),
        client_fraction=float(args.client_fraction),
        mode=args.mode,
        test_fraction=float(args.test_fraction),
        seed=int(args.seed),
        quick=bool(args.quick),
        csv=getattr(args, "csv", None),
        party_column=getattr(args, "party_column", None),
        target=getattr(args, "target", None),
        features=getattr(args, "features", None),
    )
    if hasattr(args, "csv"):
        check_own_data_arguments(args)  # before anything runs: --target without --csv is a mistake
    if settings["csv"] is not None:
        settings["dataset"] = Path(settings["csv"]).stem
    return settings


def _raw_data(name: str, seed: int) -> Tuple[np.ndarray, np.ndarray, Optional[Tuple[np.ndarray, np.ndarray]]]:
    """``(X, Y, test)``; ``test`` is ``None`` when a random fraction is to be held out."""
    from ..data import real, synthetic

    if name == "synthetic1":
        data = synthetic.fsgp_synthetic_1(seed=seed)
        return data.X_train, data.Y_train, (data.X_test, data.Y_test)
    if name == "synthetic2":
        data = synthetic.fsgp_synthetic_2(seed=seed)
        return data.X_train, data.Y_train, (data.X_test, data.Y_test)
    loaded = real.load_dataset(name)
    return loaded.X, loaded.Y, None


def build_dataset(settings: Dict[str, Any]) -> Tuple[Any, Any]:
    """The standardized :class:`~gpflow_fed.data.FederatedDataset` of the settings, and its standardizer.

    Real datasets hold out a random ``test_fraction``; the synthetic ones come with their own test grid.
    ``quick`` keeps at most :data:`QUICK_MAX_TRAIN` random training and test rows.
    """
    import numpy as np

    from ..data.partition import make_federated, split_indices

    if settings.get("csv") is not None:  # your own parties: no simulated split, no --quick row cap
        from ..data import federated_from_table

        own = federated_from_table(
            settings["csv"], party_column=settings["party_column"], target=settings["target"],
            features=settings["features"], test_fraction=settings["test_fraction"], seed=settings["seed"],
        )  # fmt: skip
        return own.standardized()
    X, Y, test = _raw_data(settings["dataset"], settings["seed"])
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
        X,
        Y,
        partition=settings["partition"],
        num_clients=settings["clients"],
        test=test,
        seed=settings["seed"],
        name=settings["dataset"],
    )
    return dataset.standardized()


def make_kernel(dataset: str, scaler: Any) -> gpflow.kernels.Kernel:
    """The shared kernel, with θ initialised to ones as in the FSGP paper (§4).

    Squared exponential with ARD lengthscales; for ``co2`` plus a periodic component
    ``Periodic(SquaredExponential)`` whose period is fixed (not trained) at one year in standardized input
    units, ``1 / σ_X``: the seasonal cycle is known, and an exactly periodic component is captured by a few
    inducing points spread over the decades.

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


#: initial noise variance σ² on standardized data: a tenth of the output variance. (The paper's σ = 0.1, i.e.
#: σ² = 0.01, is on its synthetic data's own scale; ``benchmarks/fsgp.py`` reproduces that.)
INITIAL_NOISE_VARIANCE = 0.1


def _fsgp_row(label: str, result: Any) -> MethodResult:
    return MethodResult(
        method=label,
        test_rmse=float(result.metrics["test_rmse"]),
        test_nlpd=float(result.metrics["test_nlpd"]),
        seconds=float(result.seconds),
        bytes_sent=int(result.ledger.total_bytes()),
    )


def run_federated(
    settings: Dict[str, Any],
    dataset: Any,
    kernel: gpflow.kernels.Kernel,
    mode: str,
    Z: np.ndarray,
    logdir: Path,
    progress: bool,
) -> Any:
    """Train FSGP in ``mode`` on the LocalRuntime, logging every round to ``logdir/fsgp-<mode>``."""
    from ..federated import LocalRuntime, run
    from ..federated.algorithms import FSGP
    from ..monitor import federated_monitor

    algorithm = FSGP(
        kernel,
        Z,
        INITIAL_NOISE_VARIANCE,
        rounds=settings["rounds"],
        local_steps=settings["local_steps"],
        learning_rate=settings["learning_rate"],
        client_fraction=settings["client_fraction"] if mode == "fedavg" else 1.0,
        mode=mode,
    )
    algorithm.name = f"fsgp-{mode}"  # labels this run's progress bar (the two modes run one after the other)
    monitor = federated_monitor(str(logdir / f"fsgp-{mode}"))
    return run(algorithm, dataset, runtime=LocalRuntime(progress=progress), monitor=monitor, seed=settings["seed"])


def compare(settings: Dict[str, Any], logdir: Path, progress: bool) -> Tuple[List[MethodResult], Dict[str, Any]]:
    """Run FSGP (both modes) and the baselines on the same data and initial values; return the table rows
    (headline mode first) and what the plot needs.

    Every method gets T = rounds × local_steps gradient steps: FSGP-fedavg R rounds of P local steps,
    exact federated SGPR T rounds of one Adam step, centralized and local-only SGPR T Adam steps, FGP R
    rounds of P local steps.
    """
    import numpy as np

    from ..baselines import centralized_sgpr, local_only_sgpr
    from ..federated import run
    from ..federated.algorithms import FGP, initial_inducing_inputs

    dataset, scaler = build_dataset(settings)
    steps = settings["rounds"] * settings["local_steps"]
    M = settings["inducing"]
    Z = initial_inducing_inputs(np.concatenate([X for X, _ in dataset.clients]), M, seed=settings["seed"])
    kernel = make_kernel(settings["dataset"], scaler)

    runs = {}
    exact_settings = dict(settings, rounds=steps)
    for mode in (settings["mode"], "exact" if settings["mode"] == "fedavg" else "fedavg"):
        mode_settings = settings if mode == "fedavg" else exact_settings
        runs[mode] = run_federated(mode_settings, dataset, kernel, mode, Z, logdir, progress)
    labels = {"fedavg": "FSGP (fedavg)", "exact": "exact federated SGPR"}
    rows = [_fsgp_row(labels[mode], result) for mode, result in runs.items()]

    lr, noise = settings["learning_rate"], INITIAL_NOISE_VARIANCE
    central = centralized_sgpr(dataset, kernel, Z, noise, steps, lr)
    local = local_only_sgpr(dataset, kernel, Z, noise, steps, lr)
    fgp = FGP(kernel, noise, settings["rounds"], settings["local_steps"], lr, settings["client_fraction"])
    fgp_result = run(fgp, dataset, seed=settings["seed"])
    raw_bytes = int(sum(X.nbytes + Y.nbytes for X, Y in dataset.clients))
    for label, baseline, sent in (
        ("centralized SGPR", central, raw_bytes),
        (f"local-only SGPR (mean of {dataset.num_clients})", local, 0),
    ):
        rows.append(
            MethodResult(label, baseline.metrics["test_rmse"], baseline.metrics["test_nlpd"], baseline.seconds, sent)
        )
    rows.append(_fsgp_row("FGP (rBCM)", fgp_result))
    extras = {
        "dataset": dataset,
        "scaler": scaler,
        "history": runs[settings["mode"]].history,
        "models": {labels[settings["mode"]]: runs[settings["mode"]].model, "centralized SGPR": central.model},
        "inducing": runs[settings["mode"]].model.inducing_variable.Z.numpy(),
    }
    return rows, extras


class _InDataUnits:
    """A model trained on standardised data, predicting in the data's units (for the plot)."""

    def __init__(self, model: Any, scaler: Any) -> None:
        self.model, self.scaler = model, scaler

    def predict_y(self, X: np.ndarray) -> Tuple[Any, Any]:
        import tensorflow as tf

        mean, var = (t.numpy() for t in self.model.predict_y(self.scaler.transform(X)))
        return tuple(tf.constant(a) for a in self.scaler.inverse_transform(mean, var))  # type: ignore[return-value]


def _axis_labels(settings: Dict[str, Any]) -> Tuple[str, str]:
    if settings.get("csv"):
        return ((settings["features"] or ["input"])[0], settings["target"])
    return {"co2": ("year", "CO₂ (ppm)")}.get(settings["dataset"], ("x", "y"))


def format_table(rows: List[MethodResult]) -> str:
    """A Markdown table of the rows."""
    lines = [
        "| method | test RMSE | test NLPD | time (s) | bytes sent |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r.method} | {r.test_rmse:.4f} | {r.test_nlpd:.4f} | {r.seconds:.2f} | {r.bytes_sent:,} |")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """Run the ``fsgp`` subcommand; prints a table (or JSON with ``--json``) and returns 0."""
    settings = resolve_settings(args)
    logdir = Path(args.logdir)
    logdir.mkdir(parents=True, exist_ok=True)
    from ..monitor import write_scalars
    from ..plotting import plot_run

    rows, extras = compare(settings, logdir, progress=not (args.no_progress or args.json))
    comparison = {f"{r.method}/{k}": float(getattr(r, k)) for r in rows for k in ("test_rmse", "test_nlpd", "seconds")}
    comparison.update({f"{r.method}/bytes_sent": float(r.bytes_sent) for r in rows})
    write_scalars(str(logdir / "comparison"), comparison, step=settings["rounds"])
    dataset = extras["dataset"]
    metric = "local_bound" if settings["mode"] == "fedavg" else "bound"
    scaler = extras["scaler"]
    X_test, Y_test = dataset.test
    test_in_data_units = (X_test * scaler.X_std + scaler.X_mean, scaler.inverse_transform(Y_test))
    inducing = extras["inducing"] * scaler.X_std + scaler.X_mean if dataset.input_dim == 1 else None
    plot = plot_run(
        logdir / "fsgp.png",
        extras["history"],
        {label: _InDataUnits(model, scaler) for label, model in extras["models"].items()},
        test_in_data_units,
        labels=_axis_labels(settings),
        metric=metric,
        metric_label="mean local bound ELBO_k / N_k (eq. 9)" if metric == "local_bound" else "global bound ELBO / N",
        title=f"FSGP on {dataset.name}: K={dataset.num_clients}, M={settings['inducing']}, mode={settings['mode']}",
        inducing=inducing,
    )
    if args.json:
        payload = {
            "settings": settings,
            "dataset": {
                "name": dataset.name,
                "num_clients": dataset.num_clients,
                "client_sizes": list(dataset.client_sizes),
                "input_dim": dataset.input_dim,
                "num_test": int(dataset.test[0].shape[0]),
            },
            "results": [asdict(r) for r in rows],
            "logdir": str(logdir),
            "plot": str(plot),
        }
        print(json.dumps(payload, indent=2))
    else:
        print(
            f"{dataset!r}; metrics in standardized units; T = {settings['rounds'] * settings['local_steps']} steps each"
        )
        print(format_table(rows))
        print(f"TensorBoard: tensorboard --logdir {logdir}    plot: {plot}")
    return 0
