"""Attacks by someone who can write to the checkpoint directory, and resumes that do not belong to the run.

Each attack must end in a ``ValueError`` that names the file (or the setting, or the client) and the problem,
before any state is used; no module named in a file is imported.
"""

import json
import os
import shutil
import sys

import gpflow
import numpy as np
import pytest

from gpflow_fed.data import FederatedDataset
from gpflow_fed.federated import LocalRuntime, RunOptions, run
from gpflow_fed.federated.algorithms import FSGP
from gpflow_fed.federated.engine.checkpoint import MANIFEST, POINTER, write_manifest, latest_checkpoint

from tests.federated.helpers import FederatedMean


def _data(shift: float = 0.0, sizes=(6, 5, 7)) -> FederatedDataset:
    rng = np.random.default_rng(0)
    return FederatedDataset([(rng.normal(size=(n, 1)), rng.normal(size=(n, 1)) + shift) for n in sizes])


def _checkpointed(tmp_path, rounds: int = 2):
    directory = tmp_path / "ckpt"
    run(FederatedMean(rounds), _data(), runtime=LocalRuntime(options=RunOptions(checkpoint_dir=directory)), seed=1)
    return directory, latest_checkpoint(str(directory))


def _resume(directory, rounds: int = 2, data=None):
    return run(
        FederatedMean(rounds),
        data or _data(),
        runtime=LocalRuntime(options=RunOptions(checkpoint_dir=directory, resume=True)),
        seed=1,
    )


def _files(path):
    return sorted(
        os.path.relpath(os.path.join(r, f), path).replace(os.sep, "/") for r, _, fs in os.walk(path) for f in fs
    )


