"""Attacks on the files a run writes, by another local user (issue 32, finding 7).

The attacker can write into the checkpoint folder (a shared folder) and plants links at the names the writer uses, or
swaps the folder for a link while it is written; or reads what the run leaves behind; or uses the Flower client's state
folder. Each attack must either fail without touching the file it aims at, or end in a ``ValueError`` that says what is
wrong; everything written is private (files 0600, folders 0700) whatever the umask.
"""

import io
import os
import stat

import numpy as np
import pytest
import tensorflow as tf

from gpflow_fed.data import FederatedDataset
from gpflow_fed.federated import Client, LocalRuntime, RunOptions, run
from gpflow_fed.federated.engine.checkpoint import POINTER, latest_checkpoint

from tests.federated.helpers import FederatedMean
from tests.federated.runtimes.flower_helpers import task_identity  # noqa: F401  (a fixture)

PRECIOUS = b"the user's own file\n"


def _data() -> FederatedDataset:
    rng = np.random.default_rng(0)
    return FederatedDataset([(rng.normal(size=(n, 1)), rng.normal(size=(n, 1))) for n in (6, 5, 7)])


def _run(directory, rounds: int = 2, resume: bool = False):
    return run(
        FederatedMean(rounds),
        _data(),
        runtime=LocalRuntime(options=RunOptions(checkpoint_dir=directory, resume=resume)),
        seed=1,
    )


def _victims(tmp_path):
    """A file and a folder of the user's that the attacker wants overwritten or filled."""
    victim = tmp_path / "victim.txt"
    victim.write_bytes(PRECIOUS)
    folder = tmp_path / "victim_folder"
    folder.mkdir()
    (folder / "keep.txt").write_bytes(PRECIOUS)
    return victim, folder


def _untouched(victim, folder):
    assert victim.read_bytes() == PRECIOUS
    assert sorted(os.listdir(folder)) == ["keep.txt"] and (folder / "keep.txt").read_bytes() == PRECIOUS


def _entries(path):
    """``{relative name: lstat}`` of everything below ``path``."""
    found = {}
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            full = os.path.join(root, name)
            found[os.path.relpath(full, path)] = os.lstat(full)
    return found


def _assert_private(path):
    """``path`` and everything below it: folders 0700, files 0600, no link."""
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o700, path
    for name, st in _entries(path).items():
        assert not stat.S_ISLNK(st.st_mode), name
        expected = 0o700 if stat.S_ISDIR(st.st_mode) else 0o600
        assert stat.S_IMODE(st.st_mode) == expected, (name, oct(st.st_mode))


@pytest.fixture
def open_umask():
    """Run with umask 0: the writer must not rely on the user's umask for privacy."""
    previous = os.umask(0)
    yield
    os.umask(previous)


@pytest.mark.usefixtures("nearest_rounding")  # compared with a run or encoding bit for bit
def test_a_planted_pointer_tmp_link_does_not_overwrite_its_target(tmp_path):
    """The reported attack: ``checkpoint.json.tmp`` -> a file of the user's. The old writer opened the name and
    overwrote the target with the pointer's JSON."""
    victim, folder = _victims(tmp_path)
    directory = tmp_path / "ckpt"
    directory.mkdir()
    os.symlink(victim, directory / "checkpoint.json.tmp")
    _run(directory)
    _untouched(victim, folder)
    assert _run(directory, resume=True).state == run(FederatedMean(2), _data(), seed=1).state


@pytest.mark.usefixtures("nearest_rounding")  # compared with a run or encoding bit for bit
def test_links_planted_at_every_name_the_writer_uses_are_never_followed(tmp_path):
    """Links at the pointer, its temporary name, the round folders, and (in a round folder planted beforehand) at
    every file and folder a checkpoint holds: the run succeeds, every link is replaced, the targets are untouched."""
    victim, folder = _victims(tmp_path)
    directory = tmp_path / "ckpt"
    directory.mkdir()
    os.symlink(victim, directory / "checkpoint.json.tmp")
    os.symlink(victim, directory / POINTER)
    os.symlink(folder, directory / "round-0")
    os.symlink(folder, directory / "round-00")  # a round name too: pruned as the oldest, by unlinking it
    planted = directory / "round-1"
    planted.mkdir()
    for name in ("run.json", "arrays.npz", "manifest.json", "tf", "clients"):
        os.symlink(victim if "." in name else folder, planted / name)
    _run(directory)
    _untouched(victim, folder)
    assert os.path.isfile(directory / POINTER) and not os.path.islink(directory / POINTER)
    assert not os.path.islink(directory / "round-1")
    assert not any(stat.S_ISLNK(st.st_mode) for st in _entries(directory / "round-1").values())
    assert latest_checkpoint(str(directory)) == str(directory / "round-1")
    assert _run(directory, resume=True).state == run(FederatedMean(2), _data(), seed=1).state


