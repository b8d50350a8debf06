"""``gpflow-fed privacy``: privacy-aware release of a GP regression model (Tuo & Bhattacharya).

Reads a CSV (``--csv FILE --target COL [--features COL ...]``), designs the minimum-trace synthetic-noise
covariance Σ for the sensitive points or intervals from PUBLIC hyperparameters, obfuscates the target with noise
drawn from the operating system's randomness (so nobody can regenerate and subtract it; there is deliberately
no seed), and writes ``released.csv`` (features and obfuscated target), ``model.npz`` (the released
:class:`~gpflow_fed.models.PrivacyAwareGPR`) and ``privacy.png`` (the released posterior, 1-D inputs) into
``--out``: everything there, and everything printed, is computed from W and public inputs only, so it is safe
to publish. For the data owner only (it shows the raw data), ``privacy-raw-vs-released.png`` and TensorBoard
scalars go to ``--logdir``.

Σ is low rank, so W gives the raw target back up to a few numbers, and any statistic of the raw target published
beside W (hyperparameters or a mean fitted on it) solves for them. The hyperparameters that design Σ are
therefore public inputs: ``--lengthscale``, ``--variance`` and ``--noise-variance`` as numbers you may publish,
or ``--public-csv FILE`` (public data, or rows disjoint from the released ones, with the same columns) to fit
them on. The released mean is ``--mean`` or its maximum-likelihood value given W; ``--refit`` refits the kernel
on the released W (post-processing, kept within the tolerance). The target is never standardised.

An attacker can fit the lengthscale on W itself, so Σ is solved over a public range of lengthscales (by default
within ×2 of the design's; ``--lengthscale-range LO:HI`` replaces it, ``--design-theta-only`` turns it off), and
before anything is written the floor is checked under the lengthscale refitted on W: where it fails, noise is added
to W (post-processing, at most 4 steps), else nothing is written and the command names the point.

A target recorded on a grid (a CSV with 2 decimals) would be given back exactly by enumerating grid values, so W also
gets full-rank noise of the target's recording resolution (detected from the target, or ``--resolution R``; the
resolution is published, a fact about how the target is recorded); ``--resolution 0`` turns it off only with
``--confirm-no-resolution``.
"""

from __future__ import annotations

import argparse
import collections
import csv
import json
import math
import os
import sys
import unicodedata
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

if TYPE_CHECKING:
    import numpy as np


MAXITER = 1000
QUICK_MAXITER = 20
#: the stages the progress bar counts
STAGES = ("Σ and noise", "write the release", "plots and TensorBoard")
#: first characters that make a spreadsheet evaluate a cell as a formula (CSV/formula injection); a column
#: name starting with one (after the surrounding whitespace that names lose) is refused, since ``released.csv``
#: repeats the header.
FORMULA_PREFIXES = ("=", "+", "-", "@")
OUTPUTS = ("released.csv", "model.npz", "privacy.png")


