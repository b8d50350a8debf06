"""A party's worker (issue 45): its updates in one process that lives as long as the party, with the same answers
as ClientApps restarted for every message, and nobody else may ask it."""

import os
import shutil
import socket
import stat
import tempfile
import threading

import pytest

pytest.importorskip("flwr")

from flwr.app import ConfigRecord, Context, RecordDict  # noqa: E402

from gpflow_fed.federated.runtimes.flower import worker  # noqa: E402
from gpflow_fed.federated.runtimes.flower.client_app import WORKER, ClientHost  # noqa: E402
from gpflow_fed.federated.runtimes.flower.records import recorddict_to_bytes  # noqa: E402
from gpflow_fed.federated.protocol.transport import UPDATE  # noqa: E402

from tests.federated.helpers import FACTORY, flower_dataset as dataset  # noqa: E402
from tests.federated.runtimes.flower_helpers import assert_matches_local, loopback, task_identity  # noqa: E402,F401

pytestmark = pytest.mark.usefixtures("nearest_rounding")


class Worker:
    """A party's worker on a thread of this process: a resident ClientHost serving a private folder; it counts the
    requests it answered and their stages, and stops after ``limit`` of them (None: never)."""

    def __init__(self, limit=None):
        self.folder = tempfile.mkdtemp(prefix="gpflow-fed-test-worker-")
        self.host = ClientHost(resident=True)
        self.stages, self.limit = [], limit
        self._stop = threading.Event()
        self.thread = threading.Thread(
            target=worker.serve, args=(self.folder, self.answer), kwargs={"stop": self._stop.is_set, "tick": 0.02}
        )
        self.thread.start()
        while not os.path.exists(os.path.join(self.folder, worker.KEY_FILE)):
            self._stop.wait(0.01)

    def answer(self, content, context):
        from gpflow_fed.federated.runtimes.flower.records import recorddict_to_request

        self.stages.append(recorddict_to_request(content)[0].stage)
        reply = self.host.answer(content, context)
        if self.limit is not None and len(self.stages) >= self.limit:
            self._stop.set()
        return reply

    def close(self):
        self._stop.set()
        self.thread.join()
        shutil.rmtree(self.folder, ignore_errors=True)


ROUNDS = 3


@pytest.fixture(scope="module")
def local():
    """The run every Flower path must give: LocalRuntime, same seed (the restarted ClientApps' equality with it is
    ``test_flower.py``'s)."""
    from gpflow_fed.federated import LocalRuntime, run
    from gpflow_fed.federated.protection.encoder import ClientEncoder

    from tests.federated.helpers import fsgp

    ds = dataset()
    ClientEncoder.INSECURE_NEAREST_ROUNDING = True  # the nearest_rounding fixture's, for this module's fixture
    try:
        result = run(fsgp({"rounds": ROUNDS}), ds, runtime=LocalRuntime(), seed=4)
    finally:
        ClientEncoder.INSECURE_NEAREST_ROUNDING = False
    return result, ds


def _run(tmp_path, task_identity, workers):
    """The ServerApp over restarted ClientApps (two parties), each forwarding its updates to its worker; the result
    as read back, and the grid."""
    from gpflow_fed.federated.runtimes.flower.deploy import read_result
    from gpflow_fed.federated.runtimes.flower.server_app import app as server_app

    ds = dataset()
    config = {"algorithm": FACTORY, "seed": 4, "rounds": ROUNDS, "output": str(tmp_path / "out"), "num-clients": 2}
    grid, test = loopback(tmp_path, ds, config, task_identity)
    for context in grid.contexts.values():
        index = int(context.node_config["client-index"])
        context.node_config = {**context.node_config, WORKER: workers[index].folder}
    config["test-data"] = test
    server_app(grid, Context(run_id=task_identity, node_id=1, node_config={}, state=RecordDict(), run_config=config))
    return read_result(str(tmp_path / "out")), grid


def _same_run(ours, local):
    result, ds = local
    assert_matches_local(ours, result, ds.test[0])


def _updates(ledger, client="client_0"):
    return sum(e["sender"] == "server" and e["receiver"] == client and "/secagg/" not in e["phase"] for e in ledger)


