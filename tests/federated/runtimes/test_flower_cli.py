"""``gpflow-fed flower``: the app folder it writes and the commands it prints."""

import json
import shlex
import tomllib

import pytest

pytest.importorskip("flwr")

from gpflow_fed.cli import main  # noqa: E402
from gpflow_fed.federated.runtimes.flower.app_config import run_config_defaults  # noqa: E402


@pytest.fixture(name="factory_module")
def _factory_module(tmp_path, monkeypatch):
    """An importable ``h20pkg.jobs`` whose ``fsgp`` is registered and ``plain`` is not."""
    package = tmp_path / "pkgs" / "h20pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "jobs.py").write_text(
        "from gpflow_fed.federated import register_algorithm_factory\n\n"
        "@register_algorithm_factory(name='h20pkg.jobs:fsgp')\ndef fsgp(config):\n    return None\n\n"
        "def plain(config):\n    return None\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))
    return "h20pkg.jobs"


def test_flower_writes_the_app_and_prints_the_commands(tmp_path, capsys, factory_module):
    app = tmp_path / "app"
    status = main(
        [
            "flower",
            "app",
            str(app),
            "--algorithm",
            "h20pkg.jobs:fsgp",
            "--clients",
            "2",
            "--superlink",
            "10.0.0.5:9100",
            "--data-dir",
            str(tmp_path / "data"),
            "--set",
            "seed=3",
            "--set",
            "rounds=2",
            "--set",
            "name=co2",
        ]
    )
    assert status == 0
    with open(app / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)
    config = project["tool"]["flwr"]["app"]["config"]
    given = {"algorithm": "h20pkg.jobs:fsgp", "num-clients": 2, "seed": 3, "rounds": 2, "name": "co2"}
    assert config == {**run_config_defaults(), **given}  # every key the ServerApp reads: --run-config may set any
    assert project["project"]["dependencies"] == ["gpflow-fed[flower]"]
    with open(app / "flwr_home" / "config.toml", "rb") as f:
        connection = tomllib.load(f)["superlink"]
    assert connection["gpflow-fed"] == {"address": "10.0.0.5:9100", "insecure": True}
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == (
        "export FLWR_DISABLE_UPDATE_CHECK=1 FLWR_TELEMETRY_ENABLED=0 GPFLOW_FED_ALGORITHM_MODULES=h20pkg.jobs"
    )
    assert shlex.split(lines[1])[:6] == ["flower-superlink", "--insecure", "--host", "0.0.0.0", "--port", "9100"]
    for k, line in enumerate(lines[2:4]):
        words = shlex.split(line)
        assert words[:4] == ["flower-supernode", "--insecure", "--superlink", "10.0.0.5:9100"]
        assert words[-1] == f'data="{tmp_path / "data" / f"client_{k}.npz"}" client-index={k}'
    assert shlex.split(lines[4]) == [f"FLWR_HOME={app / 'flwr_home'}", "flwr", "run", str(app), "gpflow-fed"]
    assert (
        main(
            [
                "flower",
                "app",
                str(tmp_path / "app2"),
                "--algorithm",
                "h20pkg.jobs:fsgp",
                "--clients",
                "2",
                "--superlink",
                "10.0.0.5:9100",
                "--data-dir",
                str(tmp_path / "data"),
                "--json",
            ]
        )
        == 0
    )
    payload = json.loads(capsys.readouterr().out)["outputs"]
    assert (
        payload["app"] == str(tmp_path / "app2")
        and payload["environment"]["GPFLOW_FED_ALGORITHM_MODULES"] == "h20pkg.jobs"
    )
    assert payload["supernodes"][1] == lines[3] and payload["superlink"] == lines[1]
    assert payload["run"] == f"FLWR_HOME={tmp_path / 'app2' / 'flwr_home'} flwr run {tmp_path / 'app2'} gpflow-fed"


def test_flower_checks_the_factory_before_writing(tmp_path, capsys, factory_module):
    for spec, problem in (
        ("h20nowhere.jobs:fsgp", "does not import"),
        ("h20pkg.jobs:missing", "no function"),
        ("h20pkg.jobs:plain", "not a registered algorithm factory: decorate plain"),
    ):
        assert main(["flower", "app", str(tmp_path / "app"), "--algorithm", spec, "--clients", "2"]) == 2
        assert problem in capsys.readouterr().err
    assert not (tmp_path / "app").exists()


@pytest.mark.parametrize(
    "argv, problem",
    [
        (["--algorithm", "no-colon", "--clients", "2"], "factory"),
        (["--algorithm", "a.b:c", "--clients", "0"], "--clients"),
        (["--algorithm", "a.b:c", "--clients", "2", "--superlink", "nohost"], "HOST:PORT"),
        (["--algorithm", "a.b:c", "--clients", "2", "--set", "novalue"], "key=value"),
    ],
)
def test_flower_bad_arguments_are_named(tmp_path, capsys, argv, problem):
    assert main(["flower", "app", str(tmp_path / "app"), *argv]) == 2
    assert problem in capsys.readouterr().err