def test_a_folder_swapped_for_a_link_while_it_is_written_is_not_followed(tmp_path, monkeypatch):
    """The attacker renames the checkpoint folder away and puts a link to the user's folder in its place while the
    writer is in the middle of a checkpoint. The writer keeps writing into the folder it opened; the next checkpoint
    finds the link and refuses. (The old writer followed the new link: the checkpoint landed in the user's folder.)"""
    victim, folder = _victims(tmp_path)
    directory, moved = tmp_path / "ckpt", tmp_path / "moved"
    write = tf.train.Checkpoint.write
    swapped = []

    def attacker_swaps_then_write(self, file_prefix, options=None):
        if not swapped:
            os.rename(directory, moved)
            os.symlink(folder, directory)
            swapped.append(True)
        return write(self, file_prefix, options=options)

    monkeypatch.setattr(tf.train.Checkpoint, "write", attacker_swaps_then_write)
    with pytest.raises(ValueError, match=r"checkpoint_dir .*ckpt is a symbolic link"):
        _run(directory)
    _untouched(victim, folder)
    assert latest_checkpoint(str(moved)) == str(moved / "round-0")  # the first checkpoint completed where it began


def test_a_name_that_cannot_be_replaced_is_a_clear_refusal(tmp_path):
    """A non-empty folder planted at ``checkpoint.json`` cannot be renamed over: the run refuses, naming it."""
    directory = tmp_path / "ckpt"
    (directory / POINTER).mkdir(parents=True)
    (directory / POINTER / "x").write_bytes(b"")
    with pytest.raises(ValueError, match=r"cannot replace checkpoint\.json in .*ckpt .*give each run a folder"):
        _run(directory)
    assert not [n for n in os.listdir(directory) if n.startswith(".")]  # no staging or temporary file left


def test_checkpoints_are_private_whatever_the_umask(tmp_path, open_umask):
    """A checkpoint holds client state and keyed digests of client data: folders 0700, files 0600 (the old writer
    left them world-readable)."""
    directory = tmp_path / "new" / "ckpt"
    _run(directory, rounds=3)
    _assert_private(directory)
    assert sorted(os.listdir(directory)) == [POINTER, "round-1", "round-2"]  # no staging or temporary name left


def test_an_existing_checkpoint_dir_keeps_its_mode_and_its_contents_are_private(tmp_path, open_umask):
    directory = tmp_path / "shared"
    directory.mkdir(mode=0o755)
    _run(directory)
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o755
    for name in os.listdir(directory):
        path = directory / name
        if path.is_dir():
            _assert_private(path)
        else:
            assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600


def test_a_failed_write_leaves_no_staging_folder(tmp_path, monkeypatch):
    def fails(self, file_prefix, options=None):
        raise OSError("disk full")

    monkeypatch.setattr(tf.train.Checkpoint, "write", fails)
    with pytest.raises(OSError, match="disk full"):
        _run(tmp_path / "ckpt")
    assert os.listdir(tmp_path / "ckpt") == []


@pytest.mark.parametrize("form", ["link", "link/", "file"])
def test_a_symlinked_or_non_folder_checkpoint_dir_is_refused(tmp_path, form):
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    if form == "file":
        link.write_bytes(PRECIOUS)
    else:
        os.symlink(real, link)
    path = str(link) + ("/" if form.endswith("/") else "")
    message = "exists and is not a folder" if form == "file" else "is a symbolic link; give the folder itself"
    with pytest.raises(ValueError, match=rf"checkpoint_dir .*link {message}"):
        _run(path)
    with pytest.raises(ValueError, match=rf"checkpoint_dir .*link {message}"):
        _run(path, resume=True)
    assert os.listdir(real) == []
    assert form != "file" or link.read_bytes() == PRECIOUS