def test_workers_answer_every_update_and_the_run_is_the_local_run(tmp_path, task_identity, local):
    """Secure FSGP (3 rounds and the final phase) with each party's updates in its worker equals LocalRuntime's run
    (as restarted ClientApps do); every update went to the worker and nothing else did (the secure-aggregation
    stages are answered by the ClientApp process, without TensorFlow)."""
    workers = [Worker(), Worker()]
    try:
        ours, grid = _run(tmp_path, task_identity, workers)
    finally:
        for w in workers:
            w._stop.set()
            w.thread.join()
    _same_run(ours, local)
    updates = _updates(ours["record"]["ledger"])
    assert updates == ROUNDS + 1
    for w in workers:
        assert w.stages == [UPDATE] * updates
        assert len(w.host.live) == 1  # one job, its endpoint kept between messages
    for context in grid.contexts.values():  # the encoder lives in the party's Context.state, not in the worker
        assert "gpflow-fed.encoder" in context.state.config_records
        assert dict(context.state.config_records["gpflow-fed.updates"]) == {"train": updates}
    for w in workers:  # the worker removed its key and socket when it stopped
        assert os.listdir(w.folder) == []
        w.close()


def test_a_worker_that_stops_or_misses_an_update_changes_nothing(tmp_path, task_identity, local):
    """Party 1's worker stops after its first update (its ClientApps answer the rest themselves, from the state
    folder the worker kept); party 0's second update finds no worker, so its worker's live endpoint is one update
    behind Context.state's count (its Adam state one round old) and is rebuilt from the state folder before the
    third round: the same run."""
    first, stopping = Worker(), Worker(limit=1)
    real_forward = worker.forward
    calls = []

    def flaky_forward(folder, content, context):
        if folder == first.folder:
            calls.append(1)
            if len(calls) == 2:
                return None  # as if its worker were not up: the ClientApp answers
        return real_forward(folder, content, context)

    worker.forward = flaky_forward
    try:
        ours, _ = _run(tmp_path, task_identity, [first, stopping])
    finally:
        worker.forward = real_forward
        first.close()
        stopping.close()
    _same_run(ours, local)
    assert len(calls) == ROUNDS + 1 and first.stages == [UPDATE] * ROUNDS and stopping.stages == [UPDATE]


def _raw_request(folder, key):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(os.path.join(folder, worker.SOCKET_FILE))
        conn.sendall(key)
        context = Context(run_id=1, node_id=2, node_config={}, state=RecordDict(), run_config={})
        try:
            worker._send_frames(conn, worker._context_bytes(context), recorddict_to_bytes(RecordDict()))
            conn.settimeout(5)
            return conn.recv(1024)
        except (BrokenPipeError, ConnectionResetError):  # closed unanswered
            return b""


