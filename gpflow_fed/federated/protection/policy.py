"""What a client itself insists on: its protection policy, which no broadcast or run config can lower.

The party being protected enforces its own protection. A :class:`ClientPolicy` lives with the client (the Python
:class:`~gpflow_fed.federated.Client` of an in-process run, or a Flower SuperNode's node config); its
:class:`~gpflow_fed.federated.protection.encoder.ClientEncoder` applies it to every request:

* ``secure_aggregation=True``: the client never sends a ``"sum"``/``"mean"`` payload in plain — a request that asks
  for a plain answer is refused (the client answers with a fault, and nothing of its payload leaves it);
* ``min_cohort``: the client masks only for a cohort it has been shown with at least this many members (whatever the
  server's request says);
* ``fractional_bits``: its fixed point (resolution ``2^-f``); its range over the n members of a cohort it verified is
  ``⌊(2^63 − 1)/n⌋ / 2^f`` (a value beyond it is clipped and counted, never refused), and a request that names other
  ``fractional_bits`` is refused (:mod:`.encoder`);
* ``masking_degree``: the least degree of the masking and share-holder graphs it accepts (default: the protocol's own,
  ``min(2⌈log₂ n⌉, n − 1)`` for a graph over n members); a request may ask for more, never for less;
* ``max_colluders``: c, the most members of a cohort it assumes collude with the server in the consistency round of
  secure aggregation (with a roster): it signs and unmasks only a survivor set that a quorum
  ``q = min(n, ⌊(n + c)/2⌋ + 1)`` of the n members signed (default: the protocol's own c,
  :func:`~gpflow_fed.federated.protection.secagg.default_colluders`, ``max(⌊n/3⌋, t − 1)``); a request may raise c
  (a larger quorum), never lower it;
* ``min_noise_multiplier``: the least distributed-DP noise it adds itself to a ``"sum"``/``"mean"`` answer (0: DP
  not required); a request without distributed DP (central DP's noise is the server's), or with less noise, is
  refused;
* ``honest_clients``: the most honest clients it assumes under distributed DP (None: any); a request that assumes more
  (so that each client adds less noise) is refused. Before it unmasks a distributed-DP sum over a cohort of m it
  assumes c colluders of its own: ``max_colluders`` (None: the ``h − 1`` its masking graph withstands), lowered to
  the request's ``m − H`` only down to its own ``m − honest_clients``; with None the request's H never lowers c, and a
  request with ``H > m − c`` is refused;
* ``max_rounds``: the most training rounds it answers (None: its algorithm's own); a Flower party's comes from its
  node config (``max-rounds``, default :data:`DEFAULT_MAX_ROUNDS`), never from the run config the server writes, so a
  server cannot ask for 100,000 releases by writing ``rounds = 100000``;
* ``trust_server_noise``: whether a DP clip of a phase whose algorithm bounds its payload
  (``Algorithm.payload_bound``) may bind under noise the client does not add itself. A clip swept by the server (its
  ``clip_norm``, or the payload's scale through the broadcast) changes the masked sum's slope at each party's norm, so
  without DP noise the party trusts it gives every party's payload (issue 43, a thirteenth attacker). By default
  (False) a request's clip norm below the payload's public L2 bound is refused unless the client adds the noise itself
  at its own floor (distributed DP with ``min_noise_multiplier > 0``); in-process runs (:meth:`ClientPolicy.matching`),
  whose server is the user, trust central DP's noise;
* ``budget``: an (ε, δ) the client's distributed-DP answers may spend in total, across exchanges **and runs** (None:
  no budget), kept in its own zCDP ledger (``ledger``: a file, :mod:`.budget`); under a budget it answers a
  ``"sum"``/``"mean"`` phase only under distributed DP, whose noise share it adds itself: central DP (the server adds
  the noise) and plain sums cannot be enforced by the client, so they are refused.

Within a run a client's DP on a phase never goes down: once it has answered a phase under noise multiplier z, it
refuses that phase without DP or with less (:class:`~gpflow_fed.federated.protection.encoder.ClientEncoder`), and under
distributed DP it refuses to unmask a sum over fewer survivors than the request's honest-client count (whose noise
would be below what the accountant assumes).

In an in-process runtime every party runs in one process, with every key; there the policy defaults to what the run
asks (:meth:`ClientPolicy.matching`), for parity with a deployment, not for protection.
"""

