"""``gpflow-fed flower``: the app folder it writes and the commands it prints."""

import shlex
import tomllib

import pytest

pytest.importorskip("flwr")

from gpflow_fed.cli import main  # noqa: E402


def test_flower_writes_the_app_and_prints_the_commands(tmp_path, capsys):
    app = tmp_path / "app"
    status = main(["flower", str(app), "--algorithm", "mypkg.jobs:fsgp", "--clients", "2", "--superlink", "10.0.0.5:9100",
                   "--data-dir", str(tmp_path / "data"), "--set", "seed=3", "--set", "rounds=2", "--set", "name=co2"])
    assert status == 0
    with open(app / "pyproject.toml", "rb") as f:
        config = tomllib.load(f)["tool"]["flwr"]["app"]["config"]
    assert config == {"algorithm": "mypkg.jobs:fsgp", "num-clients": 2, "seed": 3, "rounds": 2, "name": "co2"}
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "export FLWR_DISABLE_UPDATE_CHECK=1 FLWR_TELEMETRY_ENABLED=0"
    assert shlex.split(lines[1])[:6] == ["flower-superlink", "--insecure", "--host", "0.0.0.0", "--port", "9100"]
    for k, line in enumerate(lines[2:4]):
        words = shlex.split(line)
        assert words[:4] == ["flower-supernode", "--insecure", "--superlink", "10.0.0.5:9100"]
        assert words[-1] == f'data="{tmp_path / "data" / f"client_{k}.npz"}" client-index={k}'
    assert shlex.split(lines[4])[:3] == ["flwr", "run", str(app)]


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
    assert main(["flower", str(tmp_path / "app"), *argv]) == 2
    assert problem in capsys.readouterr().err
