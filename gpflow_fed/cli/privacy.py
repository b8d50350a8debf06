"""``gpflow-fed privacy``: privacy-aware release of a GP regression model (Tuo & Bhattacharya).

Reads a CSV (input columns and one output column), fits a GP by maximum likelihood (constant mean), computes
the minimum-trace synthetic-noise covariance Σ for the sensitive points or intervals, obfuscates the outputs
with noise drawn from the operating system's randomness (so nobody can regenerate and subtract it; there is
deliberately no seed), and writes ``released.csv`` (inputs and obfuscated outputs), ``model.npz`` (the released
:class:`~gpflow_fed.models.PrivacyAwareGPR`, no raw outputs inside) and ``privacy.png`` (the released posterior,
1-D inputs) into ``--out``: everything there is safe to publish. For the data owner only (it shows the raw
data), ``privacy-raw-vs-released.png`` (raw vs released posterior) and TensorBoard scalars go to ``--logdir``.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, List

if TYPE_CHECKING:
    import numpy as np


MAXITER = 1000
QUICK_MAXITER = 20
#: the stages the progress bar counts
STAGES = ("fit, Σ and noise", "write the release", "plots and TensorBoard")


def _floats(text: str) -> List[float]:
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from exc


def _interval(text: str) -> "tuple[float, float]":
    parts = _floats(text.replace(":", ","))
    if len(parts) != 2 or parts[0] > parts[1]:
        raise argparse.ArgumentTypeError(f"an interval is LOW:HIGH with LOW ≤ HIGH, got {text!r}")
    return parts[0], parts[1]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``privacy`` subcommand."""
    p = subparsers.add_parser(
        "privacy",
        help="privacy-aware GP release (synthetic correlated noise)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "csv",
        type=Path,
        help="input CSV (a first row with a non-number is the header; without one, columns are named 1, 2, …)",
    )
    p.add_argument("--x", dest="x_columns", default=None, help="comma-separated input columns (default: all but --y)")
    p.add_argument("--y", dest="y_column", default=None, help="output column (default: the last column)")
    p.add_argument("--sensitive", type=_floats, default=None, help="sensitive points (1-D inputs), e.g. 0.4,0.6")
    p.add_argument(
        "--interval",
        type=_interval,
        action="append",
        default=None,
        help="a sensitive interval LOW:HIGH (1-D inputs; repeatable; needs --alpha), discretised at --density "
        "(eq. 12–13, on a well-conditioned subset of the grid)",
    )
    p.add_argument("--density", type=float, default=20.0, help="grid points per unit length for intervals")
    p.add_argument("--tolerance", type=float, default=None, help="variance tolerance ξ at each sensitive point")
    p.add_argument("--alpha", type=float, default=None, help="kernel tolerance H = αK, 0 < α < 1 (larger hides more)")
    p.add_argument("--method", choices=("strong", "weak", "diagonal"), default="strong")
    p.add_argument(
        "--solver",
        choices=("krylov", "dense"),
        default=None,
        help="weak method: certified Krylov reduction (default) or the dense N×N SDP (small N)",
    )
    p.add_argument("--noise-variance", type=float, default=None, help="fix σ² of V (default: estimate it)")
    p.add_argument("--out", type=Path, default=Path("privacy_release"), help="output directory (created if absent)")
    p.add_argument(
        "--logdir",
        type=Path,
        default=None,
        help="owner-only outputs: TensorBoard scalars and the raw-vs-released plot (default: <out>_owner)",
    )
    p.add_argument(
        "--maxiter",
        type=int,
        default=None,
        help=f"L-BFGS iterations of the maximum-likelihood fit (default {MAXITER}; --quick {QUICK_MAXITER})",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--quick", action="store_true", help="a short hyperparameter fit, for a smoke test (seconds)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(func=run)


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def _read_csv(path: Path, x_columns: "str | None", y_column: "str | None") -> "tuple[np.ndarray, np.ndarray, list]":
    """Inputs, outputs and column names from a CSV with or without a header row.

    The first row is a header iff one of its cells is not a number; without a header, columns are named by
    their 1-based position (``--y 2``). Every value must be a finite number.
    """
    import numpy as np

    if not path.is_file():
        raise ValueError(f"CSV file {path} not found")
    with open(path, newline="") as fh:
        reader = csv.reader(fh)
        numbered = [(reader.line_num, r) for r in reader if any(c.strip() for c in r)]
    if not numbered:
        raise ValueError(f"{path} is empty")
    first_row = numbered[0][1]
    has_header = not all(_is_number(c) for c in first_row)
    header = [h.strip() for h in first_row] if has_header else [str(j + 1) for j in range(len(first_row))]
    data = numbered[1:] if has_header else numbered
    if len(data) < 2:
        raise ValueError(f"{path} needs at least 2 data rows, got {len(data)}")
    y_name = y_column or header[-1]
    x_names = x_columns.split(",") if x_columns else [h for h in header if h != y_name]
    for name in x_names + [y_name]:
        if name not in header:
            raise ValueError(
                f"column {name!r} not in {path} (columns: {', '.join(header)}"
                f"{'' if has_header else '; no header row, so columns are numbered from 1'})"
            )
    index = [header.index(n) for n in x_names + [y_name]]
    table = np.empty((len(data), len(index)))
    for i, (line, row) in enumerate(data):
        if len(row) != len(header):
            raise ValueError(f"{path}, line {line}: {len(row)} cells, expected {len(header)}")
        for j, col in enumerate(index):
            try:
                table[i, j] = float(row[col])
            except ValueError:
                raise ValueError(f"{path}, line {line}, column {header[col]!r}: {row[col]!r} is not a number") from None
            if not np.isfinite(table[i, j]):
                raise ValueError(
                    f"{path}, line {line}, column {header[col]!r}: {row[col]!r} is not finite; remove or impute the row"
                )
    return table[:, :-1], table[:, -1:], x_names + [y_name]


OUTPUTS = ("released.csv", "model.npz", "privacy.png")


def _check_out(out: Path) -> None:
    """``--out`` must be a directory (or absent) without a previous release in it.

    A second release of the same data with fresh noise would let anyone average the two and halve the noise
    variance, so an existing release is never overwritten.
    """
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} exists and is not a directory; name a directory")
    previous = [name for name in OUTPUTS if (out / name).exists()]
    if previous:
        raise ValueError(
            f"--out {out} already holds a release ({', '.join(previous)}); a second release of the same "
            "data with fresh noise can be averaged with the first, so choose a new directory (or delete "
            "the old release if it was never published)"
        )


