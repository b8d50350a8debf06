"""Protocol messages on the wire: a dict of the secure-aggregation protocol as named arrays plus a JSON structure.

The protocol (:mod:`.secagg`) speaks in dicts of bytes, strings, numbers, flags, lists and ``uint64`` arrays, nested
in dicts. Every runtime carries a :class:`~gpflow_fed.federated.Message` (named numpy arrays, which the ledger
records) plus a JSON config, so :func:`pack` puts every ``bytes`` value into one ``uint8`` array (``bytes``, the
concatenation) and every ``uint64`` array under its own name, and leaves a JSON structure that points into them;
:func:`unpack` inverts it. What crosses is therefore counted byte for byte in the ledger.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Tuple

import numpy as np

__all__ = ["pack", "unpack"]

_BYTES = "$b"
_ARRAY = "$a"
_BLOB = "bytes"


def pack(message: Mapping[str, Any]) -> Tuple[Dict[str, Any], Dict[str, np.ndarray]]:
    """``(structure, arrays)`` for a protocol message (module docstring).

    :raises TypeError: a value of a type the protocol does not use.
    """
    blob: List[bytes] = []
    arrays: Dict[str, np.ndarray] = {}
    offset = [0]

    def walk(value: Any) -> Any:
        if isinstance(value, (bytes, bytearray)):
            blob.append(bytes(value))
            start = offset[0]
            offset[0] += len(value)
            return {_BYTES: [start, len(value)]}
        if isinstance(value, np.ndarray):
            if value.dtype != np.uint64:
                raise TypeError(f"protocol arrays are uint64, got {value.dtype}")
            name = f"a{len(arrays)}"
            arrays[name] = value
            return {_ARRAY: name}
        if isinstance(value, Mapping):
            return {"$d": [[str(k), walk(v)] for k, v in value.items()]}
        if isinstance(value, (list, tuple)):
            return [walk(v) for v in value]
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, (np.integer, np.floating, np.bool_)):
            return value.item()
        raise TypeError(f"a protocol message holds bytes, text, numbers, lists, dicts and uint64 arrays, not {value!r}")

    structure = walk(dict(message))
    arrays[_BLOB] = np.frombuffer(b"".join(blob), dtype=np.uint8)
    return structure, arrays


def unpack(structure: Any, arrays: Mapping[str, np.ndarray]) -> Dict[str, Any]:
    """The protocol message :func:`pack` made (never trusted further: the protocol validates every field).

    :raises ValueError: a structure that does not fit the arrays.
    """
    blob = np.asarray(arrays.get(_BLOB, np.zeros(0, np.uint8)))
    if blob.dtype != np.uint8 or blob.ndim != 1:
        raise ValueError("a protocol message's bytes must be a 1-D uint8 array")
    raw = blob.tobytes()

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            if set(value) == {_BYTES}:
                start, length = value[_BYTES]
                if not (
                    isinstance(start, int) and isinstance(length, int) and 0 <= start <= start + length <= len(raw)
                ):
                    raise ValueError("a protocol message points outside its bytes")
                return raw[start : start + length]
            if set(value) == {_ARRAY}:
                name = value[_ARRAY]
                if name not in arrays or name == _BLOB or arrays[name].dtype != np.uint64:
                    raise ValueError(f"a protocol message names a missing or non-uint64 array {name!r}")
                return np.asarray(arrays[name])
            if set(value) == {"$d"}:
                return {str(k): walk(v) for k, v in value["$d"]}
            raise ValueError("a protocol message holds an unknown object")
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    message = walk(structure)
    if not isinstance(message, dict):
        raise ValueError("a protocol message must be a dict")
    return message
