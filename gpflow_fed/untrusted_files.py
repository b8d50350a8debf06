"""Reading files a stranger may have made: ``.npz`` archives and JSON text, with every cost bounded before it is paid.

A model file, a checkpoint or a recyclable-model dictionary can come from anyone (a collaborator, a download, an
attacker who planted it). numpy's and Python's own readers trust the file's structure: a 1.7 KB ``.npz`` whose
``.npy`` header declares a ``10⁶ × 10⁶`` array makes ``np.load`` allocate 7.28 TiB (``MemoryError``), a compressed
member can expand a thousandfold, and deeply nested JSON ends ``json.loads`` with ``RecursionError``. The readers here
read sizes from the structure first and refuse before allocating:

* :func:`read_npz_arrays` checks the archive before reading any member: at most :data:`MAX_MEMBERS` members, each
  named ``<name>.npy`` with no absolute path, ``..`` part, backslash or control character and no name twice, no
  encrypted member, stored or deflated only, a deflated member expanding at most :data:`MAX_EXPANSION` times its
  compressed size, and the declared sizes together at most ``max_bytes``. It then reads each member's ``.npy``
  header (format 1.0 or 2.0, header length bounded by numpy) and requires a numeric or unicode dtype (no objects,
  no records) whose ``shape × itemsize`` is exactly the member's declared size before reading its bytes; the bytes
  read, decompressed and CRC-checked, become the array. Cost: linear in the file's declared (bounded) size.
* :func:`parse_json` refuses text over ``max_chars`` characters, nesting deeper than ``max_depth`` (counted on the
  text before parsing, so the parser never recurses that deep), and the non-JSON constants ``NaN`` / ``Infinity``.

Every failure is one ``ValueError`` that names the file (only a missing file keeps its ``FileNotFoundError``). No
error echoes a value read from the file beyond its structure (member names are shown through ``repr``, cut short).
"""

from __future__ import annotations

import json
import os
import re
import stat
import zipfile
from typing import Any, Dict, Union

import numpy as np

__all__ = [
    "MAX_BYTES",
    "MAX_DEPTH",
    "MAX_EXPANSION",
    "MAX_JSON_CHARS",
    "MAX_MEMBERS",
    "parse_json",
    "read_json",
    "read_npz_arrays",
]

#: default bound on the total declared (uncompressed) size of an ``.npz``'s members: 4 GiB
MAX_BYTES = 4 << 30
#: at most this many members in an ``.npz``
MAX_MEMBERS = 100_000
#: a deflated member may declare at most this many times its compressed size (plus 4 KiB); the package writes its
#: files uncompressed (``np.savez``), and data that compress better than 100:1 are not a model's numbers
MAX_EXPANSION = 100
#: default bound on JSON nesting (the package's own files nest fewer than 20 levels)
MAX_DEPTH = 64
#: default bound on the length of a JSON text: 256 Mi characters
MAX_JSON_CHARS = 1 << 28

#: dtype kinds an array may have: bool, signed and unsigned integers, floats, complex numbers, unicode text
_KINDS = "biufcU"
_BAD_NAME = re.compile(r"[\x00-\x1f\x7f\\]")
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = re.compile(r"[\[\]{}]")

PathLike = Union[str, "os.PathLike[str]"]


def _short(name: str) -> str:
    return repr(name[:60] + ("…" if len(name) > 60 else ""))


def _check_member_name(info: zipfile.ZipInfo, path: PathLike, seen: set) -> str:
    name = info.filename
    parts = name.split("/")
    if (
        not name.endswith(".npy")
        or name.startswith("/")
        or _BAD_NAME.search(name)
        or any(part in ("", ".", "..") for part in parts)
        or re.match(r"^[A-Za-z]:", name)
    ):
        raise ValueError(f"member {_short(name)} is not an array member (<name>.npy with a plain relative name)")
    if name in seen:
        raise ValueError(f"member {_short(name)} appears twice")
    seen.add(name)
    if info.flag_bits & 0x1:
        raise ValueError(f"member {_short(name)} is encrypted")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise ValueError(f"member {_short(name)} uses compression method {info.compress_type} (stored or "
                         "deflated only)")  # fmt: skip
    if info.compress_type == zipfile.ZIP_DEFLATED and info.file_size > MAX_EXPANSION * info.compress_size + 4096:
        raise ValueError(
            f"member {_short(name)} declares {info.file_size} bytes from {info.compress_size} compressed "
            f"(more than {MAX_EXPANSION}-fold: refused as a decompression bomb)"
        )
    return name[: -len(".npy")]


