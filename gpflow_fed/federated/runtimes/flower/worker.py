"""A party's worker: its updates computed in one process that lives as long as the party, not one per message.

Flower 1.41 starts a new ``flwr-clientapp`` process for every message a SuperNode receives, and has no warm
ClientApp for this kind of task. A secure-aggregation stage or ``describe`` costs that process little (it imports no
TensorFlow, :mod:`.client_app`), but an ``update`` would import TensorFlow and GPflow, rebuild the party's algorithm,
restore its model from its state folder and trace its functions again, every round. So ``gpflow-fed flower party``
starts, beside its SuperNode and in the same :class:`~.processes.ProcessFamily` (stopped with it), a worker
(:mod:`.resident`: ``python -m gpflow_fed.federated.runtimes.flower.resident FOLDER``, serving with :func:`serve`): a
process of the party that imports TensorFlow once and keeps each job's endpoint alive (:class:`~.client_app.ClientHost`
with ``resident=True``). The ClientApp process that receives an update forwards it to the worker (:func:`forward`)
when its node config names one (``worker``: the worker's folder), and answers it itself when the worker cannot be
reached (not started yet, or exited): the same answer, later.

**What the worker holds and where the party's state lives.** Its live endpoint holds the model, optimizer and traced
functions, and is saved to the party's ``state-dir`` after every update, as a restarted ClientApp saves it. The
party's encoder (its keys, the answers it gave, its DP budget) is not kept by the worker: every forwarded update
carries the ClientApp's ``Context.state``, the worker reads the encoder from it and sends the new state back with the
reply, and the ClientApp stores it. So a worker that exits loses nothing: the next one rebuilds each endpoint from the
state folder. Every update is counted in ``Context.state``; a live endpoint whose count differs (an update was
answered without the worker) is rebuilt from the state folder before it answers.

**Who may talk to it.** The worker's folder is made by the party (``tempfile.mkdtemp``: mode 0700, an unguessable
name, this user's); it holds the socket (0600) and a key file (0600) of 32 random bytes from the operating system
that the worker writes when it starts. A request begins with that key (compared in constant time) and is accepted
only from a peer process of this user (``SO_PEERCRED``); the ClientApp in turn checks the folder is a private folder
of this user and that the peer answering is a process of this user. Other users cannot reach the socket; this user's
own processes can, as they can read the party's data file anyway (the threat model's local boundary).

The messages are Flower's own protobuf (``Context`` and ``RecordDict``), framed by an 8-byte length. No TensorFlow is
imported by :func:`forward`.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import os
import secrets
import socket
import struct
import sys
from typing import Callable, List, Optional

from flwr.app import Context, RecordDict

from .records import recorddict_from_bytes, recorddict_to_bytes

__all__ = ["KEY_FILE", "SOCKET_FILE", "forward", "serve", "worker_command"]

#: the worker's socket in its folder
SOCKET_FILE = "socket"
#: the file of the worker's key (32 random bytes) in its folder
KEY_FILE = "key"
#: bytes of the worker's key
KEY_BYTES = 32
#: the largest frame either side accepts (a request's context and content, a reply): 1 GiB
MAX_FRAME = 1 << 30
_LENGTH = struct.Struct(">Q")
_PEER = struct.Struct("3i")  # struct ucred: pid, uid, gid


def worker_command(folder: str) -> List[str]:
    """The command that starts a party's worker serving ``folder`` (this Python, this package: :mod:`.resident`)."""
    return [sys.executable, "-m", "gpflow_fed.federated.runtimes.flower.resident", os.path.abspath(folder)]


