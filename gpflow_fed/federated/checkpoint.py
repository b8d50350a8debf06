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
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import re
import shutil
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
import tensorflow as tf
from gpflow.keras import tf_keras

from .ledger import LedgerEntry

__all__ = ["decode_tree", "encode_tree", "is_trackable", "latest_checkpoint", "load_checkpoint", "save_checkpoint"]

POINTER = "checkpoint.json"


def is_trackable(obj: Any) -> bool:
    """Whether ``tf.train.Checkpoint`` can save ``obj`` (modules, variables, Keras optimizers)."""
    optimizers = (tf_keras.optimizers.Optimizer, tf_keras.optimizers.legacy.Optimizer)
    return isinstance(obj, (tf.Module, tf.Variable) + optimizers)


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


def decode_tree(node: Any, arrays: Mapping[str, np.ndarray]) -> Any:
    """The inverse of :func:`encode_tree`."""
    kind = node["t"]
    if kind == "value":
        return node["v"]
    if kind == "array":
        return np.array(arrays[node["k"]])
    if kind == "scalar":
        return np.array(arrays[node["k"]])[()]
    if kind == "dict":
        return {k: decode_tree(v, arrays) for k, v in node["items"]}
    if kind in ("list", "tuple"):
        items = [decode_tree(v, arrays) for v in node["items"]]
        return items if kind == "list" else tuple(items)
    if kind == "dataclass":
        module, qualname = node["cls"].split(":")
        cls: Any = importlib.import_module(module)
        for part in qualname.split("."):
            cls = getattr(cls, part)
        if not dataclasses.is_dataclass(cls):
            raise TypeError(f"checkpoint: {node['cls']} is not a dataclass")
        return cls(**{k: decode_tree(v, arrays) for k, v in node["fields"].items()})
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
    """The TensorFlow objects of a run: the algorithm's attributes and each set-up client's own."""
    objects: Dict[str, Any] = {}
    for attr, value in sorted(vars(algorithm).items()):
        if is_trackable(value):
            objects[_object_name("algorithm", attr)] = value
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


def latest_checkpoint(directory: str) -> Optional[str]:
    """The path of the latest complete checkpoint in ``directory``, or None."""
    pointer = os.path.join(directory, POINTER)
    if not os.path.exists(pointer):
        return None
    with open(pointer) as f:
        return os.path.join(directory, json.load(f)["latest"])


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

    :param run: ``state``, ``sampling_rng`` (a numpy Generator), ``history``, ``ledger`` (entries),
        ``releases`` (the privacy accountant's) and ``meta`` (what must match on resume).
    :return: the checkpoint's path.
    """
    name = f"round-{round}"
    path = os.path.join(directory, name)
    if os.path.exists(path):
        shutil.rmtree(path)
    os.makedirs(path)
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
        "ready": list(ready),
        "clients": client_records,
    }
    np.savez(os.path.join(path, "arrays.npz"), **arrays)
    tf.train.Checkpoint(**tracked_objects(algorithm, clients, ready)).write(os.path.join(path, "tf", "objects"))
    with open(os.path.join(path, "run.json"), "w") as f:
        json.dump(record, f)
    tmp = os.path.join(directory, POINTER + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"latest": name}, f)
    os.replace(tmp, os.path.join(directory, POINTER))
    kept = sorted(
        (d for d in os.listdir(directory) if re.fullmatch(r"round-\d+", d)), key=lambda d: int(d.split("-")[1])
    )
    for old in kept[: max(len(kept) - max_to_keep, 0)]:
        if old != name:
            shutil.rmtree(os.path.join(directory, old))
    return path


def load_checkpoint(path: str, meta: Mapping[str, Any]) -> Tuple[Dict[str, Any], Mapping[str, np.ndarray]]:
    """Read a checkpoint's record (the TensorFlow objects are restored by :func:`restore_objects`).

    :raises ValueError: the checkpoint belongs to a different run (algorithm, rounds, seed or clients).
    """
    with open(os.path.join(path, "run.json")) as f:
        record = json.load(f)
    with np.load(os.path.join(path, "arrays.npz")) as npz:
        arrays = {k: npz[k] for k in npz.files}
    saved = record["meta"]
    for key, value in meta.items():
        if saved.get(key) != value:
            raise ValueError(
                f"checkpoint {path} was written by a different run: {key} = {saved.get(key)!r}, this run has "
                f"{value!r}; use a fresh checkpoint_dir or resume=False"
            )
    record["state"] = decode_tree(record["state"], arrays)
    record["history"] = decode_tree(record["history"], arrays)
    record["ledger"] = [
        LedgerEntry(**{**e, "names": tuple(e["names"]), "shapes": tuple(tuple(s) for s in e["shapes"]),
                       "dtypes": tuple(e["dtypes"])})
        for e in record["ledger"]
    ]
    return record, arrays


def restore_clients(record: Mapping[str, Any], arrays: Mapping[str, np.ndarray], clients: Mapping[str, Any]) -> None:
    """Restore each saved client's RNG state and the plain values of its ``client.state``."""
    for cid, saved in record["clients"].items():
        client = clients[cid]
        client.rng.bit_generator.state = saved["rng"]
        client.state.update(decode_tree(saved["state"], arrays))


def restore_objects(path: str, algorithm: Any, clients: Mapping[str, Any], ready: List[str]) -> None:
    """Restore the algorithm's and the set-up clients' TensorFlow objects (they must exist already)."""
    status = tf.train.Checkpoint(**tracked_objects(algorithm, clients, ready)).read(os.path.join(path, "tf", "objects"))
    status.assert_existing_objects_matched()
