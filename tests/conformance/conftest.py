"""The conformance cases as a fixture: one model per public model class and per algorithm's ``result.model``."""

import pytest

from .cases import CASES

#: Checks PVI's result model fails today (issue 18 items 1–2: stale compiled predictions after a parameter
#: change, no deepcopy/freeze, marginal variances only, a ValueError for full_output_cov). It is being
#: rewritten, so they are expected failures (not strict: they pass once the rewrite lands; then drop them).
PVI_KNOWN_FAILURES = {
    "test_deepcopy_and_freeze",
    "test_predictions_follow_a_parameter_change",
    "test_full_cov_diagonal_equals_marginals",
    "test_compiled_equals_eager",
    "test_full_output_cov_is_supported_or_not_implemented_like_gpflow",
}


@pytest.fixture(params=CASES, ids=[c.name for c in CASES])
def case(request):
    return request.param


def pytest_collection_modifyitems(items):
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and str(callspec.id).startswith("PVI.result") and item.originalname in PVI_KNOWN_FAILURES:
            item.add_marker(pytest.mark.xfail(strict=False, reason="PVI's result model is being rewritten (issue 18 items 1-2)"))
