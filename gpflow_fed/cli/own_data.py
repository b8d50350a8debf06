"""``--csv FILE --party-column COL --target COL [--features COL ...]``: the options every training subcommand
shares to run on your own table (see :func:`gpflow_fed.data.federated_from_table`)."""

from __future__ import annotations

import argparse
from typing import Any, Optional


def add_own_data_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``your own data`` option group (no TensorFlow imported)."""
    group = parser.add_argument_group(
        "your own data", "one CSV with a header row and a column naming each row's party (one client per party)"
    )
    group.add_argument("--csv", default=None, metavar="FILE", help="the CSV file (replaces --dataset)")
    group.add_argument("--party-column", default=None, metavar="COL", help="the column naming each row's party")
    group.add_argument("--target", default=None, metavar="COL", help="the output column")
    group.add_argument(
        "--features",
        nargs="+",
        default=None,
        metavar="COL",
        help="input columns (default: every column but the party column and the target)",
    )


def check_own_data_arguments(args: argparse.Namespace) -> None:
    """``--csv`` needs ``--party-column`` and ``--target``, and they mean nothing without it."""
    extra = [f"--{k.replace('_', '-')}" for k in ("party_column", "target", "features") if getattr(args, k, None)]
    if args.csv is None and extra:
        raise ValueError(f"{', '.join(extra)} only apply to --csv FILE; add --csv or drop them")
    if args.csv is not None and (args.party_column is None or args.target is None):
        raise ValueError("--csv needs --party-column COL (who holds each row) and --target COL (the output)")


def own_dataset(args: argparse.Namespace, test_fraction: float, seed: int) -> Optional[Any]:
    """The :class:`~gpflow_fed.data.FederatedDataset` of ``--csv`` (raw units), or ``None`` without ``--csv``."""
    check_own_data_arguments(args)
    if args.csv is None:
        return None
    from ..data import federated_from_table

    return federated_from_table(
        args.csv, party_column=args.party_column, target=args.target, features=args.features,
        test_fraction=test_fraction, seed=seed,
    )  # fmt: skip