def test_another_users_checkpoint_dir_is_refused(tmp_path, monkeypatch):
    directory = tmp_path / "theirs"
    directory.mkdir()
    owner = os.stat(directory).st_uid
    monkeypatch.setattr(os, "geteuid", lambda: owner + 1)  # as if this process ran as another user
    with pytest.raises(ValueError, match=rf"checkpoint_dir .*theirs belongs to another user \(uid {owner}\)"):
        _run(directory)
    with pytest.raises(ValueError, match="belongs to another user"):
        _run(directory, resume=True)
    assert os.listdir(directory) == []


# --- the Flower client's state between messages ---------------------------------------------------------------------


def _context(node_config=None, run_id=7, node_id=1001):
    from flwr.app import Context, RecordDict

    return Context(
        run_id=run_id, node_id=node_id, node_config=dict(node_config or {}), state=RecordDict(), run_config={}
    )


def test_flower_state_defaults_to_a_private_per_user_folder(tmp_path, monkeypatch):
    """Not the shared ``/tmp/gpflow_fed_flower`` the old client used: ``$XDG_CACHE_HOME`` or ``~/.cache``, 0700."""
    from gpflow_fed.federated.runtimes.flower.client_app import _state_dir

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = tmp_path / "cache" / "gpflow_fed" / "flower"
    assert _state_dir(_context(), "client_0") == str(root / "run-7" / "node-1001-client_0")
    for folder in (root, root / "run-7", root / "run-7" / "node-1001-client_0"):
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # the XDG spec: a relative path is ignored
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    home = tmp_path / "home" / ".cache" / "gpflow_fed" / "flower"
    assert _state_dir(_context(), "client_1") == str(home / "run-7" / "node-1001-client_1")
    assert stat.S_IMODE(os.stat(home).st_mode) == 0o700


def test_a_loose_default_state_folder_is_made_private(tmp_path, monkeypatch):
    from gpflow_fed.federated.runtimes.flower.client_app import _state_dir

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    (tmp_path / "gpflow_fed" / "flower" / "run-7").mkdir(parents=True, mode=0o777)
    os.chmod(tmp_path / "gpflow_fed" / "flower", 0o777)
    os.chmod(tmp_path / "gpflow_fed" / "flower" / "run-7", 0o755)
    _state_dir(_context(), "client_0")
    for folder in ("flower", "flower/run-7"):
        assert stat.S_IMODE(os.stat(tmp_path / "gpflow_fed" / folder).st_mode) == 0o700


@pytest.mark.parametrize("where", ["state-dir", "default root", "run folder", "node folder"])
def test_a_symlinked_state_folder_is_refused(tmp_path, monkeypatch, where):
    from gpflow_fed.federated.runtimes.flower.client_app import _state_dir

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    state = tmp_path / "state"
    config = {"state-dir": str(state)}
    if where == "state-dir":
        os.symlink(elsewhere, state)
    elif where == "default root":
        config = {}
        (tmp_path / "cache" / "gpflow_fed").mkdir(parents=True)
        os.symlink(elsewhere, tmp_path / "cache" / "gpflow_fed" / "flower")
    elif where == "run folder":
        state.mkdir()
        os.symlink(elsewhere, state / "run-7")
    else:
        (state / "run-7").mkdir(parents=True)
        os.symlink(elsewhere, state / "run-7" / "node-1001-client_0")
    with pytest.raises(ValueError, match="is a symbolic link; give the folder itself"):
        _state_dir(_context(config), "client_0")
    assert os.listdir(elsewhere) == []


def test_another_users_state_dir_is_refused(tmp_path, monkeypatch):
    from gpflow_fed.federated.runtimes.flower.client_app import _state_dir

    owner = os.stat(tmp_path).st_uid
    monkeypatch.setattr(os, "geteuid", lambda: owner + 1)
    with pytest.raises(ValueError, match=r"node config state-dir .* belongs to another user"):
        _state_dir(_context({"state-dir": str(tmp_path)}), "client_0")


