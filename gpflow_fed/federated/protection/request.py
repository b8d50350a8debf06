"""What the server asks for: the protection of a run's ``"sum"``/``"mean"`` exchanges, as one validated value.

:class:`Protection` is the server's *request* (secure aggregation, differential privacy, robust aggregation). It is
kept apart from each client's own :class:`~gpflow_fed.federated.protection.policy.ClientPolicy`: a request may ask
for more protection than a client's policy, never for less (the client refuses a request below its policy).
It travels to every client with each protected broadcast (:meth:`Protection.to_config`), and a Flower run config
carries the same keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple, Union

from ...validation import parse_boolean, parse_integer, parse_number
from .distributed_dp import DistributedDP
from .dp import DifferentialPrivacy
from .masking import SecureAggregation
from .robust import RobustAggregation

__all__ = ["PROTECTED_AGGREGATIONS", "Protection"]

#: the aggregations whose exchanges can be protected: a ``"collect"`` phase needs each client's message
PROTECTED_AGGREGATIONS: Tuple[str, ...] = ("sum", "mean")


@dataclass(frozen=True)
class Protection:
    """The server's protection request for a run.

    :param secure_aggregation: ``True`` (the default) or a :class:`~gpflow_fed.federated.SecureAggregation` (its
        fixed point, minimum cohort and masking degree) to mask every ``"sum"``/``"mean"`` payload with drop-out
        recovery (:mod:`~gpflow_fed.federated.protection.secagg`); ``False`` to opt out (plain payloads: the exactness
        and bit-identity results of the package hold for an explicit ``False``; masked sums differ from plain ones
        by the fixed-point resolution, ``2^-f`` per client and entry). Its ``fractional_bits`` say how the server
        decodes: each party encodes with its own policy's (``ClientPolicy.fractional_bits``) and refuses a request
        that names others; its range is the party's too (the members it verifies), and a value beyond it is
        clipped and counted, never refused (:mod:`~gpflow_fed.federated.protection.wire`). ``"collect"`` phases,
        which need each client's message, always run in plain; each algorithm's documentation and the threat model
        say which have them.
    :param differential_privacy: a :class:`~gpflow_fed.federated.DifferentialPrivacy` (central: clients clip, the
        server adds Gaussian noise to each sum), a :class:`~gpflow_fed.federated.protection.DistributedDP`
        (distributed: each client adds its share of discrete Gaussian noise before masking, so the (ε, δ) holds
        against the server too, if enough clients are honest; needs secure aggregation), or None.
    :param robust: a :class:`~gpflow_fed.federated.RobustAggregation` for ``"mean"`` phases (it needs each
        client's payload, so not with the other two), or None.
    :raises TypeError: a setting of the wrong type.
    :raises ValueError: robust aggregation together with secure aggregation or DP.
    """

    secure_aggregation: Union[bool, SecureAggregation, None] = True
    differential_privacy: Optional[Union[DifferentialPrivacy, DistributedDP]] = None
    robust: Optional[RobustAggregation] = None

    def __post_init__(self) -> None:
        secure = self.secure_aggregation
        if secure is True:
            secure = SecureAggregation()
        if secure is not None and secure is not False and not isinstance(secure, SecureAggregation):
            raise TypeError(f"secure_aggregation must be a bool or SecureAggregation, got {type(secure).__name__}")
        object.__setattr__(self, "secure_aggregation", secure or None)
        dp = self.differential_privacy
        if dp is not None and not isinstance(dp, (DifferentialPrivacy, DistributedDP)):
            raise TypeError(
                f"differential_privacy must be a DifferentialPrivacy or DistributedDP, got {type(dp).__name__}"
            )
        if isinstance(dp, DistributedDP) and secure is None:
            raise ValueError(
                "distributed DP: each client adds its share of the noise before masking, so it needs secure "
                "aggregation (on by default); do not combine it with secure_aggregation=False"
            )
        if self.robust is not None and not isinstance(self.robust, RobustAggregation):
            raise TypeError(f"robust must be a RobustAggregation, got {type(self.robust).__name__}")
        if self.robust is not None and (self.secure is not None or self.dp is not None):
            raise ValueError(
                "robust aggregation needs each client's payload, which secure aggregation (on by default) hides and "
                "DP's sensitivity analysis does not cover; opt out explicitly: "
                "Protection(secure_aggregation=False, robust=...) without differential_privacy"
            )

    @property
    def secure(self) -> Optional[SecureAggregation]:
        """The secure-aggregation settings, or None."""
        return self.secure_aggregation  # type: ignore[return-value]  # normalised in __post_init__

    @property
    def dp(self) -> Optional[Union[DifferentialPrivacy, DistributedDP]]:
        return self.differential_privacy

    @property
    def distributed(self) -> Optional[DistributedDP]:
        """The distributed DP settings, or None (no DP, or central DP)."""
        return self.differential_privacy if isinstance(self.differential_privacy, DistributedDP) else None

    @property
    def active(self) -> bool:
        """Whether any protection is on."""
        return self.secure is not None or self.dp is not None or self.robust is not None

    def noised(self, phase: str, aggregation: str) -> bool:
        """Whether DP clips and noises the sums of ``phase`` (distributed DP: every ``"sum"``/``"mean"`` phase)."""
        if self.dp is None or aggregation not in PROTECTED_AGGREGATIONS:
            return False
        return isinstance(self.dp, DistributedDP) or self.dp.applies(phase)

    def client_noise(self, phase: str, aggregation: str) -> float:
        """The DP noise multiplier each client adds itself to its answer to ``phase``: distributed DP's; 0 for central
        DP (the server adds that noise, and an active server is the adversary) or no DP. What a client's floor and
        its "DP never goes down" rule compare (:class:`~.policy.ClientPolicy`, :class:`~.encoder.ClientEncoder`)."""
        if self.distributed is None or not self.noised(phase, aggregation):
            return 0.0
        return float(self.distributed.noise_multiplier)

    def protects(self, phase: str, aggregation: str) -> bool:
        """Whether the replies of ``phase`` are encoded by the clients (else: plain messages)."""
        return aggregation in PROTECTED_AGGREGATIONS and (self.secure is not None or self.noised(phase, aggregation))

    def check(self, algorithm: Any) -> None:
        """Before the run: DP's ``phases`` exist in ``algorithm`` and none of them is a ``"collect"`` phase (secure
        aggregation leaves ``"collect"`` phases plain, as the algorithm documents).

        :raises ValueError: naming the phase and the fix.
        """
        if not self.active:
            return
        phases = set(algorithm.final_phases())
        for r in range(algorithm.rounds):
            phases.update(algorithm.phases(r))
        if isinstance(self.dp, DifferentialPrivacy) and self.dp.phases is not None:
            unknown = sorted(set(self.dp.phases) - phases)
            if unknown:
                raise ValueError(
                    f"{algorithm.name}: DifferentialPrivacy(phases=...) names {unknown}, which this run never "
                    f"executes; its phases are {sorted(phases)}"
                )
        central = self.dp if isinstance(self.dp, DifferentialPrivacy) else None
        collected = sorted(
            p for p in phases if algorithm.aggregation(p) == "collect" and central and central.applies(p)
        )
        if collected:
            raise ValueError(
                f"{algorithm.name}: differential privacy protects only 'sum' and 'mean' phases, but phase(s) "
                f"{collected} collect each client's message; run this algorithm without it, or name the protected "
                "phases with DifferentialPrivacy(phases=...)"
            )

    def describe(self) -> Dict[str, str]:
        """What a checkpoint records of the request (and a resumed run must match)."""
        return {"secure_aggregation": repr(self.secure), "differential_privacy": repr(self.dp)}

    # --- as a run config (Flower) or a broadcast's config --------------------------------------------------
    def to_config(self) -> Dict[str, Union[bool, int, float, str]]:
        """Flat entries from which :meth:`from_config` rebuilds this request.

        Keys: ``secure-aggregation`` (bool), ``fractional-bits``, ``min-cohort``, ``masking-degree`` (0: default);
        ``robust-method``, ``robust-trim``, ``robust-clip-norm``; with DP ``dp-noise-multiplier``, ``dp-clip-norm``,
        ``dp-delta``, ``dp-weight-bound``, ``dp-accountant`` and ``dp-phases`` (comma-separated, empty for every
        sum phase); with distributed DP ``ddp-noise-multiplier``, ``ddp-clip-norm``, ``ddp-honest-clients``,
        ``ddp-delta``, ``ddp-granularity`` (0: the default step), ``ddp-beta``. ``from_config(to_config(p)) == p``
        for every request ``p``.
        """
        config: Dict[str, Union[bool, int, float, str]] = {"secure-aggregation": self.secure is not None}
        if self.secure is not None:
            config["fractional-bits"] = int(self.secure.fractional_bits)
            config["min-cohort"] = int(self.secure.min_cohort)
            config["masking-degree"] = int(self.secure.degree or 0)
        if self.robust is not None:
            config.update({"robust-method": self.robust.method, "robust-trim": float(self.robust.trim)})
            if self.robust.clip_norm is not None:
                config["robust-clip-norm"] = float(self.robust.clip_norm)
        dp = self.dp
        if isinstance(dp, DistributedDP):
            config.update(
                {
                    "ddp-noise-multiplier": float(dp.noise_multiplier),
                    "ddp-clip-norm": float(dp.clip_norm),
                    "ddp-honest-clients": int(dp.honest_clients),
                    "ddp-delta": float(dp.delta),
                    "ddp-granularity": float(dp.granularity or 0.0),
                    "ddp-beta": float(dp.beta),
                }
            )
        elif dp is not None:
            config.update(
                {
                    "dp-noise-multiplier": float(dp.noise_multiplier),
                    "dp-clip-norm": float(dp.clip_norm),
                    "dp-delta": float(dp.delta),
                    "dp-weight-bound": float(dp.weight_bound),
                    "dp-accountant": dp.accountant,
                    "dp-phases": "" if dp.phases is None else ",".join(dp.phases),
                }
            )
        return config

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "Protection":
        """The request a config describes. A missing key means its default, as for :class:`Protection` itself
        (``from_config({}) == Protection()``: secure aggregation on), and every value is parsed strictly: a boolean
        is a bool or exactly ``"true"``/``"false"``, a number a number or a string of one; anything else raises,
        naming the key (never a silent default: ``"yes"`` or ``"1"`` is an error, not ``True`` or ``False``).

        :raises ValueError, TypeError: a malformed value, naming its key, or invalid settings (from
            ``SecureAggregation``/``DifferentialPrivacy``/``DistributedDP``/``RobustAggregation``).
        """

        def number(key: str, default: float) -> float:
            return parse_number(config[key], key) if key in config else default

        def count(key: str, default: int) -> int:
            return parse_integer(config[key], key) if key in config else default

        secure = None
        if parse_boolean(config.get("secure-aggregation", True), "secure-aggregation"):
            degree = count("masking-degree", 0)
            secure = SecureAggregation(
                count("fractional-bits", SecureAggregation.fractional_bits),
                min_cohort=count("min-cohort", SecureAggregation.min_cohort),
                degree=degree or None,
            )
        robust = None
        if "robust-method" in config:
            robust = RobustAggregation(
                str(config["robust-method"]),
                number("robust-trim", RobustAggregation.trim),
                parse_number(config["robust-clip-norm"], "robust-clip-norm") if "robust-clip-norm" in config else None,
            )
        dp: Optional[Union[DifferentialPrivacy, DistributedDP]] = None
        if "ddp-noise-multiplier" in config:
            granularity = number("ddp-granularity", 0.0)
            dp = DistributedDP(
                noise_multiplier=parse_number(config["ddp-noise-multiplier"], "ddp-noise-multiplier"),
                clip_norm=parse_number(config.get("ddp-clip-norm"), "ddp-clip-norm"),
                honest_clients=parse_integer(config.get("ddp-honest-clients"), "ddp-honest-clients"),
                delta=number("ddp-delta", DistributedDP.delta),
                granularity=granularity or None,
                beta=number("ddp-beta", DistributedDP.beta),
            )
        elif "dp-noise-multiplier" in config or "dp-clip-norm" in config:
            phases = str(config.get("dp-phases", ""))
            dp = DifferentialPrivacy(
                noise_multiplier=parse_number(config.get("dp-noise-multiplier"), "dp-noise-multiplier"),
                clip_norm=parse_number(config.get("dp-clip-norm"), "dp-clip-norm"),
                delta=number("dp-delta", DifferentialPrivacy.delta),
                weight_bound=number("dp-weight-bound", DifferentialPrivacy.weight_bound),
                accountant=str(config.get("dp-accountant", DifferentialPrivacy.accountant)),
                phases=tuple(p for p in phases.split(",") if p) or None,
            )
        return cls(secure_aggregation=secure, differential_privacy=dp, robust=robust)
