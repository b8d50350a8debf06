"""Wire format of the Flower runtime: :class:`~gpflow_fed.federated.Message` ↔ Flower ``RecordDict``.

A gpflow-fed message travels inside a Flower message's content as three records:

* ``"arrays"``: an ``ArrayRecord`` with one ``Array`` per payload array (name, dtype and shape kept exactly);
* ``"meta"``: a ``ConfigRecord`` with ``sender``, ``round``, ``phase``, ``weight`` and ``purpose``
  (``"train"``, ``"final"``, ``"evaluate"``: the ledger's purposes);
* ``"metrics"``: a ``MetricRecord`` with the scalar metrics.

A stage's :class:`~gpflow_fed.federated.protocol.transport.Request` adds ``"request"`` (the stage and its config as
JSON) and
``"info"``, the :class:`~gpflow_fed.federated.FederationInfo` (client ids, sizes, D, P and the run's seed), so that
every party binds its algorithm to what the server used; a :class:`~gpflow_fed.federated.protocol.transport.Response`
adds
``"response"`` (fault, timing, a protected reply's layout). The conversion is lossless:
``recorddict_to_message(message_to_recorddict(m)) == m`` array for array.

One Flower run may hold several runs of the shared loop, one after the other (a table run: the moments exchange,
then the training on standardised data). Every request then adds ``"job"`` (:func:`job_to_config`): which of them it
belongs to, and, for the training, the column means and scales the moments exchange agreed, with which the party
standardises its own rows.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any, Dict, Mapping, NamedTuple, Optional, Tuple, Union

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

if TYPE_CHECKING:
    from ....data.standardize import Standardizer
from ...protocol.algorithm import Algorithm, FederationInfo
from ...engine.factories import load_factory
from ...protocol.messages import Message
from ...protocol.transport import Request, Response

__all__ = [
    "AgreedMoments",
    "PURPOSES",
    "config_to_info",
    "JOBS",
    "MOMENTS_FACTORY",
    "info_to_config",
    "job_algorithm",
    "job_moments",
    "job_to_config",
    "load_factory",
    "message_to_recorddict",
    "recorddict_from_bytes",
    "recorddict_to_bytes",
    "recorddict_to_job",
    "recorddict_to_message",
    "recorddict_to_request",
    "recorddict_to_response",
    "request_context",
    "request_to_recorddict",
    "response_to_recorddict",
]

PURPOSES = ("train", "final", "evaluate")
ARRAYS, META, METRICS, INFO = "arrays", "meta", "metrics", "info"
REQUEST, RESPONSE = "request", "response"
JOB = "job"
#: the runs one Flower run may hold: the moments exchange (:class:`~gpflow_fed.federated.algorithms.Moments`) and
#: the run's algorithm (a request without a ``"job"`` record is ``"train"`` on the party's data as given)
MOMENTS_JOB, TRAIN_JOB = "moments", "train"
#: the registered algorithm factory of the moments job (an entry point of :mod:`gpflow_fed.fitting.flower`)
MOMENTS_FACTORY = "gpflow-fed:moments"
JOBS = (MOMENTS_JOB, TRAIN_JOB)
_MOMENTS = ("X_mean", "X_std", "Y_mean", "Y_std")


def message_to_recorddict(message: Message, purpose: str = "train") -> RecordDict:
    """The Flower content carrying ``message`` (see the module docstring for the layout).

    :raises ValueError: an unknown ``purpose``.
    :raises TypeError: ``message`` is not a :class:`~gpflow_fed.federated.Message`.
    """
    if not isinstance(message, Message):
        raise TypeError(f"expected a gpflow_fed Message, got {type(message).__name__}")
    if purpose not in PURPOSES:
        raise ValueError(f"purpose must be one of {PURPOSES}, got {purpose!r}")
    arrays = ArrayRecord({name: Array(np.array(value, order="C")) for name, value in message.arrays.items()})
    meta = ConfigRecord(
        {
            "sender": message.sender,
            "round": int(message.round),
            "phase": message.phase,
            "weight": float(message.weight),
            "purpose": purpose,
        }
    )
    return RecordDict({ARRAYS: arrays, META: meta, METRICS: MetricRecord(dict(message.metrics))})


def recorddict_to_message(content: RecordDict) -> Tuple[Message, str]:
    """The :class:`~gpflow_fed.federated.Message` and its purpose from a Flower content.

    :raises ValueError: a content without the ``"arrays"``/``"meta"`` records or with missing fields.
    """
    missing = [key for key in (ARRAYS, META) if key not in content]
    if missing:
        raise ValueError(f"not a gpflow_fed message: the Flower content lacks the record(s) {missing}")
    meta: Mapping[str, Any] = content.config_records[META]  # from the wire: each field converted below
    fields = [k for k in ("sender", "round", "phase", "weight", "purpose") if k not in meta]
    if fields:
        raise ValueError(f"not a gpflow_fed message: its 'meta' record lacks {fields}")
    arrays = {name: array.numpy() for name, array in content.array_records[ARRAYS].items()}
    metrics: Dict[str, Any] = dict(content.metric_records[METRICS]) if METRICS in content else {}
    message = Message(
        sender=str(meta["sender"]),
        round=int(meta["round"]),
        phase=str(meta["phase"]),
        arrays=arrays,
        weight=float(meta["weight"]),
        metrics=metrics,
    )
    return message, str(meta["purpose"])


def request_to_recorddict(request: Request, info: FederationInfo) -> RecordDict:
    """The Flower content of one stage's :class:`~gpflow_fed.federated.protocol.transport.Request`: its message, the
    ``"request"`` record (``stage`` and the JSON of its ``config``) and the ``"info"`` record."""
    content = message_to_recorddict(request.message, request.purpose)
    content[REQUEST] = ConfigRecord({"stage": request.stage, "config": json.dumps(dict(request.config))})
    content[INFO] = info_to_config(info)
    return content


def recorddict_to_request(content: RecordDict) -> Tuple[Request, FederationInfo]:
    """The inverse of :func:`request_to_recorddict`.

    :raises ValueError: a content that is not a gpflow-fed request.
    """
    if REQUEST not in content.config_records or INFO not in content.config_records:
        raise ValueError("not a gpflow_fed request: the Flower content lacks the 'request' or 'info' record")
    record = content.config_records[REQUEST]
    message, purpose = recorddict_to_message(content)
    config = json.loads(str(record["config"]))
    if not isinstance(config, dict):
        raise ValueError("a gpflow_fed request's config must be a JSON object")
    return Request(str(record["stage"]), message, purpose, config), config_to_info(content.config_records[INFO])


def response_to_recorddict(response: Response, purpose: str) -> RecordDict:
    """The Flower content of a client's :class:`~gpflow_fed.federated.protocol.transport.Response`: its message (if
    any) and
    the ``"response"`` record (``fault``, ``seconds``, ``layout`` as JSON)."""
    content = RecordDict() if response.message is None else message_to_recorddict(response.message, purpose)
    record: Dict[str, Any] = {}
    if response.fault is not None:
        record["fault"] = str(response.fault)
    if response.seconds is not None:
        record["seconds"] = float(response.seconds)
    if response.layout is not None:
        record["layout"] = json.dumps({name: list(shape) for name, shape in response.layout.items()})
    if response.config:
        record["config"] = json.dumps(dict(response.config))
    content[RESPONSE] = ConfigRecord(record)
    return content


def recorddict_to_response(content: RecordDict) -> Response:
    """The inverse of :func:`response_to_recorddict` (as the server reads it: never trusted further).

    :raises ValueError: a content that is not a gpflow-fed response, or a malformed layout.
    """
    if RESPONSE not in content.config_records:
        raise ValueError("not a gpflow_fed response: the Flower content lacks the 'response' record")
    record: Mapping[str, Any] = content.config_records[RESPONSE]  # from the wire: converted below
    message = recorddict_to_message(content)[0] if ARRAYS in content else None
    layout = None
    if "layout" in record:
        raw = json.loads(str(record["layout"]))
        if not isinstance(raw, dict) or not all(
            isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape) for shape in raw.values()
        ):
            raise ValueError("a gpflow_fed response's layout must map names to lists of non-negative ints")
        layout = {str(name): tuple(shape) for name, shape in raw.items()}
    fault = str(record["fault"]) if "fault" in record else None
    seconds = float(record["seconds"]) if "seconds" in record else None
    config = json.loads(str(record["config"])) if "config" in record else {}
    if not isinstance(config, dict):
        raise ValueError("a gpflow_fed response's config must be a JSON object")
    return Response(message, fault, None if fault is None else RuntimeError(fault), seconds, layout, config)


class AgreedMoments(NamedTuple):
    """The column moments a training request carries, checked by the party (:func:`job_moments`): a
    :class:`~gpflow_fed.data.Standardizer`'s four arrays, held without importing TensorFlow (a party that only
    answers a secure-aggregation stage needs them for its request context, not to standardise).

    :param X_mean: ``[D]``.
    :param X_std: ``[D]``, positive.
    :param Y_mean: ``[P]``.
    :param Y_std: ``[P]``, positive.
    """

    X_mean: np.ndarray
    X_std: np.ndarray
    Y_mean: np.ndarray
    Y_std: np.ndarray

    def standardizer(self) -> "Standardizer":
        """The :class:`~gpflow_fed.data.Standardizer` of these moments (imports TensorFlow)."""
        from ....data.standardize import Standardizer

        return Standardizer(X_mean=self.X_mean, X_std=self.X_std, Y_mean=self.Y_mean, Y_std=self.Y_std)


#: what carries a job's moments: the server's :class:`~gpflow_fed.data.Standardizer` or a party's :class:`AgreedMoments`
JobMoments = Union["Standardizer", AgreedMoments]


def job_to_config(name: str, standardizer: Optional[JobMoments] = None) -> ConfigRecord:
    """The ``"job"`` record: the job's name and, for training on standardised data, the agreed moments
    (``X_mean``, ``X_std`` ``[D]``, ``Y_mean``, ``Y_std`` ``[P]`` as lists of floats: exact in Flower's encoding).

    :raises ValueError: an unknown job.
    """
    if name not in JOBS:
        raise ValueError(f"job must be one of {JOBS}, got {name!r}")
    record: Dict[str, Any] = {"name": name}
    if standardizer is not None:
        record.update({k: [float(v) for v in np.ravel(getattr(standardizer, k))] for k in _MOMENTS})
    return ConfigRecord(record)


def request_context(info: FederationInfo, job: str, standardizer: Optional[JobMoments] = None) -> bytes:
    """SHA-256 of what every request of a run carries beside its update that a party's answer depends on: the
    federation (:func:`info_to_config`) and the job record (:func:`job_to_config`: the agreed moments). Server
    (:attr:`GridTransport.context <gpflow_fed.federated.runtimes.flower.transport.GridTransport>`) and party
    (``ClientEndpoint.context``) bind it into each protected request's view, so a server that shows parties
    different moments (zeroing all answers but one) unmasks noise, and one broadcast is not re-asked under other
    moments."""
    record = {"info": dict(info_to_config(info)), "job": dict(job_to_config(job, standardizer))}
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode("utf-8")).digest()


def job_moments(content: RecordDict, info: FederationInfo) -> Tuple[str, Optional[AgreedMoments]]:
    """The job a request belongs to and the moments its party standardises with (None: its data as given), checked
    by the party before use (widths D and P of the federation, finite values, positive scales); no TensorFlow.

    :raises ValueError: an unknown job, moments for the ``"moments"`` job (which answers on the party's rows as
        they are), or moments of the wrong width, not finite, or with a scale that is not positive.
    """
    if JOB not in content.config_records:
        return TRAIN_JOB, None
    record = content.config_records[JOB]
    name = str(record.get("name", ""))
    if name not in JOBS:
        raise ValueError(f"a gpflow_fed request names the job {name!r}; expected one of {JOBS}")
    if not any(k in record for k in _MOMENTS):
        return name, None
    if name == MOMENTS_JOB:
        raise ValueError("the 'moments' job answers on the party's rows as they are; it carries no moments")
    widths = {"X_mean": info.input_dim, "X_std": info.input_dim, "Y_mean": info.output_dim, "Y_std": info.output_dim}
    moments = {}
    for key, width in widths.items():
        value = np.asarray(record.get(key, []), dtype=np.float64)
        if value.shape != (width,) or not np.all(np.isfinite(value)):
            raise ValueError(f"the agreed moments' {key} must be {width} finite numbers, got {value.tolist()}")
        if key.endswith("_std") and not np.all(value > 0):
            raise ValueError(f"the agreed moments' {key} must be positive, got {value.tolist()}")
        moments[key] = value
    return name, AgreedMoments(**moments)


def recorddict_to_job(content: RecordDict, info: FederationInfo) -> Tuple[str, Optional["Standardizer"]]:
    """The job a request belongs to and the :class:`~gpflow_fed.data.Standardizer` of its moments (None: its data
    as given): :func:`job_moments`, checked the same way.

    :raises ValueError: as :func:`job_moments`.
    """
    name, moments = job_moments(content, info)
    return name, None if moments is None else moments.standardizer()


def info_to_config(info: FederationInfo) -> ConfigRecord:
    """The federation's description as a ``ConfigRecord`` (no data: ids, sizes N_k, D, P and the seed)."""
    return ConfigRecord(
        {
            "client_ids": list(info.client_ids),
            "client_sizes": [int(info.client_sizes[c]) for c in info.client_ids],
            "input_dim": int(info.input_dim),
            "output_dim": int(info.output_dim),
            "seed": int(info.seed),
        }
    )


def config_to_info(config: Mapping[str, Any]) -> FederationInfo:
    """The inverse of :func:`info_to_config` (a ``ConfigRecord`` from the wire; each field converted)."""
    ids = tuple(str(c) for c in config["client_ids"])
    sizes = [int(n) for n in config["client_sizes"]]
    return FederationInfo(
        client_ids=ids,
        client_sizes=dict(zip(ids, sizes)),
        input_dim=int(config["input_dim"]),
        output_dim=int(config["output_dim"]),
        seed=int(config["seed"]),
    )


def job_algorithm(job: str, run_config: Mapping[str, Any]) -> Algorithm:
    """The algorithm of ``job`` (:func:`build_algorithm`): for ``"moments"`` the registered factory
    :data:`MOMENTS_FACTORY` (:class:`~gpflow_fed.federated.algorithms.Moments`, declared by :mod:`gpflow_fed.fitting`
    as an entry point), else the run config's registered ``algorithm``."""
    if job == MOMENTS_JOB:
        return build_algorithm(MOMENTS_FACTORY, run_config)
    return build_algorithm(str(run_config["algorithm"]), run_config)


def build_algorithm(spec: str, run_config: Mapping[str, Any]) -> Algorithm:
    """``load_factory(spec)(run_config)`` for a registered factory, checked to be an
    :class:`~gpflow_fed.federated.Algorithm`.

    :raises ValueError: ``spec`` is not registered (see :mod:`gpflow_fed.federated.engine.factories`).

    :raises TypeError: the factory returned something else.
    """
    algorithm = load_factory(spec)(dict(run_config))
    if not isinstance(algorithm, Algorithm):
        raise TypeError(f"the algorithm factory {spec!r} returned a {type(algorithm).__name__}, not an Algorithm")
    return algorithm


def recorddict_to_bytes(content: RecordDict) -> bytes:
    """``content`` in Flower's protobuf wire form (what crosses a SuperLink)."""
    from flwr.common.serde import recorddict_to_proto

    return bytes(recorddict_to_proto(content).SerializeToString())


def recorddict_from_bytes(data: bytes) -> RecordDict:
    """The ``RecordDict`` of :func:`recorddict_to_bytes`'s bytes."""
    from flwr.common.serde import recorddict_from_proto
    from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict

    proto = ProtoRecordDict()
    proto.ParseFromString(data)
    return recorddict_from_proto(proto)