def _floats(text: str) -> List[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values or not all(math.isfinite(v) for v in values):
        raise argparse.ArgumentTypeError(f"expected one or more finite comma-separated numbers, got {text!r}")
    return values


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
    data = p.add_argument_group("data (required: --csv, --target)")
    data.add_argument(
        "--csv",
        type=Path,
        default=None,
        metavar="FILE",
        help="input CSV (its first row names the columns, or is data: see --header; without a header, columns "
        "are named 1, 2, …)",
    )
    data.add_argument(
        "--header",
        choices=("auto", "yes", "no"),
        default="auto",
        help="whether the first row of --csv (and --public-csv) names the columns: yes, no, or auto (default: a "
        "row of numbers only is data, a row of text only is the header, a row mixing both is refused); a header "
        "cell that is a number is refused",
    )
    data.add_argument("--target", default=None, metavar="COL", help="the output column, obfuscated in the release")
    data.add_argument(
        "--features", nargs="+", default=None, metavar="COL", help="input columns (default: every column but --target)"
    )
    what = p.add_argument_group("what to protect (required: one of --sensitive/--interval, one of --tolerance/--alpha)")
    what.add_argument("--sensitive", type=_floats, default=None, help="sensitive points (1-D inputs), e.g. 0.4,0.6")
    what.add_argument(
        "--interval",
        type=_interval,
        action="append",
        default=None,
        help="a sensitive interval LOW:HIGH (1-D inputs; repeatable; needs --alpha), discretised at --density "
        "(eq. 12–13, on a well-conditioned subset of the grid)",
    )
    what.add_argument("--density", type=float, default=None, help="grid points per unit length for intervals (20)")
    what.add_argument("--tolerance", type=float, default=None, help="variance tolerance ξ at each sensitive point")
    what.add_argument(
        "--alpha", type=float, default=None, help="kernel tolerance H = αK, 0 < α < 1 (larger hides more)"
    )
    what.add_argument("--method", choices=("strong", "weak", "diagonal"), default="strong")
    what.add_argument(
        "--protect",
        choices=("records", "latent"),
        default="records",
        help="records (default): at a sensitive input that is a row of the CSV, the recorded target value "
        "itself, Var[Y | W] ≥ ξ (feasible for ξ < variance + noise variance); latent: the paper's floor on f",
    )
    what.add_argument(
        "--solver",
        choices=("krylov", "dense"),
        default=None,
        help="weak method: certified Krylov reduction (default) or the dense N×N SDP (small N)",
    )
    design = p.add_argument_group(
        "public hyperparameters that design Σ (required: --lengthscale, --variance and --noise-variance, or "
        "--public-csv); never fitted on the released target"
    )
    design.add_argument("--lengthscale", type=float, default=None, help="SE kernel lengthscale (public value)")
    design.add_argument("--variance", type=float, default=None, help="SE kernel variance (public value)")
    design.add_argument(
        "--noise-variance", type=float, default=None, help="σ² of V (public value; 0 for deterministic data)"
    )
    design.add_argument(
        "--lengthscale-range",
        type=_interval,
        default=None,
        metavar="LO:HI",
        help="the public range of lengthscales over which the floor must hold too (against a lengthscale fitted on "
        "the release itself), replacing the default (within ×2 of the design lengthscale): Σ is accumulated over 3 "
        "geometric grid values and the design",
    )
    design.add_argument(
        "--design-theta-only",
        action="store_true",
        help="turn the default θ range off: Σ for the design hyperparameters alone (the paper's setting; a "
        "lengthscale fitted on the release then often predicts the protected values better than the tolerance)",
    )
    design.add_argument(
        "--public-csv",
        type=Path,
        default=None,
        metavar="FILE",
        help="public data, or rows not in the release, with the same columns: fit the kernel (and σ² unless "
        "--noise-variance is given) on it by maximum likelihood",
    )
    what.add_argument(
        "--resolution",
        type=float,
        default=None,
        metavar="R",
        help="the target's recording resolution (e.g. 0.01 for 2 decimals, 0.3334 for thirds): W gets noise "
        "of sd R in every row, so that the grid does not give the target back (default: the coarsest decimal grid "
        "a group of the target's values shares; a value below the detected one is raised to it; 0 needs "
        "--confirm-no-resolution)",
    )
    post = p.add_argument_group("post-processing of the released W")
    post.add_argument("--mean", type=float, default=None, help="the released constant mean (default: estimated from W)")
    post.add_argument(
        "--refit",
        action="store_true",
        help="refit the kernel (and the mean unless --mean) on the released W, kept within the tolerance",
    )
    confirm = p.add_argument_group("the owner's confirmations and record")
    confirm.add_argument(
        "--confirm-unprotected",
        action="store_true",
        help="write a release whose Σ is zero or leaves a protected record unchanged (it is not privacy-aware)",
    )
    confirm.add_argument(
        "--confirm-no-resolution",
        action="store_true",
        help="write a release with --resolution 0 (no resolution noise): a target recorded on a grid is then given "
        "back exactly by enumerating grid values",
    )
    confirm.add_argument(
        "--confirm-new-audience",
        action="store_true",
        help="release records released before although the earlier release already breaks this release's floor (a "
        "higher tolerance, a new sensitive input): its audience must not hold the earlier release",
    )
    confirm.add_argument(
        "--confirm-public",
        action="store_true",
        help="publish --mean although, taken as the target's own mean, it would let a reader predict a protected "
        "target below the tolerance, or --variance although it lies within 0.1 sd (of what the release noise "
        "leaves unknown) of the target's own sample variance",
    )
    confirm.add_argument(
        "--ledger",
        type=Path,
        default=None,
        metavar="DIR",
        help="the owner's private record of releases (0700; default $GPFLOW_FED_PRIVACY_LEDGER or "
        "~/.local/share/gpflow-fed/privacy-ledger): rows released before give W₂ = W₁ + Δ, never fresh noise",
    )
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
        help=f"L-BFGS iterations of the --public-csv and --refit fits (default {MAXITER}; --quick {QUICK_MAXITER})",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--quick", action="store_true", help="short --public-csv / --refit fits, for a smoke test")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(func=run, check=check)


def _warn(message: str) -> None:
    print(f"gpflow-fed privacy: warning: {message}", file=sys.stderr)


def _missing(args: argparse.Namespace) -> List[str]:
    """Every required option that is absent, as the usage names it."""
    missing = []
    if args.csv is None:
        missing.append("--csv FILE")
    if args.target is None:
        missing.append("--target COL")
    if args.sensitive is None and args.interval is None:
        missing.append("--sensitive S[,S...] or --interval LOW:HIGH")
    if args.tolerance is None and args.alpha is None:
        missing.append("--tolerance XI or --alpha A")
    if args.public_csv is None:
        absent = [
            f"--{n.replace('_', '-')}"
            for n in ("lengthscale", "variance", "noise_variance")
            if getattr(args, n) is None
        ]
        if absent:
            missing.append(f"{' '.join(absent)} (public hyperparameters) or --public-csv FILE")
    return missing


def _check_numbers(args: argparse.Namespace) -> None:
    checks: List[Tuple[str, Any, Callable[[float], bool], str]] = [
        ("--lengthscale", args.lengthscale, lambda v: v > 0, "> 0"),
        ("--variance", args.variance, lambda v: v > 0, "> 0"),
        ("--noise-variance", args.noise_variance, lambda v: v >= 0, "≥ 0"),
        ("--tolerance", args.tolerance, lambda v: v >= 0, "≥ 0"),
        ("--alpha", args.alpha, lambda v: 0 < v < 1, "in (0, 1)"),
        ("--density", args.density, lambda v: v > 0, "> 0"),
        (
            "--lengthscale-range",
            None if args.lengthscale_range is None else args.lengthscale_range[0],
            lambda v: v > 0,
            "> 0 (LO)",
        ),
        ("--mean", args.mean, lambda v: True, "finite"),
        ("--resolution", args.resolution, lambda v: v >= 0, "≥ 0"),
        ("--maxiter", args.maxiter, lambda v: v >= 1, "at least 1"),
    ]
    for name, value, ok, rule in checks:
        if value is not None and not (math.isfinite(value) and ok(value)):
            raise ValueError(f"{name} must be a finite number {rule}, got {value}")


def check(args: argparse.Namespace) -> None:
    """Validate the options and read the CSV(s), before TensorFlow is imported; one ``ValueError`` per problem."""

    from ..validation import public_inputs_on_released

    missing = _missing(args)
    if missing:
        raise ValueError(f"missing required options: {'; '.join(missing)}")
    if args.sensitive is not None and args.interval is not None:
        raise ValueError("give sensitive points with --sensitive or intervals with --interval, not both")
    if args.tolerance is not None and args.alpha is not None:
        raise ValueError("give exactly one of --tolerance (a variance) or --alpha (H = αK)")
    if args.interval is not None and args.alpha is None:
        raise ValueError("a sensitive interval needs a kernel tolerance: use --alpha (H = αK) instead of --tolerance")
    if args.density is not None and args.interval is None:
        raise ValueError("--density applies to --interval only; drop it")
    if args.public_csv is not None and (args.lengthscale is not None or args.variance is not None):
        raise ValueError("--public-csv fits the kernel; drop --lengthscale/--variance (or drop --public-csv)")
    if (args.maxiter is not None or args.quick) and args.public_csv is None and not args.refit:
        raise ValueError("--maxiter and --quick apply to a fit (--public-csv or --refit); drop them")
    if args.design_theta_only and args.lengthscale_range is not None:
        raise ValueError("give --lengthscale-range (a range) or --design-theta-only (no range), not both")
    _check_numbers(args)
    _folders(args)
    _check_out(args.out)
    header = getattr(args, "header", "auto")
    args.table = _read_csv(args.csv, args.features, args.target, header)
    if args.public_csv is not None:
        args.public_table = _read_csv(args.public_csv, args.table[2][:-1], args.table[2][-1], header)
        on_released = public_inputs_on_released(args.public_table[0], args.table[0])
        if on_released:
            raise ValueError(
                f"--public-csv {args.public_csv} has {on_released} input(s) on inputs of --csv: their outputs carry "
                "the released outputs, and hyperparameters fitted on them let anyone holding the release recover "
                "them; use public data at other inputs"
            )
    if args.table[0].shape[1] != 1:
        raise ValueError(f"the CLI handles 1-D inputs (got {args.table[0].shape[1]} features); use the Python API")


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def _check_header(path: Path, header: List[str]) -> None:
    """Refuse empty and duplicate column names (which one would be meant?), names with control characters (echoed
    in errors and in ``released.csv``'s header, an ANSI sequence would drive the terminal) and names a spreadsheet
    would run as formulas.

    Linear in the number of columns (a count per name): ``header.count`` per name took 63 s at 60,000 columns.
    """
    if any(not h for h in header):
        raise ValueError(f"{path}: column {header.index('') + 1} of the header has no name; name every column")
    control = [j + 1 for j, h in enumerate(header) if any(unicodedata.category(c).startswith("C") for c in h)]
    if control:
        raise ValueError(
            f"{path}: the names of columns {control} of the header hold control or format characters (not shown); "
            "rename them"
        )
    duplicates = sorted(h for h, count in collections.Counter(header).items() if count > 1)
    if duplicates:
        raise ValueError(f"{path} has duplicate column names {duplicates}; rename them so that each is unique")
    formulas = [h for h in header if h.startswith(FORMULA_PREFIXES)]
    if formulas:
        raise ValueError(
            f"{path}: column names {formulas} start with one of = + - @, which spreadsheets run as a formula when "
            "released.csv is opened; rename them"
        )


def _looks_numeric(cell: str) -> bool:
    """A cell that is, or reads as, a number: ``float`` parses it, or it holds a digit and no letter (``−0.3``
    with a Unicode minus, ``1,234``, ``12 %``): such a cell is never taken for a column name."""
    if _is_number(cell):
        return True
    if cell.strip().startswith(FORMULA_PREFIXES):  # a formula-like name: refused as such by _check_header
        return False
    return any(c.isdigit() for c in cell) and not any(unicodedata.category(c).startswith("L") for c in cell)


def _first_row_is_header(path: Path, first_row: List[str], header: str) -> bool:
    """Whether the first row names the columns (``--header``), refusing a header cell that is a number.

    A header is echoed in errors and repeated in ``released.csv``: a data record taken for a header would publish
    its values (the target's included). So with ``auto`` a row of numbers only is data, a row of text only is the
    header, and a row mixing both is refused; with ``yes`` a cell that is a number is refused; the refusals name
    the columns by position, never the cells.
    """
    numeric = [j + 1 for j, cell in enumerate(first_row) if _looks_numeric(cell)]
    if header == "no":
        return False
    if header == "auto":
        if len(numeric) == len(first_row):
            return False
        if numeric:
            raise ValueError(
                f"{path}: the first row mixes numbers (columns {numeric}) and text, so it is neither clearly a header "
                "nor clearly data: pass --header yes (then name every column) or --header no"
            )
        return True
    if numeric:
        raise ValueError(
            f"{path}: with --header yes, the header's columns {numeric} are numbers, which look like a data record; "
            "name those columns, or pass --header no if the first row is data"
        )
    return True


def _read_csv(
    path: Path, features: Optional[List[str]], target: str, header_choice: str = "auto"
) -> "tuple[np.ndarray, np.ndarray, list]":
    """Features, target and column names ``features + [target]`` from a CSV with or without a header row.

    ``header_choice`` (``--header``): whether the first row names the columns (:func:`_first_row_is_header`);
    without a header, columns are named by their 1-based position (``--target 2``). Every value must be a finite
    number.
    """
    import numpy as np

    if not path.is_file():
        raise ValueError(f"CSV file {path} not found")
    try:
        # UTF-8, with or without the byte-order mark spreadsheets write (it would be a format character of the
        # first column's name)
        with open(path, newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh)
            numbered = [(reader.line_num, r) for r in reader if any(c.strip() for c in r)]
    except csv.Error as exc:  # e.g. a field beyond the csv module's limit: no value of the file in the message
        raise ValueError(f"{path} is not a CSV this command reads ({exc})") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not UTF-8 text: save the CSV as UTF-8") from None
    if not numbered:
        raise ValueError(f"{path} is empty")
    first_row = numbered[0][1]
    has_header = _first_row_is_header(path, first_row, header_choice)
    header = [h.strip() for h in first_row] if has_header else [str(j + 1) for j in range(len(first_row))]
    _check_header(path, header)
    data = numbered[1:] if has_header else numbered
    if len(data) < 2:
        raise ValueError(f"{path} needs at least 2 data rows, got {len(data)}")
    y_name = target
    x_names = list(features) if features else [h for h in header if h != y_name]
    position = {h: j for j, h in enumerate(header)}  # names are unique (_check_header): one dict, linear lookups
    for name in x_names + [y_name]:
        if name not in position:
            raise ValueError(
                f"column {name!r} not in {path} (columns: {', '.join(header)}"
                f"{'' if has_header else '; no header row, so columns are numbered from 1'})"
            )
    if y_name in x_names:
        raise ValueError(
            f"the target {y_name!r} is also a feature; features are released verbatim, so this would publish "
            "the raw target: drop it from --features"
        )
    if len(set(x_names)) != len(x_names):
        raise ValueError(f"--features names a column twice ({', '.join(x_names)})")
    index = [position[n] for n in x_names + [y_name]]
    table = np.empty((len(data), len(index)))
    for i, (line, row) in enumerate(data):
        if len(row) != len(header):
            raise ValueError(f"{path}, line {line}: {len(row)} cells, expected {len(header)}")
        for j, col in enumerate(index):
            # a feature cell is quoted (features are published anyway); a target cell is private, so it is not
            cell = f"{row[col]!r}" if j < len(x_names) else "the target's cell"
            try:
                table[i, j] = float(row[col])
            except ValueError:
                raise ValueError(f"{path}, line {line}, column {header[col]!r}: {cell} is not a number") from None
            if not np.isfinite(table[i, j]):
                raise ValueError(
                    f"{path}, line {line}, column {header[col]!r}: {cell} is not finite; remove or impute the row"
                )
    return table[:, :-1], table[:, -1:], x_names + [y_name]


def _check_out(out: Path) -> None:
    """``--out`` must be a directory (or absent) without a previous release in it.

    An existing release is never overwritten (it may have been published); a later release of the same rows is
    computed from the earlier one through the owner's ledger (``--ledger``), since two releases with independent
    noise give the target back exactly.
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


def _folders(args: argparse.Namespace, default_ledger: Optional[Path] = None) -> None:
    """``--out`` as an absolute path, and ``--logdir`` by default its sibling ``<out>_owner`` (``--out .`` names the
    current folder: its sibling is ``<folder>_owner``, not ``_owner`` of an empty name).

    ``--logdir`` (the raw-vs-released plot) and ``--ledger`` (without it, ``default_ledger``: the default ledger
    folder, which ``$GPFLOW_FED_PRIVACY_LEDGER`` may name) equal to or inside ``--out`` are refused before anything
    is written (issue 44, a twentieth attacker: ``--logdir`` equal to ``--out`` put the raw data's plot in the folder
    the CLI calls safe to publish)."""
    args.out = Path(os.path.abspath(args.out))
    if args.logdir is None:
        if not args.out.name:
            raise ValueError(f"--out {args.out} has no name to derive the default --logdir <out>_owner; give --logdir")
        args.logdir = args.out.with_name(args.out.name + "_owner")
    owner = [("--logdir", Path(args.logdir), "the raw data's plot")]
    if getattr(args, "ledger", None) is not None:
        owner.append(("--ledger", Path(args.ledger), "the owner's record of releases"))
    elif default_ledger is not None:
        owner.append(("the default ledger folder", default_ledger, "the owner's record of releases"))
    for option, folder, what in owner:
        if _inside(folder, args.out):
            raise ValueError(
                f"{option} {folder} is --out {args.out} or inside it: --out is the folder safe to publish, and "
                f"{option} holds owner-only outputs ({what}); name a folder outside --out"
            )


def _inside(folder: Path, out: Path) -> bool:
    """Whether ``folder`` is ``out`` or below it, as written (made absolute) or with symbolic links resolved."""
    for a, b in ((os.path.abspath(folder), os.path.abspath(out)), (os.path.realpath(folder), os.path.realpath(out))):
        if Path(a) == Path(b) or Path(b) in Path(a).parents:
            return True
    return False


def _make_folders(folders: List[Path]) -> List[Path]:
    """Create ``folders`` (and their missing parents); return every folder created, in order.

    Called before anything is released or recorded (issue 44: ``--out`` below a regular file, or ``--logdir`` an
    existing file, was refused only after the ledger entry, or the release too, had been written). When one cannot be
    made, the ones made are removed and the ``OSError`` is raised (one line, exit 2, nothing written).
    """
    created: List[Path] = []
    try:
        for folder in folders:
            missing = [p for p in [folder, *folder.parents] if not p.exists()]
            folder.mkdir(parents=True, exist_ok=True)
            created += [p for p in reversed(missing) if p not in created]
    except OSError:
        _remove_folders(created)
        raise
    return created


def _remove_folders(created: List[Path]) -> None:
    """Remove the folders :func:`_make_folders` created (last first), each only if still empty."""
    for folder in reversed(created):
        try:
            folder.rmdir()
        except OSError:
            pass


def run(args: argparse.Namespace) -> int:
    """Run the release (options already validated by :func:`check`) and write its outputs."""
    import gpflow
    import numpy as np

    from ..progress import tqdm
    from ..release import Interval, ProportionalKernel, RegionUnion

    if not hasattr(args, "table"):  # called directly rather than through ``gpflow-fed``
        check(args)
    X, Y, names = args.table
    if args.interval is not None:
        sensitive: Any = RegionUnion(*[Interval(lo, hi) for lo, hi in args.interval])
    else:
        sensitive = np.asarray(args.sensitive, dtype=float)[:, None]
    if args.public_csv is None:
        kernel = gpflow.kernels.SquaredExponential(variance=args.variance, lengthscales=args.lengthscale)
    else:
        # a starting point from public information only: the features' spread and the public target's variance
        Xp, Yp, _ = args.public_table
        kernel = gpflow.kernels.SquaredExponential(
            variance=float(np.var(Yp)) or 1.0, lengthscales=float(np.std(Xp)) or 1.0
        )
    tolerance = ProportionalKernel(kernel, args.alpha) if args.alpha is not None else args.tolerance
    if args.public_csv is None:  # the release checks it too (issue 44); here the message names the column
        from ..models.privacy_aware_gpr import region_density
        from ..release.precision import check_input_precision, range_kernels, region_corners
        from ..release.regions import check_region_size

        if args.interval is not None:  # a region too wide to design: that refusal (narrow it) comes first
            density = region_density(kernel) if args.density is None else float(args.density)
            check_region_size(sensitive.grid_size(density), density)
        points = region_corners(sensitive) if args.interval is not None else sensitive
        kernels = range_kernels(kernel, _theta_range(args), 3)
        check_input_precision(kernels, X, [points], noise_variance=args.noise_variance, names=names[:-1])
    with tqdm(total=len(STAGES), desc="privacy", disable=args.json or args.no_progress) as bar:
        bar.set_postfix_str(STAGES[0])
        return _release(args, X, Y, names, sensitive, tolerance, kernel, bar)


def _release(
    args: argparse.Namespace,
    X: "np.ndarray",
    Y: "np.ndarray",
    names: List[str],
    sensitive: Any,
    tolerance: Any,
    kernel: Any,
    bar: Any,
) -> int:
    """Compute Σ, obfuscate, write the release and the owner's outputs, ticking ``bar`` per stage.

    Every number printed, saved in ``--out`` or written to TensorBoard comes from the released model (X, W, Σ,
    the public hyperparameters); the raw target only reaches W and the owner's raw-vs-released plot.

    Everything that can refuse comes first (issue 44): the release (its ledger entry held back), the predictions of
    both plots (:meth:`~gpflow_fed.models.PrivacyAwareGPR.predict_f` refuses predictions with no correct digit), the
    figures and ``model.npz`` rendered in memory; only then is the release recorded in the ledger and written. A
    refusal leaves ``--out``, ``--logdir`` and the ledger's entries as they were (a first use may have created the
    ledger's key, which the release's row hashes need). Both folders are made first, before the ledger is opened: one
    that cannot be made (a file in the way) is refused with nothing written, and folders made for a release that is
    then refused are removed.
    """
    import tempfile

    import numpy as np

    maxiter = args.maxiter if args.maxiter is not None else QUICK_MAXITER if args.quick else MAXITER
    from ..release.ledger import default_ledger_folder

    _folders(args, default_ledger_folder())  # idempotent (check() made them absolute), and the default ledger checked
    created = _make_folders([args.out, args.logdir])  # before the ledger and the release: a folder refused first
    try:
        ledger = _deferred_ledger(args.ledger)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", UserWarning)
            result = _call_release(args, X, Y, sensitive, tolerance, kernel, maxiter, ledger)
        for warning in caught:  # e.g. --refit kept within the tolerance: one line each, like the errors
            _warn(str(warning.message))
        _advance(bar, 1)
        released_png = _plot(X, None, result, names)
        comparison_png = _plot(X, Y, result, names)
        with tempfile.TemporaryDirectory() as scratch:
            model_npz = result.model.save(Path(scratch) / "model.npz").read_bytes()
    except BaseException:  # a refusal leaves no folder behind that this run made
        _remove_folders(created)
        raise
    ledger.commit()  # recorded before anything is written: a release on disk is always counted
    with open(args.out / "released.csv", "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(names)
        writer.writerows(np.concatenate([X, result.W], axis=1).tolist())
    (args.out / "model.npz").write_bytes(model_npz)
    (args.out / "privacy.png").write_bytes(released_png)
    _advance(bar, 2)
    comparison = args.logdir / "privacy-raw-vs-released.png"
    comparison.write_bytes(comparison_png)
    summary = {
        "released_points": int(X.shape[0]),
        "sensitive_points": int(result.sensitive.shape[0]),
        "trace_sigma": float(np.trace(np.asarray(result.Sigma))),
        "min_sensitive_variance": float(np.min(result.variance)),
        "min_tolerance": float(np.min(result.tolerance)),
        "protected_records": int(result.targets.num_records),
        "unchanged_rows": int(result.unchanged_rows),
        "rank_sigma": int(result.rank),
        "later_release": int(result.earlier is not None),
        "refit_check_steps": int(result.refit_check.steps),
        "refit_check_added_trace": float(result.refit_check.added_trace),
        "refit_check_noise_variance": float(result.refit_check.noise_variance),
        "resolution": float(result.resolution),
    }
    certificate = result.certificate  # of the design θ's Σ (the θ range and the refit check add to it)
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
    refitted = {path.lstrip("."): np.asarray(v).tolist() for path, v in result.refit_check.theta.items()}
    if args.json:
        extra = {"theta_range": result.theta_range, "refit_check_theta": refitted}
        print(
            json.dumps(
                {**summary, **extra, "released": written, "logdir": str(args.logdir), "plot": str(comparison)},
                indent=2,
            )
        )
        return 0
    quantity = (
        f"of the protected values ({result.targets.num_records} records Y, f at the other sensitive inputs)"
        if result.protect == "records"
        else "of f at the sensitive inputs (protect=latent: the records themselves are not floored)"
    )
    print(
        f"released {X.shape[0]} points, {result.sensitive.shape[0]} sensitive; tr Σ = {summary['trace_sigma']:.6g}; "
        f"min predictive variance {quantity} = {summary['min_sensitive_variance']:.6g} "
        f"(tolerance {summary['min_tolerance']:.6g}); rank Σ = {result.rank}: W − Y lies in range(Σ), so "
        f"{result.rank} independent facts about the target give it back"
    )
    steps = result.refit_check.steps
    added = (
        "it held"
        if not steps
        else f"it held after {steps} post-processing noise step(s) added to W (tr {result.refit_check.added_trace:.4g})"
    )
    theta = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in refitted.items())
    theta += f", σ²={result.refit_check.noise_variance:.4g}"
    print(f"θ range: {result.theta_range}; the floor checked under the θ refitted on the released W ({theta}): {added}")
    if result.resolution > 0:
        how = "declared" if result.resolution_declared else "detected"
        print(
            f"resolution noise: sd {result.resolution:.6g} in every row ({how} recording resolution of the target, "
            "published); the model's noise variance is σ² + resolution²"
        )
    elif args.resolution == 0:
        print("no resolution noise (--resolution 0, confirmed): a target recorded on a grid is not protected")
    if result.earlier is not None:
        print(
            f"a later release of rows released before ({result.earlier}): W = W₁ + Δ, computed from the earlier "
            "release (holders of both have the earlier release's floor)"
        )
    if result.unchanged_rows:
        print(
            f"{result.unchanged_rows} of {X.shape[0]} rows are released unchanged (W = Y there, noise variance ≤ "
            "1e-12 of the prior)"
        )
    if certificate is not None:
        print(
            f"certificate of the design θ's Σ: tr = {certificate.objective:.10g} ≥ optimum ≥ "
            f"{certificate.lower_bound:.10g} "
            f"(relative gap {certificate.relative_gap:.1e}); min (Var − ξ) at sensitive inputs = "
            f"{certificate.feasibility_margin:.2e}; Krylov dimension {certificate.krylov_dimension}"
        )
    if result.unchanged_rows == X.shape[0]:
        print(f"wrote {', '.join(written)}: NOT privacy-aware, W = Y (confirmed by --confirm-unprotected)")
    else:
        print(f"wrote {', '.join(written)} (safe to publish)")
    print(f"owner only (shows raw data): {comparison}; TensorBoard: tensorboard --logdir {args.logdir}")
    return 0


def _call_release(
    args: argparse.Namespace,
    X: "np.ndarray",
    Y: "np.ndarray",
    sensitive: Any,
    tolerance: Any,
    kernel: Any,
    maxiter: int,
    ledger: Any,
) -> Any:
    """:func:`~gpflow_fed.models.release` with the command's options (public design, post-processing)."""
    from ..models.privacy_aware_gpr import release

    return release(
        (X, Y),
        sensitive,
        tolerance,
        kernel=kernel,
        noise_variance=args.noise_variance,
        mean=args.mean,
        public_data=args.public_table[:2] if args.public_csv is not None else None,
        refit=args.refit,
        method=args.method,
        protect=args.protect,
        ledger=ledger,
        confirm_unprotected=args.confirm_unprotected,
        confirm_public=args.confirm_public,
        confirm_new_audience=args.confirm_new_audience,
        resolution=args.resolution,
        confirm_no_resolution=args.confirm_no_resolution,
        theta_range=_theta_range(args),
        maxiter=maxiter,
        density=args.density,
        solver=args.solver,
    )


