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


def strict_skips() -> bool:
    """Whether a skip is a failure: ``make test`` sets ``GPFLOW_FED_NO_SKIPS=1``, CI services set ``CI=true``.
    The Makefile installs every optional dependency, so a skip there (``importorskip``) means a broken set-up."""
    return os.environ.get("GPFLOW_FED_NO_SKIPS") == "1" or os.environ.get("CI", "").lower() == "true"


def _as_failure(report, what: str) -> None:
    reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr
    report.outcome = "failed"
    report.longrepr = (
        f"{what} was skipped ({reason}); skips are errors under `make test` (GPFLOW_FED_NO_SKIPS=1) and CI=true: "
        "install the optional dependencies (pip install -e '.[dev,data,docs,flower]')"
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and not hasattr(report, "wasxfail") and strict_skips():
        _as_failure(report, item.nodeid)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and strict_skips():  # a module-level importorskip
        _as_failure(report, collector.nodeid)
