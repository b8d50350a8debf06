"""One party's side of a run: it answers the server's requests, stage by stage, on every runtime.

A :class:`ClientEndpoint` holds what one party holds: its :class:`~gpflow_fed.federated.Client` (private data, model,
optimizer state), its copy of the run's algorithm, the :class:`~gpflow_fed.federated.FederationInfo`, and its
:class:`~gpflow_fed.federated.protection.encoder.ClientEncoder` (its own protection policy and keys). In-process
runtimes call :meth:`ClientEndpoint.handle` directly; the Flower ClientApp calls it for each Flower message. Whatever
happens on the client (its algorithm raises, its own policy refuses), the server gets a
:class:`~gpflow_fed.federated.transport.Response` with the reason, never an exception.
"""

from __future__ import annotations

import time
from typing import Any, Optional

import numpy as np

from .algorithm import Algorithm, FederationInfo
from .client import Client
from .faults import reply_fault, weight_fault
from .messages import Message
from .protection.encoder import ClientEncoder
from .protection.masking import PUBLIC_KEY_BYTES, Exchange
from .protection.request import Protection
from .transport import UPDATE, Request, Response

__all__ = ["ClientEndpoint", "public_keys_message", "read_public_keys"]

#: array-name prefix of the public keys a "mask" request relays
KEY_PREFIX = "pk/"


def public_keys_message(round: int, phase: str, keys: dict) -> Message:
    """The server's "mask" request payload: the cohort's public keys as ``uint8`` arrays (``pk/<client>``)."""
    from .messages import SERVER

    arrays = {KEY_PREFIX + cid: np.frombuffer(key, dtype=np.uint8) for cid, key in keys.items()}
    return Message(SERVER, round, phase, arrays, weight=0.0)


def read_public_keys(message: Message) -> dict:
    """The public keys a "mask" request relays, ``{client: 32 bytes}``.

    :raises ValueError: an entry that is not a 32-byte ``uint8`` key.
    """
    keys = {}
    for name, value in message.arrays.items():
        if not name.startswith(KEY_PREFIX):
            continue
        if value.dtype != np.uint8 or value.shape != (PUBLIC_KEY_BYTES,):
            raise ValueError(f"public key {name!r} must be {PUBLIC_KEY_BYTES} uint8 values")
        keys[name[len(KEY_PREFIX) :]] = value.tobytes()
    return keys


class ClientEndpoint:
    """A party: its client, its copy of the algorithm and its encoder (module docstring).

    :param algorithm: the party's bound algorithm (``Algorithm.bind``).
    :param client: the party's :class:`Client`.
    :param info: the federation, as the server announced it.
    :param encoder: the party's :class:`ClientEncoder`.
    """

    def __init__(self, algorithm: Algorithm, client: Client, info: FederationInfo, encoder: ClientEncoder) -> None:
        self.algorithm = algorithm
        self.client = client
        self.info = info
        self.encoder = encoder
        self.ready = False
        self._timed: set = set()

    def setup(self) -> None:
        """``Algorithm.setup_client`` once, before the client's first update (also on resume)."""
        if not self.ready:
            self.algorithm.setup_client(self.client, self.info)
            self.ready = True

    def handle(self, request: Request) -> Response:
        """The client's :class:`Response` to one request (a fault instead of an exception)."""
        try:
            if request.stage == UPDATE:
                return self._update(request)
            if request.stage == "keys":
                run_id = bytes.fromhex(str(request.config["run_id"]))
                key = self.encoder.public_key(run_id)
                down = request.message
                message = Message(self.client.id, down.round, down.phase, {"public_key": np.frombuffer(key, np.uint8)})
                return Response(message=message)
            if request.stage == "mask":
                config = request.config
                exchange = Exchange(
                    bytes.fromhex(str(config["run_id"])),
                    str(config["purpose"]),
                    int(config["round"]),
                    str(config["phase"]),
                    tuple(str(c) for c in config["cohort"]),
                )
                return Response(message=self.encoder.mask(exchange, read_public_keys(request.message)))
            return Response(fault=f"unknown stage {request.stage!r}", error=ValueError(request.stage))
        except Exception as exc:  # noqa: BLE001 - every client-side failure becomes a fault the server screens
            return Response(fault=f"raised {type(exc).__name__}: {exc}", error=exc)

    def _update(self, request: Request) -> Response:
        algorithm, down, config = self.algorithm, request.message, request.config
        self.setup()
        started = time.perf_counter()
        reply = algorithm.client_update(self.client, down)
        elapsed = time.perf_counter() - started
        first = down.phase not in self._timed
        self._timed.add(down.phase)
        seconds: Optional[float] = None if first else elapsed
        protection: Optional[Any] = config.get("protection")
        fault = reply_fault(reply, self.client.id, down) if not isinstance(reply, Message) else None
        if fault is None and protection is None:  # the server screens what it can read
            return Response(message=reply, seconds=seconds)
        if fault is None:  # a protected phase: the client checks its own reply; once encoded, the server cannot
            fault = reply_fault(reply, self.client.id, down)
        if fault is None:
            size = self.client.num_data
            fault = weight_fault(reply, algorithm.expected_weight(down.phase, size), size)
        if fault is not None:
            return Response(fault=fault, error=ValueError(fault), seconds=seconds)
        request_protection = Protection.from_config(protection)
        try:
            prepared = self.encoder.prepare(
                reply, request_protection, str(config["aggregation"]), int(config["cohort_size"]), request.purpose
            )
        except ValueError as exc:  # the client's policy refuses, or a value its encoding cannot carry
            return Response(fault=str(exc), error=exc, seconds=seconds)
        if request_protection.secure is None:
            return Response(message=prepared, seconds=seconds)
        layout = {name: tuple(np.shape(value)) for name, value in prepared.arrays.items()}
        return Response(layout=layout, seconds=seconds)
