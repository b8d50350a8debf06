"""The ``gpflow-fed`` command. Each subcommand lives in its own module of this package, exposing
``register(subparsers)`` (adds its parser and sets ``func``) and is listed in ``SUBCOMMANDS``.

Parsing, ``--help``, usage errors and data errors import neither TensorFlow nor GPflow: a subcommand may set
``check`` beside ``func``, which validates the options together, the files and the tables (numpy only) and
raises one of :data:`USER_ERRORS`; only then is TensorFlow imported and ``func`` run. ``gpflow-fed --help``
answers in a fraction of a second, and so does a missing file or a wrong column. TensorFlow's log noise is
silenced as the package silences it in Python (see :func:`quiet_tensorflow`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from typing import Iterator, List, Optional, Sequence

SUBCOMMANDS: List[str] = ["datasets", "fedbnr", "flower", "fsgp", "privacy", "pvi", "recycle"]


def quiet_tensorflow() -> None:
    """Import TensorFlow and list its devices (the CUDA probe), without their start-up noise.

    The package does the silencing for Python and the command line alike (``import gpflow_fed``, which runs before
    this module: ``TF_CPP_MIN_LOG_LEVEL=2`` unless set, and its start-up lines and a GPU-less machine's CUDA probe
    filtered out of standard error while TensorFlow is imported and first lists its devices; see
    :mod:`gpflow_fed`). The devices are listed here, under the same filter, in case TensorFlow was imported before
    the package (a caller of :func:`main` that imported it first). Errors and TensorFlow's Python-side warnings
    (e.g. retracing) still show; ``GPFLOW_FED_TF_LOGS=1`` keeps everything.

    Under the same filter it also spends TensorFlow's oneDNN fallback notice (:func:`_spend_one_dnn_notice`), which
    would otherwise come mid-run (in ``gpflow-fed pvi``'s output); Python sessions keep it, as running an op at
    import would fix TensorFlow's device configuration before the user's code could change it.
    """
    import tensorflow as tf

    from .. import filtered_stderr

    if os.environ.get("GPFLOW_FED_TF_LOGS") != "1":

        def start_up() -> None:
            tf.config.list_physical_devices()
            _spend_one_dnn_notice()

        filtered_stderr(start_up)


def _spend_one_dnn_notice() -> None:
    """Run one eager int32 transpose, so that a oneDNN build of TensorFlow writes now its once-a-process ERROR-level
    notice ``oneDNN supports DT_INT32 only on platforms with AVX-512. Falling back to the default Eigen-based
    implementation`` (one flag for every data type: a later op of another unsupported type writes nothing either).
    The notice is no error: the op runs, on Eigen. Nothing is run when oneDNN is off (``TF_ENABLE_ONEDNN_OPTS=0``,
    or a build without it)."""
    import tensorflow as tf

    if os.environ.get("TF_ENABLE_ONEDNN_OPTS", "").strip().lower() in ("0", "false"):
        return
    try:
        from tensorflow.python.util import _pywrap_util_port

        if not _pywrap_util_port.IsMklEnabled():
            return
    except (ImportError, AttributeError):  # pragma: no cover - a TensorFlow without the probe: run the op anyway
        pass
    tf.transpose(tf.reshape(tf.range(4), [2, 2]))


_ROLE = re.compile(r":[a-z:]+:`(?:([^`<]*?)\s*<[^`>]*>|~?([^`]*))`")


def plain_text(text: Optional[str]) -> Optional[str]:
    """Help text without reST markup: ``code`` → code, :role:`~a.b.Name` → Name, :role:`label <t>` → label."""
    if not text:
        return text

    def role(match: "re.Match[str]") -> str:
        label, target = match.group(1), match.group(2)
        return label if label is not None else target.lstrip("~").rsplit(".", 1)[-1]

    text = _ROLE.sub(role, text)
    return text.replace("``", "").replace("**", "")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions keep their line breaks; every option's help ends with its default when it has one (and
    its help does not already state it)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or default is None
            or default is False
            or default is argparse.SUPPRESS
            or not action.option_strings
            or isinstance(action, (argparse._HelpAction, argparse._VersionAction))
        ):
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"


def _parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def _finish(parser: argparse.ArgumentParser) -> None:
    """Every (sub)parser: the shared formatter, reST-free descriptions and help texts."""
    for p in _parsers(parser):
        p.formatter_class = HelpFormatter
        p.description = plain_text(p.description)
        for action in p._actions:
            if (
                action.help is None
                and action.option_strings
                and action.default is not None
                and action.default is not False
            ):
                action.help = "(default: %(default)s)"
            elif action.help != argparse.SUPPRESS:
                action.help = plain_text(action.help)
            if isinstance(action, argparse._SubParsersAction):
                for choice in action._choices_actions:
                    choice.help = plain_text(choice.help)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every registered subcommand (imports no TensorFlow)."""
    from .. import __version__

    parser = argparse.ArgumentParser(prog="gpflow-fed", description="Federated and privacy-aware GPs for GPflow.")
    parser.add_argument("--version", action="version", version=f"gpflow-fed {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f"{__name__}.{name}").register(subparsers)
    _finish(parser)
    return parser


def _innermost(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)parser of the command line's deepest subcommand, so errors print that subcommand's usage."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = getattr(args, action.dest, None)
            if chosen in action.choices:
                return _innermost(action.choices[chosen], args)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the console script; returns the exit status."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        _innermost(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    try:
        check = getattr(args, "check", None)
        if check is not None:
            check(args)  # options, files and tables, before TensorFlow
        if getattr(args, "tensorflow", True):  # a check may find the command needs none (datasets --write-example)
            quiet_tensorflow()
        return int(args.func(args) or 0)
    except USER_ERRORS as exc:
        print(f"gpflow-fed {args.command}: error: {user_error_message(exc)}", file=sys.stderr)
        return 2


#: What a subcommand raises for bad user input (arguments, missing/unreadable/existing files, malformed content):
#: ``main`` turns each into one line on stderr and exit status 2 instead of a traceback.
USER_ERRORS = (ValueError, TypeError, OSError)


def user_error_message(exc: BaseException) -> str:
    """One line for ``exc``: an ``OSError`` as ``<reason>: <file>``, anything else as its message, newlines folded."""
    if isinstance(exc, OSError) and exc.strerror:
        text = f"{exc.strerror}: {exc.filename}" if exc.filename is not None else exc.strerror
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
