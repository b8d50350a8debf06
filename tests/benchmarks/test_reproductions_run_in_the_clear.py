"""Paper reproductions aggregate in the clear, as the papers do, whatever the library's default: every runtime a
benchmark script builds names ``secure_aggregation`` (or a ``protection``), and every ``run`` is given a runtime or a
``protection``."""

import ast
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
RUNTIMES = {"LocalRuntime", "FlowerRuntime", "DistributeRuntime"}
SCRIPTS = sorted(BENCHMARKS.glob("*.py")) + sorted((BENCHMARKS / "peer").glob("*.py"))


def _calls(path: Path):
    """(name, keywords, line) of every call of a runtime class or of ``gpflow_fed.federated.run`` in ``path``."""
    tree = ast.parse(path.read_text())
    imported = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gpflow_fed.federated")
        for alias in node.names
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in imported:
            yield node.func.id, {keyword.arg for keyword in node.keywords}, node.lineno


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_every_runtime_states_secure_aggregation(path):
    loose = [
        f"{path.name}:{line} {name}"
        for name, keywords, line in _calls(path)
        if (name in RUNTIMES and not keywords & {"secure_aggregation", "protection"})
        or (name == "run" and not keywords & {"runtime", "protection"})
    ]
    assert not loose, f"runtimes without an explicit secure_aggregation (or run() without a runtime): {loose}"


def test_the_check_sees_a_loose_call(tmp_path):
    script = tmp_path / "loose.py"
    script.write_text(
        "from gpflow_fed.federated import LocalRuntime, run\n"
        "run(algorithm, data, seed=0)\nLocalRuntime(options=RunOptions(keep_payloads=True))\n"
        "run(a, d, runtime=LocalRuntime())\n"
    )
    assert sorted(name for name, _, _ in _calls(script)) == ["LocalRuntime", "LocalRuntime", "run", "run"]
    with pytest.raises(AssertionError, match="loose.py:2 run.*loose.py:3 LocalRuntime.*loose.py:4 LocalRuntime"):
        test_every_runtime_states_secure_aggregation(script)