def run(args: argparse.Namespace) -> int:
    """Run the release and write its three outputs."""
    import numpy as np

    from ..release import ProportionalKernel, RegionUnion, Interval

    import gpflow

    from ..progress import tqdm

    maxiter = args.maxiter if args.maxiter is not None else QUICK_MAXITER if args.quick else MAXITER
    if maxiter < 1:
        raise ValueError(f"--maxiter must be at least 1, got {maxiter}")
    X, Y, names = _read_csv(args.csv, args.x_columns, args.y_column)
    if (args.tolerance is None) == (args.alpha is None):
        raise ValueError("give exactly one of --tolerance (a variance) or --alpha (H = αK)")
    if (args.sensitive is None) == (args.interval is None):
        raise ValueError("give sensitive points with --sensitive or intervals with --interval (one of them)")
    if X.shape[1] != 1:
        raise ValueError(f"the CLI handles 1-D inputs (got {X.shape[1]} columns); use the Python API for more")
    if args.interval is not None and args.alpha is None:
        raise ValueError("a sensitive interval needs a kernel tolerance: use --alpha (H = αK) instead of --tolerance")
    if args.interval is not None:
        sensitive = RegionUnion(*[Interval(lo, hi) for lo, hi in args.interval])
        S = sensitive.discretise(args.density)
    else:
        sensitive = S = np.asarray(args.sensitive, dtype=float)[:, None]
    _check_out(args.out)
    kernel = gpflow.kernels.SquaredExponential(lengthscales=float(np.std(X)) or 1.0)
    tolerance = ProportionalKernel(kernel, args.alpha) if args.alpha is not None else args.tolerance
    with tqdm(total=len(STAGES), desc="privacy", disable=args.json or args.no_progress) as bar:
        bar.set_postfix_str(STAGES[0])
        return _release(args, X, Y, names, S, sensitive, tolerance, kernel, maxiter, bar)


