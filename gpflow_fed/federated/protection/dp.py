"""Client-level differential privacy of summed messages: clipping, the Gaussian mechanism, the accountant.

Mechanism (DP-FedAvg, McMahan et al., "Learning Differentially Private Recurrent Language Models", ICLR
2018, Algorithm 1 with the fixed-denominator estimator): each client clips its whole payload ``a_k`` (all
arrays of the phase, as one vector) to L2 norm ``C``,

    ā_k = a_k · min(1, C / ‖a_k‖₂),

and the server adds Gaussian noise to the sum: ``Σ_k ā_k + N(0, (z C)² I)`` for ``"sum"`` phases, and
``(Σ_k w̄_k ā_k + N(0, (z B C)² I)) / Σ_k w̄_k`` with weights capped at ``B``, ``w̄_k = min(w_k, B)``, for
``"mean"`` phases. The weights are public (they are client sizes, which the server already knows from
``FederationInfo``); ``z`` is the noise multiplier.

Accounting: neighbouring federations differ in one client's entire data (*replace one client*; the number
of clients K is public). Replacing one client moves a clipped sum by at most ``2C`` (``2BC``), so each
release is a Gaussian mechanism with noise multiplier ``z / 2`` relative to its sensitivity. A round that
samples m of K clients without replacement and releases P sums of the same sample is one
``SampledWithoutReplacementDpEvent(K, m, P × Gaussian(z/2))`` (Wang, Balle & Kasiviswanathan, AISTATS
2019, Thm. 27); a release with every client is ``Gaussian(z/2)``. Rounds compose; ``dp_accounting``'s RDP
accountant (or, without sampling, its PLD accountant) converts the composition to (ε, δ).
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ...randomness import check_insecure_seed
from ...validation import positive_float

if TYPE_CHECKING:  # imported where an accountant is made: a client answering a stage loads no SciPy for it
    import dp_accounting

__all__ = [
    "ACCOUNTANTS",
    "DPUtilityWarning",
    "DifferentialPrivacy",
    "PrivacyAccountant",
    "clip_payload",
    "utility_warning",
]

ACCOUNTANTS = ("rdp", "pld")


def clip_payload(arrays: Mapping[str, np.ndarray], clip_norm: float) -> Tuple[Dict[str, np.ndarray], float]:
    """Scale every array by ``min(1, C / ‖a‖₂)``, ``‖a‖₂`` the L2 norm of all arrays together.

    :param arrays: a client's payload for one phase.
    :param clip_norm: C > 0.
    :return: the clipped arrays and the norm before clipping.
    """
    if not clip_norm > 0:
        raise ValueError(f"clip_norm must be positive, got {clip_norm!r}")
    norm = float(math.sqrt(sum(float(np.sum(np.square(np.asarray(a, dtype=np.float64)))) for a in arrays.values())))
    factor = min(1.0, clip_norm / norm) if norm > 0 else 1.0
    return {k: np.asarray(a, dtype=np.float64) * factor for k, a in arrays.items()}, norm


@dataclass(frozen=True)
class DifferentialPrivacy:
    """Client-level (ε, δ)-DP of every protected sum (module docstring for the mechanism and accounting).

    :param noise_multiplier: z > 0; the noise std is ``z C`` on a sum (``z B C`` on a weighted sum).
    :param clip_norm: C > 0, the bound on the L2 norm of each client's payload in a phase.
    :param delta: δ ∈ (0, 1) at which ε is reported.
    :param weight_bound: B > 0, the cap on a message's weight in ``"mean"`` phases (1 gives each client the
        same weight; e.g. ``max N_k`` keeps FedAvg's size weights).
    :param accountant: ``"rdp"`` (any sampling) or ``"pld"`` (tighter, only when every client takes part).
    :param phases: the phases whose sums are clipped and noised (e.g. ``("predict",)`` for FSGP's final
        statistics only); None: every ``"sum"``/``"mean"`` phase. Only these releases are accounted.
    :param insecure_noise_seed: **for tests only.** The Gaussian noise and the DP client sampling are drawn
        from the operating system's randomness (``secrets``), never from the run's seed, which is public.
        With this seed they are derived from it instead, so a private run can be reproduced (e.g. to compare
        runtimes); anyone who knows it can regenerate and subtract the noise, so the reported (ε, δ) then
        holds against no one who knows the seed. There is no default and no CLI option for it.
    """

    noise_multiplier: float
    clip_norm: float
    delta: float = 1e-5
    weight_bound: float = 1.0
    accountant: str = "rdp"
    phases: Optional[Tuple[str, ...]] = None
    insecure_noise_seed: Optional[int] = None

    def __post_init__(self) -> None:
        for name in ("noise_multiplier", "clip_norm", "delta", "weight_bound"):
            positive_float(getattr(self, name), f"DifferentialPrivacy: {name}")
        if not self.delta < 1:
            raise ValueError(f"DifferentialPrivacy: delta must lie in (0, 1), got {self.delta!r}")
        if self.accountant not in ACCOUNTANTS:
            raise ValueError(f"DifferentialPrivacy: accountant must be one of {ACCOUNTANTS}, got {self.accountant!r}")
        if self.phases is not None:
            if isinstance(self.phases, str) or not all(isinstance(p, str) for p in self.phases) or not self.phases:
                raise TypeError(
                    f"DifferentialPrivacy: phases must be a non-empty tuple of phase names, got {self.phases!r}"
                )
            object.__setattr__(self, "phases", tuple(self.phases))
        check_insecure_seed(self.insecure_noise_seed, "DifferentialPrivacy: insecure_noise_seed")

    @classmethod
    def for_target(
        cls,
        epsilon: float,
        delta: float = 1e-5,
        *,
        clip_norm: float,
        num_clients: int,
        rounds: int,
        clients_per_round: Optional[int] = None,
        sums_per_round: int = 1,
        final_sums: int = 0,
        tolerance: float = 1e-3,
        **options: Any,
    ) -> "DifferentialPrivacy":
        """The mechanism with the smallest noise multiplier z whose run spends at most ``epsilon`` at ``delta``.

        The run's releases are described as the accountant records them (module docstring): ``rounds`` rounds,
        each ``sums_per_round`` noised sums over ``clients_per_round`` (m) of ``num_clients`` (K) sampled without
        replacement, then ``final_sums`` sums over all K (e.g. FSGP fedavg: ``rounds=R``, ``clients_per_round=
        max(⌈Kρ⌉, 1)``, ``final_sums=1`` for the ``"predict"`` statistics; with ``phases=("predict",)``:
        ``rounds=0, final_sums=1``). z is found by bisection on the :class:`PrivacyAccountant`'s ε(z), which
        decreases in z, to relative precision ``tolerance``; ``result.privacy["epsilon"]`` of that run is then
        at most ``epsilon``.

        :param epsilon: target ε > 0; :param delta: δ ∈ (0, 1).
        :param clip_norm: C (as in the constructor; calibration does not depend on it).
        :param options: the constructor's other keywords (``weight_bound``, ``accountant``, ``phases``…).
        :raises ValueError: inconsistent counts, no release at all, or a target no z in [1e-3, 1e4] reaches.
        """
        K = int(num_clients)
        m = K if clients_per_round is None else int(clients_per_round)
        if K < 1 or not 1 <= m <= K or rounds < 0 or sums_per_round < 0 or final_sums < 0:
            raise ValueError(
                f"for_target: need 1 ≤ clients_per_round ({m}) ≤ num_clients ({K}) and non-negative "
                f"rounds ({rounds}), sums_per_round ({sums_per_round}), final_sums ({final_sums})"
            )
        releases = [(K, m, int(sums_per_round))] * (int(rounds) if sums_per_round else 0)
        releases += [(K, K, int(final_sums))] if final_sums else []
        if not releases:
            raise ValueError("for_target: the described run releases nothing; give rounds and/or final_sums")
        if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0):
            raise ValueError(f"for_target: epsilon must be positive and finite, got {epsilon!r}")

        def spent(z: float) -> float:
            accountant = PrivacyAccountant(cls(z, clip_norm, delta, **options))
            accountant.restore(releases)
            return accountant.epsilon()

        # Bracket [low, high] by halving/doubling from z = 1, so ε(z) is never evaluated far below the target's
        # z: the PLD accountant's memory grows with ε(z) (at z = 1e-3 it would need hundreds of GiB).
        smallest, largest = 1e-3, 1e4
        high = 1.0
        while spent(high) > epsilon:
            if high >= largest:
                raise ValueError(
                    f"for_target: ε = {epsilon} at δ = {delta} is out of reach for these releases (even "
                    f"z = {largest:g} spends {spent(largest):.3g}); allow a larger ε or fewer releases"
                )
            high = min(2.0 * high, largest)
        low = high / 2.0
        while spent(low) <= epsilon:
            high = low
            if high <= smallest:
                return cls(smallest, clip_norm, delta, **options)
            low = max(low / 2.0, smallest)
        while high / low > 1 + tolerance:
            mid = math.sqrt(low * high)
            low, high = (low, mid) if spent(mid) <= epsilon else (mid, high)
        return cls(high, clip_norm, delta, **options)

    def applies(self, phase: str) -> bool:
        """Whether ``phase``'s sums are clipped and noised."""
        return self.phases is None or phase in self.phases

    def noise_std(self, aggregation: str) -> float:
        """``z C`` for a ``"sum"`` phase, ``z B C`` for a ``"mean"`` phase (before dividing by Σ w̄_k)."""
        scale = self.weight_bound if aggregation == "mean" else 1.0
        return float(self.noise_multiplier * self.clip_norm * scale)


