"""``benchmarks/dp_example.py`` (the docs example "A useful model at a stated ε") at a small size."""

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def example():
    sys.path.insert(0, str(BENCHMARKS))  # the script saves through benchmarks/provenance.py
    spec = importlib.util.spec_from_file_location("dp_example_benchmark", BENCHMARKS / "dp_example.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    sys.path.remove(str(BENCHMARKS))


def test_public_clip_norm_bounds_every_payload(example):
    dataset = example.example_dataset(num_clients=5, points=20)
    kernel = example.fedbnr().kernel
    clip = example.public_clip_norm(20)
    for X, Y in dataset.clients:
        phi = kernel.features(X).numpy()
        payload = [phi.T @ phi, phi.T @ Y, Y.T @ Y, [[len(Y)]]]
        assert np.sqrt(sum(np.sum(np.square(a)) for a in payload)) <= clip


def test_small_run_spends_at_most_the_target_and_saves(example, tmp_path, capsys):
    path = tmp_path / "dp.json"
    # ε = 20 over 100 clients: the PLD accountant's cost grows with ε (ε = 50 over 40 clients took twice the CPU)
    example.main(["--clients", "100", "--epsilon", "20", "--draws", "1", "--tolerance", "0.1", "--save", str(path)])
    saved = json.loads(path.read_text())
    assert saved["command"].startswith("python benchmarks/dp_example.py") and saved["git_commit"]
    (draw,) = saved["draws"]
    assert 16 < draw["epsilon"] <= 20
    assert np.isfinite(draw["test_rmse"]) and draw["test_rmse"] < saved["constant_rmse"]
    assert "| DP, draw 0 |" in capsys.readouterr().out
