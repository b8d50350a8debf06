"""The progress bar class: ``tqdm.auto`` (a widget in Jupyter) when ipywidgets is installed, else plain text.

``tqdm.auto`` alone warns "IProgress not found" in a notebook without ipywidgets, which then shows in every
executed notebook's first output.
"""

from __future__ import annotations

import importlib.util

if importlib.util.find_spec("ipywidgets") is not None:
    from tqdm.auto import tqdm
else:
    from tqdm.std import tqdm

__all__ = ["tqdm"]
