"""The README's quickstart runs as written (with fewer rounds) and its two set-up commands are the Makefile's."""

import re
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _section(title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", README, flags=re.S | re.M)
    assert match, f"README has no '## {title}' section"
    return match.group(1)


def test_quickstart_runs(capsys) -> None:
    blocks = re.findall(r"```python\n(.*?)```", _section("Quickstart"), flags=re.S)
    assert len(blocks) == 1
    code = blocks[0]
    assert len(code.strip().splitlines()) <= 16
    assert "rounds=100" in code
    namespace: dict = {}
    exec(compile(code.replace("rounds=100", "rounds=3"), "README.md#quickstart", "exec"), namespace)
    result, dataset = namespace["result"], namespace["dataset"]
    assert dataset.num_clients == 5 and len(result.history) == 3
    mean, var = namespace["mean"], namespace["var"]
    assert mean.shape == var.shape == (300, 1) and np.all(np.isfinite(mean)) and np.all(var.numpy() > 0)
    assert f"{result.ledger.total_bytes(direction='up')} bytes sent by the clients" in capsys.readouterr().out


def test_setup_commands_match_the_makefile() -> None:
    first_block = re.search(r"```bash\n(.*?)```", _section("Set-up: two commands"), flags=re.S).group(1)
    commands = re.findall(r"^make (\S+)", first_block, flags=re.M)
    assert commands == ["run", "test"]
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    for target in ("run", "test", "test-slow", "docs", "bench"):
        rule = re.search(rf"^{re.escape(target)}: (.*)$", makefile, flags=re.M)
        assert rule and "$(STAMP)" in rule.group(1), f"make {target} must depend on the install stamp"
    # the stamp depends on the venv's python, whose rule creates .venv
    assert re.search(r"^\$\(STAMP\): \$\(VENV\)/bin/python", makefile, flags=re.M)
    assert re.search(r"^\$\(VENV\)/bin/python:\n\t\$\(PYTHON\) -m venv \$\(VENV\)", makefile, flags=re.M)
    assert "gpflow-fed fsgp --logdir runs/fsgp" in makefile


def test_install_line_and_extras_match_setup_cfg() -> None:
    import configparser

    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    extras = set(config["options.extras_require"])
    install = _section("Install as a library")
    assert 'pip install "gpflow-fed[data]"' in install
    assert set(re.findall(r"`(\w+)` \(", install)) == extras  # every extra named, and only those
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    installed = re.search(r'pip install .*-e "\.\[([\w,]+)\]"', makefile).group(1)
    assert f'pip install -e ".[{installed}]"' in _section("Set-up: two commands")
    assert set(installed.split(",")) == extras
