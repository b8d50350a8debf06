"""Every package the core imports is declared (issue 33): a core-only install (``make test-core-install``, run by
CI) must not need an extra. Offline, this checks the source against ``setup.cfg``: each module-level import of a
third-party package by a core module names a distribution of ``install_requires`` (the Flower runtime's modules
belong to the ``flower`` extra)."""

import ast
import configparser
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _declared(section: str, key: str) -> set:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    lines = config[section][key].splitlines()
    return {re.split(r"[<>=!~\[ ]", line.strip())[0].lower().replace("_", "-") for line in lines if line.strip()}


def _module_level_imports(path: Path) -> set:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in tree.body:  # module level only: imports inside functions load on use
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_core_imports_are_declared():
    required = _declared("options", "install_requires")
    distributions = packages_distributions()
    missing = {}
    for path in sorted((ROOT / "gpflow_fed").rglob("*.py")):
        if "flower" in path.name or "flower" in path.parts:  # the Flower runtime: extra "flower"
            continue
        for name in _module_level_imports(path) - set(sys.stdlib_module_names) - {"gpflow_fed", "__future__"}:
            dists = {d.lower().replace("_", "-") for d in distributions.get(name, [name])}
            if not dists & required:
                missing.setdefault(name, []).append(str(path.relative_to(ROOT)))
    assert not missing, f"imported by the core but not in install_requires: {missing}"


def test_cryptography_and_pycryptodome_are_core_requirements():
    required = _declared("options", "install_requires")
    assert {"cryptography", "pycryptodome"} <= required
    assert "flwr" not in required  # the Flower runtime stays an extra
