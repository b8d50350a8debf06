"""Sphinx configuration of the gpflow-fed documentation (``make docs``).

The API reference comes from the docstrings (autodoc; they use reST ``:param:`` field lists). The
tutorials are the jupytext percent-format notebooks ``notebooks/*.pct.py``: this file converts each to
``docs/notebooks/<name>.ipynb`` (git-ignored) and myst-nb executes them with ``GPFLOW_FED_SMALL=1``, so the
site shows real, freshly computed output with small settings.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import jupytext

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))

# The executed notebooks inherit this environment: small settings, CPU only, quiet TensorFlow. (No MPLBACKEND:
# the kernel's inline backend is what puts the notebooks' figures on the page.)
os.environ["GPFLOW_FED_SMALL"] = "1"
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _convert_notebooks() -> None:
    """Write ``docs/notebooks/<name>.ipynb`` for every ``notebooks/<name>.pct.py``; drop stale ones."""
    out_dir = DOCS / "notebooks"
    out_dir.mkdir(exist_ok=True)
    wanted = set()
    for source in sorted((ROOT / "notebooks").glob("*.pct.py")):
        name = source.name[: -len(".pct.py")]
        target = out_dir / f"{name}.ipynb"
        wanted.add(target.name)
        notebook = jupytext.read(source)
        notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        jupytext.write(notebook, target, fmt="ipynb")
    for stale in out_dir.glob("*.ipynb"):
        if stale.name not in wanted:
            stale.unlink()


_convert_notebooks()

import gpflow_fed  # noqa: E402

project = "gpflow-fed"
author = "gpflow-fed contributors"
copyright = "gpflow-fed contributors, Apache-2.0"
version = release = gpflow_fed.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "myst_nb",
]

source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "**.ipynb_checkpoints", "Thumbs.db", ".DS_Store"]
html_theme = "alabaster"
html_title = f"gpflow-fed {release}"

# autodoc: signatures without the long type hints, members in source order.
autodoc_default_options = {"members": True, "member-order": "bysource", "show-inheritance": True}
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented"
napoleon_use_param = True
# Methods without their own docstring would inherit GPflow's, whose relative :doc: links point into GPflow's
# own site (e.g. predict_f → notebooks/getting_started/basic_usage) and fail under -W.
autodoc_inherit_docstrings = False

# myst / myst-nb: always execute the converted notebooks; a failing cell is a warning, which -W makes fatal.
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 3
nb_execution_mode = "force"
nb_execution_timeout = 600
nb_execution_raise_on_error = False  # a failing notebook is a warning: -W fails the build, --keep-going reports all
nb_execution_in_temp = True
nb_kernel_rgx_aliases = {".*": "python3"}
suppress_warnings = ["mystnb.unknown_mime_type"]
