"""``import gpflow_fed`` is lazy: no TensorFlow until a submodule is used; GPflow dispatches still register."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_import_is_lazy_and_a_submodule_loads_its_dispatches() -> None:
    """Also the entry point ``from gpflow_fed.models import …`` as the first import of a session (the lazy
    attribute imports the same module in the same order; one fresh interpreter instead of two)."""
    out = _run(
        "import sys, gpflow_fed\n"
        "print('before', 'tensorflow' in sys.modules, gpflow_fed.__version__)\n"
        "gpflow_fed.models\n"
        "from gpflow_fed.models import DPOSVGP, EnsembleSVGP, AggregatedSGPR\n"
        "print('after', 'tensorflow' in sys.modules, 'gpflow_fed.covariances' in sys.modules, "
        "callable(gpflow_fed.fit))\n"
        "print('dir', {'fit', 'models', 'federated'} <= set(dir(gpflow_fed)))\n"
    )
    assert "before False" in out and "after True True True" in out and "dir True" in out


def test_importing_inducing_variables_registers_their_dispatches() -> None:
    out = _run(
        "import gpflow\n"
        "from gpflow_fed.inducing_variables import PseudoObservations\n"
        "f = gpflow.covariances.Kuu.dispatch(PseudoObservations, gpflow.kernels.SquaredExponential)\n"
        "print(f.__module__)\n"
    )
    assert "gpflow_fed.covariances" in out


ENTRY_POINTS = [
    "from gpflow_fed.federated import run, LocalRuntime",
    "from gpflow_fed.federated.algorithms import PVI, FSGP, FGP",
    "from gpflow_fed.data import satellite_data; from gpflow_fed.models import release",
    # from gpflow_fed.models import DPOSVGP, EnsembleSVGP, AggregatedSGPR: in the laziness test above
    "from gpflow_fed.baselines import ExpertCommittee; from gpflow_fed.release import obfuscate",
    "import gpflow_fed.federated.runtimes.base; import gpflow_fed.metrics",
]


@pytest.mark.parametrize("statement", ENTRY_POINTS)
def test_every_entry_point_imports_first_in_a_fresh_interpreter(statement) -> None:
    """No import order may matter: each public entry point works as the first import of a session."""
    assert "ok" in _run(f"{statement}\nprint('ok')")
