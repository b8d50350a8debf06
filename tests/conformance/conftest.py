"""The conformance cases as a fixture: one model per public model class and per algorithm's ``result.model``."""

import pytest

from .cases import CASES


@pytest.fixture(params=CASES, ids=[c.name for c in CASES])
def case(request):
    return request.param
