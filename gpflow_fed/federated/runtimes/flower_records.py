"""Wire format of the Flower runtime: :class:`~gpflow_fed.federated.Message` ↔ Flower ``RecordDict``.

A gpflow-fed message travels inside a Flower message's content as three records:

* ``"arrays"``: an ``ArrayRecord`` with one ``Array`` per payload array (name, dtype and shape kept exactly);
* ``"meta"``: a ``ConfigRecord`` with ``sender``, ``round``, ``phase``, ``weight`` and ``purpose``
  (``"train"``, ``"final"``, ``"evaluate"``: the ledger's purposes);
* ``"metrics"``: a ``MetricRecord`` with the scalar metrics.

Broadcasts also carry ``"info"``, the :class:`~gpflow_fed.federated.FederationInfo` (client ids, sizes, D,
P and the run's seed), so that every party calls ``Algorithm.initial_state`` with what the server used. The
conversion is lossless: ``recorddict_to_message(message_to_recorddict(m)) == m`` array for array.
"""

from __future__ import annotations

from typing import Any, Mapping, Tuple

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from ..algorithm import Algorithm, FederationInfo
from ..factories import load_factory
from ..messages import Message

__all__ = [
    "PURPOSES",
    "config_to_info",
    "info_to_config",
    "load_factory",
    "message_to_recorddict",
    "recorddict_to_message",
]

PURPOSES = ("train", "final", "evaluate")
ARRAYS, META, METRICS, INFO = "arrays", "meta", "metrics", "info"


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
    meta = content.config_records[META]
    fields = [k for k in ("sender", "round", "phase", "weight", "purpose") if k not in meta]
    if fields:
        raise ValueError(f"not a gpflow_fed message: its 'meta' record lacks {fields}")
    arrays = {name: array.numpy() for name, array in content.array_records[ARRAYS].items()}
    metrics = dict(content.metric_records[METRICS]) if METRICS in content else {}
    message = Message(
        sender=str(meta["sender"]),
        round=int(meta["round"]),  # type: ignore[arg-type]
        phase=str(meta["phase"]),
        arrays=arrays,
        weight=float(meta["weight"]),  # type: ignore[arg-type]
        metrics=metrics,  # type: ignore[arg-type]
    )
    return message, str(meta["purpose"])


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


def config_to_info(config: ConfigRecord) -> FederationInfo:
    """The inverse of :func:`info_to_config`."""
    ids = tuple(str(c) for c in config["client_ids"])  # type: ignore[union-attr]
    sizes = [int(n) for n in config["client_sizes"]]  # type: ignore[union-attr]
    return FederationInfo(
        client_ids=ids,
        client_sizes=dict(zip(ids, sizes)),
        input_dim=int(config["input_dim"]),  # type: ignore[arg-type]
        output_dim=int(config["output_dim"]),  # type: ignore[arg-type]
        seed=int(config["seed"]),  # type: ignore[arg-type]
    )


def build_algorithm(spec: str, run_config: Mapping[str, Any]) -> Algorithm:
    """``load_factory(spec)(run_config)`` for a registered factory, checked to be an
    :class:`~gpflow_fed.federated.Algorithm`.

    :raises ValueError: ``spec`` is not registered (see :mod:`gpflow_fed.federated.factories`).

    :raises TypeError: the factory returned something else.
    """
    algorithm = load_factory(spec)(dict(run_config))
    if not isinstance(algorithm, Algorithm):
        raise TypeError(f"the algorithm factory {spec!r} returned a {type(algorithm).__name__}, not an Algorithm")
    return algorithm
