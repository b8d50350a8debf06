"""The client's side of every protection: one encoder per client, holding the client's policy and its keys.

Every runtime hands a protected stage to the party's :class:`ClientEncoder` (through its
:class:`~gpflow_fed.federated.endpoint.ClientEndpoint`), in process or inside a Flower ClientApp:

1. **prepare** (with the update): the client checks the server's request against its own
   :class:`~gpflow_fed.federated.protection.policy.ClientPolicy`, then clips (DP), caps and applies the weight
   (``"mean"``), and encodes in fixed point (secure aggregation). The encoding stays with the client; the server
   gets its layout only (names and shapes), or, with DP alone, the clipped message;
2. **keys**: the client's X25519 public key for this run (its private key never leaves this object);
3. **mask**: for the cohort the server has fixed, the client checks that cohort itself (it is in it, it has at
   least the client's own minimum, the exchange is the one it prepared, and it has not answered this exchange
   before), computes the masking graph itself from the public cohort, and sends its encoding plus its pads.

What leaves the client is what :meth:`ClientEncoder.prepare` (layout or clipped message), :meth:`public_key` and
:meth:`mask` return; nothing else.
"""

from __future__ import annotations

import io
import json
from typing import Dict, Mapping, Optional, Set, Tuple

import numpy as np

from ..messages import Message
from .dp import clip_payload
from .masking import Exchange, MaskingKeys, mask, masking_graph
from .policy import ClientPolicy
from .request import Protection

__all__ = ["ClientEncoder", "EncoderRefusal", "METRIC_PREFIX", "WEIGHT_KEY"]

#: the encoded entry that carries the client's weight in a masked sum
WEIGHT_KEY = "secagg/weight"
#: the prefix of the encoded entries that carry the client's weighted metrics in a masked sum
METRIC_PREFIX = "secagg/metric/"


class EncoderRefusal(ValueError):
    """The client refuses a protected stage (its policy, a cohort it does not accept, a repeated exchange)."""


