"""Fixtures shared by the federated tests."""

import json
from typing import Any, Callable, Dict

import numpy as np
import pytest

from gpflow_fed.data import FederatedDataset

from tests.once import computed_once  # noqa: F401  (a fixture)


@pytest.fixture
def dataset():
    rng = np.random.default_rng(0)
    clients = [(rng.normal(size=(n, 2)), rng.normal(loc=k, size=(n, 1))) for k, n in enumerate([5, 7, 9, 11])]
    return FederatedDataset(clients=clients, test=(rng.normal(size=(6, 2)), rng.normal(size=(6, 1))), name="toy")


#: keywords only DistributeRuntime takes (LocalRuntime runs the same job without them)
DISTRIBUTE_ONLY = ("placement", "threads")


def run_local_job(name: str) -> Dict[str, Any]:
    """Job ``name`` of ``distribute_job.build_jobs()`` under ``LocalRuntime`` (its default protection, the job's
    own keywords less :data:`DISTRIBUTE_ONLY`), seed 3, summarised and through JSON as the subprocesses' summaries;
    a ``ClientUpdateError`` is recorded as ``{"error": text}``. The fixed point rounds to nearest
    (``ClientEncoder.INSECURE_NEAREST_ROUNDING``, as ``tests/conftest.py``'s ``nearest_rounding``): its callers compare
    it bit for bit, and it is computed by whichever module-scoped fixture asks first."""
    from gpflow_fed.federated import ClientUpdateError, LocalRuntime, run
    from gpflow_fed.federated.protection.encoder import ClientEncoder

    from tests.federated.runtimes.distribute_job import build_jobs, summarize

    factory, data, kwargs = build_jobs()[name]
    runtime = LocalRuntime(**{k: v for k, v in kwargs.items() if k not in DISTRIBUTE_ONLY})
    default, ClientEncoder.INSECURE_NEAREST_ROUNDING = ClientEncoder.INSECURE_NEAREST_ROUNDING, True
    try:
        return json.loads(json.dumps(summarize(run(factory(), data, runtime=runtime, seed=3))))
    except ClientUpdateError as exc:
        return {"error": str(exc)}
    finally:
        ClientEncoder.INSECURE_NEAREST_ROUNDING = default


@pytest.fixture(scope="session")
def local_job_summary(computed_once) -> Callable[[str], Dict[str, Any]]:
    """``local_job_summary(name)``: :func:`run_local_job` once per test session.

    ``test_distribute.py`` (the oracle of the strategies) and ``test_flower.py`` (the oracle of the Flower
    adapters) compare with the same uninterrupted LocalRuntime runs. ``toy_dp_os`` draws OS-random noise: every
    caller of one session sees the same draw.
    """
    return lambda name: computed_once(f"local-{name}", lambda: run_local_job(name))
