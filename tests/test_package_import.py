"""``import gpflow_fed`` is lazy: no TensorFlow until a submodule is used; GPflow dispatches still register."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_import_is_lazy_and_attributes_load_everything() -> None:
    out = _run(
        "import sys, gpflow_fed\n"
        "print('before', 'tensorflow' in sys.modules, gpflow_fed.__version__)\n"
        "gpflow_fed.models\n"
        "print('after', 'tensorflow' in sys.modules, 'gpflow_fed.covariances' in sys.modules, callable(gpflow_fed.fit))\n"
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
