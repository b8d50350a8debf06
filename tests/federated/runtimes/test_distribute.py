"""DistributeRuntime: MirroredStrategy (2 logical CPUs) and MultiWorkerMirroredStrategy (2 processes) match
LocalRuntime.

Logical devices and ``TF_CONFIG`` must be set before TensorFlow initialises its devices, so the strategies run
in subprocesses (``distribute_job.py``); this process runs the same jobs under LocalRuntime as the oracle.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest
import tensorflow as tf

from gpflow_fed.federated import (
    DistributeRuntime,
    FaultPolicy,
    LocalRuntime,
    Protection,
    RunOptions,
    run,
)
from gpflow_fed.federated import DifferentialPrivacy

from tests.federated.runtimes.distribute_job import MWMS_JOBS, build_jobs
from tests.federated.helpers import FederatedMean

#: runs and runtimes compared bit for bit: the fixed point rounds to nearest (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("nearest_rounding")

ROOT = Path(__file__).resolve().parents[3]
ENV = dict(
    os.environ, OMP_NUM_THREADS="1", TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2"
)
ENV.pop("TF_CONFIG", None)


#: ``python -m tests.federated.runtimes.distribute_job``, with check_shapes' docstring rewriting off before gpflow is
#: imported (as ``test_notebooks.py``'s kernels: about a second of CPU per process; the shape checks stay on)
_JOB_SCRIPT = (
    "import runpy, check_shapes.config; check_shapes.config.set_rewrite_docstrings(None); "
    "runpy.run_module('tests.federated.runtimes.distribute_job', run_name='__main__', alter_sys=True)"
)


def _launch(args: List[str]) -> subprocess.Popen:
    """The job script in a new process, its output in ``OUT.log`` beside its summary ``OUT`` (a file, not a
    pipe: the caller may do other work before it waits)."""
    with open(f"{args[1]}.log", "w") as log:
        return subprocess.Popen(
            [sys.executable, "-c", _JOB_SCRIPT, *args],
            cwd=ROOT,
            env=ENV,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def _finish(process: subprocess.Popen, out: Path, timeout: float = 240) -> Dict[str, Any]:
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        pytest.fail(f"distribute_job timed out:\n{Path(f'{out}.log').read_text()[-4000:]}")
    assert process.returncode == 0, Path(f"{out}.log").read_text()[-4000:]
    return json.loads(out.read_text())


def _assert_same(ours: Any, ref: Any, where: str = "") -> None:
    """Equal structure, equal strings and integers, floats to 1e-6 (relative, 1e-10 absolute)."""
    if isinstance(ref, dict):
        assert set(ours) == set(ref), f"{where}: keys {sorted(ours)} != {sorted(ref)}"
        for k in ref:
            _assert_same(ours[k], ref[k], f"{where}/{k}")
    elif isinstance(ref, list):
        assert len(ours) == len(ref), f"{where}: length {len(ours)} != {len(ref)}"
        for i, (a, b) in enumerate(zip(ours, ref)):
            _assert_same(a, b, f"{where}[{i}]")
    elif isinstance(ref, float):
        np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-10, err_msg=where)
    else:
        assert ours == ref, f"{where}: {ours!r} != {ref!r}"


@pytest.fixture(scope="module")
def local_summaries(local_job_summary) -> Dict[str, Any]:
    """Every job under LocalRuntime, summarised as the subprocesses summarise theirs (``tests/federated/
    conftest.py``: computed once per session, shared with ``test_flower.py``'s oracle runs)."""
    return {name: local_job_summary(name) for name in build_jobs()}


@pytest.fixture(scope="module")
def mirrored(computed_once, local_job_summary, tmp_path_factory) -> Dict[str, Any]:
    """Every job under MirroredStrategy, once per session (not once per xdist worker running this module); this
    process runs the LocalRuntime oracle while the subprocess works."""

    def compute() -> Dict[str, Any]:
        out = tmp_path_factory.mktemp("mirrored") / "summary.json"
        # the jobs the tests compare (an OS-random job's draw is compared with nothing here)
        process = _launch(["mirrored", str(out), "--jobs", *[j for j in build_jobs() if j not in OS_RANDOM_JOBS]])
        try:
            for name in build_jobs():
                local_job_summary(name)
        except BaseException:
            process.kill()
            process.wait()
            raise
        return _finish(process, out)

    return computed_once("mirrored", compute)


#: jobs whose noise comes from the OS: another run (LocalRuntime) draws other noise, by design
OS_RANDOM_JOBS = ("toy_dp_os",)


@pytest.mark.parametrize("job", [j for j in build_jobs() if j not in OS_RANDOM_JOBS])
def test_mirrored_strategy_reproduces_local_runtime(mirrored, local_summaries, job):
    """FSGP (fedavg with sampling and eval_every; exact in blocks and threads), the toy sum, collect, faults."""
    assert mirrored["replicas"] == 2
    ours = dict(mirrored[job])
    ours.pop("devices", None)
    _assert_same(ours, local_summaries[job], job)
    if "predict_f" in ours:  # the comparison above is exact-to-1e-6 on predictions and final parameters
        assert ours["ledger"] and sum(e[-1] for e in ours["ledger"]) == sum(
            e[-1] for e in local_summaries[job]["ledger"]
        )


def test_mirrored_strategy_places_clients_on_replica_devices(mirrored):
    """Round-robin: clients 0 and 2 on CPU:0, 1 and 3 on CPU:1; blocks: 0, 1 on CPU:0 and 2, 3 on CPU:1."""
    devices = {
        job: {cid: d.rsplit("/", 1)[-1] for cid, d in mirrored[job]["devices"].items()}
        for job in ("toy_mean", "toy_collect")
    }
    expected_rr = {
        "client_0": "device:CPU:0",
        "client_1": "device:CPU:1",
        "client_2": "device:CPU:0",
        "client_3": "device:CPU:1",
    }
    assert devices["toy_mean"] == {cid: expected_rr[cid] for cid in devices["toy_mean"]}
    assert len(devices["toy_mean"]) == 4  # sampled 3 of 4 per round; all four over three rounds
    assert devices["toy_collect"] == {
        "client_0": "device:CPU:0",
        "client_1": "device:CPU:0",
        "client_2": "device:CPU:1",
        "client_3": "device:CPU:1",
    }


def test_mirrored_strategy_error_names_the_client(mirrored, local_summaries):
    assert mirrored["toy_raise"]["error"] == local_summaries["toy_raise"]["error"]
    assert "client_3" in mirrored["toy_raise"]["error"] and "raised an error" in mirrored["toy_raise"]["error"]


def _free_ports(n: int) -> List[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@pytest.mark.slow  # two TensorFlow processes and a collective set-up: about a minute on 2 shared cores
def test_multi_worker_mirrored_strategy_reproduces_local_runtime(local_summaries, tmp_path):
    """Two worker processes on 127.0.0.1, one replica each: both return LocalRuntime's result.

    Each worker's copy of the dataset has the other worker's clients replaced by zeros, so the match also
    shows that a worker reads only its own clients' data.
    """
    ports = ",".join(str(p) for p in _free_ports(2))
    outs = [tmp_path / f"worker{i}.json" for i in range(2)]
    processes = [_launch(["mwms", str(outs[i]), "--index", str(i), "--ports", ports]) for i in range(2)]
    summaries = [_finish(p, o) for p, o in zip(processes, outs)]
    for i, summary in enumerate(summaries):
        assert summary["replicas"] == 2
        for job in MWMS_JOBS:
            ours = dict(summary[job])
            ours.pop("devices", None)
            _assert_same(ours, local_summaries[job], f"worker {i}: {job}")
        # each worker ran only its own clients (toy_collect places blocks: worker i holds clients 2i, 2i + 1)
        devices = summary["toy_collect"]["devices"]
        assert sorted(devices) == [f"client_{2 * i}", f"client_{2 * i + 1}"], devices
        assert all(f"/task:{i}/" in d for d in devices.values()), devices


def test_two_mwms_workers_agree_on_secure_masks_and_os_random_dp(local_job_summary, tmp_path):
    """The default-suite version of the test above: two worker processes, two jobs.

    ``fsgp_exact_secure``: the workers share the chief's run id and relay each other's clients' public keys,
    so their masked sums cancel and equal ``LocalRuntime``'s. ``toy_dp_os``: DP noise and sampling come from the
    chief's OS-random server secret, so both workers draw the same (unpredictable) noise and sample.

    The LocalRuntime oracle of these two jobs (not of every job, as ``local_summaries``) runs in this process while
    the workers start and run.
    """
    ports = ",".join(str(p) for p in _free_ports(2))
    outs = [tmp_path / f"worker{i}.json" for i in range(2)]
    jobs = ["--jobs", "fsgp_exact_secure", "toy_dp_os"]
    processes = [_launch(["mwms", str(outs[i]), "--index", str(i), "--ports", ports, *jobs]) for i in range(2)]
    try:
        local_summaries = {name: local_job_summary(name) for name in jobs[1:]}
    except BaseException:
        for process in processes:
            process.kill()
            process.wait()
        raise
    summaries = [_finish(p, o) for p, o in zip(processes, outs)]
    for summary in summaries:
        _assert_same(summary["fsgp_exact_secure"], local_summaries["fsgp_exact_secure"], "fsgp_exact_secure")
    _assert_same(summaries[0]["toy_dp_os"], summaries[1]["toy_dp_os"], "toy_dp_os: worker 0 vs 1")
    assert summaries[0]["toy_dp_os"]["state"]["mean"] != local_summaries["toy_dp_os"]["state"]["mean"]


# --- in this process: a one-replica strategy and bad input -------------------------------------------
def test_one_device_strategy_matches_local_runtime(dataset):  # noqa: F811
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    ours = run(FederatedMean(3, client_fraction=0.5), dataset, runtime=DistributeRuntime(strategy), seed=1)
    ref = run(FederatedMean(3, client_fraction=0.5), dataset, runtime=LocalRuntime(), seed=1)
    assert ours.state == ref.state
    assert ours.ledger.entries == ref.ledger.entries
    _assert_same(
        [{k: v for k, v in e.items() if k != "seconds"} for e in ours.history],
        [{k: v for k, v in e.items() if k != "seconds"} for e in ref.history],
    )


def test_collect_words_carry_strings_and_numbers_exactly():
    from gpflow_fed.federated.runtimes.distribute import _from_words, _to_words, _words

    arrays = [
        np.array('{"kernel": "SE", "ü": 1}'),
        np.array([b"ab", b"cde"]),
        np.arange(5, dtype=np.int32),
        np.array([[0.1, -2.5e300]]),
        np.array([True, False]),
    ]
    for a in arrays:
        words = _to_words(a)
        assert words.dtype == np.float64 and words.size == _words(a.shape, str(a.dtype))
        back = _from_words(words, a.shape, str(a.dtype))
        assert back.dtype == a.dtype and np.array_equal(back, a)
    with pytest.raises(TypeError, match="dtype object"):
        _to_words(np.array([{}], dtype=object))


def test_not_a_strategy_is_a_type_error():
    with pytest.raises(TypeError, match="tf.distribute.Strategy"):
        DistributeRuntime("mirrored")  # type: ignore[arg-type]


PROTECTIONS = {
    "secure": Protection(secure_aggregation=True),
    "dp": Protection(
        differential_privacy=DifferentialPrivacy(
            noise_multiplier=1.1, clip_norm=5.0, weight_bound=10.0, insecure_noise_seed=5
        )
    ),
    "both": Protection(
        secure_aggregation=True,
        differential_privacy=DifferentialPrivacy(
            noise_multiplier=1.1, clip_norm=5.0, weight_bound=10.0, insecure_noise_seed=5
        ),
    ),
}


class RoundMean(FederatedMean):
    """FederatedMean whose broadcast carries its round, as a real algorithm's moves every round (a sampled
    FederatedMean repeats its broadcast, which a masking client answers for one cohort only)."""

    def broadcast(self, state, round, phase):
        return {**super().broadcast(state, round, phase), "round": np.array(float(round))}


@pytest.mark.parametrize("protection", list(PROTECTIONS))
def test_one_device_strategy_protects_sums_as_local_runtime(dataset, protection, tmp_path):  # noqa: F811
    """Secure aggregation and DP give LocalRuntime's result exactly (same fixed point, same noise), with the
    masked/clipped messages in the ledger; an interrupted run resumes from its checkpoint to the same end."""
    from tests.federated.helpers import Stop, stop_after

    request = PROTECTIONS[protection]
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    # three rounds: the stopped run trains two, the resumed one the third (the accounting of each sampled DP
    # round, sampling without replacement, is most of this test's CPU: a fourth round added four of them)
    ref = run(RoundMean(3, client_fraction=0.5), dataset, runtime=LocalRuntime(protection=request), seed=2)
    ours = run(
        RoundMean(3, client_fraction=0.5), dataset, runtime=DistributeRuntime(strategy, protection=request), seed=2
    )
    assert ours.state == ref.state and ours.privacy == ref.privacy
    assert ours.ledger.entries == ref.ledger.entries
    with pytest.raises(Stop):
        run(
            RoundMean(3, client_fraction=0.5),
            dataset,
            monitor=stop_after(1),
            seed=2,
            runtime=DistributeRuntime(strategy, options=RunOptions(checkpoint_dir=tmp_path), protection=request),
        )
    resumed = run(
        RoundMean(3, client_fraction=0.5),
        dataset,
        seed=2,
        runtime=DistributeRuntime(
            strategy, options=RunOptions(checkpoint_dir=tmp_path, resume=True), protection=request
        ),
    )
    assert resumed.state == ref.state and resumed.privacy == ref.privacy


def test_checkpoint_folder_per_worker():
    from gpflow_fed.federated.runtimes.distribute import worker_folder

    assert worker_folder(tf.distribute.OneDeviceStrategy("/cpu:0"), "ck") == "ck"

    class TwoWorkers:
        cluster_resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec({"worker": ["127.0.0.1:1", "127.0.0.1:2"]}), task_type="worker", task_id=1
        )

    assert worker_folder(TwoWorkers(), "ck") == os.path.join("ck", "worker-1")


@pytest.mark.parametrize(
    "make_kwargs, match",
    [
        (lambda: {"placement": "random"}, "placement"),
        (lambda: {"options": RunOptions(eval_every=-1)}, "eval_every"),
        (lambda: {"options": RunOptions(resume=True)}, "resume=True needs checkpoint_dir"),
    ],
)
def test_bad_options_are_value_errors(make_kwargs, match):
    with pytest.raises(ValueError, match=match):
        DistributeRuntime(tf.distribute.OneDeviceStrategy("/cpu:0"), **make_kwargs())


def test_bad_fault_policy_is_a_type_error():
    with pytest.raises(TypeError, match="FaultPolicy"):
        DistributeRuntime(tf.distribute.OneDeviceStrategy("/cpu:0"), options=RunOptions(faults="exclude"))  # type: ignore[arg-type]
    assert (
        DistributeRuntime(tf.distribute.OneDeviceStrategy("/cpu:0"), options=RunOptions(faults=FaultPolicy())).faults
        == FaultPolicy()
    )
