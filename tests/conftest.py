"""Suite-wide settings: shape checks on everywhere, float64, fail on AutoGraph conversion warnings, and no silent
skips under ``make test`` (``GPFLOW_FED_NO_SKIPS=1``) or in CI (``CI=true``)."""

import logging
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import gpflow  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from check_shapes import DocstringFormat, ShapeCheckingState, set_enable_check_shapes, set_rewrite_docstrings  # noqa: E402

set_enable_check_shapes(ShapeCheckingState.ENABLED)
set_rewrite_docstrings(DocstringFormat.SPHINX)


@pytest.fixture(autouse=True)
def _float64_and_no_autograph_failures(caplog):
    """Every test runs in float64 and fails if AutoGraph could not convert a function."""
    assert gpflow.default_float() == np.float64
    with caplog.at_level(logging.WARNING, logger="tensorflow"):
        yield
    bad = [r.getMessage() for r in caplog.records if "AutoGraph could not transform" in r.getMessage()]
    assert not bad, bad


from .skip_policy import pytest_make_collect_report, pytest_runtest_makereport  # noqa: E402,F401  (hooks)