class DPUtilityWarning(UserWarning):
    """Clipping or noise swamps the signal of a differentially private sum (see :func:`utility_warning`)."""


#: threshold of :func:`utility_warning`: estimated noise larger than the clipped sum.
NOISE_TO_SIGNAL_WARNING = 1.0


def utility_warning(phase: str, noised_sum: Mapping[str, np.ndarray], noise_std: float) -> Optional[str]:
    """A warning text when a release is mostly noise, else None; computed from the *noised* sum only.

    The noise-to-signal ratio is estimated as ``σ √d / √max(‖s̃‖² − σ² d, 0)`` from the released ``s̃`` (d numbers,
    ``E‖s̃‖² = ‖s‖² + σ² d``): post-processing of the release, so it costs no privacy and the warning (which ends
    up in logs) reveals nothing the (ε, δ) does not cover. For the same reason the number of clipped clients is
    not reported: whether a client's payload exceeded C is a fact about its data.
    """
    d = sum(int(np.size(v)) for v in noised_sum.values())
    energy = sum(float(np.sum(np.square(v))) for v in noised_sum.values())
    signal = math.sqrt(max(energy - noise_std**2 * d, 0.0))
    ratio = noise_std * math.sqrt(d) / signal if signal > 0 else math.inf
    if ratio <= NOISE_TO_SIGNAL_WARNING:
        return None
    return (
        f"DP phase {phase!r}: estimated noise-to-signal ratio {ratio:.3g} (from the noised release); the "
        "released sums are mostly noise — check that clip_norm is not far below the payloads' norms, lower the "
        "noise (a larger ε via DifferentialPrivacy.for_target), or add clients"
    )


