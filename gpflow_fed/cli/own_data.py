"""``--csv FILE --party-column COL --target COL [--features COL ...]``: the options every command that trains on
your own table shares (see :func:`gpflow_fed.data.federated_from_table`).

:func:`check_own_data_arguments` runs before TensorFlow is imported: it checks the options together (every
missing one named at once), refuses the options ``--csv`` makes meaningless, and reads and checks the table
(:func:`gpflow_fed.data.split_table`, numpy only), so a wrong column or an empty cell is reported in a fraction
of a second.
"""

from __future__ import annotations

import argparse
from typing import Any, Mapping, Optional

from .options import refuse_ignored

OWN = ("party_column", "target", "features")
#: how table errors name the arguments on the command line (:data:`gpflow_fed.data.tabular.PARAMETERS`)
OPTIONS = {name: f"--{name.replace('_', '-')}" for name in ("party_column", "target", "features", "test_fraction")}


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


def check_own_data_arguments(
    args: argparse.Namespace, ignored_with_csv: Mapping[str, str] = {}, test_fraction: float = 0.2
) -> Optional[Any]:
    """Check the own-data options and read the table; returns the :class:`~gpflow_fed.data.TableSplit` (also
    kept as ``args.table``), or ``None`` without ``--csv``.

    :param ignored_with_csv: options that do not apply with ``--csv`` (``{dest: why}``); given ones are refused.
    :param test_fraction: the held-out fraction when ``--test-fraction`` is not given.
    :raises ValueError: ``--party-column``/``--target``/``--features`` without ``--csv``; ``--csv`` without
        ``--party-column`` or ``--target`` (all that are missing, in one message); a refused option; or a table
        error of :func:`~gpflow_fed.data.split_table`.
    """
    extra = [f"--{k.replace('_', '-')}" for k in OWN if getattr(args, k, None)]
    if args.csv is None:
        if extra:
            raise ValueError(f"{', '.join(extra)} only apply to --csv FILE; add --csv or drop them")
        args.table = None
        return None
    problems = []  # every problem with the options at once
    missing = [f"--{k.replace('_', '-')} COL" for k in ("party_column", "target") if getattr(args, k) is None]
    if missing:
        problems.append(f"--csv needs {' and '.join(missing)} (who holds each row, and the output column)")
    try:
        refuse_ignored(args, ignored_with_csv)
    except ValueError as exc:
        problems.append(str(exc))
    if problems:
        raise ValueError("; ".join(problems))
    from ..data.tabular import split_table

    fraction = args.test_fraction if getattr(args, "test_fraction", None) is not None else test_fraction
    args.table = split_table(
        args.csv, party_column=args.party_column, target=args.target, features=args.features,
        test_fraction=fraction, seed=args.seed, spelling=OPTIONS,
    )  # fmt: skip
    return args.table


def check_federation(
    args: argparse.Namespace,
    clients: Optional[int],
    *,
    client_fraction: Optional[float] = None,
    inducing: Optional[int] = None,
) -> None:
    """Enough parties for the protection every training command asks (secure aggregation, minimum cohort 2), in all
    and per round, and for FSGP enough rows for its statistics; before TensorFlow (:mod:`gpflow_fed.fitting.checks`,
    its messages naming the parties and this command's options).

    :param clients: the number of simulated clients without ``--csv`` (``None``: the dataset fixes them).
    :param client_fraction: ρ of a command whose rounds mask a sum over the sampled parties (``--client-fraction``).
    :param inducing: FSGP's M (``-M``), checked against the table's training rows.
    :raises ValueError: one line.
    """
    from ..fitting.checks import check_inducing, check_parties, required_cohort

    table = getattr(args, "table", None)
    if table is not None:
        parties, spelling = table.parties, {"parties": f"--party-column {args.party_column}", "party": "party"}
    elif clients is not None:
        parties, spelling = tuple(f"client_{k}" for k in range(clients)), {"parties": "--clients", "party": "client"}
    else:
        return
    minimum, reason = required_cohort(None)
    spelling.update(client_fraction="--client-fraction", protection="", num_inducing="--inducing")
    check_parties(parties, minimum, reason, client_fraction=client_fraction, spelling=spelling)
    if table is not None and inducing is not None:
        check_inducing(inducing, sum(int(Y.shape[0]) for _, Y in table.clients), True, spelling)


def own_dataset(args: argparse.Namespace) -> Optional[Any]:
    """The :class:`~gpflow_fed.data.FederatedDataset` (raw units, clients named by party) of the table
    :func:`check_own_data_arguments` read, or ``None`` without ``--csv``."""
    if getattr(args, "table", None) is None:
        return None
    from ..data.tabular import dataset_from_split

    return dataset_from_split(args.table)
