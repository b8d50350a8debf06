"""The command lines of Flower's processes for a gpflow-fed federation: no TensorFlow, no Flower imported.

A federation is one ``flower-superlink`` (the server's machine) and one ``flower-supernode`` per party (each on its
own machine). This module builds their argument lists, for :mod:`gpflow_fed.federated.runtimes.flower.deploy`
(which starts them on loopback for tests and demos) and for ``gpflow-fed flower party``/``server``, which start
them for real — quickly, since nothing here imports TensorFlow.

A SuperNode's node config is what its party alone decides: its data file, its index, its state folder, its identity
(:mod:`gpflow_fed.federated.runtimes.flower.client_app` lists every key the ClientApp reads) and its own protection
policy. These are every policy key
(:meth:`~gpflow_fed.federated.protection.policy.ClientPolicy.from_node_config`, which parses each strictly; what each
means: :class:`~gpflow_fed.federated.ClientPolicy`), with the ``gpflow-fed flower party`` option that writes it:

* ``secure-aggregation`` (true; ``--no-secure-aggregation`` writes false): never send a sum in plain;
* ``min-cohort`` (2; ``--min-cohort``): the fewest cohort members it masks with;
* ``fractional-bits`` (32): its fixed-point resolution ``2^-f``;
* ``protect-small-cohorts`` (true; the party command writes true): refuse a sum that determines a cohort's rows;
* ``masking-degree`` (0: the protocol's): the least masking and share-holder degree it accepts;
* ``min-noise-multiplier`` (0: none): the least distributed-DP noise it adds itself;
* ``honest-clients`` (0: any): the most honest clients it assumes under distributed DP;
* ``max-rounds`` (1000; ``--max-rounds``): the most training rounds it answers;
* ``max-colluders`` (absent: the protocol's c; ``--max-colluders``): its collusion bound, which sets its quorum in
  the consistency round;
* ``trust-server-noise`` (false): let a DP clip bind its bounded payload under central DP's noise (the server's);
* ``dp-budget-epsilon`` (none; ``--dp-budget``): the ε its distributed-DP answers may spend, across runs;
* ``dp-budget-delta`` (none; ``--dp-budget``): the δ of that budget (both or neither);
* ``dp-ledger`` (required with a budget; ``--dp-ledger``): its DP ledger file (``gpflow-fed flower ledger create``).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
from typing import Dict, List, Mapping, Optional, Union

import numpy as np

__all__ = [
    "OFFLINE_ENV",
    "default_state_root",
    "executable",
    "free_port",
    "node_config",
    "parse_address",
    "party_environment",
    "superlink_command",
    "supernode_command",
    "write_party_data",
]

#: environment that keeps Flower offline: no update check, no telemetry
OFFLINE_ENV = {"FLWR_DISABLE_UPDATE_CHECK": "1", "FLWR_TELEMETRY_ENABLED": "0"}

Setting = Union[str, int, float, bool]


#: Flower 1.41's setting of how often a SuperNode's ``flower-superexec`` looks for a message to start a ClientApp for
SUPEREXEC_POLL_ENV = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"
#: a party's: every 0.2 s (Flower's default 1 s adds half a second to every exchange, on average)
SUPEREXEC_POLL = "0.2"


def party_environment(supernode: str, base: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The environment of a party's ``flower-supernode`` (the executable ``supernode``): ``base`` (default this
    process's) kept offline (:data:`OFFLINE_ENV`), its SuperExec looking for work every :data:`SUPEREXEC_POLL`
    seconds unless ``base`` sets :data:`SUPEREXEC_POLL_ENV`, with the SuperNode's folder first on ``PATH`` (its
    ``flower-superexec`` and ``flwr-clientapp`` are found beside it)."""
    env = {SUPEREXEC_POLL_ENV: SUPEREXEC_POLL, **(os.environ if base is None else base), **OFFLINE_ENV}
    env["PATH"] = os.path.dirname(supernode) + os.pathsep + env.get("PATH", "")
    return env


