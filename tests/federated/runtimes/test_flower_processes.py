"""A clean stop: every process a ``flower`` command starts ends with it (``processes.ProcessFamily``), and a party
stops by itself once the SuperLink has gone (``lifetime.serve_party``).

The family is tested on a stand-in process tree shaped like Flower's (a child that starts a grandchild ignoring
SIGTERM and a great-grandchild in a session of its own, as a SuperLink starts its ``flower-superexec``); the
commands on real processes: ``gpflow-fed flower party`` with its real ``flower-supernode`` (and the SuperNode's
``flower-superexec``) stopped by SIGTERM, and ``gpflow-fed flower server`` with its real ``flower-superlink`` (and
the SuperLink's detached ``flower-superexec``) and ``flwr run`` stopped by Ctrl-C (SIGINT), each in seconds.
"""

from __future__ import annotations

import http.server
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import List

import pytest

from gpflow_fed.federated.runtimes.flower import lifetime
from gpflow_fed.federated.runtimes.flower.processes import Interrupted, ProcessFamily, process_table

ROOT = Path(__file__).resolve().parents[3]
LINUX = os.path.isdir("/proc/self")

#: a child that starts a grandchild ignoring SIGTERM (same session) and a detached great-grandchild (new session),
#: writes their pids to argv[1], and sleeps
TREE = r"""
import os, subprocess, sys, time
stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
detached = (
    "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
    "time.sleep(600)"
)
a = subprocess.Popen([sys.executable, "-c", stubborn])
b = subprocess.Popen([sys.executable, "-c", detached], start_new_session=True)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(f"{a.pid} {b.pid}")
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(600)
"""