def _theta_range(args: argparse.Namespace) -> Any:
    """The public θ range of the command's options (``theta_range`` of :func:`~gpflow_fed.models.release`)."""
    if args.design_theta_only:
        return "design"
    return "default" if args.lengthscale_range is None else {"lengthscales": args.lengthscale_range}


def _deferred_ledger(folder: Optional[Path]) -> Any:
    """The owner's :class:`~gpflow_fed.release.ReleaseLedger` in ``folder`` (None: the default folder), its entry
    held back until ``commit()``: the CLI records a release only once everything that can refuse is computed."""
    from ..release.ledger import ReleaseLedger, default_ledger_folder

    class DeferredLedger(ReleaseLedger):
        pending: Optional[Tuple[Tuple[Any, ...], Dict[str, Any]]] = None

        def record(self, *args: Any, **kwargs: Any) -> str:
            """Hold the entry back (``commit`` writes it)."""
            self.pending = (args, kwargs)
            return "(not yet recorded)"

        def commit(self) -> Optional[str]:
            """Write the held-back entry, if any; returns its name."""
            if self.pending is None:
                return None
            args, kwargs = self.pending
            self.pending = None
            return ReleaseLedger.record(self, *args, **kwargs)

    return DeferredLedger(default_ledger_folder() if folder is None else folder)


