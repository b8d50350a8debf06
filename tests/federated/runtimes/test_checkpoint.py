"""Checkpoint/resume: a run stopped after round r and resumed ends exactly where an uninterrupted run ends."""

from dataclasses import dataclass

import gpflow
import numpy as np
import pytest

from gpflow_fed.data import FederatedDataset
from gpflow_fed.federated import LocalRuntime, Protection, RunOptions, run
from gpflow_fed.federated.algorithms import FSGP
from gpflow_fed.federated.engine.checkpoint import decode_tree, encode_tree, latest_checkpoint
from gpflow_fed.federated.protection.dp import DifferentialPrivacy

from tests.federated.helpers import FederatedMean, Stop, stop_after

#: runs and runtimes compared bit for bit: the fixed point rounds to nearest (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("nearest_rounding")

#: the plain, readable messages these tests check (the secure default masks them)
PLAIN = Protection(secure_aggregation=False)


def interrupted_then_resumed(algorithm_factory, data, tmp_path, stop, protection=None):
    """The run stopped after round ``stop`` and resumed from its checkpoint. (Exact equality of a resumed run's
    history and ledger is stated in plain: a resumed secure run makes its keys again, in its first round.)"""
    directory = tmp_path / "ckpt"
    with pytest.raises(Stop):
        run(
            algorithm_factory(),
            data,
            runtime=LocalRuntime(options=RunOptions(checkpoint_dir=directory)),
            monitor=stop_after(stop),
            seed=5,
            protection=protection,
        )
    assert latest_checkpoint(str(directory)).endswith(f"round-{stop}")
    resumed = LocalRuntime(options=RunOptions(checkpoint_dir=directory, resume=True))
    return run(algorithm_factory(), data, runtime=resumed, seed=5, protection=protection)


def without_timing(history):
    return [{k: v for k, v in h.items() if k != "seconds"} for h in history]


@dataclass(frozen=True)
class Inner:
    values: np.ndarray
    label: str


def test_state_tree_round_trips():
    state = {"a": (1, 2.5, None, "x"), "b": [np.arange(3.0), np.float64(np.nan)], "c": Inner(np.eye(2), "z")}
    arrays = {}
    back = decode_tree(encode_tree(state, arrays), arrays, allowed={f"{__name__}:Inner": Inner})
    assert back["a"] == state["a"] and isinstance(back["a"], tuple)
    np.testing.assert_array_equal(back["b"][0], state["b"][0])
    assert isinstance(back["b"][1], np.float64) and np.isnan(back["b"][1])
    assert isinstance(back["c"], Inner) and back["c"].label == "z"
    np.testing.assert_array_equal(back["c"].values, np.eye(2))
    with pytest.raises(TypeError, match="cannot save a set"):
        encode_tree({"bad": {1, 2}}, {})


def test_toy_resume_equals_uninterrupted_run(dataset, tmp_path):  # noqa: F811
    factory = lambda: FederatedMean(5, client_fraction=0.5)  # noqa: E731  (sampling RNG state matters)
    full = run(factory(), dataset, seed=5, protection=PLAIN)
    resumed = interrupted_then_resumed(factory, dataset, tmp_path, stop=2, protection=PLAIN)
    assert resumed.state == full.state
    assert without_timing(resumed.history) == without_timing(full.history)
    assert resumed.ledger.entries == full.ledger.entries


def test_resume_with_dp_and_secure_aggregation(dataset, tmp_path):  # noqa: F811
    protection = Protection(
        differential_privacy=DifferentialPrivacy(1.0, 50.0, insecure_noise_seed=3), secure_aggregation=True
    )
    factory = lambda: FederatedMean(4, client_fraction=0.5)  # noqa: E731
    full = run(factory(), dataset, runtime=LocalRuntime(protection=protection), seed=5)
    resumed = interrupted_then_resumed(factory, dataset, tmp_path, stop=1, protection=protection)
    assert resumed.state == full.state
    assert resumed.privacy == full.privacy


