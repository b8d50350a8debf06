"""``gpflow-fed privacy``: privacy-aware release of a GP regression model (Tuo & Bhattacharya).

Reads a CSV (input columns and one output column), fits a GP by maximum likelihood (constant mean), computes
the minimum-trace synthetic-noise covariance Σ for the sensitive points or intervals, obfuscates the outputs
with noise drawn from the operating system's randomness (so nobody can regenerate and subtract it; there is
deliberately no seed), and writes ``released.csv`` (inputs and obfuscated outputs), ``model.npz`` (the released
:class:`~gpflow_fed.models.PrivacyAwareGPR`, no raw outputs inside) and ``privacy.png`` (raw vs released
posterior, 1-D inputs) into ``--out``.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path
from typing import List

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
    p.add_argument("csv", type=Path, help="input CSV (a first row with a non-number is the header; without one, "
                   "columns are named 1, 2, …)")
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
    p.add_argument("--noise-variance", type=float, default=None, help="fix σ² of V (default: estimate it)")
    p.add_argument("--out", type=Path, default=Path("privacy_release"), help="output directory (created if absent)")
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
            raise ValueError(f"column {name!r} not in {path} (columns: {', '.join(header)}"
                             f"{'' if has_header else '; no header row, so columns are numbered from 1'})")
    index = [header.index(n) for n in x_names + [y_name]]
    table = np.empty((len(data), len(index)))
    for i, (line, row) in enumerate(data):
        if len(row) != len(header):
            raise ValueError(f"{path}, line {line}: {len(row)} cells, expected {len(header)}")
        for j, col in enumerate(index):
            try:
                table[i, j] = float(row[col])
            except ValueError:
                raise ValueError(f"{path}, line {line}, column {header[col]!r}: {row[col]!r} is not a "
                                 "number") from None
            if not np.isfinite(table[i, j]):
                raise ValueError(f"{path}, line {line}, column {header[col]!r}: {row[col]!r} is not finite; "
                                 "remove or impute the row")
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
        raise ValueError(f"--out {out} already holds a release ({', '.join(previous)}); a second release of the same "
                         "data with fresh noise can be averaged with the first, so choose a new directory (or delete "
                         "the old release if it was never published)")


def run(args: argparse.Namespace) -> int:
    """Run the release and write its three outputs."""
    from ..models.privacy_aware_gpr import release
    from ..privacy import ProportionalKernel, RegionUnion, Interval

    import gpflow

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
    result = release((X, Y), sensitive, tolerance, kernel=kernel, method=args.method,
                     noise_variance=args.noise_variance, density=args.density)
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
