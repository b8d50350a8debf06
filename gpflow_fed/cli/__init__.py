"""The ``gpflow-fed`` command. Each subcommand lives in its own module of this package, exposing
``register(subparsers)`` (adds its parser and sets ``func``) and is listed in ``SUBCOMMANDS``."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import List, Optional, Sequence

SUBCOMMANDS: List[str] = ["datasets", "fedbnr", "flower", "fsgp", "privacy", "pvi", "recycle"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every registered subcommand."""
    parser = argparse.ArgumentParser(prog="gpflow-fed", description="Federated and privacy-aware GPs for GPflow.")
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"gpflow-fed {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f"{__name__}.{name}").register(subparsers)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the console script; returns the exit status."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    try:
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