def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, path: PathLike) -> np.ndarray:
    name = _short(info.filename)
    with archive.open(info) as fp:
        version = np.lib.format.read_magic(fp)  # type: ignore[no-untyped-call]  # numpy leaves it untyped
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fp)  # type: ignore[no-untyped-call]
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fp)  # type: ignore[no-untyped-call]
        else:
            raise ValueError(f"member {name} has .npy format {version} (1.0 or 2.0 only)")
        if dtype.hasobject or dtype.kind not in _KINDS or dtype.fields is not None or dtype.subdtype is not None:
            raise ValueError(f"member {name} has dtype {dtype.str!r}: numbers or text only")
        if not all(isinstance(n, int) and n >= 0 for n in shape):
            raise ValueError(f"member {name} has an invalid shape")
        count = 1
        for n in shape:
            count *= n
        nbytes = count * dtype.itemsize
        offset = fp.tell()
        if offset + nbytes != info.file_size:
            raise ValueError(
                f"member {name} declares shape {tuple(shape)} ({nbytes} bytes) but holds "
                f"{info.file_size - offset} bytes of data"
            )
        data = fp.read(nbytes)
        if len(data) != nbytes or fp.read(1):  # reading to the end checks the member's CRC-32
            raise ValueError(f"member {name} is truncated")
    array = np.frombuffer(bytearray(data), dtype=dtype, count=count)
    return array.reshape(shape[::-1]).T if fortran else array.reshape(shape)


def read_npz_arrays(path: PathLike, what: str, max_bytes: int = MAX_BYTES) -> Dict[str, np.ndarray]:
    """Every array of the ``.npz`` at ``path``, read under the bounds of the module docstring.

    :param what: the kind of file, for messages (e.g. ``"checkpoint arrays"``).
    :param max_bytes: bound on the members' total declared (uncompressed) size and on the file's size.
    :raises FileNotFoundError: ``path`` does not exist.
    :raises ValueError: naming the file: not a zip archive, a member refused (name, size, dtype, shape, encryption,
        compression), truncated or corrupted (CRC), or over a bound.
    """
    st = os.stat(path)  # FileNotFoundError passes through
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{path}: not a regular file (not a {what})")
    if st.st_size > max_bytes:
        raise ValueError(f"{path}: {st.st_size} bytes, more than the {max_bytes} allowed for a {what}")
    try:
        with zipfile.ZipFile(path) as archive:
            infos = archive.infolist()
            if len(infos) > MAX_MEMBERS:
                raise ValueError(f"{len(infos)} members, more than {MAX_MEMBERS} (not a {what})")
            seen: set = set()
            names = [_check_member_name(info, path, seen) for info in infos]
            total = sum(info.file_size for info in infos)
            if total > max_bytes:
                raise ValueError(f"its members declare {total} bytes, more than the {max_bytes} allowed for a {what}")
            return {name: _read_member(archive, info, path) for name, info in zip(names, infos)}
    except ValueError as exc:  # the checks above, and numpy's refusal of a malformed .npy header
        raise ValueError(f"{path}: not a readable {what}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - BadZipFile, EOFError, OSError, zlib.error, struct.error, ...
        raise ValueError(
            f"{path}: not a readable {what} (corrupt, truncated or another kind of file; {type(exc).__name__})"
        ) from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"the non-JSON constant {name}")


def parse_json(
    text: Union[str, bytes],
    where: str,
    max_depth: int = MAX_DEPTH,
    max_chars: int = MAX_JSON_CHARS,
    allow_nan: bool = False,
) -> Any:
    """``json.loads(text)`` with the bounds of the module docstring.

    :param where: what the text is, for messages (``"<file>: structure"``, a file name, ...).
    :param allow_nan: accept ``NaN`` / ``Infinity`` (Python's ``json.dump`` writes them, e.g. in a checkpoint's record).
    :raises ValueError: ``"<where>: ..."``: too long, nested too deep, not JSON, or holding ``NaN`` / ``Infinity``
        (unless ``allow_nan``).
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{where}: not UTF-8 text") from None
    if len(text) > max_chars:
        raise ValueError(f"{where}: {len(text)} characters of JSON, more than the {max_chars} allowed")
    depth = deepest = 0
    for bracket in _BRACKETS.findall(_STRINGS.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        deepest = max(deepest, depth)
        if deepest > max_depth:
            raise ValueError(f"{where}: JSON nested more than {max_depth} levels deep")
    try:
        return json.loads(text) if allow_nan else json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise ValueError(f"{where}: not valid JSON ({type(exc).__name__}: {str(exc)[:120]})") from None


def read_json(
    path: PathLike, what: str, max_depth: int = MAX_DEPTH, max_chars: int = MAX_JSON_CHARS, allow_nan: bool = False
) -> Any:
    """The JSON value in the file at ``path`` (size checked before reading), as :func:`parse_json`.

    :raises FileNotFoundError: ``path`` does not exist.
    :raises ValueError: naming the file: too large, unreadable, nested too deep or not JSON.
    """
    st = os.stat(path)
    if st.st_size > 4 * max_chars:
        raise ValueError(f"{path}: {st.st_size} bytes, more than a {what} may hold")
    try:
        with open(path, "rb") as f:
            data = f.read(4 * max_chars + 1)
    except OSError as exc:
        raise ValueError(f"{path}: unreadable {what} ({exc.strerror or type(exc).__name__})") from None
    return parse_json(data, f"{path}", max_depth, max_chars, allow_nan)
