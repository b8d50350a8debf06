"""Flower from tables: the guide's commands (docs/guides/flower.md), run as written.

The default test runs every command of the guide's tested block through the CLI's own parsing and checks; only the
processes are replaced: ``flower party`` would start ``flower-supernode`` (``lifetime.serve_party``), whose node
config is kept instead, and ``flower server`` would start ``flower-superlink`` and ``flwr run``, whose app folder is
written as usual and whose ServerApp runs on a loopback grid of restarted ClientApps, one per party's node config
(state on disk between messages, as on a SuperNode). Reduced settings: fewer rounds and inducing points. The slow test
runs the same commands as processes: a SuperLink and one SuperNode per party on 127.0.0.1.
"""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import Context, RecordDict  # noqa: E402
from flwr.common.config import parse_config_args  # noqa: E402

from gpflow_fed.cli import main  # noqa: E402
from gpflow_fed.federated.runtimes.flower import deploy, lifetime  # noqa: E402
from gpflow_fed.federated.runtimes.flower.client_app import make_client_app  # noqa: E402
from gpflow_fed.fitting.flower import server_app  # noqa: E402
from gpflow_fed.federated.runtimes.flower.testing import LoopbackGrid  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
GUIDE = ROOT / "docs" / "guides" / "flower.md"
MARK = "<!-- tested: tests/federated/runtimes/test_flower_tables.py -->"
#: the reduced settings the default test appends to ``flower server`` (argparse keeps the last value)
REDUCED = ["--rounds", "2", "--inducing", "8"]


