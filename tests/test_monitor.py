"""gpflow_fed.monitor: per-round scalars written to TensorBoard and read back from the event files."""

from pathlib import Path
from typing import Any, Dict, List, Tuple

import gpflow
import numpy as np
import pytest
import tensorflow as tf

from gpflow_fed.data import FederatedDataset
from gpflow_fed.federated import Algorithm, LocalRuntime, Protection, RunOptions, run
from gpflow_fed.monitor import (
    HistoryToTensorBoard,
    ScalarsToTensorBoard,
    federated_monitor,
    round_scalars,
    write_scalars,
)

PLAIN = Protection(secure_aggregation=False)  # the tests count plain bytes


def read_events(log_dir: Path) -> Dict[str, List[Tuple[int, float]]]:
    """``{tag: [(step, value), ...]}`` from every event file under ``log_dir``."""
    out: Dict[str, List[Tuple[int, float]]] = {}
    files = sorted(log_dir.rglob("events.out.tfevents.*"))
    assert files, f"no event file under {log_dir}"
    for path in files:
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                out.setdefault(value.tag, []).append((int(event.step), float(tf.make_ndarray(value.tensor))))
    return {k: sorted(v) for k, v in out.items()}


class ConstantGP(gpflow.models.GPModel):
    """Predicts a known constant mean with a fixed variance."""

    def __init__(self, mean: float) -> None:
        super().__init__(gpflow.kernels.Constant(), gpflow.likelihoods.Gaussian(0.5), num_latent_gps=1)
        self.mean = mean

    def predict_f(self, Xnew, full_cov=False, full_output_cov=False):
        n = tf.shape(Xnew)[0]
        dtype = gpflow.default_float()
        return tf.fill([n, 1], tf.constant(self.mean, dtype)), tf.fill([n, 1], tf.constant(0.25, dtype))

    def maximum_log_likelihood_objective(self, *args: Any, **kwargs: Any) -> tf.Tensor:
        return tf.constant(0.0, gpflow.default_float())


class MeanBySums(Algorithm):
    """The global mean of Y from the sums Σ y_k and Σ N_k; clients report their local mean as a metric."""

    name = "mean"

    def initial_state(self, info):
        return {"mean": 0.0}

    def broadcast(self, state, round, phase):
        return {"mean": np.array([state["mean"]])}

    def aggregation(self, phase):
        return "sum"

    def client_update(self, client, broadcast):
        _, Y = client.data
        return self.reply(
            client,
            broadcast,
            {"sum_y": Y.sum(axis=0), "n": np.array([float(len(Y))])},
            metrics={"local_mean": float(Y.mean())},
        )

    def server_update(self, state, aggregate):
        return {"mean": float(aggregate["sum_y"][0] / aggregate["n"][0])}

    def result(self, state):
        return ConstantGP(state["mean"])


@pytest.fixture
def dataset() -> FederatedDataset:
    rng = np.random.default_rng(0)
    clients = [(rng.normal(size=(n, 1)), rng.normal(loc=k, size=(n, 1))) for k, n in enumerate((5, 8, 11))]
    return FederatedDataset(clients, test=(rng.normal(size=(7, 1)), rng.normal(size=(7, 1))), name="toy")


def test_round_scalars_tags_and_cumulative_bytes() -> None:
    history = [
        {"round": 0, "clients": 2, "bytes_up": 100, "bytes_down": 40, "seconds": 0.5, "bound": -1.5},
        {
            "round": 1,
            "clients": 3,
            "bytes_up": 150,
            "bytes_down": 60,
            "seconds": 0.25,
            "bound": -1.25,
            "test_rmse": 0.3,
            "test_nlpd": 1.1,
            "flag": True,
            "note": "text",
            "bad": float("inf"),
        },
    ]
    assert round_scalars(history) == {
        "round/clients": 3.0,
        "communication/bytes_up": 150.0,
        "communication/bytes_down": 60.0,
        "communication/total_bytes": 350.0,
        "round/seconds": 0.25,
        "algorithm/bound": -1.25,
        "test/rmse": 0.3,
        "test/nlpd": 1.1,
    }
    with pytest.raises(ValueError, match="at least one round"):
        round_scalars([])