def executable(name: str) -> str:
    """The Flower executable ``name`` of this Python environment (next to ``sys.executable``), else from ``PATH``.

    :raises FileNotFoundError: neither has it (the ``flower`` extra is not installed).
    """
    here = os.path.join(os.path.dirname(sys.executable), name)
    if os.path.isfile(here) and os.access(here, os.X_OK):
        return here
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(
            2, f"{name} not found; install the Flower extra: pip install 'gpflow-fed[flower]'", name
        )
    return found


def parse_address(address: str, what: str) -> tuple:
    """``(host, port)`` of ``HOST:PORT``.

    :raises ValueError: not ``HOST:PORT`` with a port in 1–65535, naming ``what`` (e.g. ``"--superlink"``).
    """
    host, sep, port = str(address).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{what} must be HOST:PORT (a port in 1-65535), got {address!r}")
    return host, int(port)


def _toml(value: Setting) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        # Flower reads a quoted value up to the next quote of the same kind, with no escapes
        if '"' not in value and "\\" not in value and "\n" not in value:
            return json.dumps(value)  # a TOML basic string with nothing to escape
        if "'" not in value and "\n" not in value:
            return f"'{value}'"  # a TOML literal string
        raise ValueError(f"a node config value cannot hold both ' and \" (or a line break): {value!r}; rename it")
    raise TypeError(f"node config values must be str, int, float or bool, got {type(value).__name__}")


def node_config(settings: Mapping[str, Setting]) -> str:
    """``--node-config``'s value: ``key=value`` pairs, strings quoted (Flower parses each value as TOML)."""
    return " ".join(f"{key}={_toml(value)}" for key, value in settings.items())


def superlink_command(port: int, host: str = "127.0.0.1") -> List[str]:
    """``flower-superlink`` serving the Fleet, Control and Runtime APIs on ``host:port`` (plain HTTP)."""
    return [
        "flower-superlink",
        "--insecure",
        "--host",
        host,
        "--port",
        str(port),
        "--disable-runtime-dependency-installation",
    ]


def supernode_command(
    superlink: str,
    port: int,
    data: str,
    client_index: int,
    state_dir: Optional[str] = None,
    settings: Optional[Mapping[str, Setting]] = None,
) -> List[str]:
    """``flower-supernode`` for party ``client_index`` with its data file, its Runtime API on ``port``.

    :param settings: further node-config entries (the party's policy, its column names).
    """
    config: Dict[str, Setting] = {"data": data, "client-index": int(client_index)}
    if state_dir is not None:
        config["state-dir"] = state_dir
    config.update(settings or {})
    return [
        "flower-supernode",
        "--insecure",
        "--superlink",
        superlink,
        "--port",
        str(port),
        "--node-config",
        node_config(config),
    ]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def default_state_root() -> str:
    """Where a party keeps what its SuperNode needs between messages, by default: ``$XDG_CACHE_HOME/gpflow_fed/flower``
    (``~/.cache/gpflow_fed/flower``): per user, never a shared temporary folder."""
    cache = os.environ.get("XDG_CACHE_HOME", "")
    cache = cache if os.path.isabs(cache) else os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "gpflow_fed", "flower")


def write_party_data(folder: str, client_index: int, X: np.ndarray, Y: np.ndarray) -> str:
    """Write a party's own ``(X, Y)`` as ``<folder>/party-<k>.npz`` for its SuperNode: the folder private (0700,
    created if missing; a link or another user's folder is refused), the file private (0600), replaced atomically.

    :return: the file's path.
    :raises ValueError: ``folder`` is a symbolic link, a file or another user's folder.
    """
    import io

    from ....private_files import make_private_folder, replace_file

    folder = make_private_folder(os.path.abspath(folder), "the party's state folder")
    buffer = io.BytesIO()
    np.savez(buffer, X=np.asarray(X, dtype=np.float64), Y=np.asarray(Y, dtype=np.float64))
    name = f"party-{int(client_index)}.npz"
    replace_file(folder, name, buffer.getvalue())
    return os.path.join(folder, name)