def guide_commands() -> List[List[str]]:
    """The shell commands of the guide's tested block: one per line, comments and the prompt dropped."""
    text = GUIDE.read_text()
    assert text.count(MARK) == 1, f"{GUIDE} must mark its table commands once with {MARK}"
    block = text.split(MARK, 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    lines = [line.split("#", 1)[0].strip() for line in block.replace("\\\n", " ").splitlines()]
    return [shlex.split(line) for line in lines if line]


def guide_python() -> str:
    """The guide's Python block that follows the tested commands (loading the saved model)."""
    text = GUIDE.read_text().split(MARK, 1)[1]
    return text.split("```python\n", 1)[1].split("```", 1)[0]


class _Parties:
    """What the ``flower party`` commands would have started: their node configs, as Flower parses them."""

    def __init__(self) -> None:
        self.node_configs: List[Dict[str, Any]] = []
        self.commands: List[List[str]] = []

    def serve_party(self, family: Any, argv: List[str], env: Dict[str, str], superlink: str, **kwargs: Any) -> int:
        assert os.path.basename(argv[0]) == "flower-supernode" and superlink == argv[argv.index("--superlink") + 1]
        assert env["FLWR_TELEMETRY_ENABLED"] == "0" and kwargs["linger"] == 15.0 and not kwargs["stay"]
        self.commands.append(argv)
        self.node_configs.append(parse_config_args([argv[argv.index("--node-config") + 1]]))
        return 0


def _loopback_server(parties: _Parties, runs: List[Dict[str, Any]]) -> type:
    """A stand-in for :class:`deploy.SuperLinkServer`: the app written as usual, its ServerApp run on a loopback grid
    of the parties' node configs (ClientApps restarted for every message), the result read as usual."""

    class LoopbackServer(deploy.SuperLinkServer):
        def __enter__(self) -> "LoopbackServer":
            os.makedirs(self.workdir, exist_ok=True)
            return self

        def __exit__(self, *exc: Any) -> None:
            return None

        def run(self, algorithm: str, config: Any = None, timeout: Any = None, stream: bool = False) -> Dict[str, Any]:
            output = os.path.join(self.workdir, "output")
            app = deploy.write_app(os.path.join(self.workdir, "app"), algorithm, {"output": output, **dict(config)})
            with open(os.path.join(app, "pyproject.toml"), "rb") as f:
                run_config = tomllib.load(f)["tool"]["flwr"]["app"]["config"]
            grid = LoopbackGrid(make_client_app(), parties.node_configs, run_config, 7)
            server_app(grid, Context(run_id=7, node_id=1, node_config={}, state=RecordDict(), run_config=run_config))
            runs.append({"run_config": run_config, "grid": grid})
            return deploy.read_result(output)

    return LoopbackServer


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_the_guides_table_commands_run_as_written(tmp_path, monkeypatch, capsys):
    commands = guide_commands()
    assert [c[:3] for c in commands] == [["gpflow-fed", "datasets", "--write-party-examples"]] + [
        ["gpflow-fed", "flower", "keygen"]
    ] * 4 + [["gpflow-fed", "flower", "server"]] + [["gpflow-fed", "flower", "party"]] * 4
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    parties, runs = _Parties(), []
    monkeypatch.setattr(lifetime, "serve_party", parties.serve_party)
    monkeypatch.setattr(deploy, "SuperLinkServer", _loopback_server(parties, runs))
    flower_log = logging.getLogger("flwr")
    lines = _Lines()
    flower_log.addHandler(lines)
    try:
        server = None
        for argv in commands:
            if argv[1:3] == ["flower", "server"]:
                server = argv  # the server waits for the parties: run it once they are up
                continue
            assert main(argv[1:]) == 0, argv
        assert server is not None
        assert main(server[1:] + REDUCED) == 0
    finally:
        flower_log.removeHandler(lines)
    out = capsys.readouterr().out

    # every party ran one command on its own table, with its own policy; no pooled table anywhere
    assert [c["client-index"] for c in parties.node_configs] == [0, 1, 2, 3]
    for config in parties.node_configs:
        assert config["secure-aggregation"] is True and config["min-cohort"] == 2
        assert os.path.isfile(config["signing-key"]) and os.path.isfile(config["roster"])  # authenticated parties
        assert oct(os.stat(config["signing-key"]).st_mode & 0o777) == "0o600"
        assert config["target"] == "los"
        with np.load(config["data"]) as npz:
            assert npz["X"].shape[1] == 2  # age, dose of this party only
        assert oct(os.stat(config["data"]).st_mode & 0o777) == "0o600"
    assert not list(tmp_path.glob("**/*pooled*")) and len(list((tmp_path / "hospitals").glob("*.csv"))) == 4

    # the server: the moments phase under secure aggregation first, then the rounds; progress in its log
    run_config = runs[0]["run_config"]
    assert run_config["secure-aggregation"] is True and run_config["standardize"] is True
    assert run_config["rounds"] == 2 and run_config["num-inducing"] == 8
    log = "\n".join(lines.lines)
    assert "4 parties, 220 rows" in log and "features" in log and "-> target los" in log
    assert "moments agreed (secure aggregation" in log
    assert [f"round {r}/2" in log for r in (1, 2)] == [True] * 2
    # the estimate after the moments counts the training's exchanges as they are made: 3 to set up, 4 a round, 4 to
    # finish; each round's line says what is left
    assert "11 exchanges of" in log and "the training's 2 rounds take 15 exchanges (4 a round, 3 to set up" in log
    assert "round 1/2: 4 clients, 7 exchanges" in log and "min left (8 exchanges)" in log
    assert "model saved to" in log and "trained fsgp in 2 rounds" in out

    # the saved model predicts in the user's units (length of stay in days), from raw inputs
    namespace: Dict[str, Any] = {}
    exec(guide_python(), namespace)  # noqa: S102 - the guide's own snippet
    mean = np.asarray(namespace["mean"])
    table = np.loadtxt(tmp_path / "hospitals" / "north.csv", delimiter=",", skiprows=1)
    los = table[:, 2]
    assert mean.shape == (1, 1) and los.min() - 5 < float(mean[0, 0]) < los.max() + 5

    # the moments exchanges (the columns' scales, then the scaled sums) are recorded, protected: the ledger holds
    # their secagg stages before the training's
    record = deploy.read_result(str(tmp_path / "gpflow-fed-server" / "output"))["record"]
    exchanges = record["exchanges"]
    assert [exchanges[j]["stages"] for j in ("describe", "moments", "train")] == [1, 11, 15]  # 4R + 19, R = 2
    assert exchanges["train"]["by_stage"]["update"][0] == 3 and exchanges["train"]["seconds"] > 0
    phases = [e["phase"] for e in record["ledger"]]
    assert phases[0].startswith("magnitudes") and any(p.startswith("magnitudes/secagg/masked_input") for p in phases)
    assert any(p.startswith("moments/secagg/masked_input") for p in phases)
    assert max(i for i, p in enumerate(phases) if p.startswith("moments")) < phases.index("train")
    assert any(p.startswith("train/secagg/masked_input") for p in phases)


def test_a_party_refuses_a_bad_table_before_tensorflow(tmp_path, capsys):
    bad = tmp_path / "mine.csv"
    bad.write_text("age,dose,los\n40,1.0,3\n")
    code = main(["flower", "party", "--csv", str(bad), "--target", "stay", "--client-index", "0", "--superlink", "x"])
    err = capsys.readouterr().err
    assert code == 2
    assert "'stay' not among the table's columns (columns: age, dose, los)" in err
    assert "--superlink must be HOST:PORT" in err


@pytest.mark.slow
def test_the_guides_table_commands_on_a_superlink_and_supernodes(tmp_path):
    """The guide's commands as processes on 127.0.0.1 (minutes: the SuperNode polls every 3 s and starts a
    ClientApp process per message); the parties stop by themselves once the server's run is over, and nothing any
    command started is left."""
    from gpflow_fed.federated.runtimes.flower.processes import ProcessFamily

    commands = guide_commands()
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    cli = [sys.executable, "-m", "gpflow_fed.cli"]
    for argv in commands[:5]:  # the tables, the parties' keys and roster
        subprocess.run(cli + argv[1:], cwd=tmp_path, env=env, check=True, timeout=300, stdout=subprocess.DEVNULL)
    family = ProcessFamily(grace=10.0)
    log = tmp_path / "server.log"
    with family, open(log, "w") as server_log:
        server = family.start(
            cli + commands[5][1:] + ["--rounds", "1", "--inducing", "8"],
            cwd=tmp_path,
            env=env,
            stdout=server_log,
            stderr=subprocess.STDOUT,
        )
        parties = [
            family.start(cli + argv[1:] + ["--linger", "2"], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL)
            for argv in commands[6:]
        ]
        deadline = time.monotonic() + 1500
        while any(p.poll() is None for p in [server, *parties]) and time.monotonic() < deadline:
            family.look()  # every session any command starts, while it runs
            time.sleep(1.0)
        out = log.read_text()
        assert server.returncode == 0, out[-3000:]
        assert [party.returncode for party in parties] == [0] * 4  # each stopped by itself
        assert family.alive() == []  # no SuperLink, SuperNode, superexec or ClientApp left
    assert "round 1/1" in out and "trained fsgp in 1 rounds" in out
    assert (tmp_path / "model.npz").exists()
