"""What :func:`gpflow_fed.fit` and the command line check about the parties before anything is trained (and before
TensorFlow is imported): enough parties for the protection asked, every round, and enough rows for FSGP's
statistics.

A masked sum needs a cohort of at least ``SecureAggregation.min_cohort`` parties (2 by default; under distributed DP
at least its ``honest_clients``), and a client refuses to mask for fewer (:mod:`gpflow_fed.federated.protection`).
Found only when a run reaches its first exchange, that is a failed round after TensorFlow has started, naming
``client_0`` (the runtime's id) rather than the party. Here it is one ``ValueError`` that names the parties as the
table names them and the argument that changes the outcome, spelled as the caller spells it: Python's keywords by
default (:data:`PARAMETERS`), the command line's options when it calls (it passes its own spelling).

This module imports neither TensorFlow nor GPflow.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Sequence, Tuple

__all__ = ["DEFAULT_MIN_COHORT", "PARAMETERS", "check_inducing", "check_parties", "required_cohort"]

#: ``SecureAggregation().min_cohort``, the default protection's minimum (a test checks they agree): importing
#: :mod:`gpflow_fed.federated.protection` for it would load its DP accountants (≈ 1.6 s of SciPy) before any check
DEFAULT_MIN_COHORT = 2

#: how the messages name what changes the outcome, for a Python caller: ``parties`` (what decides the parties),
#: ``party`` (what one is called), ``client_fraction``, ``protection`` (empty: the caller has no such argument) and
#: ``num_inducing``.
PARAMETERS: Mapping[str, str] = {
    "parties": "party_column",
    "party": "party",
    "client_fraction": "client_fraction",
    "protection": "protection=Protection(...)",
    "num_inducing": "num_inducing",
}


def required_cohort(protection: Any = None) -> Tuple[int, str]:
    """The fewest parties every masked sum of ``protection`` needs, and why, as ``(minimum, reason)``.

    :param protection: a :class:`~gpflow_fed.federated.Protection`, or ``None`` for the default (secure aggregation
        on, ``SecureAggregation.min_cohort`` = 2).
    :return: ``SecureAggregation.min_cohort`` (at least 2), the larger ``DistributedDP.honest_clients`` under
        distributed DP (as the run's secure-aggregation server requires), or 1 without secure aggregation.
    """
    if protection is None:
        return DEFAULT_MIN_COHORT, "secure aggregation (on by default)"
    secure = getattr(protection, "secure", None)
    if secure is None:
        return 1, "no secure aggregation"
    minimum, reason = int(secure.min_cohort), f"secure aggregation (min_cohort={secure.min_cohort})"
    distributed = getattr(protection, "distributed", None)
    if distributed is not None and int(distributed.honest_clients) > minimum:
        minimum = int(distributed.honest_clients)
        reason = f"distributed DP (honest_clients={minimum})"
    return minimum, reason


def _plural(noun: str) -> str:
    return f"{noun[:-1]}ies" if noun.endswith("y") else f"{noun}s"


def _listed(parties: Sequence[str], most: int = 6) -> str:
    shown = ", ".join(repr(p) for p in parties[:most])
    return shown + (f", … ({len(parties)} in all)" if len(parties) > most else "")


def check_parties(
    parties: Sequence[str],
    minimum: int,
    reason: str,
    *,
    client_fraction: Optional[float] = None,
    spelling: Mapping[str, str] = PARAMETERS,
) -> None:
    """Refuse a federation too small for its protection: fewer than ``minimum`` parties, or fewer than ``minimum``
    asked per round (``max(⌈Kρ⌉, 1)`` of the K parties for a client fraction ρ).

    :param parties: the parties' names (the table's, or the dataset's ``names``).
    :param minimum: / :param reason: as :func:`required_cohort` returns them.
    :param client_fraction: ρ of an algorithm whose every round masks a sum over the sampled parties (``None``: every
        party every round).
    :param spelling: how the message names the arguments (:data:`PARAMETERS`; the command line passes its options).
    :raises ValueError: one line naming the parties and what to change.
    """
    from ..federated.protocol.sampling import num_sampled_clients  # numpy only

    K, party = len(parties), spelling["party"]
    protection = spelling.get("protection", "")
    weaker = f", or ask for less protection ({protection})" if protection else ""
    if K < minimum:
        raise ValueError(
            f"{K} {party if K == 1 else _plural(party)} ({_listed(parties)}) from {spelling['parties']}: {reason} "
            f"sums no fewer than {minimum} {_plural(party)}' data, so a federated run needs at least {minimum}: "
            f"{spelling['parties']} must give {minimum} or more{weaker}"
        )
    if client_fraction is None:
        return
    per_round = num_sampled_clients(K, client_fraction)
    if per_round < minimum:
        enough = min(math.ceil(100 * minimum / K) / 100, 1.0)  # the least ρ, to two decimals, with ⌈Kρ⌉ ≥ minimum
        raise ValueError(
            f"{spelling['client_fraction']} {client_fraction:g} asks {per_round} of the {K} {_plural(party)} "
            f"({_listed(parties)}) per round, and {reason} sums no fewer than {minimum}; raise "
            f"{spelling['client_fraction']} to {enough:g}{' or more' if enough < 1 else ''}{weaker}"
        )


def check_inducing(num_inducing: Any, num_rows: int, secure: bool, spelling: Mapping[str, str] = PARAMETERS) -> None:
    """FSGP's statistics of N ≤ M rows would give the rows back, so a masked group must hold more than M rows
    (``FSGP.min_cohort_data``); refuse ``num_inducing`` M ≥ N, the training rows of all parties together.

    :param num_inducing: M, or the inducing inputs themselves (an array: not checked here).
    :param num_rows: N, the training rows of every party.
    :param secure: whether secure aggregation is on (without it each party's own rows must exceed M, which its
        own policy checks).
    :raises ValueError: one line naming ``spelling["num_inducing"]``.
    """
    if not secure or not isinstance(num_inducing, int) or isinstance(num_inducing, bool):
        return
    if num_inducing >= num_rows:
        raise ValueError(
            f"{num_inducing} inducing points ({spelling['num_inducing']}) need more than {num_inducing} training "
            f"rows in all, and the parties hold {num_rows} (FSGP's statistics of no more rows than inducing points "
            f"would give the rows back); lower {spelling['num_inducing']} below {num_rows}"
        )
