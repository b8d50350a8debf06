"""Option types and options every training subcommand shares (no TensorFlow imported).

Options whose absence means "the default" are parsed with ``default=None`` and resolved later (:func:`resolve`),
so a command can tell an option the user gave from one it filled in, and refuse an option it would ignore
(:func:`refuse_ignored`) instead of silently dropping it.
"""

from __future__ import annotations

import argparse
import math
from typing import Any, Callable, Dict, Mapping, Tuple

__all__ = [
    "add_run_arguments",
    "fraction",
    "given",
    "non_negative_float",
    "non_negative_int",
    "open_fraction",
    "positive_float",
    "positive_int",
    "refuse_ignored",
    "resolve",
]


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


positive_int = _checked(int, "a positive integer", lambda v: v >= 1)
non_negative_int = _checked(int, "a non-negative integer", lambda v: v >= 0)
positive_float = _checked(float, "a positive finite number", lambda v: math.isfinite(v) and v > 0)
non_negative_float = _checked(float, "a non-negative finite number", lambda v: math.isfinite(v) and v >= 0)
fraction = _checked(float, "a number in (0, 1] (the fraction ρ of clients per round)", lambda v: 0 < v <= 1)
open_fraction = _checked(float, "a number in (0, 1)", lambda v: 0 < v < 1)


def add_run_arguments(parser: argparse.ArgumentParser, logdir: str, plot: str) -> None:
    """``--test-fraction``, ``--seed``, ``--logdir``, ``--save``, ``--json``, ``--quick``, ``--no-progress``."""
    parser.add_argument(
        "--test-fraction",
        type=open_fraction,
        default=None,
        help="rows held out for testing: of each party with --csv, of a real dataset otherwise (default 0.2)",
    )
    parser.add_argument("--seed", type=non_negative_int, default=0, help="seed of splits, initial values and sampling")
    parser.add_argument("--logdir", default=logdir, help=f"TensorBoard events and {plot} go here")
    parser.add_argument(
        "--save",
        default=None,
        metavar="FILE",
        help="write the trained model (raw inputs in, the target's units out) to this .npz; default <logdir>/model.npz"
        " (load it with gpflow_fed.models.load_model)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON (layout: docs 'Command output')")
    parser.add_argument("--quick", action="store_true", help="tiny settings for a smoke test (seconds)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")


def given(args: argparse.Namespace, name: str) -> bool:
    """Whether the user gave option ``name`` (parsed with ``default=None``)."""
    return getattr(args, name, None) is not None


def resolve(args: argparse.Namespace, defaults: Mapping[str, Any], quick: Mapping[str, Any]) -> Dict[str, Any]:
    """The effective value of each key of ``defaults``: the option if given, else ``quick``'s value under
    ``--quick``, else the default."""
    out = {}
    for key, value in defaults.items():
        option = getattr(args, key, None)
        out[key] = option if option is not None else quick.get(key, value) if args.quick else value
    return out


def refuse_ignored(args: argparse.Namespace, ignored: Mapping[str, str]) -> None:
    """Raise one ``ValueError`` naming every given option of ``ignored`` (``{dest: why it does not apply}``)."""
    bad = [(name, why) for name, why in ignored.items() if given(args, name)]
    if bad:
        names = ", ".join(f"--{name.replace('_', '-')}" for name, _ in bad)
        reasons = "; ".join(dict.fromkeys(why for _, why in bad))
        raise ValueError(f"{names} would be ignored: {reasons}; drop {'them' if len(bad) > 1 else 'it'}")


def standardized(raw: Any) -> Tuple[Any, Any]:
    """``raw`` standardised with moments agreed in the recorded, protected exchange every command uses
    (:func:`gpflow_fed.fitting.standardize`, secure aggregation on): ``(dataset, standardizer)``."""
    from ..fitting import standardize

    dataset, scaler, _ = standardize(raw)
    return dataset, scaler
