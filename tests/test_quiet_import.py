"""Quiet by default (issue 45): ``import gpflow_fed`` in plain Python keeps TensorFlow's start-up lines (the
pre-logging notices, oneDNN, a GPU-less machine's CUDA probe) off standard error, as the command line does, sets
``TF_CPP_MIN_LOG_LEVEL`` only when the user has not, and keeps every other line (errors, Python warnings)."""

import os
import subprocess
import sys
from pathlib import Path

import gpflow_fed

ROOT = Path(__file__).resolve().parents[1]

_SESSION = """
import os, sys, warnings
import gpflow_fed
import tensorflow as tf
tf.constant(1.0) + 1.0  # the first op lists the devices: the CUDA probe
warnings.warn("a real warning")
print("level", os.environ.get("TF_CPP_MIN_LOG_LEVEL"), "loader", type(tf.__spec__.loader).__name__)
"""


def _session(code: str = _SESSION, **env: str) -> "subprocess.CompletedProcess[str]":
    environment = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "GPFLOW_FED_TF_LOGS")}
    environment.update(PYTHONPATH=str(ROOT), **env)
    return subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True, timeout=180)


def test_plain_python_session_is_quiet_but_keeps_warnings():
    done = _session()
    assert done.returncode == 0, done.stderr[-2000:]
    assert "level 2 loader SourceFileLoader" in done.stdout  # set because unset; the real loader left on the module
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert any("UserWarning: a real warning" in line for line in lines), done.stderr
    noise = [line for line in lines if "a real warning" not in line and "warnings.warn" not in line]
    assert noise == [], noise


def test_a_level_the_user_set_is_kept_and_the_opt_out_changes_nothing():
    code = "import os, sys, gpflow_fed\nprint(os.environ.get('TF_CPP_MIN_LOG_LEVEL'), len(sys.meta_path))"
    plain = _session("import sys\nprint(len(sys.meta_path))").stdout.split()
    assert _session(code, TF_CPP_MIN_LOG_LEVEL="0").stdout.split() == ["0", str(int(plain[0]) + 1)]
    assert _session(code, GPFLOW_FED_TF_LOGS="1").stdout.split() == ["None", plain[0]]  # no level, no import hook


def test_the_filter_drops_known_start_up_lines_only():
    text = (
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
        "I0000 00:00:1.5 7809 port.cc:153] oneDNN custom operations are on. You may see slightly different ...\n"
        "E0000 00:00:1.5 7809 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error\n"
        "I0000 00:00:1.5 7809 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.\n"
        "E0000 00:00:1.5 7809 util.cc:131] oneDNN supports DT_INT32 only on platforms with AVX-512. Falling back to "
        "the default Eigen-based implementation if present.\n"
        "E0000 00:00:1.5 7809 op_kernel.cc:1] a real error\n"
        "Traceback (most recent call last):\n"
    )
    kept = gpflow_fed.without_start_up_noise(text, gpu=False)
    assert kept == "E0000 00:00:1.5 7809 op_kernel.cc:1] a real error\nTraceback (most recent call last):\n"
    with_gpu = gpflow_fed.without_start_up_noise(text, gpu=True)  # a GPU machine's CUDA errors are real
    assert "failed call to cuInit" in with_gpu and "cudart_stub" in with_gpu and "oneDNN" not in with_gpu


def test_no_packaging_or_flower_deprecation_warnings(tmp_path):
    """setup.cfg carries an SPDX licence and no License classifier (setuptools ≥ 77 warns about one at every
    install); the Flower app the package writes passes Flower's own check without warnings (its missing ``license``
    was one); and the package builds its Flower messages with ``Message(...)``, not the deprecated
    ``Grid.create_message``."""
    import configparser
    import re
    import tomllib

    from flwr.app import MessageType, RecordDict
    from flwr.common.config import validate_fields_in_config

    from gpflow_fed.federated.runtimes.flower.deploy import write_app
    from gpflow_fed.federated.runtimes.flower.testing import LoopbackGrid
    from gpflow_fed.federated.runtimes.flower.transport import instruction

    metadata = configparser.ConfigParser()
    metadata.read(ROOT / "setup.cfg")
    assert metadata["metadata"]["license"] == "Apache-2.0" and "License ::" not in metadata["metadata"]["classifiers"]
    app = Path(write_app(str(tmp_path / "app"), "tests.federated.helpers:fsgp"))
    valid, errors, warnings = validate_fields_in_config(tomllib.loads((app / "pyproject.toml").read_text()))
    assert valid and errors == [] and warnings == [], (errors, warnings)
    callers = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in (ROOT / "gpflow_fed").rglob("*.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\.create_message\(", line)
    ]
    assert callers == [], callers
    from flwr.supercore.task_identity import TaskIdentity

    previous = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    try:
        LoopbackGrid(None, [{}], {}, run_id=5)  # an in-process run declares its task, as Flower's simulation does
        meta = instruction(RecordDict({}), MessageType.TRAIN, 1001, "train/0/update/0").metadata
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = previous
    assert (meta.run_id, meta.dst_node_id, meta.group_id, meta.message_type) == (5, 1001, "train/0/update/0", "train")


def test_the_command_line_spends_the_one_dnn_fallback_notice_at_start_up():
    """TensorFlow's oneDNN build prints, once a process, ``E… util.cc] oneDNN supports DT_INT32 only on platforms
    with AVX-512. Falling back to the default Eigen-based implementation`` at the first op of a type oneDNN does not
    take (PVI's int32 shape arithmetic: in ``gpflow-fed pvi``'s stderr, mid-run); the command line's start-up
    (:func:`gpflow_fed.cli.quiet_tensorflow`) spends that notice under its filter, and a real error still shows."""
    code = (
        "from gpflow_fed.cli import quiet_tensorflow\n"
        "import tensorflow as tf\n"
        "quiet_tensorflow()\n"
        "f = tf.function(lambda n: tf.transpose(tf.reshape(tf.range(n * 2), [2, -1])), autograph=False)\n"
        "print(f(tf.constant(2)).shape)\n"
        "tf.gather(tf.constant([1.0]), [5])  # out of range: a real error\n"
    )
    done = _session(code)
    assert "oneDNN supports" not in done.stderr, done.stderr
    assert "(2, 2)" in done.stdout and done.returncode != 0 and "InvalidArgumentError" in done.stderr, done.stderr
