"""What :func:`gpflow_fed.fit` and the command line check about the parties before anything is trained (and before
TensorFlow is imported): enough parties for the protection asked, every round, and enough rows for FSGP's
statistics; and what ``fit`` checks of its own arguments and settings (:func:`check_arguments`,
:func:`check_settings`): an unknown setting, a value of the wrong kind, a count below 1.

A masked sum needs a cohort of at least ``SecureAggregation.min_cohort`` parties (2 by default; under distributed DP
at least its ``honest_clients``), and a client refuses to mask for fewer (:mod:`gpflow_fed.federated.protection`).
Found only when a run reaches its first exchange, that is a failed round after TensorFlow has started, naming
``client_0`` (the runtime's id) rather than the party. Here it is one ``ValueError`` that names the parties as the
table names them and the argument that changes the outcome, spelled as the caller spells it: Python's keywords by
default (:data:`PARAMETERS`), the command line's options when it calls (it passes its own spelling).

This module imports neither TensorFlow nor GPflow.
"""

from __future__ import annotations

import difflib
import math
import sys
from numbers import Real
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from ..validation import integer, positive_float, probability
from .defaults import SETTINGS

__all__ = [
    "CHOICES",
    "DEFAULT_MIN_COHORT",
    "PARAMETERS",
    "check_arguments",
    "check_inducing",
    "check_parties",
    "check_settings",
    "required_cohort",
]

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


#: the settings that name one of a few choices, by method (the algorithms' ``MODES``, ``METHODS`` of PVI,
#: ``AGGREGATIONS`` and ``PROTOCOLS``: a test checks they agree)
CHOICES: Mapping[str, Mapping[str, Tuple[str, ...]]] = {
    "fsgp": {"mode": ("fedavg", "exact")},
    "pvi": {"variant": ("dpo", "cpo", "fixed", "fixed_dpo", "fedavg", "global")},
    "fedbnr": {"aggregation": ("fedavg", "kd"), "protocol": ("statistics", "two_step")},
}

#: counts that must be at least 1 (``rounds`` too, but FedBNR's 0 rounds is its documented phase 2 alone)
_COUNTS = (
    "local_steps", "num_samples", "hidden", "kd_steps", "patience", "fedavg_steps", "max_pseudo", "num_predict_samples",
)  # fmt: skip
#: names a newcomer may try for a setting (the paper's letters, the constructors' argument)
_ALIASES = {
    **dict.fromkeys(("inducing", "inducing_points", "inducing_variable", "n_inducing", "M", "Z"), "num_inducing"),
    **{"R": "rounds", "lr": "learning_rate"},
}
_POSITIVE = ("learning_rate", "noise_variance", "prior_variance", "init_noise", "jitter", "init_Z_var", "init_rho_var")


def _unknown(name: str, method: str, caller: str, takes: Sequence[str]) -> TypeError:
    others = [m for m, names in SETTINGS.items() if m != method and name in names]
    if others:
        return TypeError(
            f"{name} is a setting of method {' and '.join(map(repr, others))}, not of {method!r}; drop {name}= or "
            f"pick method={others[0]!r}"
        )
    close = [_ALIASES[name]] if _ALIASES.get(name) in SETTINGS[method] else []
    close = close or difflib.get_close_matches(name, (*takes, *SETTINGS[method]), n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}=?)" if close else ""
    own = f"{', '.join(takes)} and, for method {method!r}, " if takes else f"for method {method!r} "
    return TypeError(f"unknown keyword {name!r}{hint}; {caller} takes {own}the settings {', '.join(SETTINGS[method])}")


def _scalar(value: Any) -> bool:
    return isinstance(value, (bool, str, Real)) or (hasattr(value, "dtype") and getattr(value, "ndim", None) == 0)


