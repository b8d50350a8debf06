"""The federated-core refactor changed no result: every algorithm and runtime against runs saved before it.

``tests/fixtures/prerefactor/reference.npz`` and ``checkpoint/`` were written at commit a71f18d (the last commit before
the refactor) by ``tests/fixtures/prerefactor/make_reference.py``. Runs with ``secure_aggregation=False`` must give the
same predictions, numeric history and ledger layout bit for bit; secure non-DP sums too (the masks cancel modulo 2^64),
except for the ledger, which now records the protocol's stages. The old checkpoint (named by the old module paths) must
still resume to the uninterrupted run's model.
"""

import importlib.util
import os
import shutil

import numpy as np
import pytest

HERE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "prerefactor")


def _script():
    spec = importlib.util.spec_from_file_location("make_reference", os.path.join(HERE, "make_reference.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def reference():
    with np.load(os.path.join(HERE, "reference.npz")) as npz:
        return {k: npz[k] for k in npz.files}


def _compare(reference, name, outcome, ledger=True):
    """Every array of ``outcome`` equal to the reference; without ``ledger``, the ledger and the history's byte
    counts are left out (a secure run's ledger now records the protocol's own stages)."""
    if not ledger:
        keys = outcome["history_keys"].tolist()
        assert keys == reference[f"{name}/history_keys"].tolist()
        kept = [i for i, k in enumerate(keys) if not k.startswith("bytes_")]
        outcome = {**outcome, "history": outcome["history"][:, kept]}
        reference = {**reference, f"{name}/history": reference[f"{name}/history"][:, kept]}
    for key, value in outcome.items():
        if key == "ledger" and not ledger:
            continue
        expected = reference[f"{name}/{key}"]
        if value.dtype.kind in "US":
            assert value.tolist() == expected.tolist(), f"{name}/{key}"
        else:
            np.testing.assert_array_equal(value, expected, err_msg=f"{name}/{key}")


#: the cases of the default suite (a few seconds each); the slow suite runs them all
QUICK = ("fsgp_fedavg", "fsgp_exact_secure", "fgp")


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=() if n in QUICK else pytest.mark.slow)
        for n in (
            "fsgp_fedavg",
            "fsgp_exact",
            "fsgp_exact_secure",
            "fsgp_fedavg_secure",
            "fsgp_exclude",
            "fgp",
            "pvi",
            "fedbnr",
            "recycle",
            "fedavg_nn",
            "personalised",
            "fsgp_distribute",
            "fsgp_flower",
        )
    ],
)
def test_runs_are_bit_identical_to_the_prerefactor_commit(reference, name):
    script = _script()
    outcome = {k.split("/", 1)[1]: v for k, v in script.run_case(name).items()}
    _compare(reference, name, outcome, ledger="secure" not in name)


def test_a_prerefactor_checkpoint_still_resumes_to_the_same_model(reference, tmp_path):
    script = _script()
    folder = tmp_path / "checkpoint"
    shutil.copytree(os.path.join(HERE, "checkpoint"), folder)
    from gpflow_fed.federated import LocalRuntime, Protection, RunOptions, run

    result = run(
        script._fsgp(rounds=script.CHECKPOINT_ROUNDS),
        script._fsgp_data(),
        runtime=LocalRuntime(),
        options=RunOptions(checkpoint_dir=str(folder), resume=True),
        protection=Protection(secure_aggregation=False),
        seed=0,
    )
    assert [e["round"] for e in result.history] == list(range(script.CHECKPOINT_ROUNDS))
    _compare(reference, "checkpointed", script.outcome(result))
