"""Every tutorial notebook ``notebooks/*.pct.py`` runs end to end with ``GPFLOW_FED_SMALL=1``.

Each notebook is converted with jupytext and executed by nbclient on the ``python3`` kernel of the
interpreter running the tests. On a fresh machine the kernelspec is created programmatically (ipykernel
installs it into ``sys.prefix``), so ``make test`` needs no manual set-up.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

jupytext = pytest.importorskip("jupytext")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.pct.py"))
KERNEL = "python3"
# Notebooks should run in about 2 minutes with GPFLOW_FED_SMALL=1; a cell gets 5 minutes so that a loaded
# machine (the suite runs on 2 cores, often shared) does not turn a slow cell into a failure.
CELL_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def kernel_name() -> str:
    """The ``python3`` kernelspec, pointing at this interpreter's environment (installed if missing)."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec(KERNEL)
    except NoSuchKernel:
        from ipykernel.kernelspec import install

        install(kernel_name=KERNEL, prefix=sys.prefix)
    return KERNEL


def test_notebooks_exist() -> None:
    assert NOTEBOOKS, "no notebooks/*.pct.py found"


@pytest.fixture(scope="module")
def ipython_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An IPython directory whose startup file turns off check_shapes' docstring rewriting in each kernel.

    GPflow's ``@check_shapes`` decorators otherwise parse and rewrite every decorated docstring while gpflow is
    imported (≈ 1.3 s CPU of each kernel's start); the checks themselves stay on.
    """
    folder = tmp_path_factory.mktemp("ipython")
    startup = folder / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-check-shapes-docstrings.py").write_text(
        "import check_shapes.config\n\ncheck_shapes.config.set_rewrite_docstrings(None)\n"
    )
    return folder


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_executes(
    path: Path, kernel_name: str, ipython_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPFLOW_FED_SMALL", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("IPYTHONDIR", str(ipython_dir))
    notebook = jupytext.read(path)
    client = nbclient.NotebookClient(
        notebook,
        kernel_name=kernel_name,
        timeout=CELL_TIMEOUT_S,
        startup_timeout=CELL_TIMEOUT_S,  # the startup file imports TensorFlow before the kernel is ready
        resources={"metadata": {"path": str(tmp_path)}},  # outputs (runs/, plots) land in tmp_path
    )
    client.execute()  # raises nbclient.exceptions.CellExecutionError naming the failing cell
    printed = [cell for cell in notebook.cells if cell.cell_type == "code" and cell.get("outputs")]
    assert printed, f"{path.name} executed but no cell produced output"
