"""A party's own DP budget: its zCDP ledger of every distributed-DP-noised answer, across exchanges and runs.

A :class:`~gpflow_fed.federated.protection.policy.ClientPolicy` with a ``budget`` (ε, δ) answers a distributed-DP
exchange only while its total zCDP ρ — every noised answer it has given, in every exchange and every run, plus this
one (:func:`~gpflow_fed.federated.protection.distributed_dp.release_rho` of the request's mechanism for the party's
own payload dimension) — converts to at most ε at δ, by the conversion the accountant uses
(:func:`~gpflow_fed.federated.protection.distributed_dp.zcdp_epsilon`). Only distributed DP is the party's own: its
noise share is added on the client; central DP's noise is the server's, so a party under a budget refuses central DP
and plain sums.

**The ledger file** (``ClientPolicy.ledger``, a Flower party's node config ``dp-ledger``) is a JSON document::

    {"format": "gpflow-fed/dp-ledger/1", "rho": <total>, "entries": [
        {"run": "<run id hex or ''>", "purpose": "train", "round": 3, "phase": "stats", "rho": <ρ>}, ...]}

It is created once, explicitly, by :func:`create_ledger` (``gpflow-fed flower ledger create PATH``), 0600 in a
folder of this user that no one else can write (a folder it creates is 0700); it is never overwritten. Each answer's
spend is **reserved before the answer leaves**: the file is locked (``fcntl.flock``, exclusive), read, checked,
the entry added, written (a fresh 0600 file, ``fsync``, renamed over the name, the folder ``fsync``-ed) and only then
unlocked and the answer encoded. So two runs of the same party (two processes, or two threads) cannot both spend the
last of the budget. A spend is reserved when the client encodes its answer, even if the exchange then fails: the
ledger may count more than was released, never less.

**Fails closed, never resets.** A missing ledger, a symbolic link, a file that is not this user's or that others can
read or write, a folder others can write, bad JSON, another format tag, a total that is not exactly the sum of its
entries, or a negative or non-finite value: the client refuses the exchange (:class:`LedgerRefusal`) and leaves the
file as it is. Restoring the ledger (e.g. from a backup) is the party's decision, not the package's.

**In memory.** Under a budget without a ledger path (an in-process :class:`~gpflow_fed.federated.LocalRuntime`
client), the encoder keeps its ledger in memory for its own life (and in its saved state): it does not span runs
then. A Flower party's node config must name a ``dp-ledger``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import stat
import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple, Union

from ...private_files import check_folder, make_private_folder, new_file, replace_file
from .distributed_dp import zcdp_epsilon

__all__ = ["FORMAT", "FileLedger", "LedgerRefusal", "MemoryLedger", "Spend", "create_ledger", "read_ledger"]

#: the format tag of a ledger file
FORMAT = "gpflow-fed/dp-ledger/1"
_ENTRY_KEYS = {"run", "purpose", "round", "phase", "rho"}
_OPEN = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class LedgerRefusal(ValueError):
    """The party refuses an exchange for its budget or its ledger (exhausted, missing, corrupt, unsafe)."""


@dataclass(frozen=True)
class Spend:
    """One noised answer: the run id (hex, ``""`` before the run's setup), the exchange and its zCDP ρ."""

    run: str
    purpose: str
    round: int
    phase: str
    rho: float

    def to_json(self) -> Dict[str, Any]:
        return {
            "run": self.run,
            "purpose": self.purpose,
            "round": int(self.round),
            "phase": self.phase,
            "rho": self.rho,
        }


def _dump(entries: List[Dict[str, Any]]) -> bytes:
    total = math.fsum(e["rho"] for e in entries)
    text = json.dumps({"format": FORMAT, "rho": total, "entries": entries}, indent=1, allow_nan=False)
    return (text + "\n").encode("utf-8")


def _real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _parse(data: bytes, path: str) -> Tuple[float, List[Dict[str, Any]]]:
    """The checked (total, entries) of a ledger file's bytes.

    :raises LedgerRefusal: anything but a well-formed ledger whose total is exactly the sum of its entries.
    """

    def corrupt(why: str) -> LedgerRefusal:
        return LedgerRefusal(
            f"the DP ledger {path} is corrupt or was edited ({why}); the party refuses every budgeted exchange until "
            "it restores its own ledger (it is never reset)"
        )

    def no_constants(name: str) -> Any:
        raise corrupt(f"the value {name}")

    try:
        document = json.loads(data.decode("utf-8"), parse_constant=no_constants)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise corrupt("not JSON") from None
    if not isinstance(document, dict) or set(document) != {"format", "rho", "entries"}:
        raise corrupt("not a ledger document")
    if document["format"] != FORMAT:
        raise corrupt(f"format {document['format']!r}, not {FORMAT!r}")
    entries = document["entries"]
    if not isinstance(entries, list):
        raise corrupt("entries is not a list")
    for entry in entries:
        if not isinstance(entry, dict) or set(entry) != _ENTRY_KEYS:
            raise corrupt("an entry is malformed")
        if not all(isinstance(entry[k], str) for k in ("run", "purpose", "phase")):
            raise corrupt("an entry is malformed")
        if isinstance(entry["round"], bool) or not isinstance(entry["round"], int) or entry["round"] < 0:
            raise corrupt("an entry's round is not a non-negative integer")
        if not _real(entry["rho"]):
            raise corrupt("an entry's rho is negative or not a number")
    total = document["rho"]
    if not _real(total):
        raise corrupt("its rho is negative or not a number")
    if float(total) != math.fsum(e["rho"] for e in entries):
        raise corrupt("its rho is not the sum of its entries")
    return float(total), entries


def _check_folder(folder: str) -> None:
    try:
        if not check_folder(folder, "the DP ledger's folder"):
            raise LedgerRefusal(f"the DP ledger's folder {folder} does not exist")
    except ValueError as error:
        if isinstance(error, LedgerRefusal):
            raise
        raise LedgerRefusal(str(error)) from None
    if os.lstat(folder).st_mode & 0o022:
        raise LedgerRefusal(
            f"the DP ledger's folder {folder} can be written by other users (who could replace the ledger); make it "
            "0700"
        )


def _check_file(path: str, st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise LedgerRefusal(f"the DP ledger {path} is not a regular file")
    euid = os.geteuid() if hasattr(os, "geteuid") else None
    if euid is not None and st.st_uid != euid:
        raise LedgerRefusal(f"the DP ledger {path} belongs to another user (uid {st.st_uid}); refused")
    if st.st_mode & 0o077:
        raise LedgerRefusal(
            f"the DP ledger {path} has mode {stat.S_IMODE(st.st_mode):04o}: others can read or write it; it must be "
            "0600 (refused; the package does not repair it)"
        )


def _open_checked(path: str) -> int:
    """A descriptor of the ledger file (read only, never through a link), its folder and itself checked."""
    _check_folder(os.path.dirname(path))
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise LedgerRefusal(
            f"there is no DP ledger at {path}; a party with a DP budget creates its ledger once, explicitly "
            f"(gpflow-fed flower ledger create {path}, or create_ledger), and a missing one is never recreated"
        ) from None
    if stat.S_ISLNK(st.st_mode):
        raise LedgerRefusal(f"the DP ledger {path} is a symbolic link; give the file itself")
    try:
        fd = os.open(path, _OPEN)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise LedgerRefusal(f"the DP ledger {path} is a symbolic link; give the file itself") from None
        raise LedgerRefusal(f"the DP ledger {path} cannot be opened ({error.strerror})") from None
    try:
        _check_file(path, os.fstat(fd))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_fd(fd: int) -> bytes:
    chunks: List[bytes] = []
    offset = 0
    while True:
        chunk = os.pread(fd, 1 << 20, offset)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        offset += len(chunk)


def _fsync_folder(folder: str) -> None:
    with contextlib.suppress(OSError):  # not every platform can open a folder
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def create_ledger(path: Union[str, "os.PathLike[str]"]) -> str:
    """Create an empty DP ledger at ``path`` (0600; its folder made 0700 if missing), once.

    :return: the ledger's absolute path.
    :raises FileExistsError: something is already at ``path`` (a ledger is never overwritten: it holds the spend).
    :raises LedgerRefusal: the folder is a link, another user's, or writable by others.
    """
    path = os.path.abspath(os.path.expanduser(os.fspath(path)))
    folder = make_private_folder(os.path.dirname(path), "the DP ledger's folder")
    _check_folder(folder)
    try:
        with new_file(path, "wb") as f:
            f.write(_dump([]))
            f.flush()
            os.fsync(f.fileno())
    except FileExistsError:
        raise FileExistsError(
            f"{path} exists; a DP ledger is never overwritten (it holds the party's spend across runs)"
        ) from None
    _fsync_folder(folder)
    return path


def read_ledger(path: Union[str, "os.PathLike[str]"]) -> Tuple[float, List[Dict[str, Any]]]:
    """The checked (total ρ, entries) of the ledger at ``path``, read under a shared lock.

    :raises LedgerRefusal: missing, unsafe or corrupt (:mod:`module docstring <.budget>`).
    """
    import fcntl

    path = os.path.abspath(os.path.expanduser(os.fspath(path)))
    fd = _open_checked(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        return _parse(_read_fd(fd), path)
    finally:
        os.close(fd)


def _within(total: float, spend: Spend, budget: Tuple[float, float], who: str) -> float:
    """The total after ``spend``; raises unless it converts to ε ≤ the budget's at its δ."""
    epsilon, delta = budget
    after = total + spend.rho
    spent = zcdp_epsilon(after, delta)
    if spent > epsilon:
        raise LedgerRefusal(
            f"{who} refuses: its DP budget is ε = {epsilon:g} at δ = {delta:g}, and this answer (ρ = {spend.rho:.4g}) "
            f"would bring its spend across exchanges and runs to ρ = {after:.4g}, ε = {spent:.4g}; refused (nothing "
            "of the payload was encoded)"
        )
    return after


class MemoryLedger:
    """The ledger of a budgeted party without a ledger file: in memory, for its encoder's life only."""

    def __init__(self, entries: Optional[List[Dict[str, Any]]] = None) -> None:
        self._entries: List[Dict[str, Any]] = []
        if entries:
            _, self._entries = _parse(_dump(list(entries)), "(in memory)")
        self._lock = threading.Lock()

    @property
    def entries(self) -> List[Dict[str, Any]]:
        return [dict(e) for e in self._entries]

    def reserve(self, spend: Spend, budget: Tuple[float, float], who: str) -> float:
        """Add ``spend`` if it stays within ``budget``; the new total ρ.

        :raises LedgerRefusal: beyond the budget.
        """
        with self._lock:
            after = _within(math.fsum(e["rho"] for e in self._entries), spend, budget, who)
            self._entries.append(spend.to_json())
            return after


class FileLedger:
    """The ledger file at ``path`` (module docstring); nothing is read until :meth:`reserve`."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(os.path.expanduser(os.fspath(path)))

    def reserve(self, spend: Spend, budget: Tuple[float, float], who: str) -> float:
        """Reserve ``spend`` under the file's exclusive lock: read, check, add, write, ``fsync``, unlock.

        :return: the new total ρ.
        :raises LedgerRefusal: beyond the budget, or a missing, unsafe or corrupt ledger (nothing is written then).
        """
        import fcntl

        folder, name = os.path.split(self.path)
        for _ in range(1000):
            fd = _open_checked(self.path)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    current = os.lstat(self.path)
                except FileNotFoundError:
                    continue  # replaced while this waited; open again (a missing file refuses there)
                if not os.path.samestat(current, os.fstat(fd)):
                    continue  # another writer renamed its new ledger over the one this locked: open the new one
                total, entries = _parse(_read_fd(fd), self.path)
                after = _within(total, spend, budget, who)
                try:
                    replace_file(folder, name, _dump([*entries, spend.to_json()]), sync=True)
                except OSError as error:
                    raise LedgerRefusal(f"the DP ledger {self.path} could not be written ({error}); refused") from None
                _fsync_folder(folder)
                return after
            finally:
                os.close(fd)  # releases the lock, after the new ledger is in place
        raise LedgerRefusal(f"the DP ledger {self.path} kept changing while it was read; refused")


def open_ledger(path: Optional[str], budget: Optional[Tuple[float, float]]) -> Union[None, FileLedger, MemoryLedger]:
    """The ledger a policy names: None without a budget, its file, or one in memory."""
    if budget is None:
        return None
    return FileLedger(path) if path is not None else MemoryLedger()