def _peer_uid(conn: socket.socket) -> Optional[int]:
    """The user id of the process at the other end of a Unix socket (None where ``SO_PEERCRED`` does not exist)."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    _, uid, _ = _PEER.unpack(conn.getsockopt(socket.SOL_SOCKET, option, _PEER.size))
    return int(uid)


def _same_user(conn: socket.socket) -> bool:
    uid = _peer_uid(conn)
    return uid is None or uid == os.getuid()


def _read_exactly(conn: socket.socket, count: int) -> bytes:
    chunks, left = [], count
    while left:
        chunk = conn.recv(min(left, 1 << 20))
        if not chunk:
            raise ConnectionError(f"the connection closed {left} bytes short")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _send_frames(conn: socket.socket, *frames: bytes) -> None:
    conn.sendall(b"".join(_LENGTH.pack(len(f)) + f for f in frames))


def _read_frame(conn: socket.socket) -> bytes:
    (length,) = _LENGTH.unpack(_read_exactly(conn, _LENGTH.size))
    if length > MAX_FRAME:
        raise ConnectionError(f"a frame of {length} bytes (at most {MAX_FRAME})")
    return _read_exactly(conn, length)


def _context_bytes(context: Context) -> bytes:
    from flwr.common.serde import context_to_proto

    return bytes(context_to_proto(context).SerializeToString())


def _context_of(data: bytes) -> Context:
    from flwr.common.serde import context_from_proto
    from flwr.proto.message_pb2 import Context as ProtoContext

    proto = ProtoContext()
    proto.ParseFromString(data)
    return context_from_proto(proto)


def _replace_state(context: Context, state: RecordDict) -> None:
    for name in list(context.state.keys()):
        del context.state[name]
    for name, record in state.items():
        context.state[name] = record


def _private(folder: str, what: str) -> bool:
    """Whether ``folder`` exists; it must be a folder of this user that nobody else may enter (mode 0700).

    :raises ValueError: a symbolic link, a file, another user's folder, or one others may read or write.
    """
    from ....private_files import check_folder

    if not check_folder(folder, what):
        return False
    if os.lstat(folder).st_mode & 0o077:
        raise ValueError(
            f"{what} {folder!r} is open to other users (mode {os.lstat(folder).st_mode & 0o777:o}); "
            "a party's worker folder is 0700"
        )
    return True


def forward(folder: str, content: RecordDict, context: Context) -> Optional[RecordDict]:
    """The party's worker's reply to one ``train`` message's ``content``, ``context.state`` replaced by the state it
    sends back; None when no worker answers at ``folder`` (no socket, nobody listening, or it exited before its
    reply): the caller answers itself.

    :raises ValueError: ``folder`` is a symbolic link, a file, another user's folder or open to others, or its key
        file is not :data:`KEY_BYTES` bytes; the peer is another user's process.
    :raises RuntimeError: the worker answered with an error (its message).
    """
    if not _private(folder, "node config worker"):
        return None
    try:
        fd = os.open(os.path.join(folder, KEY_FILE), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return None  # the worker has not started yet
    with os.fdopen(fd, "rb") as f:
        key = f.read(KEY_BYTES + 1)
    if len(key) != KEY_BYTES:
        raise ValueError(f"node config worker={folder!r}: its key file is not {KEY_BYTES} bytes")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        try:
            conn.connect(os.path.join(folder, SOCKET_FILE))
        except (FileNotFoundError, ConnectionRefusedError):
            return None
        if not _same_user(conn):
            raise ValueError(f"node config worker={folder!r}: the process at its socket is another user's")
        try:
            conn.sendall(key)
            _send_frames(conn, _context_bytes(context), recorddict_to_bytes(content))
            status = json.loads(_read_frame(conn).decode("utf-8"))
            if status.get("error"):
                raise RuntimeError(f"the party's worker: {status['error']}")
            reply, state = recorddict_from_bytes(_read_frame(conn)), recorddict_from_bytes(_read_frame(conn))
        except (ConnectionError, OSError):
            return None  # it exited mid-answer: answered here instead
    _replace_state(context, state)
    return reply


Answer = Callable[[RecordDict, Context], RecordDict]


def _serve_one(conn: socket.socket, key: bytes, answer: Answer) -> None:
    """One request on an accepted connection (refused without a word unless from this user with the key)."""
    if not _same_user(conn) or not hmac.compare_digest(_read_exactly(conn, KEY_BYTES), key):
        return
    context = _context_of(_read_frame(conn))
    content = recorddict_from_bytes(_read_frame(conn))
    try:
        reply = answer(content, context)
    except Exception as exc:  # noqa: BLE001 - the ClientApp raises it, as it would have raised it itself
        _send_frames(conn, json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode("utf-8"))
        return
    _send_frames(conn, b"{}", recorddict_to_bytes(reply), recorddict_to_bytes(context.state))


def serve(folder: str, answer: Answer, *, stop: Optional[Callable[[], bool]] = None, tick: float = 1.0) -> int:
    """Serve a party's updates at ``folder`` until ``stop()`` is true or this process's parent exits.

    Writes the key file (0600, :data:`KEY_BYTES` bytes from ``secrets``) and the socket (0600) in ``folder``, which
    must be a private folder of this user (made by the party), and removes both when it returns.

    :param answer: what answers a request (the party's worker: a resident :class:`~.client_app.ClientHost`'s
        ``answer``, :mod:`.resident`).
    :param stop: asked every ``tick`` seconds while idle.
    :return: the number of requests answered.
    :raises ValueError: ``folder`` is missing, a symbolic link, a file, another user's folder or open to others.
    """
    from ....private_files import replace_file

    if not _private(folder, "the worker's folder"):
        raise ValueError(f"the worker's folder {folder!r} does not exist")
    parent = os.getppid()
    key = secrets.token_bytes(KEY_BYTES)
    path = os.path.join(folder, SOCKET_FILE)
    served = 0
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path)
        os.chmod(path, 0o600)
        listener.listen(8)
        replace_file(folder, KEY_FILE, key)  # 0600, whole or absent: a ClientApp never reads a key half written
        listener.settimeout(tick)
        try:
            while not (stop is not None and stop()) and os.getppid() == parent:
                try:
                    conn, _ = listener.accept()
                except socket.timeout:
                    continue
                with conn:
                    conn.settimeout(None)
                    try:
                        _serve_one(conn, key, answer)
                        served += 1
                    except Exception:  # noqa: BLE001 - a request it cannot read or a ClientApp gone: that
                        pass  # ClientApp answers itself; the worker serves the next
        finally:
            for name in (KEY_FILE, SOCKET_FILE):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(folder, name))
    return served