def test_the_worker_answers_only_its_key_in_a_private_folder(tmp_path, request):
    """The socket and key file are 0600 in a 0700 folder; a request with another key, or with the key and frames it
    cannot parse, gets nothing (the connection closes unanswered, the worker keeps serving); a folder others may
    enter, a link or a file is refused on both sides; no worker: None."""
    calls = []

    def answer(content, context):
        calls.append(1)
        context.state["seen"] = ConfigRecord({"n": len(calls)})
        return RecordDict({"echo": ConfigRecord({"n": len(calls)})})

    folder = tempfile.mkdtemp(prefix="gpflow-fed-test-worker-")
    stop = threading.Event()
    thread = threading.Thread(target=worker.serve, args=(folder, answer), kwargs={"stop": stop.is_set, "tick": 0.02})
    thread.start()
    try:
        while not os.path.exists(os.path.join(folder, worker.KEY_FILE)):
            stop.wait(0.01)
        for name in (worker.SOCKET_FILE, worker.KEY_FILE):
            assert stat.S_IMODE(os.lstat(os.path.join(folder, name)).st_mode) == 0o600
        with open(os.path.join(folder, worker.KEY_FILE), "rb") as f:
            key = f.read()
        assert len(key) == worker.KEY_BYTES
        assert _raw_request(folder, bytes(b ^ 1 for b in key)) == b"" and calls == []
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:  # the key, then frames it cannot parse
            conn.connect(os.path.join(folder, worker.SOCKET_FILE))
            conn.sendall(key)
            worker._send_frames(conn, b"\xff" * 7, b"not a record")
            conn.settimeout(5)
            try:
                answered = conn.recv(1024)
            except ConnectionResetError:  # closed with the second frame unread
                answered = b""
            assert answered == b""  # closed unanswered; the worker serves the next request
        assert _raw_request(folder, key) != b"" and calls == [1]
        context = Context(run_id=1, node_id=2, node_config={}, state=RecordDict(), run_config={})
        reply = worker.forward(folder, RecordDict(), context)
        assert reply is not None and reply.config_records["echo"]["n"] == 2
        assert context.state.config_records["seen"]["n"] == 2  # the state comes back with the reply
        os.chmod(folder, 0o750)
        with pytest.raises(ValueError, match="open to other users"):
            worker.forward(folder, RecordDict(), context)
        os.chmod(folder, 0o700)
    finally:
        stop.set()
        thread.join()
    request.addfinalizer(lambda: shutil.rmtree(folder, ignore_errors=True))
    link = tmp_path / "link"
    link.symlink_to(folder)
    with pytest.raises(ValueError, match="symbolic link"):
        worker.forward(str(link), RecordDict(), context)
    os.chmod(tmp_path, 0o755)
    with pytest.raises(ValueError, match="open to other users"):
        worker.serve(str(tmp_path), answer)
    assert worker.forward(folder, RecordDict(), context) is None  # stopped: the ClientApp answers itself
    assert worker.forward(str(tmp_path / "missing"), RecordDict(), context) is None


def test_flower_party_starts_its_worker_in_a_private_folder_and_removes_it(tmp_path, monkeypatch, capsys):
    """``gpflow-fed flower party`` names a fresh 0700 folder in its node config, starts the worker on it in the
    party's process family (with the SuperNode's environment), and removes the folder when it ends."""
    from gpflow_fed.cli import main
    from gpflow_fed.federated.runtimes.flower import lifetime
    from gpflow_fed.federated.runtimes.flower.commands import parse_address  # noqa: F401 - the CLI's own
    from flwr.common.config import parse_config_args

    seen = {}

    def serve_party(family, command, env, superlink, **kwargs):
        config = parse_config_args([command[command.index("--node-config") + 1]])
        folder = config[WORKER]
        seen.update(folder=folder, worker=kwargs["worker"], mode=stat.S_IMODE(os.lstat(folder).st_mode))
        return 0

    monkeypatch.setattr(lifetime, "serve_party", serve_party)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    rows = "\n".join(f"{x},{2 * x + 1}" for x in range(12))
    (tmp_path / "party.csv").write_text("x,y\n" + rows + "\n")
    argv = ["flower", "party", "--csv", str(tmp_path / "party.csv"), "--target", "y", "--client-index", "0",
            "--superlink", "127.0.0.1:9", "--no-roster"]  # fmt: skip
    assert main(argv) == 0
    assert seen["mode"] == 0o700 and seen["worker"] == worker.worker_command(seen["folder"])
    assert seen["worker"][1:3] == ["-m", "gpflow_fed.federated.runtimes.flower.resident"]
    assert not os.path.exists(seen["folder"])


def test_a_partys_superexec_looks_for_work_every_fifth_of_a_second():
    """Flower's SuperExec looks for a message to start a ClientApp for every second by default; a party's every
    0.2 s, unless its operator's environment says otherwise (and always offline)."""
    from gpflow_fed.federated.runtimes.flower.commands import SUPEREXEC_POLL_ENV, party_environment

    env = party_environment("/opt/venv/bin/flower-supernode", {"PATH": "/usr/bin"})
    assert env[SUPEREXEC_POLL_ENV] == "0.2" and env["FLWR_TELEMETRY_ENABLED"] == "0"
    assert env["PATH"].split(os.pathsep)[0] == "/opt/venv/bin"
    assert party_environment("/opt/venv/bin/flower-supernode", {SUPEREXEC_POLL_ENV: "1.0"})[SUPEREXEC_POLL_ENV] == "1.0"
