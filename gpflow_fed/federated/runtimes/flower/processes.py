"""The processes a gpflow-fed command starts for Flower, and how every one of them stops: no TensorFlow, no Flower.

``gpflow-fed flower server`` starts ``flower-superlink`` and ``flwr run``; ``gpflow-fed flower party`` starts
``flower-supernode``. Flower's processes start more of their own: a SuperLink starts a ``flower-superexec`` *in a
new session* (detached from its parent's process group), which starts a ServerApp process per run; a SuperNode
starts a ``flower-superexec`` in its own group, which starts a ``flwr-clientapp`` process per message. Signalling
one process, or one process group, leaves the others behind.

:class:`ProcessFamily` starts each child in a session of its own (``start_new_session``: its own process group, no
controlling terminal) and remembers the sessions of the child and of everything below it (read from ``/proc``,
``ppid`` links, whenever it looks; a process whose parent has died keeps its session). :meth:`ProcessFamily.stop`
sends SIGTERM to every live process of those sessions, waits up to ``grace`` seconds, then sends SIGKILL to any that
remain. Its own session is never signalled. Without ``/proc`` (not Linux) it signals each child's process group.

With ``signals=True`` (a command's main thread) the family turns the first SIGINT, SIGTERM or SIGHUP into
:class:`Interrupted` in the main thread, so that the command's ``with`` blocks unwind and the family stops
everything; a second signal during the stop skips the grace period.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from types import FrameType, TracebackType
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple, Type

__all__ = ["STOP_SIGNALS", "Interrupted", "ProcessFamily", "process_table"]

#: the signals that stop a command and everything it started
STOP_SIGNALS: Tuple[int, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: seconds between looks at a family's processes while it waits for them
_TICK = 0.1


class Interrupted(Exception):
    """A stop signal arrived (see the module docstring).

    :param signum: the signal's number.
    """

    def __init__(self, signum: int) -> None:
        self.signum = int(signum)
        super().__init__(signal.Signals(self.signum).name)

    @property
    def exit_status(self) -> int:
        """The shell's status for a command ended by this signal: 128 + its number (130 for Ctrl-C)."""
        return 128 + self.signum


def process_table() -> Optional[Dict[int, Tuple[int, int, str]]]:
    """``{pid: (parent pid, session id, state)}`` of every process, from ``/proc`` (None without it).

    ``state`` is the one-letter state of ``/proc/PID/stat`` (``"Z"``: exited, not yet reaped).
    """
    if not os.path.isdir("/proc/self"):
        return None
    table: Dict[int, Tuple[int, int, str]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # it exited while we looked
            continue
        fields = stat[stat.rindex(b")") + 2 :].split()  # the command name may hold spaces and parentheses
        # fields: state, ppid, pgrp, session, ...
        table[int(name)] = (int(fields[1]), int(fields[3]), fields[0].decode("ascii", "replace"))
    return table


class ProcessFamily:
    """Child processes, each in a session of its own, and everything they start (module docstring).

    Use as a context manager: leaving it stops the whole family (:meth:`stop`).

    :param grace: seconds the family has to end after SIGTERM before SIGKILL.
    :param signals: turn the first SIGINT, SIGTERM or SIGHUP into :class:`Interrupted` while the context is open
        (only in the main thread; elsewhere signals are left alone).
    :raises ValueError: a negative ``grace``.
    """

    def __init__(self, grace: float = 10.0, *, signals: bool = False) -> None:
        if not grace >= 0:
            raise ValueError(f"grace must be non-negative seconds, got {grace!r}")
        self.grace = float(grace)
        self.signals = bool(signals)
        #: the processes this family started itself, in order
        self.children: List[subprocess.Popen] = []
        #: set by a second stop signal: :meth:`stop` sends SIGKILL without waiting
        self.hurry = False
        self._sessions: Set[int] = set()
        self._own_session = os.getsid(0)
        self._previous: Dict[int, Any] = {}
        #: how many live processes the last :meth:`stop` ended
        self.ended = 0

    # --- starting ------------------------------------------------------------------------------------
    def start(self, command: Sequence[str], **popen: Any) -> subprocess.Popen:
        """Start ``command`` in a new session (``subprocess.Popen(command, start_new_session=True, **popen)``).

        :raises OSError: the command cannot be started.
        """
        process = subprocess.Popen(list(command), start_new_session=True, **popen)
        self.children.append(process)
        self._sessions.add(process.pid)  # a new session's id is its leader's pid
        return process

    # --- looking -------------------------------------------------------------------------------------
    def look(self) -> Set[int]:
        """Remember the sessions of the children and of every process below them; the family's sessions."""
        table = process_table()
        if table is None:
            return set(self._sessions)
        below: Dict[int, List[int]] = {}
        for pid, (ppid, _, _) in table.items():
            below.setdefault(ppid, []).append(pid)
        queue = [p.pid for p in self.children]
        seen: Set[int] = set()
        while queue:
            pid = queue.pop()
            if pid in seen or pid not in table:
                continue
            seen.add(pid)
            self._sessions.add(table[pid][1])
            queue.extend(below.get(pid, []))
        self._sessions.discard(self._own_session)  # never this command's own session
        return set(self._sessions)

    def alive(self) -> List[int]:
        """The live processes of the family's sessions (never this process; an exited, unreaped one is not live)."""
        self.look()
        table = process_table()
        if table is None:
            return [p.pid for p in self.children if p.poll() is None]
        me = os.getpid()
        return sorted(
            pid for pid, (_, sid, state) in table.items() if sid in self._sessions and pid != me and state != "Z"
        )

    # --- stopping ------------------------------------------------------------------------------------
    def _signal(self, pids: Sequence[int], signum: int) -> None:
        if process_table() is None:  # no /proc: each child's process group (its pid: a new session)
            for child in self.children:
                if child.poll() is None:
                    try:
                        os.killpg(child.pid, signum)
                    except (ProcessLookupError, PermissionError):
                        pass
            return
        for pid in pids:
            try:
                os.kill(pid, signum)
            except (ProcessLookupError, PermissionError):  # gone meanwhile
                pass

    def _reap(self) -> None:
        for child in self.children:
            child.poll()

    def stop(self) -> int:
        """End every process of the family: SIGTERM, up to ``grace`` seconds, then SIGKILL; the children reaped.

        :return: how many processes were live when it began.
        """
        live = self.alive()
        self._signal(live, signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        while not self.hurry and time.monotonic() < deadline:
            self._reap()
            if not self.alive():
                break
            time.sleep(_TICK)
        left = self.alive()
        if left:
            self._signal(left, signal.SIGKILL)
        for child in self.children:
            try:
                child.wait(timeout=5)
            except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL cannot be refused
                pass
        self.ended = len(live)
        return self.ended

    # --- the context -------------------------------------------------------------------------------
    def _first(self, signum: int, frame: Optional[FrameType]) -> None:
        for s in STOP_SIGNALS:  # during the stop, another signal only hurries it
            signal.signal(s, self._again)
        raise Interrupted(signum)

    def _again(self, signum: int, frame: Optional[FrameType]) -> None:
        self.hurry = True

    def __enter__(self) -> "ProcessFamily":
        if self.signals and threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._first) for s in STOP_SIGNALS}
        return self

    def __exit__(
        self,
        kind: Optional[Type[BaseException]] = None,
        error: Optional[BaseException] = None,
        trace: Optional[TracebackType] = None,
    ) -> None:
        try:
            if self._previous:
                for s in STOP_SIGNALS:
                    signal.signal(s, self._again)
            self.stop()
        finally:
            for s, handler in self._previous.items():
                signal.signal(s, handler)
            self._previous = {}