class ClientEncoder:
    """One client's protection: its policy, its per-run keys, and what it has prepared and answered.

    :param client_id: the client's id (the sender of its messages).
    :param policy: the client's own :class:`ClientPolicy`.
    """

    def __init__(self, client_id: str, policy: ClientPolicy) -> None:
        if not isinstance(policy, ClientPolicy):
            raise TypeError(f"policy must be a ClientPolicy, got {type(policy).__name__}")
        self.client_id = client_id
        self.policy = policy
        self._run_id: Optional[bytes] = None
        self._keys: Optional[MaskingKeys] = None
        self._prepared: Dict[Tuple[str, int, str], Tuple[Message, Protection]] = {}
        self._answered: Set[Tuple[bytes, str, int, str]] = set()

    # --- the update ----------------------------------------------------------------------------------
    def prepare(
        self, message: Message, request: Protection, aggregation: str, cohort_size: int, purpose: str
    ) -> Message:
        """The client's protected answer to an update: clipped and weighted (DP), fixed point (secure aggregation).

        With secure aggregation the encoding is kept here until :meth:`mask`, and the returned message holds
        zeros in its layout (only its names and shapes may leave the client); with DP alone the clipped message
        is returned, which the client sends.

        :raises EncoderRefusal: the request is below the client's policy.
        :raises ValueError: a payload outside the fixed-point range (see ``SecureAggregation``).
        """
        refusal = self.policy.refusal(request, message.phase, aggregation)
        if refusal:
            raise EncoderRefusal(refusal)
        arrays = {k: np.asarray(v, dtype=np.float64) for k, v in message.arrays.items()}
        weight = message.weight
        metrics = dict(message.metrics)
        dp = request.dp
        if dp is not None and request.noised(message.phase, aggregation):
            arrays, _ = clip_payload(arrays, dp.clip_norm)
            if aggregation == "mean":
                weight = min(weight, dp.weight_bound)
            metrics = {}
        if request.secure is None:
            return Message(message.sender, message.round, message.phase, arrays, weight=weight)
        if aggregation == "mean":
            arrays = {k: weight * v for k, v in arrays.items()}
        arrays[WEIGHT_KEY] = np.array([weight])
        arrays.update({METRIC_PREFIX + k: np.array([weight * v]) for k, v in metrics.items()})
        encoded = {k: request.secure.encode(k, v, cohort_size) for k, v in arrays.items()}
        prepared = Message(message.sender, message.round, message.phase, encoded, weight=0.0)
        self._prepared = {(purpose, message.round, message.phase): (prepared, request)}  # one exchange at a time
        return prepared

    # --- keys and masking ----------------------------------------------------------------------------
    def public_key(self, run_id: bytes) -> bytes:
        """This client's X25519 public key for run ``run_id`` (fresh keys from the OS for every new run)."""
        if run_id != self._run_id:
            self._run_id, self._keys = bytes(run_id), MaskingKeys()
        assert self._keys is not None
        return self._keys.public_bytes

    def mask(self, exchange: Exchange, public_keys: Mapping[str, bytes]) -> Message:
        """What the client sends for ``exchange``: its kept encoding plus its pads (module docstring, step 3).

        :param exchange: the exchange the server fixed (run id, purpose, round, phase, cohort).
        :param public_keys: the cohort's public keys, relayed by the server.
        :raises EncoderRefusal: an exchange this client did not prepare, has answered before, is not in, or whose
            cohort is below its own minimum; keys of another run.
        """
        key = (exchange.run_id, exchange.purpose, exchange.round, exchange.phase)
        if key in self._answered:
            raise EncoderRefusal(
                f"round {exchange.round}, phase {exchange.phase!r}: this client has answered this exchange already; "
                "a second masked answer (to another cohort) would let the server difference the sums; refused"
            )
        kept = self._prepared.get((exchange.purpose, exchange.round, exchange.phase))
        if kept is None:
            raise EncoderRefusal(
                f"round {exchange.round}, phase {exchange.phase!r}: this client prepared no payload for this exchange"
            )
        if self.client_id not in exchange.members:
            raise EncoderRefusal(f"the cohort {exchange.cohort} does not include this client ({self.client_id})")
        prepared, request = kept
        assert request.secure is not None
        minimum = max(self.policy.min_cohort, request.secure.min_cohort)
        if len(exchange.cohort) < minimum:
            raise EncoderRefusal(
                f"round {exchange.round}, phase {exchange.phase!r}: a cohort of {len(exchange.cohort)} is below this "
                f"client's minimum of {minimum}; refused"
            )
        if exchange.run_id != self._run_id or self._keys is None:
            raise EncoderRefusal("the server asks to mask for a run whose keys this client never made")
        graph = masking_graph(exchange, request.secure.masking_degree(len(exchange.cohort)))
        neighbours = graph[self.client_id]
        masked = mask(self._keys, self.client_id, prepared.arrays, exchange, public_keys, neighbours)
        self._answered.add(key)
        del self._prepared[(exchange.purpose, exchange.round, exchange.phase)]
        return Message(self.client_id, prepared.round, prepared.phase, masked, weight=0.0)

    # --- the client's own state between messages (a Flower ClientApp restarts for each one) -------------
    def to_state(self) -> bytes:
        """Everything this encoder holds, as bytes for the client's *in-memory* state only (Flower's
        ``Context.state``, which the SuperNode keeps): its private key, what it prepared, what it answered."""
        header = {
            "client_id": self.client_id,
            "run_id": None if self._run_id is None else self._run_id.hex(),
            "answered": [[r.hex(), p, int(n), f] for r, p, n, f in sorted(self._answered)],
            "prepared": [
                {
                    "purpose": key[0],
                    "round": int(key[1]),
                    "phase": key[2],
                    "names": sorted(message.arrays),
                    "request": request.to_config(),
                }
                for key, (message, request) in self._prepared.items()
            ],
        }
        buffer = io.BytesIO()
        arrays = {
            f"p{i}/{name}": np.asarray(message.arrays[name])
            for i, (message, _) in enumerate(self._prepared.values())
            for name in sorted(message.arrays)
        }
        if self._keys is not None:
            arrays["private_key"] = np.frombuffer(self._keys.export_private(), np.uint8)
        np.savez(buffer, header=np.frombuffer(json.dumps(header).encode("utf-8"), np.uint8), **arrays)
        return buffer.getvalue()

    @classmethod
    def from_state(cls, client_id: str, policy: ClientPolicy, state: bytes) -> "ClientEncoder":
        """The encoder :meth:`to_state` saved, for ``client_id`` under ``policy`` (the policy is never part of the
        saved state: it always comes from the client's own configuration).

        :raises ValueError: a state of another client, or malformed.
        """
        encoder = cls(client_id, policy)
        with np.load(io.BytesIO(state), allow_pickle=False) as npz:
            header = json.loads(npz["header"].tobytes().decode("utf-8"))
            if header.get("client_id") != client_id:
                raise ValueError(f"the saved encoder state belongs to {header.get('client_id')!r}, not {client_id!r}")
            if header["run_id"] is not None:
                encoder._run_id = bytes.fromhex(header["run_id"])
                encoder._keys = MaskingKeys.from_private(npz["private_key"].tobytes())
            encoder._answered = {(bytes.fromhex(r), str(p), int(n), str(f)) for r, p, n, f in header["answered"]}
            for i, kept in enumerate(header["prepared"]):
                arrays = {name: npz[f"p{i}/{name}"] for name in kept["names"]}
                message = Message(client_id, int(kept["round"]), str(kept["phase"]), arrays, weight=0.0)
                key = (str(kept["purpose"]), int(kept["round"]), str(kept["phase"]))
                encoder._prepared[key] = (message, Protection.from_config(kept["request"]))
        return encoder
