"""Reading the package's ``.npz`` model files: numbers and JSON text only, every failure a ``ValueError``.

A saved model is a zip of ``.npy`` members (``numpy.savez``). A file can be truncated, bit-flipped (each
member carries a CRC-32 that ``zipfile`` checks on reading), incomplete, hold pickled objects or be another
kind of file altogether; numpy and ``zipfile`` then raise ``BadZipFile``, ``EOFError``, ``KeyError``,
``OSError`` or ``ValueError`` with messages that do not name the file. :func:`read_npz` reads every member
eagerly under ``allow_pickle=False`` and turns all of them into one ``ValueError`` naming the file and the
problem; only a missing file keeps its ``FileNotFoundError``.
"""

from __future__ import annotations

import os
from typing import Dict, Sequence, Union

import numpy as np

__all__ = ["read_npz"]


def read_npz(
    path: Union[str, os.PathLike], what: str, format_tag: str, required: Sequence[str] = ()
) -> Dict[str, np.ndarray]:
    """Every array of the ``.npz`` at ``path``, after checking its format tag and required members.

    :param what: the kind of file, for messages (e.g. ``"PrivacyAwareGPR file (PrivacyAwareGPR.save)"``).
    :param format_tag: the expected value of the file's ``format`` member.
    :param required: members that must be present besides ``format``.
    :raises FileNotFoundError: ``path`` does not exist.
    :raises ValueError: the file is unreadable (not a zip, truncated, a failed CRC, pickled data), has another
        format tag, or lacks a required member; the message names the file.
    """
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {name: np.asarray(f[name]) for name in f.files}
    except FileNotFoundError:
        raise
    except Exception as exc:  # BadZipFile, EOFError, OSError, ValueError (pickles), AttributeError (.npy) ...
        raise ValueError(
            f"{path}: not a readable {what} (corrupt, truncated or another kind of file; {type(exc).__name__}: {exc})"
        ) from exc
    tag = arrays.get("format")
    if tag is None or tag.dtype.kind != "U" or str(tag) != format_tag:
        found = "none" if tag is None else repr(str(tag)[:80])
        raise ValueError(f"{path}: incompatible file format {found}, expected {format_tag!r}: not a {what}")
    missing = [name for name in required if name not in arrays]
    if missing:
        raise ValueError(f"{path}: incomplete file, missing arrays {missing} (not a complete {what})")
    return arrays