def release_event(noise_multiplier: float, num_clients: int, sample_size: int, num_sums: int) -> dp_accounting.DpEvent:
    """One round's releases as a ``dp_accounting`` event: P Gaussians(z/2) over a sample of m of K."""
    import dp_accounting

    gaussian = dp_accounting.GaussianDpEvent(noise_multiplier / 2.0)  # sensitivity 2C: replace one
    inner = dp_accounting.SelfComposedDpEvent(gaussian, num_sums) if num_sums > 1 else gaussian
    if sample_size < num_clients:
        inner = dp_accounting.SampledWithoutReplacementDpEvent(num_clients, sample_size, inner)
    return inner


@functools.lru_cache(maxsize=1024)
def _release_rdp(noise_multiplier: float, num_clients: int, sample_size: int, num_sums: int, count: int) -> np.ndarray:
    """The RDP curve (at ``dp_accounting``'s default orders) of ``count`` rounds of :func:`release_event`, as its
    ``RdpAccountant`` composes them, computed once per process: sampling without replacement costs ≈ 0.2 s a curve
    (Wang et al.'s bound, order by order), which a run would otherwise pay every round. Read-only."""
    import dp_accounting

    accountant = dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    accountant.compose(release_event(noise_multiplier, num_clients, sample_size, num_sums), count)
    curve = accountant.rdp
    curve.flags.writeable = False
    return curve


