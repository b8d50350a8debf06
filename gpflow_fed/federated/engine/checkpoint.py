"""Checkpoint and resume a federated run: everything a restart needs to continue bit-for-bit.

A checkpoint after round r holds

* the server state (any nesting of dicts, lists, tuples, frozen dataclasses, numpy arrays and scalars;
  arrays go to ``arrays.npz``, the structure to ``run.json``), the round r, the server's sampling RNG
  state, the history, the ledger's entries and the privacy accountant's releases;
* every set-up client's own state, as each real client would checkpoint its own: its RNG state, and
  through ``tf.train.Checkpoint`` its ``model``, its ``optimizer`` (Adam moments and step count) and the
  TensorFlow objects in ``client.state``; plain values of ``client.state`` (arrays, numbers, nested
  containers) go to ``arrays.npz``/``run.json``. Other values (e.g. compiled functions) are rebuilt by
  ``Algorithm.setup_client`` on resume;
* the TensorFlow objects the algorithm itself holds (e.g. a server-side optimizer).

Checkpoints are written to ``<dir>/round-<r>/`` and become visible atomically: ``<dir>/checkpoint.json``
names the latest complete one and is replaced only after it is fully written. Masks and DP noise are
derived from (seed, exchange), so a resumed run draws the same ones as an uninterrupted run.

How they are written (threat model: another local user who can write into ``<dir>``, e.g. a shared folder,
and plants links or files at the names the writer uses; see :mod:`gpflow_fed.private_files`):

* ``<dir>`` is created 0700 if missing; a ``<dir>`` that is a symbolic link, not a folder, or another user's
  folder is refused with a ``ValueError`` (when a run resumes and when it writes a checkpoint). The mode
  of an existing ``<dir>`` is left as the user set it; everything the writer puts in it is private;
* a checkpoint is written into a fresh staging folder ``<dir>/.staging-round-<r>-*`` (``mkdtemp``: 0700,
  an unpredictable name nobody else can write into), its own files created 0600 with
  ``O_CREAT | O_EXCL | O_NOFOLLOW``, TensorFlow's and numpy's files set to 0600 before the folder is renamed
  to ``round-<r>``; on Linux every write goes through the open descriptor of ``<dir>``, so swapping ``<dir>``
  or the staging folder for a link mid-write cannot redirect it;
* ``checkpoint.json`` is replaced by renaming a private temporary file (``mkstemp``) over it, so no fixed
  temporary name is ever opened (a link planted at ``checkpoint.json.tmp`` is inert); whatever was planted at
  ``round-<r>`` or ``checkpoint.json``, or at an old ``round-<r>`` being pruned, is replaced or removed, never
  followed (a link is unlinked; a folder is removed with ``shutil.rmtree``, which never follows a link); a
  name that cannot be replaced is a ``ValueError``.

Not guaranteed: nothing is ``fsync``-ed (after a power failure the pointer may name the previous checkpoint,
or one whose files did not reach the disk, which the manifest refuses); a staging folder left by a crash stays
until removed; links
above ``<dir>`` are followed as the user wrote the path; the owner of ``<dir>``'s parent can still replace
``<dir>`` between runs (it is re-checked each time); root and the user's own processes are not kept out.

A checkpoint's files are not trusted on load (threat model: someone who can write to the directory):

* ``manifest.json`` lists the SHA-256 and size of every file; a missing, extra, truncated or altered file,
  or a symbolic link, raises ``ValueError`` naming the file, before anything is parsed;
* ``checkpoint.json``'s ``"latest"`` must be ``round-<r>`` and resolve inside the directory;
* a state class is instantiated only if it is allowed (:func:`decode_tree`): a dataclass defined in an
  already-imported ``gpflow_fed`` module, or a class of the algorithm's own initial state; no module is ever
  imported from a name in a file;
* ``meta["settings"]`` (:func:`~gpflow_fed.federated.protocol.fingerprint.describe_settings`) must equal the running
  algorithm's, and each client's part (``clients/<id>.json``: its size and a keyed digest of its data, with
  the key it drew from the OS) must match the client's current data; the ``ValueError`` names what differs.

The manifest detects corruption and tampering with single files; it is not a signature (someone who rewrites
every file and the manifest consistently can change values, but still cannot make the loader import code).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import hmac
import json
import os
import re
import secrets
import sys
import tempfile
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

import numpy as np
import tensorflow as tf

from ...private_files import FOLDER_MODE, check_folder, new_file, private_folder, remove, replace_file, seal
from ...untrusted_files import read_json, read_npz_arrays
from ..protocol.fingerprint import data_digest, is_trackable, settings_differences
from ..protocol.ledger import LedgerEntry

__all__ = [
    "check_client_data",
    "decode_tree",
    "encode_tree",
    "is_trackable",
    "latest_checkpoint",
    "load_checkpoint",
    "save_checkpoint",
    "state_classes",
    "verify_manifest",
]

POINTER = "checkpoint.json"
MANIFEST = "manifest.json"
CLIENTS = "clients"
#: the prefix of the private folder a checkpoint is written in before it is renamed into place
STAGING = ".staging-"
_ROUND = re.compile(r"round-\d+")
_DOTTED = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"
_CLASS_NAME = re.compile(f"{_DOTTED}:{_DOTTED}")


def encode_tree(obj: Any, arrays: Dict[str, np.ndarray]) -> Any:
    """A JSON-able description of ``obj``; its numpy arrays are put in ``arrays`` under fresh keys.

    :raises TypeError: a value that is not a plain container, dataclass, array, scalar or string.
    """
    if obj is None or isinstance(obj, (bool, str)):
        return {"t": "value", "v": obj}
    if isinstance(obj, (int, float)) and not isinstance(obj, np.generic):
        return {"t": "value", "v": obj}
    if isinstance(obj, (np.ndarray, np.generic)):
        key = f"a{len(arrays)}"
        arrays[key] = np.asarray(obj)
        return {"t": "scalar" if isinstance(obj, np.generic) else "array", "k": key}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        cls = type(obj)
        fields = {f.name: encode_tree(getattr(obj, f.name), arrays) for f in dataclasses.fields(obj) if f.init}
        return {"t": "dataclass", "cls": f"{cls.__module__}:{cls.__qualname__}", "fields": fields}
    if isinstance(obj, Mapping):
        if not all(isinstance(k, str) for k in obj):
            raise TypeError("checkpoint: only mappings with string keys can be saved")
        return {"t": "dict", "items": [[k, encode_tree(v, arrays)] for k, v in obj.items()]}
    if isinstance(obj, (list, tuple)):
        return {"t": type(obj).__name__, "items": [encode_tree(v, arrays) for v in obj]}
    raise TypeError(
        f"checkpoint: cannot save a {type(obj).__name__} in the server state; keep the state to dicts, lists, "
        "tuples, dataclasses, numpy arrays and scalars"
    )


def _class_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def state_classes(tree: Any) -> Dict[str, type]:
    """The dataclasses that occur in ``tree`` (e.g. an algorithm's initial state), by ``module:qualname``."""
    found: Dict[str, type] = {}
    if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        found[_class_name(type(tree))] = type(tree)
        for f in dataclasses.fields(tree):
            found.update(state_classes(getattr(tree, f.name)))
    elif isinstance(tree, Mapping):
        for v in tree.values():
            found.update(state_classes(v))
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            found.update(state_classes(v))
    return found


def _allowed_class(name: Any, allowed: Mapping[str, type]) -> type:
    """The class a checkpoint names, if allowed; never imports anything.

    Allowed: the classes in ``allowed``, and dataclasses defined (not merely re-exported) in a ``gpflow_fed``
    module that is already imported.
    """
    if not isinstance(name, str) or not _CLASS_NAME.fullmatch(name):
        raise ValueError(f"checkpoint: {name!r} is not a class name of the form module:qualname")
    module_name, qualname = name.split(":")
    if name in allowed:
        return allowed[name]
    refusal = (
        f"checkpoint: the state names class {name!r}, which is not an allowed state class (only "
        "dataclasses of gpflow_fed and of the algorithm's own state are); the file was altered or "
        "written by another program"
    )
    if module_name != "gpflow_fed" and not module_name.startswith("gpflow_fed."):
        raise ValueError(refusal)
    obj: Any = sys.modules.get(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if not (isinstance(obj, type) and dataclasses.is_dataclass(obj) and _class_name(obj) == name):
        raise ValueError(refusal)
    return obj


def decode_tree(node: Any, arrays: Mapping[str, np.ndarray], allowed: Optional[Mapping[str, type]] = None) -> Any:
    """The inverse of :func:`encode_tree`.

    :param allowed: extra dataclasses that may be instantiated, by ``module:qualname`` (see
        :func:`state_classes`); ``gpflow_fed``'s own dataclasses always may.
    :raises ValueError: a malformed node, a missing array or a class that is not allowed (nothing is
        imported or instantiated for it).
    """
    allowed = {} if allowed is None else allowed
    if not isinstance(node, Mapping) or "t" not in node:
        raise ValueError(f"checkpoint: malformed state node {str(node)[:80]!r}")
    kind = node["t"]
    try:
        if kind == "value":
            value = node["v"]
            if not (value is None or isinstance(value, (bool, int, float, str))):
                raise ValueError(f"checkpoint: a plain value must be a number, string or null, got {value!r}")
            return value
        if kind in ("array", "scalar"):
            if node["k"] not in arrays:
                raise ValueError(f"checkpoint: array {node['k']!r} is missing from arrays.npz")
            array = np.array(arrays[node["k"]])
            return array[()] if kind == "scalar" else array
        if kind == "dict":
            return {str(k): decode_tree(v, arrays, allowed) for k, v in node["items"]}
        if kind in ("list", "tuple"):
            items = [decode_tree(v, arrays, allowed) for v in node["items"]]
            return items if kind == "list" else tuple(items)
        if kind == "dataclass":
            cls = _allowed_class(node["cls"], allowed)
            names = {f.name for f in dataclasses.fields(cls) if f.init}
            fields = node["fields"]
            if not isinstance(fields, Mapping) or set(fields) - names:
                raise ValueError(f"checkpoint: fields {sorted(set(fields) - names)} do not belong to {node['cls']}")
            return cls(**{k: decode_tree(v, arrays, allowed) for k, v in fields.items()})
    except (KeyError, TypeError) as exc:
        raise ValueError(f"checkpoint: malformed {kind!r} node ({type(exc).__name__}: {exc})") from None
    raise ValueError(f"checkpoint: unknown node kind {kind!r}")


def _plain(obj: Any) -> bool:
    try:
        encode_tree(obj, {})
    except TypeError:
        return False
    return True


def _object_name(*parts: str) -> str:
    return "__".join(re.sub(r"[^0-9A-Za-z_]", "_", p) for p in parts)


def tracked_objects(algorithm: Any, clients: Mapping[str, Any], ready: List[str]) -> Dict[str, Any]:
    """The TensorFlow objects of a run: the algorithm's (``Algorithm.checkpoint_objects``; None on a client, which
    saves its own only) and each set-up client's own."""
    own = {} if algorithm is None else algorithm.checkpoint_objects()
    objects = {_object_name("algorithm", attr): value for attr, value in own.items()}
    for cid in ready:
        client = clients[cid]
        for attr in ("model", "optimizer"):
            value = getattr(client, attr)
            if is_trackable(value):
                objects[_object_name(cid, attr)] = value
        for key, value in sorted(client.state.items()):
            if is_trackable(value):
                objects[_object_name(cid, "state", key)] = value
    return objects


def _inside(directory: str, path: str) -> bool:
    root = os.path.realpath(directory)
    return os.path.commonpath([root, os.path.realpath(path)]) == root


def latest_checkpoint(directory: str) -> Optional[str]:
    """The path of the latest complete checkpoint in ``directory``, or None.

    :raises ValueError: ``directory`` is a symbolic link, not a folder or another user's folder;
        ``checkpoint.json`` is unreadable, or names anything but a ``round-<r>`` folder inside ``directory``.
    """
    if not check_folder(directory, "checkpoint_dir"):
        return None
    pointer = os.path.join(directory, POINTER)
    if not os.path.lexists(pointer):
        return None
    try:
        latest = read_json(pointer, "checkpoint pointer")["latest"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"checkpoint: {pointer} is unreadable or malformed ({type(exc).__name__}: {exc})") from None
    if not isinstance(latest, str) or not _ROUND.fullmatch(latest):
        raise ValueError(f"checkpoint: {pointer} names {latest!r}, not a round-<r> folder of {directory}")
    path = os.path.join(directory, latest)
    if os.path.islink(path) or not _inside(directory, path):
        raise ValueError(f"checkpoint: {pointer} names {latest!r}, which leads outside {directory}")
    if not os.path.isdir(path):
        raise ValueError(f"checkpoint: {pointer} names {latest!r}, which is missing from {directory}")
    return path


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _files(path: str) -> Dict[str, str]:
    """``{relative name: absolute path}`` of every file under ``path``; a symbolic link raises ValueError."""
    found = {}
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            full = os.path.join(root, name)
            if os.path.islink(full):
                raise ValueError(
                    f"checkpoint {path}: {os.path.relpath(full, path)} is a symbolic link; checkpoints "
                    "hold plain files only"
                )
        for name in files:
            full = os.path.join(root, name)
            found[os.path.relpath(full, path).replace(os.sep, "/")] = full
    return found


def write_manifest(path: str) -> None:
    """Write ``manifest.json`` (mode 0600, never through a link) with the SHA-256 and size of every other file under
    ``path``, which must not hold a ``manifest.json`` yet."""
    files = {
        name: {"sha256": _sha256(full), "size": os.path.getsize(full)}
        for name, full in sorted(_files(path).items())
        if name != MANIFEST
    }
    with new_file(os.path.join(path, MANIFEST)) as f:
        json.dump({"format": 1, "files": files}, f, indent=0, sort_keys=True)


def verify_manifest(path: str) -> None:
    """Check every file of the checkpoint at ``path`` against its ``manifest.json``.

    :raises ValueError: naming the file: manifest missing or malformed, a file missing, not listed, of
        another size (truncated) or with another SHA-256 (altered), or a symbolic link.
    """
    manifest_path = os.path.join(path, MANIFEST)
    if not os.path.isfile(manifest_path):
        raise ValueError(
            f"checkpoint {path}: {MANIFEST} is missing (an incomplete checkpoint, or one written by "
            "an older version); use a fresh checkpoint_dir"
        )
    try:
        listed = read_json(manifest_path, "checkpoint manifest")["files"]
        listed = {str(k): (str(v["sha256"]), int(v["size"])) for k, v in listed.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"checkpoint {path}: {MANIFEST} is malformed ({type(exc).__name__}: {exc})") from None
    present = {k: v for k, v in _files(path).items() if k != MANIFEST}
    for name in sorted(set(listed) - set(present)):
        raise ValueError(f"checkpoint {path}: {name} is listed in {MANIFEST} but missing")
    for name in sorted(set(present) - set(listed)):
        raise ValueError(f"checkpoint {path}: {name} is not listed in {MANIFEST} (added after the checkpoint)")
    for name, (sha, size) in sorted(listed.items()):
        actual = os.path.getsize(present[name])
        if actual != size:
            raise ValueError(
                f"checkpoint {path}: {name} has {actual} bytes but {MANIFEST} records {size} (truncated or altered)"
            )
        if not hmac.compare_digest(_sha256(present[name]).encode(), sha.encode()):
            raise ValueError(
                f"checkpoint {path}: {name} does not match its SHA-256 in {MANIFEST} (corrupted or altered)"
            )


def _client_file(cid: str) -> str:
    return f"{CLIENTS}/{_object_name(cid)}.json"


def _write_client_parts(path: str, clients: Mapping[str, Any]) -> None:
    """Each client's own part: its size and a digest of its data under a key it draws from the OS."""
    os.mkdir(os.path.join(path, CLIENTS), FOLDER_MODE)
    for cid, client in clients.items():
        key = secrets.token_bytes(32)
        X, Y = client.data
        part = {"id": cid, "num_data": int(client.num_data), "key": key.hex(), "digest": data_digest(key, X, Y)}
        with new_file(os.path.join(path, _client_file(cid))) as f:
            json.dump(part, f)


def check_client_data(path: str, clients: Mapping[str, Any]) -> None:
    """Each client checks its current data against its part of the checkpoint (run on the client's side).

    :raises ValueError: a client's part is missing or malformed, or its data differ (size or values).
    """
    for cid, client in clients.items():
        name = _client_file(cid)
        try:
            part = read_json(os.path.join(path, name), "client part")
            saved_id, size, key, digest = part["id"], int(part["num_data"]), bytes.fromhex(part["key"]), part["digest"]
        except FileNotFoundError:
            raise ValueError(f"checkpoint {path}: {name} (client {cid}'s part) is missing") from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"checkpoint {path}: {name} is malformed ({type(exc).__name__}: {exc})") from None
        if saved_id != cid:
            raise ValueError(f"checkpoint {path}: {name} belongs to client {saved_id!r}, not {cid!r}")
        if size != client.num_data:
            raise ValueError(
                f"checkpoint {path} was written with other data: client {cid} had {size} rows, now "
                f"{client.num_data}; use a fresh checkpoint_dir or resume=False"
            )
        X, Y = client.data
        if not hmac.compare_digest(str(digest).encode(), data_digest(key, X, Y).encode()):
            raise ValueError(
                f"checkpoint {path} was written with other data: client {cid}'s {size} rows have "
                "other values now; use a fresh checkpoint_dir or resume=False"
            )


def save_checkpoint(
    directory: str,
    round: int,
    run: Mapping[str, Any],
    algorithm: Any,
    clients: Mapping[str, Any],
    ready: List[str],
    max_to_keep: int = 2,
) -> str:
    """Write the checkpoint after ``round`` and make it the latest.

    The checkpoint is written into a fresh private staging folder inside ``directory`` (0700, files 0600, created
    with ``O_EXCL | O_NOFOLLOW``), renamed into place as ``round-<r>`` (whatever was at that name, a link included,
    is removed, never followed), and named by ``checkpoint.json``, replaced through a private temporary file.

    :param directory: ``checkpoint_dir``: created 0700 if missing.
    :param run: ``state``, ``sampling_rng`` (a numpy Generator), ``history``, ``ledger`` (entries),
        ``releases`` (the privacy accountant's) and ``meta`` (what must match on resume; its ``"settings"``
        are compared setting by setting).
    :param clients: every client of the run; each writes its own part (size, keyed digest of its data).
    :return: the checkpoint's path.
    :raises ValueError: ``directory`` is a symbolic link, not a folder or another user's folder; or a name the
        writer replaces cannot be replaced (something else writes to the folder).
    """
    name = f"round-{int(round)}"
    arrays: Dict[str, np.ndarray] = {}
    client_records = {}
    for cid in ready:
        client = clients[cid]
        plain = {k: v for k, v in client.state.items() if not is_trackable(v) and _plain(v)}
        client_records[cid] = {"rng": client.rng.bit_generator.state, "state": encode_tree(plain, arrays)}
    record = {
        "round": int(round),
        "meta": dict(run["meta"]),
        "state": encode_tree(run["state"], arrays),
        "sampling_rng": run["sampling_rng"].bit_generator.state,
        "history": encode_tree(list(run["history"]), arrays),
        "ledger": [dataclasses.asdict(e) for e in run["ledger"]],
        "releases": [list(r) for r in run["releases"]],
        "final": bool(run.get("final", False)),  # the state after the final phases: resuming restores it
        "ready": list(ready),
        "clients": client_records,
    }
    with private_folder(directory, "checkpoint_dir") as folder:
        staging = tempfile.mkdtemp(prefix=f"{STAGING}{name}-", dir=folder)
        try:
            with new_file(os.path.join(staging, "arrays.npz"), "wb") as f:
                np.savez(f, **arrays)
            objects = tf.train.Checkpoint(**tracked_objects(algorithm, clients, ready))
            objects.write(os.path.join(staging, "tf", "objects"))
            with new_file(os.path.join(staging, "run.json")) as f:
                json.dump(record, f)
            _write_client_parts(staging, clients)
            seal(staging)
            write_manifest(staging)
            with _replacing(name, directory):
                remove(os.path.join(folder, name))  # an earlier run's round, or a planted link: removed, not followed
                os.rename(staging, os.path.join(folder, name))
        except BaseException:
            remove(staging)
            raise
        with _replacing(POINTER, directory):
            replace_file(folder, POINTER, json.dumps({"latest": name}).encode())
        kept = sorted((d for d in os.listdir(folder) if _ROUND.fullmatch(d)), key=lambda d: int(d.split("-")[1]))
        for old in kept[: max(len(kept) - max_to_keep, 0)]:
            if old != name:
                with _replacing(old, directory):
                    remove(os.path.join(folder, old))
    return os.path.join(directory, name)


@contextlib.contextmanager
def _replacing(name: str, directory: str) -> Iterator[None]:
    """Replace or remove ``name`` in ``directory``; an OS error becomes a ValueError that says what to do."""
    try:
        yield
    except OSError as exc:
        raise ValueError(
            f"checkpoint: cannot replace {name} in {directory} ({exc.strerror or type(exc).__name__}); something "
            "else writes to checkpoint_dir: give each run a folder of its own"
        ) from None


def _check_meta(path: str, saved: Any, meta: Mapping[str, Any]) -> None:
    if not isinstance(saved, Mapping):
        raise ValueError(f"checkpoint {path}: run.json has no meta record")
    for key, value in meta.items():
        if key == "settings":
            differences = settings_differences(saved.get("settings") or {}, value)
            if differences:
                listed = "; ".join(f"{k}: {a} in the checkpoint, {b} now" for k, a, b in differences[:5])
                more = f" (and {len(differences) - 5} more)" if len(differences) > 5 else ""
                raise ValueError(
                    f"checkpoint {path} was written by an algorithm with other settings: {listed}"
                    f"{more}; use a fresh checkpoint_dir or resume=False"
                )
        elif saved.get(key) != value:
            raise ValueError(
                f"checkpoint {path} was written by a different run: {key} = {saved.get(key)!r}, this run has "
                f"{value!r}; use a fresh checkpoint_dir or resume=False"
            )


def load_checkpoint(
    path: str,
    meta: Mapping[str, Any],
    clients: Optional[Mapping[str, Any]] = None,
    allowed: Optional[Mapping[str, type]] = None,
) -> Tuple[Dict[str, Any], Mapping[str, np.ndarray]]:
    """Verify and read a checkpoint's record (the TensorFlow objects are restored by :func:`restore_objects`).

    :param meta: what must match (algorithm, seed, clients, privacy settings, ``"settings"``).
    :param clients: the run's clients, each checked against its own part of the checkpoint (None: unchecked).
    :param allowed: extra state dataclasses that may be instantiated (see :func:`decode_tree`).
    :raises ValueError: naming the file and the problem: a manifest failure (missing, extra, truncated or
        altered file), a malformed file, a class that is not allowed, or a different run (which setting, which
        client's data).
    """
    verify_manifest(path)
    try:
        record = read_json(os.path.join(path, "run.json"), "checkpoint record", allow_nan=True)
    except (OSError, ValueError) as exc:
        raise ValueError(f"checkpoint {path}: run.json is unreadable ({type(exc).__name__}: {exc})") from None
    try:
        arrays = read_npz_arrays(os.path.join(path, "arrays.npz"), "checkpoint's arrays")
    except (OSError, ValueError) as exc:
        raise ValueError(f"checkpoint {path}: arrays.npz is unreadable ({type(exc).__name__}: {exc})") from None
    if not isinstance(record, dict):
        raise ValueError(f"checkpoint {path}: run.json does not hold a checkpoint record")
    _check_meta(path, record.get("meta"), meta)
    if clients is not None:
        check_client_data(path, clients)
    try:
        record["state"] = decode_tree(record["state"], arrays, allowed)
        record["history"] = decode_tree(record["history"], arrays, allowed)
        record["ledger"] = [
            LedgerEntry(
                **{
                    **e,
                    "names": tuple(e["names"]),
                    "shapes": tuple(tuple(s) for s in e["shapes"]),
                    "dtypes": tuple(e["dtypes"]),
                }
            )
            for e in record["ledger"]
        ]
        record["round"] = int(record["round"])
        ready, saved_clients = list(record["ready"]), dict(record["clients"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"checkpoint {path}: run.json is malformed ({type(exc).__name__}: {exc})") from None
    expected = set(meta.get("clients", ready))
    if not (set(ready) <= expected and set(saved_clients) <= set(ready)):
        raise ValueError(f"checkpoint {path}: run.json names clients that are not in this run")
    return record, arrays


def restore_clients(record: Mapping[str, Any], arrays: Mapping[str, np.ndarray], clients: Mapping[str, Any]) -> None:
    """Restore each saved client's RNG state and the plain values of its ``client.state``."""
    for cid, saved in record["clients"].items():
        client = clients[cid]
        try:
            client.rng.bit_generator.state = saved["rng"]
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"checkpoint: run.json holds a malformed RNG state for {cid} ({exc})") from None
        client.state.update(decode_tree(saved["state"], arrays))


def restore_objects(path: str, algorithm: Any, clients: Mapping[str, Any], ready: List[str]) -> None:
    """Restore the algorithm's and the set-up clients' TensorFlow objects (they must exist already)."""
    try:
        objects = tf.train.Checkpoint(**tracked_objects(algorithm, clients, ready))
        objects.read(os.path.join(path, "tf", "objects")).assert_existing_objects_matched()
    except (tf.errors.OpError, AssertionError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"checkpoint {path}: tf/objects cannot be restored ({first})") from None
