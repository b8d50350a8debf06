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
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

if TYPE_CHECKING:
    from ....data.dataset import FederatedDataset
from ...protection.identity import write_federation
from .commands import OFFLINE_ENV, free_port, superlink_command, supernode_command
from .lifetime import superlink_up
from .processes import ProcessFamily
from .app_config import CLIENT_APP, SERVER_APP, TABLE_APP, run_config_defaults

__all__ = [
    "LoopbackFederation",
    "SuperLinkServer",
    "OFFLINE_ENV",
    "free_port",
    "read_result",
    "superlink_command",
    "supernode_command",
    "write_app",
    "write_client_data",
]


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

    The app's ``[tool.flwr.app.config]`` holds every key the ServerApp reads, with its default
    (:func:`~gpflow_fed.federated.runtimes.flower.app_config.run_config_defaults`), then ``config``: Flower's
    ``flwr run --run-config "k=v ..."`` may override only keys the app has, so each of them can be set there.
    Its ServerApp is :data:`SERVER_APP`, or, for a table run (``standardize`` or ``save`` set),
    :data:`~gpflow_fed.federated.runtimes.flower.app_config.TABLE_APP` (fit's job and model saving).

    :param algorithm: the algorithm factory ``"package.module:function"`` every party imports and calls
        with the run config (see :func:`~gpflow_fed.federated.runtimes.flower.records.load_factory`).
    :param config: the factory's own keys (e.g. ``rounds``) and run-config values other than the defaults.
    :return: ``directory``.
    :raises ValueError: a malformed factory spec.
    :raises TypeError: a config value that is not str/int/float/bool.
    """
    if not isinstance(algorithm, str) or algorithm.count(":") != 1:
        raise ValueError(f"algorithm must be a factory 'package.module:function', got {algorithm!r}")
    os.makedirs(directory, exist_ok=True)
    settings = {"algorithm": algorithm, **run_config_defaults(), **dict(config or {})}
    server_app = TABLE_APP if settings["standardize"] or settings["save"] else SERVER_APP
    lines = [
        "[build-system]",
        'requires = ["hatchling"]',
        'build-backend = "hatchling.build"',
        "",
        "[project]",
        'name = "gpflow-fed-flower-app"',
        'version = "1.0.0"',
        'description = "gpflow-fed algorithms as a Flower ServerApp/ClientApp"',
        'license = "Apache-2.0"',
        'dependencies = ["gpflow-fed[flower]"]',
        "",
        "[tool.flwr.app]",
        'publisher = "gpflow-fed"',
        "",
        "[tool.flwr.app.components]",
        f'serverapp = "{server_app}"',
        f'clientapp = "{CLIENT_APP}"',
        "",
        "[tool.flwr.app.config]",
        *(f'"{key}" = {_toml_value(value)}' for key, value in settings.items()),
        "",
    ]
    with open(os.path.join(directory, "pyproject.toml"), "w") as f:
        f.write("\n".join(lines))
    return directory


def write_client_data(directory: str, dataset: "FederatedDataset") -> Tuple[List[str], Optional[str]]:
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


class SuperLinkServer:
    """The server's side of a deployment: ``flower-superlink`` as a subprocess of this process, and the gpflow-fed
    apps submitted to it with ``flwr run``.

    Use as a context manager; :meth:`run` writes the app, submits it and waits for the result file (``flwr run``
    can exit 0 even when the run failed, so the result, not the exit code, is checked). Every process it starts
    runs in its :attr:`family` (:class:`~.processes.ProcessFamily`: each in a session of its own, with everything
    they start, the SuperLink's detached ``flower-superexec`` and its ServerApps included); on leaving, the whole
    family is stopped (SIGTERM, ``grace`` seconds, SIGKILL).

    :param workdir: a folder for the app, FLWR_HOME, the output and the logs.
    :param host: the address the SuperLink listens on (``0.0.0.0``: every interface, for parties on other machines).
    :param port: its port (default: a free one).
    :param bin_dir: where the ``flower-*``/``flwr`` executables are (default: next to ``sys.executable``).
    :param env: extra environment variables for every process, e.g. ``PYTHONPATH`` so that the ServerApp
        and ClientApps can import the algorithm factory's module.
    :param grace: seconds the processes have to end after SIGTERM, before SIGKILL.
    :param signals: a command's main thread: the first SIGINT, SIGTERM or SIGHUP raises
        :class:`~.processes.Interrupted` there, and the family stops (see :class:`~.processes.ProcessFamily`).
    """

    #: the name of the SuperLink connection in the written ``flwr_home/config.toml``
    CONNECTION = "loopback"

    def __init__(
        self,
        workdir: str,
        *,
        host: str = "127.0.0.1",
        port: Optional[int] = None,
        bin_dir: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        grace: float = 10.0,
        signals: bool = False,
    ) -> None:
        self.workdir = os.path.abspath(workdir)
        self.host = host
        self.port = int(port) if port else 0
        self.bin_dir = bin_dir or os.path.dirname(sys.executable)
        #: every process this server started, and theirs
        self.family = ProcessFamily(grace, signals=signals)
        #: the ``flower-superlink`` process (None before :meth:`__enter__`)
        self.superlink: Optional[subprocess.Popen] = None
        self.env = {
            **os.environ,
            **OFFLINE_ENV,
            "FLWR_HOME": os.path.join(self.workdir, "flwr_home"),
            "PATH": self.bin_dir + os.pathsep + os.environ.get("PATH", ""),
            **dict(env or {}),
        }

    @property
    def address(self) -> str:
        """Where this machine reaches the SuperLink: ``127.0.0.1:<port>``."""
        return f"127.0.0.1:{self.port}"

    def _start(self, command: Sequence[str], log: str) -> subprocess.Popen:
        with open(os.path.join(self.workdir, log), "w") as out:
            return self.family.start(list(command), env=self.env, stdout=out, stderr=subprocess.STDOUT)

    def __enter__(self) -> "SuperLinkServer":
        os.makedirs(os.path.join(self.workdir, "flwr_home"), exist_ok=True)
        self.port = self.port or free_port()
        with open(os.path.join(self.workdir, "flwr_home", "config.toml"), "w") as f:
            f.write(
                f'[superlink]\ndefault = "{self.CONNECTION}"\n\n[superlink.{self.CONNECTION}]\n'
                f'address = "{self.address}"\ninsecure = true\n'
            )
        self.family.__enter__()
        try:
            self.superlink = self._start(superlink_command(self.port, self.host), "superlink.log")
            self._wait_healthy(60.0)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _wait_healthy(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.superlink is None or self.superlink.poll() is not None:
                break
            if superlink_up(self.address):
                self.family.look()  # its detached flower-superexec, while its parent is known
                return
            time.sleep(0.3)
        raise RuntimeError(
            f"the SuperLink did not start on port {self.port} within {seconds:g} s (is the port taken?); see "
            f"{self.workdir}/superlink.log"
        )

    def run(
        self,
        algorithm: str,
        config: Optional[Mapping[str, Any]] = None,
        timeout: Optional[float] = 300.0,
        stream: bool = False,
    ) -> Dict[str, Any]:
        """Run ``algorithm`` (a factory spec) with ``config`` and return :func:`read_result`'s dict.

        :param timeout: seconds to wait for the result (None: as long as the SuperLink runs).
        :param stream: show the run's log (``flwr run --stream``: the ServerApp's progress) on this process's
            output instead of writing it to ``flwr_run.log``.
        :raises RuntimeError: the ServerApp failed (its error is quoted), or no result within ``timeout``
            seconds or before the SuperLink stopped (the logs are named in the message).
        """
        output = os.path.join(self.workdir, "output")
        shutil.rmtree(output, ignore_errors=True)
        app = write_app(os.path.join(self.workdir, "app"), algorithm, {"output": output, **dict(config or {})})
        command = [os.path.join(self.bin_dir, "flwr"), "run", app, self.CONNECTION] + (["--stream"] if stream else [])
        deadline = None if timeout is None else time.monotonic() + timeout
        if stream:
            submit = self.family.start(command, env=self.env)
        else:
            submit = self._start(command, "flwr_run.log")
        try:
            submit.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        while not os.path.exists(os.path.join(output, "result.json")):
            if os.path.exists(os.path.join(output, "error.json")):
                with open(os.path.join(output, "error.json")) as f:
                    error = json.load(f)
                raise RuntimeError(f"the ServerApp failed: {error['type']}: {error['message']}")
            superlink_gone = self.superlink is None or self.superlink.poll() is not None
            if deadline is not None and time.monotonic() > deadline or superlink_gone:
                raise RuntimeError(f"no result from the ServerApp; see the logs in {self.workdir}")
            time.sleep(0.5)
        return read_result(output)

    def __exit__(self, *exc: Any) -> None:
        self.family.__exit__(*exc)


class LoopbackFederation(SuperLinkServer):
    """A SuperLink and one SuperNode per client on 127.0.0.1, as subprocesses of this process.

    Use as a context manager; :meth:`run` submits the app with ``flwr run`` and waits for the result file.

    :param workdir: a folder for data, the app, FLWR_HOME, client state and logs.
    :param dataset: the federation's data (client k becomes the SuperNode with ``client-index=k``).
    :param bin_dir: where the ``flower-*``/``flwr`` executables are (default: next to ``sys.executable``).
    :param env: extra environment variables for every process (see :class:`SuperLinkServer`).
    """

    def __init__(
        self,
        workdir: str,
        dataset: "FederatedDataset",
        bin_dir: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
    ) -> None:
        super().__init__(workdir, bin_dir=bin_dir, env=env)
        self.dataset = dataset

    def __enter__(self) -> "LoopbackFederation":
        os.makedirs(self.workdir, exist_ok=True)
        self.data, self.test = write_client_data(os.path.join(self.workdir, "data"), self.dataset)
        super().__enter__()
        # every party a fresh signing key and one roster of them all, as a deployment's parties agree out of band
        keys, roster = write_federation(
            os.path.join(self.workdir, "identity"), [f"client_{k}" for k in range(len(self.data))]
        )
        try:
            for k, path in enumerate(self.data):
                state = os.path.join(self.workdir, "state")
                settings = {"signing-key": keys[f"client_{k}"], "roster": roster}
                command = supernode_command(self.address, free_port(), path, k, state, settings)
                self._start(command, f"supernode_{k}.log")
            self.family.look()
        except BaseException:
            self.__exit__()
            raise
        return self

    def run(  # type: ignore[override]
        self, algorithm: str, config: Optional[Mapping[str, Any]] = None, timeout: float = 300.0
    ) -> Dict[str, Any]:
        """Run ``algorithm`` (a factory spec) with ``config`` on every client and return :func:`read_result`'s dict
        (``num-clients`` and, with a test set, ``test-data`` filled in)."""
        settings = {"num-clients": len(self.data), **dict(config or {})}
        if self.test is not None:
            settings.setdefault("test-data", self.test)
        return super().run(algorithm, settings, timeout)