class PrivacyAccountant:
    """Composes the releases of a run and reports the spent (ε, δ) with ``dp_accounting``.

    RDP composes by adding the releases' curves (each computed once, :func:`_release_rdp`; the sums are
    ``RdpAccountant``'s own, to the last bit); PLD by ``dp_accounting``'s ``PLDAccountant``.

    :param dp: the mechanism's settings.
    """

    def __init__(self, dp: DifferentialPrivacy) -> None:
        self.dp = dp
        self._releases: List[Tuple[int, int, int]] = []
        self._compose_from_zero()

    def _compose_from_zero(self) -> None:
        import dp_accounting

        self._rdp: Optional[np.ndarray] = None
        self._pld: Optional[dp_accounting.pld.PLDAccountant] = None
        if self.dp.accountant == "rdp":
            self._rdp = np.zeros(len(dp_accounting.rdp.rdp_privacy_accountant.DEFAULT_RDP_ORDERS))
        else:
            # Without sampling, replacing one client is a Gaussian mechanism with sensitivity 2C: its privacy loss
            # distribution equals add/remove's at noise multiplier z / 2 (the same dominating pair).
            self._pld = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)

    def _compose(self, release: Tuple[int, int, int], count: int) -> None:
        if self._rdp is not None:
            self._rdp = self._rdp + _release_rdp(self.dp.noise_multiplier, *release, count)
        else:
            assert self._pld is not None
            self._pld.compose(release_event(self.dp.noise_multiplier, *release), count)

    @property
    def releases(self) -> Tuple[Tuple[int, int, int], ...]:
        """``(K, m, P)`` per recorded exchange group: P sums over the same m of K clients."""
        return tuple(self._releases)

    def record(self, num_clients: int, sample_size: int, num_sums: int) -> None:
        """Record ``num_sums`` noised sums over one sample of ``sample_size`` of ``num_clients`` clients.

        :raises ValueError: sizes out of range, or sampling with the PLD accountant.
        """
        if not 1 <= sample_size <= num_clients or num_sums < 0:
            raise ValueError(f"invalid release: {sample_size} of {num_clients} clients, {num_sums} sums")
        if sample_size < num_clients and self.dp.accountant == "pld":
            raise ValueError(
                "the PLD accountant does not support sampling clients without replacement; "
                "use DifferentialPrivacy(accountant='rdp') or client_fraction=1"
            )
        if num_sums:
            release = (int(num_clients), int(sample_size), int(num_sums))
            self._releases.append(release)
            self._compose(release, 1)

    def restore(self, releases: Sequence[Sequence[int]]) -> None:
        """Replace the recorded releases (used when resuming from a checkpoint)."""
        self._releases = [tuple(int(v) for v in r) for r in releases]  # type: ignore[misc]  # (K, m, P) triples: unpacked below
        self._compose_from_zero()
        for release, count in Counter(self._releases).items():
            self._compose(release, count)

    def after(self, earlier: "PrivacyAccountant") -> "PrivacyAccountant":
        """A new accountant of ``earlier``'s releases and then this one's: two runs on the same data compose (e.g.
        the moments and the training of :func:`gpflow_fed.fit`).

        :raises ValueError: ``earlier`` used other DP settings (its releases would be composed at the wrong noise).
        """
        if not isinstance(earlier, PrivacyAccountant) or earlier.dp != self.dp:
            raise ValueError("only releases under the same DifferentialPrivacy settings compose in one accountant")
        composed = PrivacyAccountant(self.dp)
        composed.restore([*earlier.releases, *self.releases])
        return composed

    def epsilon(self) -> float:
        """ε spent so far at the configured δ (0 before any release)."""
        import dp_accounting

        if not self._releases:
            return 0.0
        if self._rdp is not None:
            orders = dp_accounting.rdp.rdp_privacy_accountant.DEFAULT_RDP_ORDERS
            return float(dp_accounting.rdp.compute_epsilon(orders, self._rdp, self.dp.delta)[0])
        assert self._pld is not None
        return float(self._pld.get_epsilon(self.dp.delta))

    def report(self) -> Dict[str, object]:
        """What a run exposes as ``result.privacy``."""
        return {
            "epsilon": self.epsilon(),
            "delta": self.dp.delta,
            "noise_multiplier": self.dp.noise_multiplier,
            "clip_norm": self.dp.clip_norm,
            "weight_bound": self.dp.weight_bound,
            "accountant": self.dp.accountant,
            "neighbouring": "replace one client's data (K public)",
            "releases": int(sum(P for _, _, P in self._releases)),
        }
