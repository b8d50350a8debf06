"""Fingerprints that tie a checkpoint to the run that wrote it: the algorithm's settings and each client's data.

* :func:`describe_settings` flattens an algorithm's attributes, as they are before the run starts, into
  ``{"rounds": "int:4", "kernel.lengthscales": "array(...)", ...}``. It reads ``vars(algorithm)``, so every
  subclass is covered without declaring anything: numbers, strings, arrays, containers and dataclasses by
  value, GPflow/TensorFlow modules by their class and every parameter's value and trainability, Keras
  optimizers by their config, functions and classes by name. Objects it cannot read are described by their
  type alone. A resume compares the two descriptions and names every setting that differs.
* :func:`data_digest` is the keyed digest (HMAC-SHA256) a client computes of its own ``(X_k, Y_k)``; the key is
  drawn from the OS by the client and kept in the client's own part of the checkpoint, never in the server's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
from typing import Any, Dict, List, Mapping, Tuple

import numpy as np

__all__ = ["data_digest", "describe_settings", "is_trackable", "settings_differences", "values_digest"]

_MAX_DEPTH = 8


def _array(value: Any) -> str:
    a = np.asarray(value)
    return f"array{list(a.shape)}:{a.dtype.str}:{hashlib.sha256(a.tobytes(order='C')).hexdigest()}"


def values_digest(arrays: Mapping[str, Any]) -> str:
    """Hex SHA-256 of named arrays by value (names, shapes and float64 values, −0.0 as 0.0, each length-prefixed): a
    record key, not a secret (a client's record of what it answered once, e.g. FedBNR's ``"weights"``)."""
    digest = hashlib.sha256()
    for name in sorted(arrays):
        value = np.ascontiguousarray(np.asarray(arrays[name], dtype=np.float64) + 0.0)
        for part in (name.encode("utf-8"), repr(value.shape).encode("ascii"), value.tobytes()):
            digest.update(len(part).to_bytes(8, "big") + part)
    return digest.hexdigest()


def _name(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__qualname__)}"


def _module(path: str, obj: Any, out: Dict[str, str]) -> None:
    import gpflow

    out[path] = f"module:{_name(type(obj))}"
    try:
        parameters = gpflow.utilities.parameter_dict(obj)
    except Exception:  # noqa: BLE001 - a module whose variables cannot be listed is described by its type
        return
    for name, variable in sorted(parameters.items()):
        out[f"{path}{name}"] = f"{_array(variable.numpy())}:trainable={bool(variable.trainable)}"


def is_trackable(obj: Any) -> bool:
    """Whether ``tf.train.Checkpoint`` can save ``obj`` (modules, variables, Keras optimizers)."""
    import tensorflow as tf
    from gpflow.keras import tf_keras

    optimizers = (tf_keras.optimizers.Optimizer, tf_keras.optimizers.legacy.Optimizer)
    return isinstance(obj, (tf.Module, tf.Variable) + optimizers)


def _describe(path: str, obj: Any, out: Dict[str, str], depth: int) -> None:
    import tensorflow as tf

    if obj is None or isinstance(obj, (bool, int, float, str)):
        out[path] = f"{type(obj).__name__}:{obj!r}"
    elif isinstance(obj, np.generic):
        out[path] = f"{type(obj).__name__}:{obj.item()!r}"
    elif isinstance(obj, np.ndarray):
        out[path] = _array(obj)
    elif depth >= _MAX_DEPTH:
        out[path] = f"type:{_name(type(obj))}"
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out[path] = f"dataclass:{_name(type(obj))}"
        for f in dataclasses.fields(obj):
            _describe(f"{path}.{f.name}", getattr(obj, f.name), out, depth + 1)
    elif isinstance(obj, Mapping):
        out[path] = f"{type(obj).__name__}:{len(obj)}"
        for key in sorted(obj, key=repr):
            _describe(f"{path}[{key!r}]", obj[key], out, depth + 1)
    elif isinstance(obj, (list, tuple)):
        out[path] = f"{type(obj).__name__}:{len(obj)}"
        for i, item in enumerate(obj):
            _describe(f"{path}[{i}]", item, out, depth + 1)
    elif isinstance(obj, tf.Module):
        _module(path, obj, out)
    elif isinstance(obj, tf.Variable):
        out[path] = f"{_array(obj.numpy())}:trainable={bool(obj.trainable)}"
    elif is_trackable(obj) and hasattr(obj, "get_config"):  # a Keras optimizer: its hyperparameters
        try:
            config = json.dumps(obj.get_config(), sort_keys=True, default=str)
        except Exception:  # noqa: BLE001 - a config that cannot be read is described by its type
            config = "?"
        out[path] = f"optimizer:{_name(type(obj))}:{config}"
    elif isinstance(obj, type) or callable(obj):
        out[path] = f"callable:{_name(obj)}"
    else:
        out[path] = f"type:{_name(type(obj))}"


def describe_settings(algorithm: Any) -> Dict[str, str]:
    """The algorithm's configuration, flattened to ``{attribute path: canonical description}``.

    Call it before the run touches the algorithm (the runtime does so first thing); a resumed run, built the
    same way, must give the same description.
    """
    out: Dict[str, str] = {"class": f"callable:{_name(type(algorithm))}"}
    for attr, value in sorted(vars(algorithm).items()):
        _describe(attr, value, out, 0)
    return out


def settings_differences(saved: Mapping[str, str], current: Mapping[str, str]) -> List[Tuple[str, str, str]]:
    """``[(setting, saved description, current description)]`` for every setting that differs (or is absent).

    Private attributes (``_name``) are left out on both sides: they are the algorithm's implementation and the
    per-run state its ``bind`` sets (None on the configuration object), which a new release may add or rename
    without changing what the user configured.
    """
    keys = sorted(k for k in set(saved) | set(current) if not k.startswith("_"))
    return [(k, saved.get(k, "(absent)"), current.get(k, "(absent)")) for k in keys if saved.get(k) != current.get(k)]


def data_digest(key: bytes, X: np.ndarray, Y: np.ndarray) -> str:
    """HMAC-SHA256 under ``key`` of a client's ``(X_k, Y_k)`` (shapes, dtypes and bytes), as hex."""
    mac = hmac.new(key, digestmod=hashlib.sha256)
    for a in (np.asarray(X), np.asarray(Y)):
        mac.update(f"{list(a.shape)}:{a.dtype.str};".encode())
        mac.update(a.tobytes(order="C"))
    return mac.hexdigest()
