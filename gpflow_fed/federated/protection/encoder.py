"""The client's side of every protection: one encoder per client, holding the client's policy and its keys.

Every runtime hands a protected stage to the party's :class:`ClientEncoder` (through its
:class:`~gpflow_fed.federated.endpoint.ClientEndpoint`), in process or inside a Flower ClientApp:

1. **prepare** (with the update): the client checks the server's request against its own
   :class:`~gpflow_fed.federated.protection.policy.ClientPolicy`, then clips (DP), caps and applies the weight
   (``"mean"``), and encodes in fixed point (secure aggregation). The encoding stays with the client; the server
   gets its layout only (names and shapes), or, with DP alone, the clipped message;
2. **the secure-aggregation protocol** (:mod:`.secagg`, drop-out recovery included): once per run its keys and
   the Shamir shares of its self-mask seed; per exchange its masked encoding, for a cohort the client checks
   itself (it is in it, it has at least the client's own minimum, the exchange is the one it prepared, it has not
   answered this exchange before), then what the unmasking of that exchange needs.

What leaves the client is what :meth:`ClientEncoder.prepare` (layout or clipped message) and :meth:`respond`
return; nothing else.
"""

from __future__ import annotations

import io
import json
from typing import Any, Dict, Mapping, Optional, Tuple, cast

import numpy as np