def _wait_for(predicate, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"{what} within {seconds:g} s"
        time.sleep(0.1)


def _live(pids: List[int]) -> List[int]:
    table = process_table() or {}
    return [p for p in pids if p in table and table[p][2] != "Z"]


@pytest.mark.skipif(not LINUX, reason="the family's sessions are read from /proc (Linux)")
def test_the_family_ends_a_tree_with_a_detached_session_and_a_process_that_ignores_sigterm(tmp_path):
    pids_file = tmp_path / "pids"
    started = time.monotonic()
    with ProcessFamily(grace=1.0) as family:
        child = family.start([sys.executable, "-c", TREE, str(pids_file)])
        _wait_for(pids_file.exists, 60, "the stand-in tree starts")
        stubborn, detached = map(int, pids_file.read_text().split())
        _wait_for(lambda: len(family.alive()) == 4, 60, "the detached process starts its own child")
        sessions = family.look()
        assert {child.pid, detached} <= sessions and os.getsid(0) not in sessions
        tree = family.alive()
    assert family.ended == 4  # SIGTERM, then SIGKILL for the one that ignored it
    # a killed orphan is reaped by init, not by us: on a loaded machine that may take a moment
    _wait_for(lambda: not _live(tree), 10, "every process of the tree ends")
    assert child.returncode == -signal.SIGTERM
    assert time.monotonic() - started < 30


def test_a_stop_signal_becomes_interrupted_and_the_handlers_come_back(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted) as stopped:
        with ProcessFamily(grace=1.0, signals=True) as family:
            child = family.start([sys.executable, "-c", "import time; time.sleep(600)"])
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the signal arrives first
    assert stopped.value.exit_status == 128 + signal.SIGTERM and str(stopped.value) == "SIGTERM"
    assert child.returncode == -signal.SIGTERM and family.ended == 1
    assert signal.getsignal(signal.SIGTERM) is before


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_a_party_stops_once_the_superlink_has_gone_and_says_so():
    """The watcher on a stand-in SuperLink (its ``/health`` only) and a stand-in SuperNode process."""
    server = http.server.HTTPServer(("127.0.0.1", 0), _Health)
    address = f"127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    lines: List[str] = []
    assert lifetime.superlink_up(address)
    stop = threading.Timer(1.5, lambda: (server.shutdown(), server.server_close()))
    stop.start()
    with ProcessFamily(grace=1.0) as family:
        status = lifetime.serve_party(
            family, [sys.executable, "-c", "import time; time.sleep(600)"], dict(os.environ), address,
            linger=0.5, poll=0.2, report=lines.append,
        )  # fmt: skip
    assert status == 0 and family.ended == 1 and not lifetime.superlink_up(address)
    assert lines == [
        f"the SuperLink at {address} has not answered for 0.5 s: the server's run is over (or the server stopped); "
        "stopping this party's SuperNode"
    ]
    # a SuperNode that exits by itself ends the party with its status; --stay says it waits for the next run
    with ProcessFamily(grace=1.0) as family:
        status = lifetime.serve_party(
            family, [sys.executable, "-c", "raise SystemExit(3)"], dict(os.environ), address, poll=0.2,
            report=lines.append,
        )  # fmt: skip
    assert status == 3 and lines[-1] == "its SuperNode exited by itself (status 3)"
    with pytest.raises(ValueError, match="linger"):
        lifetime.serve_party(ProcessFamily(), ["true"], {}, address, linger=-1)


def _cli(tmp_path: Path, *argv: str) -> ProcessFamily:
    """``gpflow-fed`` as a real process, in a family of this test (which observes what it starts)."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    family = ProcessFamily(grace=5.0)
    with open(tmp_path / "cli.log", "w") as log:
        family.start([sys.executable, "-m", "gpflow_fed.cli", *argv], cwd=tmp_path, env=env, stdout=log, stderr=log)
    return family


def _names(family: ProcessFamily) -> List[str]:
    names = []
    for pid in family.alive():
        try:
            names.append(" ".join(Path(f"/proc/{pid}/cmdline").read_text().split("\0")[:3]))
        except OSError:
            pass
    return names


@pytest.mark.skipif(not LINUX, reason="the processes are read from /proc (Linux)")
def test_sigterm_on_a_party_ends_its_supernode_and_everything_below_it(tmp_path):
    from gpflow_fed.cli import main
    from gpflow_fed.federated.runtimes.flower.commands import free_port

    pytest.importorskip("flwr")
    assert main(["datasets", "--write-party-examples", str(tmp_path / "hospitals")]) == 0
    family = _cli(
        tmp_path, "flower", "party", "--csv", str(tmp_path / "hospitals" / "north.csv"), "--target", "los",
        "--client-index", "0", "--superlink", f"127.0.0.1:{free_port()}", "--port", str(free_port()), "--no-roster",
    )  # fmt: skip
    party = family.children[0]
    try:
        # the party, its SuperNode and the SuperNode's flower-superexec (no SuperLink: it keeps retrying)
        _wait_for(lambda: any("flower-superexec" in n for n in _names(family)), 120, "the SuperNode starts")
        assert len(family.look()) == 3  # the party's session, its worker's and its SuperNode's
        party.send_signal(signal.SIGTERM)
        assert party.wait(timeout=30) == 128 + signal.SIGTERM
        assert family.alive() == []  # nothing left of either session
    finally:
        family.stop()
    out = (tmp_path / "cli.log").read_text()
    assert "party 0: stopped (SIGTERM); its SuperNode and the 3 process(es) it ran have ended" in out


@pytest.mark.skipif(not LINUX, reason="the processes are read from /proc (Linux)")
def test_ctrl_c_on_the_server_ends_the_superlink_its_superexec_and_the_run(tmp_path):
    from gpflow_fed.federated.runtimes.flower.commands import free_port

    pytest.importorskip("flwr")
    family = _cli(
        tmp_path, "flower", "server", "--clients", "2", "--save", str(tmp_path / "model.npz"), "--port",
        str(free_port()), "--workdir", str(tmp_path / "server"),
    )  # fmt: skip
    server = family.children[0]
    try:
        # the SuperLink, its flower-superexec (a session of its own) and the run's submission
        _wait_for(lambda: any("flwr run" in n for n in _names(family)), 120, "the server submits its run")
        assert len(family.look()) >= 4  # the command's, the SuperLink's, its superexec's and flwr run's sessions
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=30) == 128 + signal.SIGINT
        assert family.alive() == []
    finally:
        family.stop()
    assert "server: stopped (SIGINT); the SuperLink, the run and the" in (tmp_path / "cli.log").read_text()
