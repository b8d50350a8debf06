"""The conformance cases as a fixture: one model per public model class and per algorithm's ``result.model``."""

import pytest

from .cases import CASES

#: PVI's result model is being rewritten (issue 18 items 1–2: stale compiled predictions, no deepcopy/freeze
#: after predicting); its checks may fail until then.
PVI_XFAIL = pytest.mark.xfail(strict=False, reason="PVI's result model is being rewritten (issue 18 items 1-2)")


@pytest.fixture(params=[pytest.param(c, id=c.name, marks=[PVI_XFAIL] if c.name.startswith("PVI") else [])
                        for c in CASES])
def case(request):
    return request.param