def test_checkpoint_of_another_run_is_refused(dataset, tmp_path):  # noqa: F811
    run(FederatedMean(2), dataset, runtime=LocalRuntime(options=RunOptions(checkpoint_dir=tmp_path)), seed=1)
    with pytest.raises(ValueError, match="different run: seed"):
        run(
            FederatedMean(2),
            dataset,
            runtime=LocalRuntime(options=RunOptions(checkpoint_dir=tmp_path, resume=True)),
            seed=2,
        )
    with pytest.raises(ValueError, match="checkpoint_dir"):
        LocalRuntime(options=RunOptions(resume=True))
    with pytest.raises(ValueError, match="checkpoint_every"):
        LocalRuntime(options=RunOptions(checkpoint_dir=tmp_path, checkpoint_every=0))


def test_resume_without_checkpoint_starts_afresh(dataset, tmp_path):  # noqa: F811
    fresh = run(
        FederatedMean(2),
        dataset,
        runtime=LocalRuntime(options=RunOptions(checkpoint_dir=tmp_path / "new", resume=True)),
        seed=1,
    )
    assert fresh.state == run(FederatedMean(2), dataset, seed=1).state


@pytest.fixture
def fsgp_data():
    rng = np.random.default_rng(3)
    clients = []
    for k in range(2):
        X = rng.uniform(-3, 3, size=(20, 1))
        clients.append((X, np.sin(2 * X) + 0.1 * rng.normal(size=X.shape)))
    Xt = np.linspace(-3, 3, 11)[:, None]
    return FederatedDataset(clients=clients, test=(Xt, np.sin(2 * Xt)), name="sine")


@pytest.mark.parametrize(
    "mode, fraction",
    [("fedavg", 0.5), ("exact", 1.0)],  # exact: restores the server Adam
)
def test_fsgp_resume_is_identical(fsgp_data, tmp_path, mode, fraction):
    Z = np.linspace(-2.5, 2.5, 4)[:, None]

    def factory():
        return FSGP(
            gpflow.kernels.SquaredExponential(),
            Z,
            0.1,
            rounds=3,
            local_steps=2,
            learning_rate=0.05,
            client_fraction=fraction,
            mode=mode,
        )

    full = run(factory(), fsgp_data, seed=5, protection=PLAIN)
    resumed = interrupted_then_resumed(factory, fsgp_data, tmp_path, stop=0, protection=PLAIN)
    for key, value in full.state.params.items():
        np.testing.assert_array_equal(resumed.state.params[key], value)
    Xt = fsgp_data.test[0]
    for a, b in zip(full.model.predict_f(Xt), resumed.model.predict_f(Xt)):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert without_timing(resumed.history) == without_timing(full.history)


@pytest.mark.parametrize(
    "job, stop",
    [
        ("fedbnr_fedavg", 0),
        ("fedbnr_kd", 1),
        ("pvi_dpo", 0),
        pytest.param("pvi_cpo", 0, marks=pytest.mark.slow),  # PVI's resume: pvi_dpo in the default suite
        ("recycle", 0),
    ],
)
def test_every_algorithm_resumes_to_the_uninterrupted_run(tmp_path, job, stop):
    """FedBNR (FedAvg, KD), PVI (DPO, CPO) and Recycle: server state, client state (Adam moments, factors,
    random-stream positions) and the round survive a restart; the resumed run's history, ledger and
    predictions equal the uninterrupted run's exactly."""
    from tests.federated.runtimes.distribute_job import build_jobs, summarize

    factory, data, _ = build_jobs()[job]
    directory = tmp_path / "ckpt"
    full = summarize(run(factory(), data, seed=3, protection=PLAIN))
    with pytest.raises(Stop):
        runtime = LocalRuntime(options=RunOptions(checkpoint_dir=directory))
        run(factory(), data, runtime=runtime, monitor=stop_after(stop), seed=3, protection=PLAIN)
    runtime = LocalRuntime(options=RunOptions(checkpoint_dir=directory, resume=True))
    resumed = summarize(run(factory(), data, runtime=runtime, seed=3, protection=PLAIN))
    assert without_timing(resumed["history"]) == without_timing(full["history"])
    assert resumed["ledger"] == full["ledger"]
    np.testing.assert_array_equal(resumed["predict_f"], full["predict_f"])
