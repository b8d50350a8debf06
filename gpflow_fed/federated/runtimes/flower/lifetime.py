"""How long a party's SuperNode lives: until the federation's SuperLink stops, or until the party is stopped.

``flower-supernode`` on its own retries the SuperLink for ever once it has gone (its ``--max-retries`` and
``--max-wait-time`` bound every retry, the first connection's too, so a party started before the server would give
up). ``gpflow-fed flower party`` therefore watches instead: :func:`serve_party` starts the SuperNode in a
:class:`~.processes.ProcessFamily`, asks the SuperLink's ``/health`` every ``poll`` seconds and, once it has seen the
SuperLink, stops the SuperNode (and every process below it) when the SuperLink has not answered for ``linger``
seconds: ``gpflow-fed flower server`` stops its SuperLink when its run is over, so a SuperLink gone means the run is
over. With ``stay`` the party keeps serving for the next run instead, and says so in one line.

No TensorFlow and no Flower are imported here.
"""

from __future__ import annotations

import subprocess
import time
import urllib.request
from typing import Callable, Mapping, Optional, Sequence

from .processes import ProcessFamily

__all__ = ["serve_party", "superlink_up"]

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def superlink_up(address: str, timeout: float = 2.0) -> bool:
    """Whether the SuperLink at ``HOST:PORT`` answers its ``/health`` (plain HTTP, no proxy)."""
    try:
        with _NO_PROXY.open(f"http://{address}/health", timeout=timeout) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def serve_party(
    family: ProcessFamily,
    command: Sequence[str],
    env: Mapping[str, str],
    superlink: str,
    *,
    linger: float = 15.0,
    stay: bool = False,
    poll: float = 1.0,
    report: Callable[[str], None] = print,
    worker: Optional[Sequence[str]] = None,
) -> int:
    """Run a party's SuperNode ``command`` in ``family`` until the federation no longer needs it (module docstring).

    :param family: where the SuperNode starts (the caller's ``with`` block stops it and everything below it).
    :param command: the ``flower-supernode`` command line.
    :param env: its environment.
    :param superlink: the SuperLink's ``HOST:PORT``.
    :param linger: seconds without an answer from a SuperLink seen before, after which the party stops.
    :param stay: never stop because the SuperLink stopped (serve the next run).
    :param poll: seconds between looks.
    :param report: called with one line when the party decides to stop (or to stay).
    :param worker: the command of the party's worker (:mod:`.worker`), started in ``family`` before the SuperNode,
        with the same environment; the party does not depend on it (its ClientApps answer without it).
    :return: the exit status: 0 when the SuperLink stopped, else the SuperNode's own (it exited by itself).
    :raises ValueError: a negative ``linger`` or a ``poll`` that is not positive.
    """
    if not linger >= 0 or not poll > 0:
        raise ValueError(f"linger must be non-negative and poll positive seconds, got {linger!r}, {poll!r}")
    if worker is not None:
        family.start(list(worker), env=dict(env))
    supernode = family.start(list(command), env=dict(env))
    seen = False
    silent_since = None
    while True:
        code = supernode.poll()
        if code is not None:
            report(f"its SuperNode exited by itself (status {code})")
            return int(code)
        now = time.monotonic()
        if superlink_up(superlink):
            if not seen and stay:
                report(f"the SuperLink at {superlink} answers; this party serves its runs until stopped (Ctrl-C)")
            seen, silent_since = True, None
        elif seen and not stay:
            silent_since = now if silent_since is None else silent_since
            if now - silent_since >= linger:
                report(
                    f"the SuperLink at {superlink} has not answered for {linger:g} s: the server's run is over (or "
                    "the server stopped); stopping this party's SuperNode"
                )
                return 0
        try:
            supernode.wait(timeout=poll)
        except subprocess.TimeoutExpired:
            pass
