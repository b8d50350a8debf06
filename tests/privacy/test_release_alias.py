"""``gpflow_fed.release`` is a deprecated alias of ``gpflow_fed.release`` (renamed; kept for one release)."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUBMODULES = ("_linalg", "lowrank", "obfuscation", "regions", "sdp", "tolerance", "weak")

_SCRIPT = """
import importlib, json, warnings
import gpflow  # noqa: F401 -- TensorFlow's own DeprecationWarnings are not what this test counts
report = {}


def ours(caught):
    return [str(w.message) for w in caught if w.category is DeprecationWarning and "gpflow_fed" in str(w.message)]


with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import gpflow_fed.release as old
    report["package"] = ours(caught)
    import gpflow_fed.release as new
    report["same_api"] = all(getattr(old, name) is getattr(new, name) for name in new.__all__)
    for name in %r:
        del caught[:]
        module = importlib.import_module("gpflow_fed.release." + name)
        report[name] = {
            "warnings": ours(caught),
            "same": module is importlib.import_module("gpflow_fed.release." + name),
        }
    from gpflow_fed.release.lowrank import _orthonormal_block  # private names resolve too
    from gpflow_fed.release.lowrank import _orthonormal_block as same
    report["private"] = _orthonormal_block is same
    from gpflow_fed.release import weak
    report["attribute"] = weak is importlib.import_module("gpflow_fed.release.weak")
print(json.dumps(report))
"""


def test_the_old_package_and_each_old_submodule_warn_and_give_the_same_objects() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT % (SUBMODULES,)],
        env={**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().split("\n")[-1])
    assert report["package"] == [
        "gpflow_fed.release is deprecated and will be removed in the next release; import gpflow_fed.release instead"
    ]
    assert report["same_api"] and report["private"] and report["attribute"]
    for name in SUBMODULES:
        assert report[name]["same"], name
        assert report[name]["warnings"] == [
            f"gpflow_fed.release.{name} is deprecated and will be removed in the next release; "
            f"import gpflow_fed.release.{name} instead"
        ], name


def test_every_module_of_the_new_package_has_an_alias() -> None:
    new = {p.stem for p in (ROOT / "gpflow_fed" / "release").glob("*.py") if p.stem != "__init__"}
    old = {p.stem for p in (ROOT / "gpflow_fed" / "privacy").glob("*.py") if p.stem != "__init__"}
    assert new == old == set(SUBMODULES)