def _release(
    args: argparse.Namespace,
    X: "np.ndarray",
    Y: "np.ndarray",
    names: List[str],
    S: "np.ndarray",
    sensitive: Any,
    tolerance: Any,
    kernel: Any,
    maxiter: int,
    bar: Any,
) -> int:
    """Fit, compute Σ, obfuscate, write the release and the owner's outputs, ticking ``bar`` per stage."""
    import numpy as np

    from ..models.privacy_aware_gpr import release

    result = release(
        (X, Y),
        sensitive,
        tolerance,
        kernel=kernel,
        method=args.method,
        maxiter=maxiter,
        noise_variance=args.noise_variance,
        density=args.density,
        solver=args.solver,
    )
    _advance(bar, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "released.csv", "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(names)
        writer.writerows(np.concatenate([X, result.W], axis=1).tolist())
    result.model.save(args.out / "model.npz")
    _plot(X, None, result, args.out / "privacy.png", names)
    _advance(bar, 2)
    if args.logdir is None:
        args.logdir = args.out.with_name(args.out.name + "_owner")
    args.logdir.mkdir(parents=True, exist_ok=True)
    comparison = args.logdir / "privacy-raw-vs-released.png"
    _plot(X, Y, result, comparison, names)
    mean, var = result.model.predict_f(S)
    summary = {
        "released_points": int(X.shape[0]),
        "sensitive_points": int(S.shape[0]),
        "trace_sigma": float(np.trace(np.asarray(result.Sigma))),
        "min_sensitive_variance": float(np.min(var)),
    }
    certificate = getattr(result.Sigma, "certificate", None)
    if certificate is not None:
        summary.update(
            {
                "certified_lower_bound": float(certificate.lower_bound),
                "relative_gap": float(certificate.relative_gap),
                "feasibility_margin": float(certificate.feasibility_margin),
                "krylov_dimension": float(certificate.krylov_dimension),
            }
        )
    from ..monitor import write_scalars

    write_scalars(str(args.logdir / "privacy"), {k: float(v) for k, v in summary.items()}, step=0)
    bar.update(1)
    bar.close()  # before the result lines, so they do not share the bar's line
    written = [str(args.out / name) for name in OUTPUTS]
    if args.json:
        print(
            json.dumps({**summary, "released": written, "logdir": str(args.logdir), "plot": str(comparison)}, indent=2)
        )
        return 0
    print(
        f"released {X.shape[0]} points, {S.shape[0]} sensitive; tr Σ = {summary['trace_sigma']:.6g}; "
        f"min predictive variance at sensitive inputs = {summary['min_sensitive_variance']:.6g}"
    )
    if certificate is not None:
        print(
            f"certificate: tr Σ = {certificate.objective:.10g} ≥ optimum ≥ {certificate.lower_bound:.10g} "
            f"(relative gap {certificate.relative_gap:.1e}); min (Var − ξ) at sensitive inputs = "
            f"{certificate.feasibility_margin:.2e}; Krylov dimension {certificate.krylov_dimension}; "
            f"{certificate.seconds:.2f} s"
        )
    print(f"wrote {', '.join(written)} (safe to publish)")
    print(f"owner only (shows raw data): {comparison}; TensorBoard: tensorboard --logdir {args.logdir}")
    return 0


def _advance(bar: Any, stage: int) -> None:
    """Count one finished stage and name the next."""
    bar.update(1)
    bar.set_postfix_str(STAGES[stage])


def _plot(X: np.ndarray, Y: "np.ndarray | None", result: object, path: Path, names: List[str]) -> None:
    """The released posterior (and, given the raw ``Y``, the raw-data posterior with the same hyperparameters)."""
    import numpy as np

    import gpflow

    from ..plotting import figure

    grid = np.linspace(X.min(), X.max(), 400)[:, None]
    fig = figure(figsize=(7, 3.8))
    ax = fig.subplots()
    curves = [("released", result.model, "k", "C1")]
    if Y is not None:
        ax.plot(X[:, 0], Y[:, 0], ".", color="0.5", ms=4, label="raw data (owner only)")
        raw = gpflow.models.GPR(
            (X, Y),
            kernel=result.model.kernel,
            mean_function=result.model.mean_function,
            noise_variance=result.noise_variance,
        )
        curves.insert(0, ("raw-data", raw, "C0", None))
    ax.plot(X[:, 0], result.W[:, 0], "o", ms=3, color="C1", alpha=0.6, label="released outputs W")
    for label, model, colour, _ in curves:
        mean, var = model.predict_f(grid)
        mean, sd = mean.numpy()[:, 0], np.sqrt(np.maximum(var.numpy()[:, 0], 0))
        ax.plot(grid[:, 0], mean, "-", color=colour, label=f"{label} posterior mean")
        ax.fill_between(grid[:, 0], mean - 2 * sd, mean + 2 * sd, color=colour, alpha=0.15, label=f"{label} ±2 sd")
    ax.plot(
        result.sensitive[:, 0],
        np.full(result.sensitive.shape[0], ax.get_ylim()[0]),
        "r|",
        ms=12,
        label="sensitive inputs",
    )
    ax.set_xlabel(names[0])
    ax.set_ylabel(names[-1])
    ax.set_title("raw vs released posterior" if Y is not None else "released posterior")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
