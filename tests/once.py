"""``computed_once``: an expensive JSON-able test oracle computed once per test session, shared by the xdist workers.

Import the fixture into a ``conftest.py`` or a test module (``from tests.once import computed_once``).
"""

import fcntl
import json
import os
from typing import Any, Callable

import pytest


@pytest.fixture(scope="session")
def computed_once(tmp_path_factory) -> Callable[[str, Callable[[], Any]], Any]:
    """``computed_once(key, compute)``: ``compute()`` (a JSON-able value) run once per test session, not once per
    module and xdist worker: a module-scoped fixture is set up again on every worker that runs one of the module's
    tests, so an expensive one ran twice under ``-n 2``.

    The workers share the value through a file in the run's common temporary folder, one lock per key: the first
    worker to ask computes, the other waits and reads. Each call returns a fresh object (read from the file), so a
    test may modify what it gets. A ``compute`` may ask for other keys, never for its own.
    """
    base = tmp_path_factory.getbasetemp()
    # an xdist worker's temporary folder is one of the run's; without xdist (``-p no:xdist``, where its
    # ``worker_id`` fixture does not exist) the process is the whole session
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    root = (base.parent if worker else base) / "computed-once"
    root.mkdir(exist_ok=True)

    def once(key: str, compute: Callable[[], Any]) -> Any:
        path = root / f"{key}.json"
        with open(root / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if not path.exists():
                    (root / f"{key}.tmp").write_text(json.dumps(compute()))
                    (root / f"{key}.tmp").replace(path)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        return json.loads(path.read_text())

    return once