def test_federated_monitor_writes_every_round(tmp_path: Path, dataset: FederatedDataset) -> None:
    rounds = 3
    monitor = federated_monitor(str(tmp_path), callbacks={"server/mean": lambda state, **_: state["mean"]})
    runtime = LocalRuntime(options=RunOptions(eval_every=1))
    result = run(MeanBySums(rounds), dataset, runtime=runtime, monitor=monitor, seed=0, protection=PLAIN)  # plain bytes
    events = read_events(tmp_path)

    steps = list(range(rounds))
    expected_tags = {
        "communication/bytes_up",
        "communication/bytes_down",
        "communication/total_bytes",
        "round/clients",
        "round/seconds",
        "test/rmse",
        "test/mae",
        "test/nlpd",
        "algorithm/local_mean",
        "server/mean",
    }
    assert set(events) == expected_tags
    for tag in expected_tags:
        assert [s for s, _ in events[tag]] == steps, tag
    total = 0.0
    for r, entry in enumerate(result.history):
        assert events["communication/bytes_up"][r][1] == entry["bytes_up"]
        assert events["communication/bytes_down"][r][1] == entry["bytes_down"]
        total += entry["bytes_up"] + entry["bytes_down"]
        assert events["communication/total_bytes"][r][1] == total
        assert events["round/clients"][r][1] == 3
        # TensorBoard stores float32: compare to float32 precision
        np.testing.assert_allclose(events["test/rmse"][r][1], entry["test_rmse"], rtol=1e-6)
        np.testing.assert_allclose(events["test/nlpd"][r][1], entry["test_nlpd"], rtol=1e-6)
    # bytes: per round three uploads of sum_y (8) + n (8) + weight (8) + one metric (8)
    assert events["communication/bytes_up"][0][1] == 3 * (8 + 8 + 8 + 8)
    pooled_y = dataset.pooled()[1]
    np.testing.assert_allclose(events["server/mean"][-1][1], pooled_y.mean(), rtol=1e-6)
    local_means = np.array([Y.mean() for _, Y in dataset.clients])
    # messages have weight 1, so the reported metric is the plain mean of the clients' local means
    np.testing.assert_allclose(events["algorithm/local_mean"][0][1], local_means.mean(), rtol=1e-6)


def test_period_and_include(tmp_path: Path, dataset: FederatedDataset) -> None:
    monitor = federated_monitor(str(tmp_path), period=2, include=("communication/bytes_up",))
    run(MeanBySums(5), dataset, monitor=monitor, seed=1)
    events = read_events(tmp_path)
    assert set(events) == {"communication/bytes_up"}
    assert [s for s, _ in events["communication/bytes_up"]] == [0, 2, 4]


def test_history_task_is_a_gpflow_monitor_task_and_scalars_helper(tmp_path: Path) -> None:
    task = HistoryToTensorBoard(str(tmp_path / "a"))
    assert isinstance(task, gpflow.monitor.ToTensorBoard)
    task(4, history=[{"bytes_up": 7, "bytes_down": 1}], state=None, algorithm=None)
    write_scalars(str(tmp_path / "b"), {"final/fsgp/rmse": 0.125}, step=9)
    assert read_events(tmp_path / "a") == {
        "communication/bytes_up": [(4, 7.0)],
        "communication/bytes_down": [(4, 1.0)],
        "communication/total_bytes": [(4, 8.0)],
    }
    assert read_events(tmp_path / "b") == {"final/fsgp/rmse": [(9, 0.125)]}


def test_bad_input(tmp_path: Path) -> None:
    for period in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="period must be a positive integer"):
            federated_monitor(str(tmp_path), period=period)
    with pytest.raises(TypeError, match="MonitorTask"):
        federated_monitor(str(tmp_path), extra_tasks=[lambda step: None])
    with pytest.raises(TypeError, match="callable"):
        federated_monitor(str(tmp_path), callbacks={"x": 1.0})
    with pytest.raises(ValueError, match="not finite"):
        ScalarsToTensorBoard(str(tmp_path), {"x": float("nan")})
    with pytest.raises(TypeError, match="real number"):
        ScalarsToTensorBoard(str(tmp_path), {"x": "1.0"})