from ..messages import Message
from .distributed_dp import DistributedDP, NoiseSource
from .dp import DifferentialPrivacy, clip_payload
from .policy import ClientPolicy
from .request import Protection
from .secagg import SecAggClient

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
    :param sizes: the registered sizes of the federation's clients (public), for the small-cohort rule.
    """

    def __init__(self, client_id: str, policy: ClientPolicy, sizes: Optional[Mapping[str, int]] = None) -> None:
        if not isinstance(policy, ClientPolicy):
            raise TypeError(f"policy must be a ClientPolicy, got {type(policy).__name__}")
        self.client_id = client_id
        self.policy = policy
        self._run_id: Optional[bytes] = None
        self._secagg: Optional[SecAggClient] = None
        self._prepared: Dict[Tuple[str, int, str], Tuple[Message, Protection]] = {}
        self._noise = NoiseSource()  # distributed DP's shares: the OS's randomness
        self.sizes = dict(sizes or {})
        #: per exchange (purpose, round, phase), the least total data a summed group must hold (small-cohort rule)
        self._min_data: Dict[Tuple[str, int, str], int] = {}

    # --- the update ----------------------------------------------------------------------------------
    def prepare(
        self,
        message: Message,
        request: Protection,
        aggregation: str,
        cohort_size: int,
        purpose: str,
        min_data: Optional[int] = None,
    ) -> Message:
        """The client's protected answer to an update: clipped and weighted (DP), fixed point (secure aggregation).

        With secure aggregation the encoding is kept here until :meth:`mask`, and the returned message holds
        zeros in its layout (only its names and shapes may leave the client); with DP alone the clipped message
        is returned, which the client sends.

        :param min_data: the least total data a summed group must hold for the payload not to determine its rows
            (``Algorithm.min_cohort_data``); checked on the cohort and on every group unmasking reveals.
        :raises EncoderRefusal: the request is below the client's policy.
        :raises ValueError: a payload outside the fixed-point range (see ``SecureAggregation``).
        """
        refusal = self.policy.refusal(request, message.phase, aggregation)
        if refusal:
            raise EncoderRefusal(refusal)
        if min_data is not None and self.policy.protect_small_cohorts:
            self._min_data[(purpose, message.round, message.phase)] = int(min_data)
        arrays = {k: np.asarray(v, dtype=np.float64) for k, v in message.arrays.items()}
        distributed = request.distributed
        if distributed is not None and request.noised(message.phase, aggregation):
            return self._keep(self._distributed_codes(message, arrays, distributed, cohort_size), request, purpose)
        weight = message.weight
        metrics = dict(message.metrics)
        dp = request.dp
        if dp is not None and request.noised(message.phase, aggregation):
            arrays, _ = clip_payload(arrays, dp.clip_norm)
            if aggregation == "mean":
                weight = min(weight, cast(DifferentialPrivacy, dp).weight_bound)  # distributed DP returned above
            metrics = {}
        if request.secure is None:
            return Message(message.sender, message.round, message.phase, arrays, weight=weight)
        if aggregation == "mean":
            arrays = {k: weight * v for k, v in arrays.items()}
        arrays[WEIGHT_KEY] = np.array([weight])
        arrays.update({METRIC_PREFIX + k: np.array([weight * v]) for k, v in metrics.items()})
        encoded = {k: request.secure.encode(k, v, cohort_size) for k, v in arrays.items()}
        return self._keep(Message(message.sender, message.round, message.phase, encoded, weight=0.0), request, purpose)

    def _keep(self, prepared: Message, request: Protection, purpose: str) -> Message:
        self._prepared = {(purpose, prepared.round, prepared.phase): (prepared, request)}  # one exchange at a time
        return prepared

    def _distributed_codes(
        self, message: Message, arrays: Dict[str, np.ndarray], dp: DistributedDP, cohort_size: int
    ) -> Message:
        """Distributed DP: the whole payload clipped, rounded and noised on the client
        (:meth:`DistributedDP.encode`), as ``uint64`` codes per array. A ``"mean"`` phase averages the clients'
        clipped payloads with equal weights (the server divides by the number of survivors); metrics are dropped."""
        names = sorted(arrays)
        flat = np.concatenate([arrays[n].ravel() for n in names])
        codes = dp.encode(flat, cohort_size, rng=self._noise).view(np.uint64)
        encoded, offset = {}, 0
        for n in names:
            encoded[n] = codes[offset : offset + arrays[n].size].reshape(arrays[n].shape)
            offset += arrays[n].size
        return Message(message.sender, message.round, message.phase, encoded, weight=0.0)

    # --- the secure-aggregation protocol ---------------------------------------------------------------
    def respond(self, stage: str, request: Mapping[str, Any]) -> Dict[str, Any]:
        """This client's answer to one stage of the secure-aggregation protocol (:mod:`.secagg`).

        ``advertise`` starts the run's protocol client (fresh keys from the OS; the client's own ``min_cohort``);
        ``masked_input`` masks the encoding :meth:`prepare` kept for the exchange the request names, once.

        :raises EncoderRefusal: no setup for this run, or no kept encoding for the exchange.
        :raises SecAggRefused: the protocol client refuses (its policy, a cohort it does not accept, a replay).
        """
        if stage == "advertise":
            run_id = request.get("run_id") if isinstance(request, Mapping) else None
            if self._secagg is None or run_id != self._run_id:
                self._secagg = SecAggClient(self.client_id, min_cohort=self.policy.min_cohort)
                self._run_id = run_id if isinstance(run_id, bytes) else None
        if self._secagg is None:
            raise EncoderRefusal(f"secure aggregation: {self.client_id!r} has no setup for this run")
        codes = None
        key: Optional[Tuple[Any, Any, Any]] = None  # the request's values: wrong types find nothing
        if stage in ("masked_input", "unmask"):
            self._check_groups(request)
        if stage == "masked_input":
            key = (request.get("purpose"), request.get("round"), request.get("phase"))
            kept = self._prepared.get(key)
            if kept is None:
                raise EncoderRefusal(
                    f"secure aggregation: {self.client_id!r} prepared no payload for round {key[1]}, phase {key[2]!r}"
                )
            prepared = kept[0]
            codes = np.concatenate([prepared.arrays[n].ravel() for n in sorted(prepared.arrays)]).astype(np.uint64)
        answer = self._secagg.respond(stage, request, codes)
        if key is not None:
            del self._prepared[key]
        return answer

    def _check_groups(self, request: Mapping[str, Any]) -> None:
        """The small-cohort rule: every group whose sum the server would learn holds enough data."""
        key: Tuple[Any, Any, Any] = (request.get("purpose"), request.get("round"), request.get("phase"))
        needed = self._min_data.get(key)
        if needed is None or self._secagg is None:
            return
        for group in self._secagg.survivor_groups(request):
            held = sum(int(self.sizes.get(c, 0)) for c in group)
            if held < needed:
                raise EncoderRefusal(
                    f"secure aggregation: {self.client_id!r} refuses: the sum over a group of {len(group)} client(s) "
                    f"holding {held} points would determine their rows (this phase needs ≥ {needed})"
                )

    # --- the client's own state between messages (a Flower ClientApp restarts for each one) -------------
    def to_state(self) -> bytes:
        """Everything this encoder holds, as bytes for the client's *in-memory* state only (Flower's
        ``Context.state``, which the SuperNode keeps): its protocol client's secrets, what it prepared."""
        header = {
            "client_id": self.client_id,
            "run_id": None if self._run_id is None else self._run_id.hex(),
            "secagg": [] if self._secagg is None else sorted(self._secagg.to_state()),
            "sizes": self.sizes,
            "min_data": [[k[0], int(k[1]), k[2], v] for k, v in self._min_data.items()],
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
        arrays = {
            f"p{i}/{name}": np.asarray(message.arrays[name])
            for i, (message, _) in enumerate(self._prepared.values())
            for name in sorted(message.arrays)
        }
        if self._secagg is not None:
            arrays.update({f"s/{k}": np.frombuffer(v, np.uint8) for k, v in self._secagg.to_state().items()})
        buffer = io.BytesIO()
        np.savez(buffer, header=np.frombuffer(json.dumps(header).encode("utf-8"), np.uint8), **arrays)
        return buffer.getvalue()

    @classmethod
    def from_state(cls, client_id: str, policy: ClientPolicy, state: bytes) -> "ClientEncoder":
        """The encoder :meth:`to_state` saved, for ``client_id`` under ``policy`` (the policy is never part of the
        saved state: it always comes from the client's own configuration).

        :raises ValueError: a state of another client, or malformed.
        """
        with np.load(io.BytesIO(state), allow_pickle=False) as npz:
            header = json.loads(npz["header"].tobytes().decode("utf-8"))
            if header.get("client_id") != client_id:
                raise ValueError(f"the saved encoder state belongs to {header.get('client_id')!r}, not {client_id!r}")
            encoder = cls(client_id, policy, {str(k): int(v) for k, v in header.get("sizes", {}).items()})
            encoder._min_data = {(str(p), int(r), str(f)): int(v) for p, r, f, v in header.get("min_data", [])}
            if header["run_id"] is not None:
                encoder._run_id = bytes.fromhex(header["run_id"])
            if header["secagg"]:
                encoder._secagg = SecAggClient.from_state({k: npz[f"s/{k}"].tobytes() for k in header["secagg"]})
            for i, kept in enumerate(header["prepared"]):
                arrays = {name: npz[f"p{i}/{name}"] for name in kept["names"]}
                message = Message(client_id, int(kept["round"]), str(kept["phase"]), arrays, weight=0.0)
                key = (str(kept["purpose"]), int(kept["round"]), str(kept["phase"]))
                encoder._prepared[key] = (message, Protection.from_config(kept["request"]))
        return encoder