def _advance(bar: Any, stage: int) -> None:
    """Count one finished stage and name the next."""
    bar.update(1)
    bar.set_postfix_str(STAGES[stage])


def _plot(X: "np.ndarray", Y: "np.ndarray | None", result: Any, names: List[str]) -> bytes:
    """The released posterior (and, given the raw ``Y``, the raw-data posterior with the same hyperparameters) as
    PNG bytes, computed before anything is written (its predictions may refuse)."""
    import io

    import numpy as np

    from ..models import PrivacyAwareGPR
    from ..plotting import figure

    grid = np.linspace(X.min(), X.max(), 400)[:, None]
    fig = figure(figsize=(7, 3.8))
    ax = fig.subplots()
    curves: List[Tuple[str, Any, str, Optional[str]]] = [("released", result.model, "k", "C1")]
    if Y is not None:
        ax.plot(X[:, 0], Y[:, 0], ".", color="0.5", ms=4, label="raw data (owner only)")
        # the raw data under the released hyperparameters (Σ = 0; a 1e-10 relative jitter when σ² = 0)
        jitter = 1e-10 * float(np.max(result.model.kernel(X, full_cov=False).numpy()))
        raw = PrivacyAwareGPR(
            (X, Y),
            result.model.kernel,
            np.zeros((X.shape[0], X.shape[0])),
            result.model.mean_function,
            noise_variance=result.noise_variance + jitter,
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
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    return png.getvalue()
