"""No silent skips under ``make test`` or CI: pytest hooks that turn a skip into a failure.

Registered by ``tests/conftest.py``; a module of its own (without TensorFlow) so that it can also be loaded
alone as a plugin (``-p tests.skip_policy``), as ``tests/test_no_silent_skips.py`` does.
"""

import os

import pytest


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
