"""Fixtures of the benchmark tests: the scripts in ``benchmarks/`` are not a package, so they load by path."""

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Callable

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="session")
def load_benchmark() -> Callable[[str], ModuleType]:
    """``load_benchmark("pvi")`` imports ``benchmarks/pvi.py`` as a module (its ``main`` is not run)."""

    def load(name: str) -> ModuleType:
        spec = importlib.util.spec_from_file_location(f"{name}_benchmark", BENCHMARKS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load
