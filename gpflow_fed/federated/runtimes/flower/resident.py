"""A party's worker process: ``python -m gpflow_fed.federated.runtimes.flower.resident FOLDER``.

Started by ``gpflow-fed flower party`` beside its SuperNode (:mod:`.worker` says why and how it is reached): it
imports TensorFlow and GPflow once, then answers the party's forwarded updates with a resident
:class:`~.client_app.ClientHost` until the party stops it (or its parent process exits).
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from .client_app import ClientHost
from .worker import serve

__all__ = ["main"]


def main(argv: Optional[List[str]] = None) -> int:
    """Serve the party's worker folder (its one argument) with a resident host; 0 when it stops."""
    parser = argparse.ArgumentParser(prog="gpflow-fed-worker", description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="the worker's private folder (made by gpflow-fed flower party)")
    args = parser.parse_args(argv)
    import gpflow  # noqa: F401 - TensorFlow and GPflow once, before the first update

    serve(args.folder, ClientHost(resident=True).answer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