@pytest.mark.usefixtures("nearest_rounding")  # compared with a run or encoding bit for bit
def test_untampered_checkpoint_resumes(tmp_path):
    directory, path = _checkpointed(tmp_path)
    assert {"run.json", "arrays.npz", MANIFEST, "clients/client_0.json"} <= set(_files(path))
    assert any(f.startswith("tf/") for f in _files(path))
    assert _resume(directory).state == run(FederatedMean(2), _data(), seed=1).state


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete", "append"])
def test_every_file_tampered_is_named(tmp_path, damage):
    directory, path = _checkpointed(tmp_path)
    for name in _files(path):
        victim = os.path.join(path, name)
        original = open(victim, "rb").read()
        if damage == "truncate":
            open(victim, "wb").write(original[: len(original) // 2])
        elif damage == "flip":
            data = bytearray(original)
            data[len(data) // 2] ^= 0x01
            open(victim, "wb").write(bytes(data))
        elif damage == "append":
            open(victim, "ab").write(b"\x00")
        else:
            os.remove(victim)
        with pytest.raises(ValueError) as exc:
            _resume(directory)
        message = str(exc.value)
        assert path in message
        # a damaged manifest may surface as a mismatch of the file whose record changed: both are named
        assert name in message or (name == MANIFEST and "manifest.json" in message), (name, damage, message)
        open(victim, "wb").write(original)
    _resume(directory)  # restored: resumes again


def test_an_added_file_or_a_symlink_is_refused(tmp_path):
    directory, path = _checkpointed(tmp_path)
    extra = os.path.join(path, "tf", "objects.data-00001-of-00002")
    open(extra, "wb").write(b"payload")
    with pytest.raises(ValueError, match=r"tf/objects.data-00001-of-00002 is not listed in manifest.json"):
        _resume(directory)
    os.remove(extra)
    outside = tmp_path / "elsewhere.json"
    outside.write_text("{}")
    os.symlink(outside, os.path.join(path, "clients", "client_9.json"))
    with pytest.raises(ValueError, match=r"clients/client_9.json is a symbolic link"):
        _resume(directory)


@pytest.mark.parametrize(
    "latest", ["../outside", "/tmp", "round-1/../../outside", "round-1/run.json", "round-x", 17, None, "round-7"]
)
def test_latest_must_name_a_round_inside_the_directory(tmp_path, latest):
    directory, _ = _checkpointed(tmp_path)
    (tmp_path / "outside").mkdir()
    (directory / POINTER).write_text(json.dumps({"latest": latest}))
    with pytest.raises(ValueError, match=r"checkpoint\.json names .*(not a round-<r> folder|missing from)"):
        _resume(directory)


def test_latest_may_not_be_a_symlink_out_of_the_directory(tmp_path):
    directory, path = _checkpointed(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(path, elsewhere)  # a valid checkpoint, but outside checkpoint_dir
    os.symlink(elsewhere, directory / "round-9")
    (directory / POINTER).write_text(json.dumps({"latest": "round-9"}))
    with pytest.raises(ValueError, match="which leads outside"):
        _resume(directory)
    (directory / POINTER).write_text("{not json")
    with pytest.raises(ValueError, match=r"checkpoint\.json is unreadable or malformed"):
        _resume(directory)


def _rewrite_state(path, node):
    """The attacker rewrites run.json's state and the manifest consistently (the manifest is no signature)."""
    record = json.load(open(os.path.join(path, "run.json")))
    record["state"] = node
    json.dump(record, open(os.path.join(path, "run.json"), "w"))
    os.remove(os.path.join(path, MANIFEST))
    write_manifest(path)


@pytest.mark.parametrize(
    "cls",
    [
        "subprocess:Popen",
        "this:Anything",
        "builtins:eval",
        "os:system",
        "gpflow_fed.not_a_module:State",
        "gpflow_fed.federated.engine.checkpoint:json",
        "gpflow_fed:__class__",
        "a b:c",
    ],
)
def test_only_allowed_state_classes_are_instantiated(tmp_path, cls):
    directory, path = _checkpointed(tmp_path)
    node = {"t": "dataclass", "cls": cls, "fields": {"args": {"t": "value", "v": "touch /tmp/pwned"}}}
    _rewrite_state(path, node)
    before = set(sys.modules)
    with pytest.raises(ValueError, match="not an allowed state class|not a class name"):
        _resume(directory)
    assert "this" not in sys.modules and "gpflow_fed.not_a_module" not in sys.modules
    assert not {m for m in set(sys.modules) - before if m.startswith(("this", "gpflow_fed.not_a"))}


def test_malformed_state_is_a_value_error(tmp_path):
    directory, path = _checkpointed(tmp_path)
    for node in (
        {"t": "array", "k": "missing"},
        {"t": "value", "v": {"nested": 1}},
        {"t": "dict", "items": 3},
        {"t": "pickle", "v": ""},
        ["not", "a", "node"],
    ):
        _rewrite_state(path, node)
        with pytest.raises(ValueError, match="checkpoint"):
            _resume(directory)


def test_a_two_round_algorithm_cannot_resume_a_four_round_checkpoint(tmp_path):
    directory, _ = _checkpointed(tmp_path, rounds=4)
    with pytest.raises(ValueError, match=r"other settings: rounds: int:4 in the checkpoint, int:2 now"):
        _resume(directory, rounds=2)


def test_resume_with_other_data_names_the_client(tmp_path):
    directory, _ = _checkpointed(tmp_path)
    with pytest.raises(ValueError, match=r"other data: client client_1 had 5 rows, now 4"):
        _resume(directory, data=_data(sizes=(6, 4, 7)))
    rng = np.random.default_rng(0)
    clients = [(rng.normal(size=(n, 1)), rng.normal(size=(n, 1))) for n in (6, 5, 7)]
    clients[2] = (clients[2][0], clients[2][1] + 1e-12)  # same size, values differ in the last bits
    with pytest.raises(ValueError, match=r"other data: client client_2's 7 rows have other values"):
        _resume(directory, data=FederatedDataset(clients))


def test_client_parts_hold_a_key_the_server_record_does_not(tmp_path):
    directory, path = _checkpointed(tmp_path)
    part = json.load(open(os.path.join(path, "clients", "client_0.json")))
    assert len(bytes.fromhex(part["key"])) == 32 and part["num_data"] == 6
    assert part["key"] not in open(os.path.join(path, "run.json")).read()
    # each checkpoint draws fresh keys from the OS: the same data give unrelated digests
    directory2, path2 = _checkpointed(tmp_path / "again")
    other = json.load(open(os.path.join(path2, "clients", "client_0.json")))
    assert other["key"] != part["key"] and other["digest"] != part["digest"]


def test_fsgp_resume_with_another_learning_rate_or_kernel_is_refused(tmp_path):
    rng = np.random.default_rng(2)
    data = FederatedDataset([(x, np.sin(x)) for x in (rng.uniform(-2, 2, (12, 1)) for _ in range(2))])
    Z = np.linspace(-1.5, 1.5, 3)[:, None]

    def fsgp(learning_rate=0.05, lengthscale=1.0):
        return FSGP(
            gpflow.kernels.SquaredExponential(lengthscales=lengthscale),
            Z,
            0.1,
            rounds=1,
            local_steps=1,
            learning_rate=learning_rate,
        )

    directory = tmp_path / "ckpt"
    run(fsgp(), data, runtime=LocalRuntime(options=RunOptions(checkpoint_dir=directory)), seed=0)
    resume = LocalRuntime(options=RunOptions(checkpoint_dir=directory, resume=True))
    with pytest.raises(ValueError, match=r"learning_rate: float:0.05 in the checkpoint, float:0.1 now"):
        run(fsgp(learning_rate=0.1), data, runtime=resume, seed=0)
    with pytest.raises(ValueError, match=r"kernel\.lengthscales: array"):
        run(fsgp(lengthscale=2.0), data, runtime=resume, seed=0)
    run(fsgp(), data, runtime=resume, seed=0)  # the same settings resume


def _rewrite_file(path, name, text):
    with open(os.path.join(path, name), "w") as f:
        f.write(text)
    os.remove(os.path.join(path, MANIFEST))
    write_manifest(path)


def test_client_parts_rewritten_with_a_consistent_manifest(tmp_path):
    directory, path = _checkpointed(tmp_path)
    part0 = open(os.path.join(path, "clients", "client_0.json")).read()
    part1 = open(os.path.join(path, "clients", "client_1.json")).read()
    _rewrite_file(path, "clients/client_0.json", part1)  # another client's part
    with pytest.raises(ValueError, match=r"clients/client_0.json belongs to client 'client_1', not 'client_0'"):
        _resume(directory)
    forged = json.loads(part0)
    forged["digest"] = "é" * 64  # not even hex
    _rewrite_file(path, "clients/client_0.json", json.dumps(forged))
    with pytest.raises(ValueError, match=r"client client_0's 6 rows have other values"):
        _resume(directory)
    _rewrite_file(path, "clients/client_0.json", "[]")
    with pytest.raises(ValueError, match=r"clients/client_0.json is malformed"):
        _resume(directory)
    _rewrite_file(path, "clients/client_0.json", part0)
    _resume(directory)


def test_a_forged_manifest_entry_is_a_value_error(tmp_path):
    directory, path = _checkpointed(tmp_path)
    manifest = json.load(open(os.path.join(path, MANIFEST)))
    manifest["files"]["run.json"]["sha256"] = "é" * 64
    json.dump(manifest, open(os.path.join(path, MANIFEST), "w"))
    with pytest.raises(ValueError, match=r"run.json does not match its SHA-256"):
        _resume(directory)
    json.dump({"files": {"run.json": 3}}, open(os.path.join(path, MANIFEST), "w"))
    with pytest.raises(ValueError, match=r"manifest.json is malformed"):
        _resume(directory)


def test_a_subclass_setting_is_fingerprinted_without_declaring_it(tmp_path):
    """FederatedMean adds its own constructor setting (fail_client); the fingerprint covers it for free."""
    directory, _ = _checkpointed(tmp_path)
    resume = LocalRuntime(options=RunOptions(checkpoint_dir=directory, resume=True))
    with pytest.raises(ValueError, match=r"fail_client: str:'' in the checkpoint, str:'nobody' now"):
        run(FederatedMean(2, fail_client="nobody"), _data(), runtime=resume, seed=1)
