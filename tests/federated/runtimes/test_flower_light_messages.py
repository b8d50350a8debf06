"""Exchanges that cost what they carry: a ClientApp process that answers ``describe`` or a secure-aggregation stage
imports no TensorFlow (Flower 1.41 starts a fresh ``flwr-clientapp`` process for every message, and TensorFlow's
import is most of such a process's time); only an ``update`` does.

Each check runs in a fresh interpreter, as a ``flwr-clientapp`` process would: it imports the ClientApp module,
answers one message through Flower's serialisation (:class:`~gpflow_fed.federated.runtimes.flower.testing.LoopbackGrid`)
and reports what it imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")

ROOT = Path(__file__).resolve().parents[3]

#: one party answers one message in this interpreter; prints its answer's record names and whether TF was imported
ANSWER = r"""
import json, os, sys, time
started = time.perf_counter()
from flwr.app import ConfigRecord, RecordDict
from gpflow_fed.federated.protocol.algorithm import FederationInfo
from gpflow_fed.federated.protocol.messages import Message
from gpflow_fed.federated.protocol.transport import Request
from gpflow_fed.federated.protection.wire import pack
from gpflow_fed.federated.runtimes.flower.client_app import ENCODER_STATE, make_client_app
from gpflow_fed.federated.runtimes.flower.records import (
    job_to_config, recorddict_to_response, request_to_recorddict, JOB,
)
from gpflow_fed.federated.runtimes.flower.testing import LoopbackGrid
from flwr.app import MessageType

kind, data = sys.argv[1], sys.argv[2]
node = {"data": data, "client-index": 0, "no-roster": True, "state-dir": os.path.dirname(data)}
grid = LoopbackGrid(make_client_app(), [node], {"algorithm": "gpflow-fed:fit", "method": "fsgp"}, 7)
(node_id,) = grid.get_node_ids()
info = FederationInfo(("client_0", "client_1"), {"client_0": 5, "client_1": 5}, 2, 1, 0)
if kind == "describe":
    content, message_type, group = RecordDict({}), MessageType.QUERY, "describe"
else:
    structure, arrays = pack({"run_id": os.urandom(16)})
    request = Request("advertise", Message("server", 0, "train", arrays, weight=0.0), "train", {"protocol": structure})
    content = request_to_recorddict(request, info)
    content[JOB] = job_to_config("train", None)
    message_type, group = MessageType.TRAIN, "train/0/train/advertise"
from gpflow_fed.federated.runtimes.flower.transport import instruction
(reply,) = grid.send_and_receive([instruction(content, message_type, node_id, group)])
out = {"tensorflow": "tensorflow" in sys.modules, "gpflow": "gpflow" in sys.modules,
       "seconds": time.perf_counter() - started, "error": reply.error.reason if reply.has_error() else None}
if kind == "describe":
    out["described"] = dict(reply.content.config_records["describe"])
else:
    response = recorddict_to_response(reply.content)
    out["fault"] = response.fault
    out["answer"] = sorted(response.message.arrays) if response.message is not None else None
    out["encoder_kept"] = ENCODER_STATE in grid.contexts[node_id].state.config_records
print(json.dumps(out))
"""


def _answer(tmp_path: Path, kind: str) -> dict:
    data = tmp_path / "party.npz"
    rng = np.random.default_rng(0)
    np.savez(data, X=rng.normal(size=(5, 2)), Y=rng.normal(size=(5, 1)))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run(
        [sys.executable, "-c", ANSWER, kind, str(data)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_secure_aggregation_stage_is_answered_without_tensorflow(tmp_path):
    out = _answer(tmp_path, "advertise")
    assert out["error"] is None and out["fault"] is None, out
    assert out["answer"] and out["encoder_kept"]  # its public keys sent, its secrets kept in Context.state
    assert not out["tensorflow"] and not out["gpflow"], out


def test_describe_is_answered_without_tensorflow(tmp_path):
    out = _answer(tmp_path, "describe")
    assert out["error"] is None, out
    assert out["described"] == {"client-index": 0, "num-data": 5, "input-dim": 2, "output-dim": 1}
    assert not out["tensorflow"] and not out["gpflow"], out