from __future__ import annotations

from dataclasses import dataclass
import math
import os
from typing import Any, Dict, Mapping, Optional, Tuple

from ...validation import parse_boolean, parse_integer, parse_number
from .masking import SecureAggregation
from .request import Protection

__all__ = ["ClientPolicy", "DEFAULT_MAX_ROUNDS"]

#: a Flower party's cap on training rounds when its node config names none (``max-rounds``): ten times the package's
#: largest default schedule (fit's FSGP, 100 rounds)
DEFAULT_MAX_ROUNDS = 1000


@dataclass(frozen=True)
class ClientPolicy:
    """A client's own protection policy (module docstring).

    :param secure_aggregation: require masking of every ``"sum"``/``"mean"`` payload (default: required).
    :param min_cohort: the fewest cohort members the client masks with (≥ 2).
    :param fractional_bits: f ∈ [1, 62], the client's fixed-point resolution ``2^-f`` (module docstring).
    :param protect_small_cohorts: refuse to send a payload whose sum over the cohort (or the client alone, in plain)
        would determine the cohort's rows, as the algorithm declares (``Algorithm.min_cohort_data``: FSGP's
        statistics of Σ N_k ≤ M points are invertible).
    :param masking_degree: the least degree of a graph the client masks or shares over (≥ 2; None: the protocol's
        default for the graph's size, :func:`~gpflow_fed.federated.protection.secagg.default_degree`).
    :param min_noise_multiplier: the DP floor (≥ 0; module docstring).
    :param honest_clients: the most honest clients this client assumes under distributed DP (≥ 1, or None).
    :param max_rounds: the most training rounds the client answers (≥ 1, or None: its algorithm's).
    :param budget: ``(ε, δ)``, ε > 0 and 0 < δ < 1: the most its distributed-DP answers spend in total, across
        exchanges and runs (None: no budget). Only distributed DP is the party's own: under a budget, a central-DP or
        non-DP request for a ``"sum"``/``"mean"`` phase is refused.
    :param ledger: the path of the party's ledger file (:mod:`.budget`; made once with
        :func:`~gpflow_fed.federated.protection.budget.create_ledger`), or None: kept in memory for the encoder's
        life, so the budget does not span runs then. Needs a ``budget``.
    :param max_colluders: c ≥ 0, the most cohort members the client assumes collude with the server, which sets the
        quorum of signers it needs in the consistency round (module docstring; None: the protocol's default,
        :func:`~gpflow_fed.federated.protection.secagg.default_colluders`). A request may raise it, never lower it.
    :param trust_server_noise: let a DP clip bind a bounded payload under noise the client does not add itself
        (module docstring; default False).
    :raises ValueError: ``min_cohort`` below 2, ``masking_degree`` below 2, a negative noise floor, ``honest_clients``
        below 1, a budget out of range, a ledger without a budget, a negative ``max_colluders``.
    :raises TypeError: settings of the wrong type.
    """

    secure_aggregation: bool = True
    min_cohort: int = 2
    fractional_bits: int = SecureAggregation.fractional_bits
    protect_small_cohorts: bool = True
    masking_degree: Optional[int] = None
    min_noise_multiplier: float = 0.0
    honest_clients: Optional[int] = None
    max_rounds: Optional[int] = None
    budget: Optional[Tuple[float, float]] = None
    ledger: Optional[str] = None
    max_colluders: Optional[int] = None
    trust_server_noise: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.protect_small_cohorts, bool):
            raise TypeError("ClientPolicy: protect_small_cohorts must be a bool")
        if not isinstance(self.trust_server_noise, bool):
            raise TypeError("ClientPolicy: trust_server_noise must be a bool")
        if not isinstance(self.secure_aggregation, bool):
            raise TypeError(
                f"ClientPolicy: secure_aggregation must be a bool, got {type(self.secure_aggregation).__name__}"
            )
        if isinstance(self.min_cohort, bool) or not isinstance(self.min_cohort, int) or self.min_cohort < 2:
            raise ValueError(f"ClientPolicy: min_cohort must be an int ≥ 2, got {self.min_cohort!r}")
        bits = self.fractional_bits
        if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 62:
            raise ValueError(f"ClientPolicy: fractional_bits must be an int in [1, 62], got {bits!r}")
        degree = self.masking_degree
        if degree is not None and (isinstance(degree, bool) or not isinstance(degree, int) or degree < 2):
            raise ValueError(f"ClientPolicy: masking_degree must be an int ≥ 2 or None, got {degree!r}")
        floor = self.min_noise_multiplier
        if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not 0.0 <= floor < float("inf"):
            raise ValueError(f"ClientPolicy: min_noise_multiplier must be a finite number ≥ 0, got {floor!r}")
        object.__setattr__(self, "min_noise_multiplier", float(floor))
        honest = self.honest_clients
        if honest is not None and (isinstance(honest, bool) or not isinstance(honest, int) or honest < 1):
            raise ValueError(f"ClientPolicy: honest_clients must be an int ≥ 1 or None, got {honest!r}")
        cap = self.max_rounds
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise ValueError(f"ClientPolicy: max_rounds must be an int ≥ 1 or None, got {cap!r}")
        colluders = self.max_colluders
        if colluders is not None and (isinstance(colluders, bool) or not isinstance(colluders, int) or colluders < 0):
            raise ValueError(f"ClientPolicy: max_colluders must be an int ≥ 0 or None, got {colluders!r}")
        budget = self.budget
        if budget is not None:
            if not isinstance(budget, (tuple, list)) or len(budget) != 2:
                raise ValueError(f"ClientPolicy: budget must be (epsilon, delta) or None, got {budget!r}")
            if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in budget):
                raise TypeError(f"ClientPolicy: budget must hold two numbers, got {budget!r}")
            epsilon, delta = float(budget[0]), float(budget[1])
            if not (math.isfinite(epsilon) and epsilon > 0 and 0 < delta < 1):
                raise ValueError(f"ClientPolicy: budget needs 0 < epsilon < inf and 0 < delta < 1, got {budget!r}")
            object.__setattr__(self, "budget", (epsilon, delta))
        if self.ledger is not None:
            if not isinstance(self.ledger, (str, os.PathLike)) or not os.fspath(self.ledger):
                raise TypeError(f"ClientPolicy: ledger must be a path or None, got {self.ledger!r}")
            if budget is None:
                raise ValueError("ClientPolicy: a ledger needs a budget (budget=(epsilon, delta))")
            object.__setattr__(self, "ledger", os.path.abspath(os.path.expanduser(os.fspath(self.ledger))))

    @classmethod
    def matching(cls, protection: Protection) -> "ClientPolicy":
        """The policy of an in-process client of a run with ``protection``: it requires what the run asks."""
        secure = protection.secure
        return cls(
            secure_aggregation=secure is not None,
            min_cohort=secure.min_cohort if secure is not None else 2,
            fractional_bits=secure.fractional_bits if secure is not None else SecureAggregation.fractional_bits,
            protect_small_cohorts=secure is not None,
            masking_degree=secure.degree if secure is not None else None,
            min_noise_multiplier=protection.distributed.noise_multiplier if protection.distributed is not None else 0.0,
            honest_clients=protection.distributed.honest_clients if protection.distributed is not None else None,
            trust_server_noise=protection.dp is not None and protection.distributed is None,
        )

    @classmethod
    def from_node_config(cls, config: Mapping[str, Any]) -> "ClientPolicy":
        """A Flower SuperNode's policy from its node config; each key's default when absent:

        * ``secure-aggregation`` (bool, true): :attr:`secure_aggregation`;
        * ``min-cohort`` (int ≥ 2, 2): :attr:`min_cohort`;
        * ``fractional-bits`` (int in [1, 62], 32): :attr:`fractional_bits`;
        * ``protect-small-cohorts`` (bool, true): :attr:`protect_small_cohorts`;
        * ``masking-degree`` (int, 0 for the protocol's default, else ≥ 2; 0): :attr:`masking_degree`;
        * ``min-noise-multiplier`` (number ≥ 0, 0: no DP floor): :attr:`min_noise_multiplier`;
        * ``honest-clients`` (int, 0 for any; 0): :attr:`honest_clients`;
        * ``max-rounds`` (int ≥ 1, :data:`DEFAULT_MAX_ROUNDS`): :attr:`max_rounds`;
        * ``max-colluders`` (int ≥ 0; absent: the protocol's default c): :attr:`max_colluders`;
        * ``trust-server-noise`` (bool, false): :attr:`trust_server_noise`;
        * ``dp-budget-epsilon`` and ``dp-budget-delta`` (numbers, both or neither; no budget): :attr:`budget`;
        * ``dp-ledger`` (a path, required with a budget, since a Flower ClientApp restarts for each message and its
          spend must outlive the run): :attr:`ledger`.

        Every value is parsed strictly (a bool or exactly ``"true"``/``"false"``; an integer or a string of one in
        base 10; a number or a string of one): ``"yes"``, ``"1"``, ``"on"`` or ``"True "`` for a bool, ``"abc"``,
        ``"1.5"``, ``"yes"`` or ``true`` for an int, is a ``ValueError`` naming the key and the value, never a silent
        default. :meth:`to_node_config` writes a policy back.

        :raises ValueError, TypeError: a malformed value (naming the node-config key) or an invalid policy.
        """
        budget: Optional[Tuple[float, float]] = None
        given = [k for k in ("dp-budget-epsilon", "dp-budget-delta") if k in config]
        if len(given) == 1:
            missing = ({"dp-budget-epsilon", "dp-budget-delta"} - set(given)).pop()
            raise ValueError(f"node config {given[0]} needs {missing} too (a DP budget is an (epsilon, delta) pair)")
        if given:
            budget = (
                parse_number(config["dp-budget-epsilon"], "node config dp-budget-epsilon"),
                parse_number(config["dp-budget-delta"], "node config dp-budget-delta"),
            )
            if not (budget[0] > 0 and 0 < budget[1] < 1):
                raise ValueError(
                    f"node config dp-budget-epsilon must be > 0 and dp-budget-delta in (0, 1), got {budget}"
                )
        ledger = config.get("dp-ledger")
        if ledger is not None and (not isinstance(ledger, str) or not ledger.strip() or ledger != ledger.strip()):
            raise ValueError(f"node config dp-ledger must be a path (a non-empty string), got {ledger!r}")
        if budget is not None and ledger is None:
            raise ValueError(
                "node config dp-budget-epsilon needs dp-ledger: a Flower party's spend lives in its ledger file, "
                "made once with `gpflow-fed flower ledger create PATH`"
            )
        if ledger is not None and budget is None:
            raise ValueError("node config dp-ledger needs dp-budget-epsilon and dp-budget-delta")
        colluders = config.get("max-colluders")  # absent: the protocol's default c (0 is a bound: no colluders)
        return cls(
            secure_aggregation=parse_boolean(config.get("secure-aggregation", True), "node config secure-aggregation"),
            min_cohort=parse_integer(config.get("min-cohort", 2), "node config min-cohort", 2),
            fractional_bits=parse_integer(
                config.get("fractional-bits", SecureAggregation.fractional_bits), "node config fractional-bits", 1
            ),
            protect_small_cohorts=parse_boolean(
                config.get("protect-small-cohorts", True), "node config protect-small-cohorts"
            ),
            masking_degree=parse_integer(config.get("masking-degree", 0), "node config masking-degree", 0) or None,
            min_noise_multiplier=parse_number(
                config.get("min-noise-multiplier", 0.0), "node config min-noise-multiplier"
            ),
            honest_clients=parse_integer(config.get("honest-clients", 0), "node config honest-clients", 0) or None,
            max_rounds=parse_integer(config.get("max-rounds", DEFAULT_MAX_ROUNDS), "node config max-rounds", 1),
            budget=budget,
            ledger=ledger,
            max_colluders=None if colluders is None else parse_integer(colluders, "node config max-colluders", 0),
            trust_server_noise=parse_boolean(config.get("trust-server-noise", False), "node config trust-server-noise"),
        )

    def to_node_config(self) -> Dict[str, Any]:
        """This policy as a Flower node config (:meth:`from_node_config`'s keys), each value a TOML bool, int, float
        or str: ``from_node_config(policy.to_node_config()) == policy`` for every policy with ``max_rounds`` set.

        A default is written as :meth:`from_node_config` reads it (``masking-degree`` and ``honest-clients`` 0 for
        None); ``max-colluders`` and the budget's keys only when set. ``max_rounds=None`` (an in-process party's: its
        algorithm's own count) has no node-config spelling, so ``max-rounds`` is left out and a Flower party reading
        the config caps at :data:`DEFAULT_MAX_ROUNDS`.

        :raises ValueError: a budget without a ledger (a Flower party keeps its spend in its ledger file, and
            :meth:`from_node_config` refuses a budget without ``dp-ledger``).
        """
        if self.budget is not None and self.ledger is None:
            raise ValueError(
                "ClientPolicy.to_node_config: a budget needs a ledger in a node config (a Flower party's spend lives "
                "in its ledger file); give ledger="
            )
        config: Dict[str, Any] = {
            "secure-aggregation": self.secure_aggregation,
            "min-cohort": self.min_cohort,
            "fractional-bits": self.fractional_bits,
            "protect-small-cohorts": self.protect_small_cohorts,
            "masking-degree": self.masking_degree or 0,
            "min-noise-multiplier": self.min_noise_multiplier,
            "honest-clients": self.honest_clients or 0,
            "trust-server-noise": self.trust_server_noise,
        }
        if self.max_rounds is not None:
            config["max-rounds"] = self.max_rounds
        if self.max_colluders is not None:
            config["max-colluders"] = self.max_colluders
        if self.budget is not None:
            config["dp-budget-epsilon"], config["dp-budget-delta"] = self.budget
        if self.ledger is not None:
            config["dp-ledger"] = self.ledger
        return config

    def refusal(self, request: Protection, phase: str, aggregation: str) -> str:
        """Why this client refuses to answer ``phase`` under ``request``, or ``""`` when it may.

        A plain answer to a ``"sum"``/``"mean"`` phase is refused when the policy requires secure aggregation; an
        answer below its DP floor (no DP, or a smaller noise multiplier) or under distributed DP that assumes more
        honest clients than it does is refused too.
        """
        if aggregation not in ("sum", "mean"):
            return ""
        if self.secure_aggregation and request.secure is None:
            return (
                f"phase {phase!r}: this client's policy requires secure aggregation, but the server asked for its "
                "payload in plain; refused (nothing of the payload was sent)"
            )
        if self.budget is not None and not (request.distributed is not None and request.noised(phase, aggregation)):
            epsilon, delta = self.budget
            kind = "central DP (noise the server adds)" if request.dp is not None else "no DP"
            return (
                f"phase {phase!r}: this client has a DP budget (ε = {epsilon:g} at δ = {delta:g}), which only "
                f"distributed DP (its own noise share) lets it keep; the request has {kind}; refused"
            )
        noise = request.client_noise(phase, aggregation)  # central DP's noise is the server's: none of its own
        if noise < self.min_noise_multiplier:
            return (
                f"phase {phase!r}: this client's policy requires DP noise multiplier ≥ {self.min_noise_multiplier:g}, "
                f"the request has {noise:g}; refused"
            )
        assumed = request.distributed.honest_clients if request.distributed is not None else 0
        if self.honest_clients is not None and assumed > self.honest_clients:
            return (
                f"phase {phase!r}: the request assumes {assumed} honest clients, this client at most "
                f"{self.honest_clients} (each client's noise share would be too small); refused"
            )
        return ""
