"""Option types and options every training subcommand shares (no TensorFlow imported).

Options whose absence means "the default" are parsed with ``default=None`` and resolved later (:func:`resolve`),
so a command can tell an option the user gave from one it filled in, and refuse an option it would ignore
(:func:`refuse_ignored`) instead of silently dropping it.
"""

from __future__ import annotations

import argparse
import math
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

__all__ = [
    "RUN_OPTIONS_NOT_ON_THE_COMMAND_LINE",
    "add_run_arguments",
    "add_run_option_arguments",
    "for_run",
    "fraction",
    "given",
    "non_negative_float",
    "non_negative_int",
    "open_fraction",
    "positive_float",
    "positive_int",
    "refuse_ignored",
    "resolve",
    "run_options",
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


def add_run_arguments(parser: argparse.ArgumentParser, logdir: str, plot: str, quick_cpu: int) -> None:
    """``--test-fraction``, ``--seed``, ``--logdir``, ``--save``, ``--json``, ``--quick``, ``--no-progress``.

    :param quick_cpu: the CPU seconds the command's ``--quick`` run took, measured (``/usr/bin/time gpflow-fed
        <command> --quick``, docs page "Command output"): its help states it, since the wall time depends on the
        machine's load.
    """
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
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"tiny settings for a smoke test: about {quick_cpu} s of CPU time (TensorFlow's start included), a "
        "minute or more of wall time on a busy machine",
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")


#: the :class:`~gpflow_fed.federated.RunOptions` keys a command line does not take: ``progress`` is
#: :func:`add_run_arguments`' ``--no-progress`` (a command shows its bars unless ``--no-progress`` or ``--json``),
#: and nothing a command writes shows the payloads ``keep-payloads`` would keep
RUN_OPTIONS_NOT_ON_THE_COMMAND_LINE = ("progress", "keep-payloads")


def _option_type(field: Any) -> Callable[[str], Any]:
    """An argparse ``type=`` that reads a word as a config would (:func:`gpflow_fed.validation.dataclass_from_config`:
    the same checks, the error naming the option)."""
    from ..validation import parse_integer, parse_number

    def parse(text: str) -> Any:
        try:
            if field.kind == "int":
                return parse_integer(text, f"--{field.key}", field.minimum)
            seconds = parse_number(text, f"--{field.key}")
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if not seconds > 0:
            raise argparse.ArgumentTypeError(f"--{field.key} must be positive seconds, got {text}")
        return seconds

    parse.__name__ = field.kind
    return parse


def add_run_option_arguments(parser: argparse.ArgumentParser, *, checkpoints: str = "") -> None:
    """One option per :class:`~gpflow_fed.federated.RunOptions` key (its fault policy's inlined), generated from
    the dataclasses' fields, with their defaults and help: ``--eval-every``, ``--on-error``, ``--min-clients``,
    ``--timeout``, ``--checkpoint-dir``, ``--checkpoint-every``, ``--resume`` (not
    :data:`RUN_OPTIONS_NOT_ON_THE_COMMAND_LINE`). :func:`run_options` builds the ``RunOptions`` from them.

    :param checkpoints: appended to ``--checkpoint-dir``'s help (e.g. where a command that runs several federated
        runs puts each one's checkpoints).
    """
    from ..federated.engine.options import RunOptions
    from ..validation import config_fields

    group = parser.add_argument_group(
        "run options", "how the federated run is run (RunOptions; the same keys in a Flower run config)"
    )
    for field in config_fields(RunOptions):
        if field.key in RUN_OPTIONS_NOT_ON_THE_COMMAND_LINE:
            continue
        flag, text = f"--{field.key}", field.help
        if field.kind == "bool":
            if field.default:  # pragma: no cover - no such option yet
                group.add_argument(f"--no-{field.key}", dest=field.key.replace("-", "_"), action="store_false")
            else:
                group.add_argument(flag, action="store_true", help=text)
        elif field.kind == "choice":
            group.add_argument(flag, choices=field.choices, default=field.default, help=text)
        elif field.kind == "path":
            text = f"{text}{checkpoints} (default: none)" if field.key == "checkpoint-dir" else text
            group.add_argument(flag, default=field.default, metavar="DIR", help=text)
        else:  # int, seconds
            metavar = "N" if field.kind == "int" else "SECONDS"
            group.add_argument(flag, type=_option_type(field), default=field.default, metavar=metavar, help=text)


def run_options(args: argparse.Namespace, *, progress: bool = False, run: Optional[str] = None) -> Any:
    """The :class:`~gpflow_fed.federated.RunOptions` of :func:`add_run_option_arguments`' parsed options (through
    :meth:`RunOptions.from_config <gpflow_fed.federated.RunOptions.from_config>`, as a Flower run config is read).

    :param progress: show the run's progress bar.
    :param run: a command that runs several federated runs names each: its checkpoints go to
        ``<--checkpoint-dir>/<run>``.
    :raises ValueError: options that do not go together (``--resume`` without ``--checkpoint-dir``).
    """
    from ..federated.engine.options import RunOptions
    from ..validation import config_fields

    config: Dict[str, Any] = {"progress": bool(progress)}
    for field in config_fields(RunOptions):
        value = getattr(args, field.key.replace("-", "_"), None)
        if field.key not in RUN_OPTIONS_NOT_ON_THE_COMMAND_LINE and value is not None:
            config[field.key] = value
    try:
        options = RunOptions.from_config(config)
    except ValueError as exc:
        if getattr(args, "resume", False) and not getattr(args, "checkpoint_dir", None):
            raise ValueError("--resume needs --checkpoint-dir, the folder the interrupted run wrote to") from None
        raise ValueError(f"run options: {exc}") from exc
    return options if run is None else for_run(options, run)


def for_run(options: Any, run: str) -> Any:
    """``options`` (a :class:`~gpflow_fed.federated.RunOptions`) for one of a command's several federated runs:
    its checkpoints in ``<checkpoint_dir>/<run>`` (unchanged without a ``checkpoint_dir``)."""
    import dataclasses
    import os

    if options.checkpoint_dir is None:
        return options
    return dataclasses.replace(options, checkpoint_dir=os.path.join(options.checkpoint_dir, run))


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
