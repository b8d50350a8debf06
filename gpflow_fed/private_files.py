"""Private files: folders and files that no other local user can read, plant or redirect.

What gpflow-fed writes for itself (a run's checkpoints, a Flower client's state between messages) holds a party's
model state and keyed digests of its data. Its writers use this module, which guarantees on POSIX systems:

* a folder it creates is mode 0700 and a file it creates is mode 0600, whatever the umask (:func:`seal` sets the
  modes of what other code, e.g. ``tf.train.Checkpoint.write``, wrote inside a private folder);
* a folder it is given must be a real folder of this user: a symbolic link, a file or another user's folder is
  refused with a ``ValueError`` (whoever controls a link or a folder controls what is written through it);
* a file is created with ``O_CREAT | O_EXCL | O_NOFOLLOW``: never through a symbolic link, never over an existing
  file; a name is replaced only by ``rename(2)``, which replaces a link planted at the name instead of following it;
* removal never follows a link (a link is unlinked; a folder goes through ``shutil.rmtree``, which refuses a link and
  works by file descriptor below it);
* on Linux, :func:`private_folder` yields a path through the folder's open file descriptor (``/proc/self/fd/N``), so
  renaming the folder or swapping it for a link while it is being written cannot redirect a write.

What it does not do: it trusts the folder's parents (a link above the folder is followed, as the user wrote the path);
it does not ``fsync`` unless asked (``replace_file(..., sync=True)``; otherwise a crash may lose the last write,
and the writers detect a half-written one); it cannot protect against root or against this user's own processes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from typing import IO, Iterator, Optional, Tuple

__all__ = [
    "FILE_MODE",
    "FOLDER_MODE",
    "check_folder",
    "make_private_folder",
    "new_file",
    "private_folder",
    "remove",
    "replace_file",
    "seal",
]

#: the mode of every file written: readable and writable by its owner only
FILE_MODE = 0o600
#: the mode of every folder created: only its owner can list, enter or change it
FOLDER_MODE = 0o700

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC | getattr(os, "O_BINARY", 0)
_OPEN_FOLDER = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW | _CLOEXEC


def _refuse(path: str, what: str, st: os.stat_result) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise ValueError(
            f"{what} {path} is a symbolic link; give the folder itself (whoever can change a link can redirect "
            "what is written through it)"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise ValueError(f"{what} {path} exists and is not a folder; give a folder")
    euid = os.geteuid() if hasattr(os, "geteuid") else None
    if euid is not None and st.st_uid != euid:
        raise ValueError(
            f"{what} {path} belongs to another user (uid {st.st_uid}); use a folder of your own (its owner could "
            "read or replace what is written there)"
        )


def check_folder(path: str, what: str) -> bool:
    """Whether the folder at ``path`` exists (False: nothing is there).

    :param what: how an error names the folder (e.g. ``"checkpoint_dir"``).
    :raises ValueError: ``path`` is a symbolic link, not a folder, or another user's folder.
    """
    path = os.path.normpath(os.fspath(path))  # a trailing "/" would make lstat follow a link
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    _refuse(path, what, st)
    return True


def _open(path: str, what: str, tighten: bool) -> Tuple[str, Optional[int]]:
    """Create or check the folder; ``(normalised path, open descriptor or None where folders cannot be opened)``."""
    path = os.path.normpath(os.fspath(path))
    created = False
    if not check_folder(path, what):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        try:
            os.mkdir(path, FOLDER_MODE)
            created = True
        except FileExistsError:  # made by someone else in between: checked like any existing folder
            pass
        check_folder(path, what)
    if os.name != "posix":
        if created or tighten:
            os.chmod(path, FOLDER_MODE)
        return path, None
    try:
        fd = os.open(path, _OPEN_FOLDER)
    except OSError as exc:
        raise ValueError(
            f"{what} {path} changed while it was opened ({exc.strerror}); give a folder of your own"
        ) from None
    try:
        _refuse(path, what, os.fstat(fd))
        if created or tighten:
            os.fchmod(fd, FOLDER_MODE)
    except BaseException:
        os.close(fd)
        raise
    return path, fd


def make_private_folder(path: str, what: str, *, tighten: bool = False) -> str:
    """Create the folder at ``path`` (mode 0700; missing parents as the umask makes them) or check the existing one.

    :param what: how an error names the folder.
    :param tighten: also set an existing folder to 0700 (for folders this package names and owns).
    :return: ``path``, normalised.
    :raises ValueError: ``path`` is a symbolic link, not a folder, or another user's folder.
    """
    path, fd = _open(path, what, tighten)
    if fd is not None:
        os.close(fd)
    return path


@contextlib.contextmanager
def private_folder(path: str, what: str, *, tighten: bool = False) -> Iterator[str]:
    """Like :func:`make_private_folder`, and yield a path to write through that stays bound to the folder.

    On Linux the yielded path goes through the folder's open file descriptor (``/proc/self/fd/N``): a rename of the
    folder, or a link put in its place, while the block runs cannot redirect a write. Elsewhere it is ``path``.
    """
    path, fd = _open(path, what, tighten)
    if fd is None:
        yield path
        return
    try:
        through = f"/proc/self/fd/{fd}"
        try:
            bound = os.path.samestat(os.stat(through), os.fstat(fd))
        except OSError:
            bound = False
        yield through if bound else path
    finally:
        os.close(fd)


def new_file(path: str, mode: str = "w") -> IO:
    """Open a new file at ``path`` for writing (``mode`` ``"w"`` or ``"wb"``): created 0600 with
    ``O_CREAT | O_EXCL | O_NOFOLLOW``, so never through a symbolic link and never over an existing file.

    :raises FileExistsError: something (a file, a folder, a link) is already at ``path``.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"new_file opens for writing only ('w' or 'wb'), got {mode!r}")
    fd = os.open(path, _NEW_FILE, FILE_MODE)
    return os.fdopen(fd, mode, encoding=None if mode == "wb" else "utf-8")


def replace_file(folder: str, name: str, data: bytes, *, sync: bool = False) -> None:
    """Write ``data`` to ``folder/name`` atomically: a fresh private temporary file (0600, ``O_EXCL | O_NOFOLLOW``)
    renamed over the name, so a reader sees the old or the new content, and a link at the name is replaced, not
    followed.

    :param sync: ``fsync`` the new content before the rename (the caller ``fsync``-s the folder if it needs the
        rename itself to be durable).
    :raises IsADirectoryError: a folder is at ``folder/name``.
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, os.path.join(folder, name))
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def seal(folder: str) -> None:
    """Set ``folder`` and every folder below it to 0700 and every file below it to 0600.

    For a private folder that other code wrote into (e.g. ``tf.train.Checkpoint.write``, which creates its files with
    the umask's mode). Nobody else can create a name inside a private folder, so a link there means it was not private.

    :raises ValueError: a symbolic link inside ``folder``.
    """
    os.chmod(folder, FOLDER_MODE)
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            full = os.path.join(root, name)
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                raise ValueError(f"{os.path.relpath(full, folder)} in a private folder is a symbolic link")
            os.chmod(full, FOLDER_MODE if stat.S_ISDIR(st.st_mode) else FILE_MODE)


def remove(path: str) -> None:
    """Remove whatever is at ``path`` without following a link: a link or file is unlinked, a folder removed with
    everything in it (``shutil.rmtree``, which never follows a link inside); nothing there is fine."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)
