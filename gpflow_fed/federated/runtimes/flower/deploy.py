"""Deploying on Flower's Deployment Engine: the app folder, the parties' data files and the exact commands.

A real federation runs one ``flower-superlink`` (the server's machine) and one ``flower-supernode`` per
party; ``flwr run <app folder> <connection>`` then starts the gpflow-fed ServerApp on the SuperLink, which
drives the ClientApps on the SuperNodes (``docs/guides/flower.md`` has the walk-through). This module
writes what those commands need and, for tests and demos, :class:`LoopbackFederation` starts the whole
federation on 127.0.0.1 as subprocesses, offline (no update check, no telemetry, no per-run dependency
installation), and reads the ServerApp's result back.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ....data.dataset import FederatedDataset

__all__ = [
    "LoopbackFederation",
    "OFFLINE_ENV",
    "free_port",
    "read_result",
    "superlink_command",
    "supernode_command",
    "write_app",
    "write_client_data",
]

SERVER_APP = "gpflow_fed.federated.runtimes.flower.server_app:app"
CLIENT_APP = "gpflow_fed.federated.runtimes.flower.client_app:app"

#: environment that keeps Flower offline: no update check, no telemetry
OFFLINE_ENV = {"FLWR_DISABLE_UPDATE_CHECK": "1", "FLWR_TELEMETRY_ENABLED": "0"}


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    raise TypeError(f"run-config values must be str, int, float or bool, got {type(value).__name__}")


def write_app(directory: str, algorithm: str, config: Optional[Mapping[str, Any]] = None) -> str:
    """Write the Flower app folder (``pyproject.toml``) whose components are gpflow-fed's Server/ClientApp.

    :param algorithm: the algorithm factory ``"package.module:function"`` every party imports and calls
        with the run config (see :func:`~gpflow_fed.federated.runtimes.flower.records.load_factory`).
    :param config: further run-config defaults (``seed``, ``num-clients``, ``output``, ``test-data``,
        ``timeout``, ``on-error``, ``min-clients``, and the factory's own keys); ``flwr run --run-config``
        overrides them.
    :return: ``directory``.
    :raises ValueError: a malformed factory spec.
    :raises TypeError: a config value that is not str/int/float/bool.
    """
    if not isinstance(algorithm, str) or algorithm.count(":") != 1:
        raise ValueError(f"algorithm must be a factory 'package.module:function', got {algorithm!r}")
    os.makedirs(directory, exist_ok=True)
    settings = {"algorithm": algorithm, **dict(config or {})}
    lines = [
        "[build-system]",
        'requires = ["hatchling"]',
        'build-backend = "hatchling.build"',
        "",
        "[project]",
        'name = "gpflow-fed-flower-app"',
        'version = "1.0.0"',
        'description = "gpflow-fed algorithms as a Flower ServerApp/ClientApp"',
        'dependencies = ["gpflow-fed[flower]"]',
        "",
        "[tool.flwr.app]",
        'publisher = "gpflow-fed"',
        "",
        "[tool.flwr.app.components]",
        f'serverapp = "{SERVER_APP}"',
        f'clientapp = "{CLIENT_APP}"',
        "",
        "[tool.flwr.app.config]",
        *(f'"{key}" = {_toml_value(value)}' for key, value in settings.items()),
        "",
    ]
    with open(os.path.join(directory, "pyproject.toml"), "w") as f:
        f.write("\n".join(lines))
    return directory


def write_client_data(directory: str, dataset: FederatedDataset) -> Tuple[List[str], Optional[str]]:
    """Each client's ``(X_k, Y_k)`` as ``client_k.npz`` (for its SuperNode) and the test set as ``test.npz``.

    In a real federation every party writes its own file on its own machine; this helper is for demos.
    :return: the client files in order, and the test file (None without a test set).
    """
    os.makedirs(directory, exist_ok=True)
    paths = []
    for k, (X, Y) in enumerate(dataset.clients):
        paths.append(os.path.join(directory, f"client_{k}.npz"))
        np.savez(paths[-1], X=X, Y=Y)
    test = None
    if dataset.test is not None:
        test = os.path.join(directory, "test.npz")
        np.savez(test, X=dataset.test[0], Y=dataset.test[1])
    return paths, test


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
    superlink: str, port: int, data: str, client_index: int, state_dir: Optional[str] = None
) -> List[str]:
    """``flower-supernode`` for party ``client_index`` with its data file, its Runtime API on ``port``."""
    node_config = f"data={json.dumps(data)} client-index={int(client_index)}"
    if state_dir is not None:
        node_config += f" state-dir={json.dumps(state_dir)}"
    return [
        "flower-supernode",
        "--insecure",
        "--superlink",
        superlink,
        "--port",
        str(port),
        "--node-config",
        node_config,
    ]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def read_result(directory: str) -> Dict[str, Any]:
    """What :func:`~gpflow_fed.federated.runtimes.flower.server_app.save_result` wrote: ``record`` (history,
    metrics, ledger), ``parameters`` and, if present, ``predictions`` (dicts of arrays).

    :raises FileNotFoundError: no ``result.json`` (the run did not finish).
    """
    with open(os.path.join(directory, "result.json")) as f:
        out: Dict[str, Any] = {"record": json.load(f)}
    with np.load(os.path.join(directory, "parameters.npz")) as npz:
        out["parameters"] = {k: npz[k] for k in npz.files}
    path = os.path.join(directory, "predictions.npz")
    if os.path.exists(path):
        with np.load(path) as npz:
            out["predictions"] = {k: npz[k] for k in npz.files}
    return out


class LoopbackFederation:
    """A SuperLink and one SuperNode per client on 127.0.0.1, as subprocesses of this process.

    Use as a context manager; :meth:`run` submits the app with ``flwr run`` and waits for the result file
    (``flwr run`` can exit 0 even when the run failed, so the result, not the exit code, is checked).

    :param workdir: a folder for data, the app, FLWR_HOME, client state and logs.
    :param dataset: the federation's data (client k becomes the SuperNode with ``client-index=k``).
    :param bin_dir: where the ``flower-*``/``flwr`` executables are (default: next to ``sys.executable``).
    :param env: extra environment variables for every process, e.g. ``PYTHONPATH`` so that the ServerApp
        and ClientApps can import the algorithm factory's module.
    """

    def __init__(
        self,
        workdir: str,
        dataset: FederatedDataset,
        bin_dir: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
    ) -> None:
        self.workdir = os.path.abspath(workdir)
        self.dataset = dataset
        self.bin_dir = bin_dir or os.path.dirname(sys.executable)
        self.processes: List[subprocess.Popen] = []
        self.port = 0
        self.env = {
            **os.environ,
            **OFFLINE_ENV,
            "FLWR_HOME": os.path.join(self.workdir, "flwr_home"),
            "PATH": self.bin_dir + os.pathsep + os.environ.get("PATH", ""),
            **dict(env or {}),
        }

    def _start(self, command: Sequence[str], log: str) -> None:
        with open(os.path.join(self.workdir, log), "w") as out:
            self.processes.append(
                subprocess.Popen(
                    list(command), env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
            )

    def __enter__(self) -> "LoopbackFederation":
        os.makedirs(os.path.join(self.workdir, "flwr_home"), exist_ok=True)
        self.data, self.test = write_client_data(os.path.join(self.workdir, "data"), self.dataset)
        self.port = free_port()
        address = f"127.0.0.1:{self.port}"
        with open(os.path.join(self.workdir, "flwr_home", "config.toml"), "w") as f:
            f.write(
                f'[superlink]\ndefault = "loopback"\n\n[superlink.loopback]\naddress = "{address}"\ninsecure = true\n'
            )
        self._start(superlink_command(self.port), "superlink.log")
        self._wait_healthy(60.0)
        for k, path in enumerate(self.data):
            state = os.path.join(self.workdir, "state")
            self._start(supernode_command(address, free_port(), path, k, state), f"supernode_{k}.log")
        return self

    def _wait_healthy(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2):
                    return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError(f"the SuperLink did not become healthy in {seconds:g} s; see {self.workdir}/superlink.log")

    def run(self, algorithm: str, config: Optional[Mapping[str, Any]] = None, timeout: float = 300.0) -> Dict[str, Any]:
        """Run ``algorithm`` (a factory spec) with ``config`` and return :func:`read_result`'s dict.

        :raises RuntimeError: the ServerApp failed (its error is quoted), or no result within ``timeout``
            seconds (the logs are named in the message).
        """
        output = os.path.join(self.workdir, "output")
        shutil.rmtree(output, ignore_errors=True)
        settings = {"num-clients": len(self.data), "output": output, **dict(config or {})}
        if self.test is not None:
            settings.setdefault("test-data", self.test)
        app = write_app(os.path.join(self.workdir, "app"), algorithm, settings)
        with open(os.path.join(self.workdir, "flwr_run.log"), "w") as out:
            subprocess.run(
                [os.path.join(self.bin_dir, "flwr"), "run", app, "loopback"],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                check=False,
            )
        deadline = time.monotonic() + timeout
        while not os.path.exists(os.path.join(output, "result.json")):
            if os.path.exists(os.path.join(output, "error.json")):
                with open(os.path.join(output, "error.json")) as f:
                    error = json.load(f)
                raise RuntimeError(f"the ServerApp failed: {error['type']}: {error['message']}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no result from the ServerApp after {timeout:g} s; see the logs in {self.workdir}")
            time.sleep(0.5)
        return read_result(output)

    def __exit__(self, *exc: Any) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self.processes = []