def _client(value):
    client = Client("client_0", (np.zeros((3, 1)), np.zeros((3, 1))), seed=1)
    client.state["factor"] = np.full(4, float(value))
    client.state["weights"] = tf.Variable(np.full(2, float(value)))
    return client


def test_client_state_is_private_and_planted_links_are_not_followed(tmp_path, monkeypatch, open_umask):
    """Links planted in the node's folder (the old default was a shared ``/tmp`` folder that anyone could prepare) at
    every name the client writes: replaced, never followed; files 0600, folders 0700; the state restores."""
    from gpflow_fed.federated.runtimes.flower.client_app import _restore_client, _save_client, _state_dir

    victim, folder = _victims(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    directory = _state_dir(_context(), "client_0")
    for name in ("client.json", "client.json.tmp", "arrays.npz", "manifest.json"):
        os.symlink(victim, os.path.join(directory, name))
    os.symlink(folder, os.path.join(directory, "tf"))
    for value in (1.0, 2.0):  # the first save replaces the links, the second its own files
        _save_client(directory, _client(value))
        _untouched(victim, folder)
        _assert_private(directory)
        assert sorted(os.listdir(directory)) == ["arrays.npz", "client.json", "manifest.json", "tf"]
        again = Client("client_0", (np.zeros((3, 1)), np.zeros((3, 1))), seed=1)
        again.state["weights"] = tf.Variable(np.zeros(2))
        assert _restore_client(directory, again)
        np.testing.assert_array_equal(again.state["factor"], np.full(4, value))
        np.testing.assert_array_equal(again.state["weights"].numpy(), np.full(2, value))


def test_an_interrupted_client_save_is_refused_on_restore(tmp_path, monkeypatch):
    """A save that dies after removing the old manifest leaves a state the next message refuses (never half read)."""
    from gpflow_fed.federated.runtimes.flower import client_app

    directory = str(tmp_path / "node")
    client_app._save_client(directory, _client(1.0))
    calls = []
    real_rename = os.rename

    def dies_on_the_second_rename(src, dst, **kwargs):
        calls.append(dst)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_rename(src, dst, **kwargs)

    monkeypatch.setattr(os, "rename", dies_on_the_second_rename)
    with pytest.raises(KeyboardInterrupt):
        client_app._save_client(directory, _client(2.0))
    monkeypatch.undo()
    assert not [n for n in os.listdir(directory) if n.startswith(".")]
    with pytest.raises(ValueError, match="manifest.json is missing"):
        client_app._restore_client(directory, _client(0.0))


def test_no_key_reaches_the_client_state_folder(tmp_path, task_identity):  # noqa: F811
    """Secure aggregation through restartable ClientApps: each party's secrets (its private keys and self-mask seed)
    stay in Flower's ``Context.state``; no file in the state folder holds them, raw or in hex."""
    from flwr.app import Context, RecordDict

    from gpflow_fed.federated import Protection
    from gpflow_fed.federated.runtimes.flower.client_app import ENCODER_STATE
    from gpflow_fed.federated.runtimes.flower.server_app import app as server_app

    from tests.federated.helpers import FACTORY, flower_dataset
    from tests.federated.runtimes.flower_helpers import loopback

    config = {
        "algorithm": FACTORY,
        "seed": 4,
        "rounds": 1,
        "local-steps": 1,
        "output": str(tmp_path / "out"),
        "num-clients": 2,
        **Protection(secure_aggregation=True).to_config(),
    }
    grid, test = loopback(tmp_path, flower_dataset(), config, task_identity)
    config["test-data"] = test
    server_app(grid, Context(run_id=task_identity, node_id=1, node_config={}, state=RecordDict(), run_config=config))
    stored = b"".join(
        open(os.path.join(root, f), "rb").read() for root, _, files in os.walk(tmp_path / "state") for f in files
    )
    assert len(stored) > 0
    for context in grid.contexts.values():
        with np.load(io.BytesIO(bytes(context.state.config_records[ENCODER_STATE]["state"]))) as npz:
            secrets = npz["s/secrets"].tobytes()
        assert len(secrets) >= 96  # two private keys and the self-mask seed, 32 bytes each
        for i in range(0, len(secrets), 16):
            chunk = secrets[i : i + 16]
            assert chunk not in stored and chunk.hex().encode() not in stored
    _assert_private(tmp_path / "state")