def check_settings(
    method: str, settings: Mapping[str, Any], caller: str = "fit", takes: Sequence[str] = ()
) -> Dict[str, Any]:
    """Refuse a setting ``method`` does not take, of the wrong kind, or out of range, before TensorFlow is imported
    (the algorithm's constructor checks the same, but only once the moments run has agreed the standardisation).

    :param method: one of :data:`~gpflow_fed.fitting.METHODS`.
    :param settings: ``fit``'s ``**settings``.
    :param caller: / :param takes: how an unknown setting's message names the function and its own keywords.
    :return: ``settings`` as given.
    :raises TypeError: an unknown name (naming the closest known one and the method's settings), or a value of the
        wrong kind (:class:`~gpflow_fed.validation.ArgumentTypeError`, also a ``ValueError``).
    :raises ValueError: a count below 1 (``rounds``: below 0 for FedBNR, whose 0 rounds is phase 2 alone), a
        non-positive rate or variance, a ``client_fraction`` outside (0, 1], a choice not among the method's.
    """
    for name in settings:
        if name not in SETTINGS[method]:
            raise _unknown(name, method, caller, takes)
    for name, value in settings.items():
        if name in _COUNTS:
            integer(value, name, minimum=1)
        elif name == "rounds":
            integer(value, name, minimum=0 if method == "fedbnr" else 1)
        elif name in _POSITIVE:
            positive_float(value, name)
        elif name == "client_fraction":
            probability(value, name)
        elif name in CHOICES[method] and value not in CHOICES[method][name]:
            raise ValueError(f"{name} must be one of {CHOICES[method][name]} for method {method!r}, got {value!r}")
    M = settings.get("num_inducing")
    if M is not None and (method == "pvi" or _scalar(M)):
        try:
            integer(M, "num_inducing", minimum=1)
        except ValueError as exc:  # ArgumentTypeError too
            what = "" if method == "pvi" else " or, for fsgp, the [M, D] inducing inputs"
            kind = type(M).__name__
            raise type(exc)(f"num_inducing must be a positive integer (at least 1){what}; got {M!r} ({kind})") from None
    return dict(settings)


def _instance(value: Any, module: str, name: str) -> bool:
    """``isinstance(value, module.name)`` without importing ``module`` (no instance exists before it is loaded)."""
    loaded = sys.modules.get(module)
    return loaded is not None and isinstance(value, getattr(loaded, name))


def check_arguments(
    method: str,
    *,
    features: Any = None,
    test_fraction: Any = 0.2,
    kernel: Any = None,
    runtime: Any = None,
    protection: Any = None,
    monitor: Any = None,
    seed: Any = 0,
) -> None:
    """Refuse ``fit``'s own arguments of the wrong kind, before TensorFlow is imported, each naming the parameter
    and what it takes (the table's columns and ranges are :func:`~gpflow_fed.data.split_table`'s to check).

    :raises TypeError: a single string for ``features``, a ``test_fraction`` or ``seed`` that is not a number, a
        ``kernel``, ``runtime``, ``protection`` or ``monitor`` of the wrong kind
        (:class:`~gpflow_fed.validation.ArgumentTypeError` for the numbers, also a ``ValueError``).
    :raises ValueError: a negative ``seed``, a ``test_fraction`` outside [0, 1), a ``kernel`` for PVI.
    """
    integer(seed, "seed", minimum=0)
    if isinstance(features, (str, bytes)):
        raise TypeError(f"features must be a list of column names, got the string {features!r}; use features=[...]")
    if isinstance(test_fraction, bool) or not isinstance(test_fraction, Real):
        raise TypeError(
            f"test_fraction must be a number in [0, 1), got {test_fraction!r} ({type(test_fraction).__name__})"
        )
    if not 0 <= float(test_fraction) < 1:
        raise ValueError(f"test_fraction must be in [0, 1) (the held-out share of each party), got {test_fraction!r}")
    if kernel is not None:
        if method == "pvi":
            raise ValueError("fit(method='pvi') uses PVI's own prior over kernel hyperparameters; drop kernel=")
        wanted = ("gpflow_fed.kernels.urk", "URK") if method == "fedbnr" else ("gpflow.kernels", "Kernel")
        if not _instance(kernel, *wanted):
            kind = "a gpflow_fed.kernels.URK" if method == "fedbnr" else "a gpflow.kernels.Kernel"
            raise TypeError(f"kernel must be None or {kind} for method {method!r}, got {type(kernel).__name__}")
    if runtime is not None and not _instance(runtime, "gpflow_fed.federated.runtimes.base", "Runtime"):
        raise TypeError(
            f"runtime must be None (LocalRuntime) or a gpflow_fed.federated Runtime, got {type(runtime).__name__}"
        )
    if protection is not None and not _instance(protection, "gpflow_fed.federated.protection.request", "Protection"):
        raise TypeError(
            "protection must be None (secure aggregation) or a gpflow_fed.federated.Protection, got "
            f"{type(protection).__name__}"
        )
    if monitor is not None and not callable(monitor):
        raise TypeError(
            f"monitor must be None or callable (monitor(round, **kwargs), e.g. a gpflow.monitor.Monitor), got "
            f"{type(monitor).__name__}"
        )
