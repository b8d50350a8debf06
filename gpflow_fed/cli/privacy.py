"""``gpflow-fed privacy``: privacy-aware release of a GP regression model (Tuo & Bhattacharya).

Reads a CSV (input columns and one output column), fits a GP by maximum likelihood (constant mean), computes
the minimum-trace synthetic-noise covariance Σ for the sensitive points or intervals, obfuscates the outputs,
and writes ``released.csv`` (inputs and obfuscated outputs), ``model.npz`` (the released
:class:`~gpflow_fed.models.PrivacyAwareGPR`, no raw outputs inside) and ``privacy.png`` (raw vs released
posterior, 1-D inputs) into ``--out``.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path
from typing import List

import gpflow
import numpy as np


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
    p = subparsers.add_parser("privacy", help="privacy-aware GP release (synthetic correlated noise)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("csv", type=Path, help="input CSV with a header row")
    p.add_argument("--x", dest="x_columns", default=None, help="comma-separated input columns (default: all but --y)")
    p.add_argument("--y", dest="y_column", default=None, help="output column (default: the last column)")
    p.add_argument("--sensitive", type=_floats, default=None, help="sensitive points (1-D inputs), e.g. 0.4,0.6")
    p.add_argument("--interval", type=_interval, action="append", default=None,
                   help="a sensitive interval LOW:HIGH (1-D inputs; repeatable; needs --alpha), discretised at --density "
                        "(eq. 12–13, on a well-conditioned subset of the grid)")
    p.add_argument("--density", type=float, default=20.0, help="grid points per unit length for intervals")
    p.add_argument("--tolerance", type=float, default=None, help="variance tolerance ξ at each sensitive point")
    p.add_argument("--alpha", type=float, default=None, help="kernel tolerance H = αK, 0 < α < 1 (larger hides more)")
    p.add_argument("--method", choices=("strong", "weak", "diagonal"), default="strong")
    p.add_argument("--solver", choices=("krylov", "dense"), default=None,
                   help="weak method: certified Krylov reduction (default) or the dense N×N SDP (small N)")
    p.add_argument("--noise-variance", type=float, default=None, help="fix σ² of V (default: estimate it)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("privacy_release"))
    p.set_defaults(func=run)


def _read_csv(path: Path, x_columns: "str | None", y_column: "str | None") -> "tuple[np.ndarray, np.ndarray, list]":
    if not path.is_file():
        raise ValueError(f"CSV file {path} not found")
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    if len(rows) < 3:
        raise ValueError(f"{path} needs a header and at least 2 data rows")
    header = [h.strip() for h in rows[0]]
    y_name = y_column or header[-1]
    x_names = x_columns.split(",") if x_columns else [h for h in header if h != y_name]
    for name in x_names + [y_name]:
        if name not in header:
            raise ValueError(f"column {name!r} not in {path} (columns: {', '.join(header)})")
    try:
        table = np.array([[float(r[header.index(n)]) for n in x_names + [y_name]] for r in rows[1:]])
    except (ValueError, IndexError) as exc:
        raise ValueError(f"{path}: non-numeric or missing value ({exc})") from exc
    return table[:, :-1], table[:, -1:], x_names + [y_name]


def run(args: argparse.Namespace) -> int:
    """Run the release and write its three outputs."""
    from ..models.privacy_aware_gpr import release
    from ..privacy import ProportionalKernel, RegionUnion, Interval

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
    kernel = gpflow.kernels.SquaredExponential(lengthscales=float(np.std(X)) or 1.0)
    tolerance = ProportionalKernel(kernel, args.alpha) if args.alpha is not None else args.tolerance
    result = release((X, Y), sensitive, tolerance, kernel=kernel, method=args.method,
                     noise_variance=args.noise_variance, seed=args.seed, density=args.density, solver=args.solver)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "released.csv", "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(names)
        writer.writerows(np.concatenate([X, result.W], axis=1).tolist())
    result.model.save(args.out / "model.npz")
    _plot(X, result, args.out / "privacy.png")
    mean, var = result.model.predict_f(S)
    print(f"released {X.shape[0]} points, {S.shape[0]} sensitive; tr Σ = {np.trace(np.asarray(result.Sigma)):.6g}; "
          f"min predictive variance at sensitive inputs = {float(np.min(var)):.6g}")
    certificate = getattr(result.Sigma, "certificate", None)
    if certificate is not None:
        print(f"certificate: tr Σ = {certificate.objective:.10g} ≥ optimum ≥ {certificate.lower_bound:.10g} "
              f"(relative gap {certificate.relative_gap:.1e}); min (Var − ξ) at sensitive inputs = "
              f"{certificate.feasibility_margin:.2e}; Krylov dimension {certificate.krylov_dimension}; "
              f"{certificate.seconds:.2f} s")
    print(f"wrote {args.out / 'released.csv'}, {args.out / 'model.npz'}, {args.out / 'privacy.png'}")
    return 0


def _plot(X: np.ndarray, result: object, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = np.linspace(X.min(), X.max(), 400)[:, None]
    mean, var = result.model.predict_f(grid)
    mean, sd = mean.numpy()[:, 0], np.sqrt(np.maximum(var.numpy()[:, 0], 0))
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(X[:, 0], result.W[:, 0], "o", ms=3, label="released W")
    ax.plot(grid[:, 0], mean, "k-", label="released mean (eq. 3)")
    ax.fill_between(grid[:, 0], mean - 2 * sd, mean + 2 * sd, color="g", alpha=0.2, label="±2σ (eq. 4)")
    ax.plot(result.sensitive[:, 0], np.full(result.sensitive.shape[0], ax.get_ylim()[0]), "r|", ms=12,
            label="sensitive")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
