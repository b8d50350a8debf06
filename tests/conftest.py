"""Suite-wide settings: shape checks on everywhere, float64, fail on AutoGraph conversion warnings, no silent
skips under ``make test`` (``GPFLOW_FED_NO_SKIPS=1``) or in CI (``CI=true``), and one TensorFlow/OpenMP thread per
test process (the suite runs one pytest-xdist worker per core; the workers' own thread pools only contend: measured
10–13 % faster on this 2-core machine, tests/federated/algorithms and tests/conformance + recyclable training, side
by side). Subprocesses (notebook kernels, fresh interpreters) inherit the setting."""

import logging
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
for _threads in ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_threads, "1")

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


@pytest.fixture(autouse=True)
def _private_release_ledger(monkeypatch, tmp_path_factory):
    """Each test gets its own privacy-release ledger (``gpflow_fed.release.ledger``), never the user's own: a
    test's releases neither read nor grow the ledger of whoever runs the suite (created only when a test releases)."""
    base = tmp_path_factory.getbasetemp() / "privacy-ledgers"
    base.mkdir(exist_ok=True)
    monkeypatch.setenv("GPFLOW_FED_PRIVACY_LEDGER", str(base / f"{len(list(base.iterdir())):06d}"))
    yield


@pytest.fixture
def nearest_rounding(monkeypatch):
    """Secure aggregation's fixed point rounds to nearest (``ClientEncoder.INSECURE_NEAREST_ROUNDING``), so a
    protected run is a deterministic function of the payloads: for tests that compare runs or runtimes bit for bit, or
    a sum with the payloads' own encodings. The default (randomized rounding from the OS) is what every other test
    runs."""
    from gpflow_fed.federated.protection.encoder import ClientEncoder

    monkeypatch.setattr(ClientEncoder, "INSECURE_NEAREST_ROUNDING", True)
    yield


from .skip_policy import pytest_make_collect_report, pytest_runtest_makereport  # noqa: E402,F401  (hooks)
