"""Distributed differential privacy: each client adds its share of discrete Gaussian noise before masking.

Mechanism: the distributed discrete Gaussian (DDG) of Kairouz, Liu & Steinke, "The Distributed Discrete Gaussian
Mechanism for Federated Learning with Secure Aggregation", ICML 2021, arXiv:2102.06387 (KLS21), without their
random rotation and modular clipping (the sum here lives in ``Z_{2^64}``, the ring of
:mod:`~gpflow_fed.federated.protection.masking`, and every message is kept within the range of a 64-bit sum
instead). Client ``k`` with payload ``x_k ∈ R^d`` (all arrays of a phase, flattened) sends, under secure aggregation,

1. **clip**: ``x̄_k = x_k · min(1, c' / ‖x_k‖₂)`` (:func:`~gpflow_fed.federated.protection.dp.clip_payload`),
   ``c' = c (1 − 2^-36)`` so that float round-off never takes ‖x̄_k‖₂ past c (``_CLIP_MARGIN``);
2. **scale**: ``v_k = x̄_k / γ``, γ the granularity of the integer grid (``‖v_k‖₂ ≤ c/γ``);
3. **conditional randomized rounding** (KLS21 §4, their Algorithm 1's rounding step): each coordinate is
   rounded to ``⌊v⌋ + Bernoulli(v − ⌊v⌋)`` (unbiased), and the whole vector is rounded again until

       ‖ṽ_k‖₂² ≤ Δ̃²,   Δ̃² = min{ (c/γ + √d)²,  c²/γ² + d/4 + √(2 log(1/β)) · (c/γ + √d/2) }     (R)

   (:func:`rounded_norm_bound`). The first term holds for every rounding (each coordinate moves by < 1);
   the second holds for one randomized rounding with probability ≥ 1 − β (KLS21's bound on the rounded
   norm), so the loop ends after at most ``1/(1 − β)`` tries on average; β ≤ 0.99 (:data:`MAX_BETA`: β is the
   server's choice, and 10,000 failed tries, which depend on the payload, then have probability < 3e-44; the
   encoder answers one anyway with its generic data refusal and stops). The condition is checked exactly, in
   integers, so ``‖ṽ_k‖₂ ≤ Δ̃`` holds **always**, whatever the payload: that, not the clipping, is the
   sensitivity the accounting uses. The conditioning pulls ṽ slightly towards 0 (by well under one grid step
   per coordinate; tested), negligible next to the noise;
4. **noise share**: ``y_k = ṽ_k + ξ_k``, ``ξ_k ~ N_Z(0, σ²)^d`` i.i.d. discrete Gaussian (pmf
   ``∝ exp(−x²/2σ²)`` on ``Z``), drawn by the exact sampler of Canonne, Kamath & Steinke, "The Discrete
   Gaussian for Differential Privacy", NeurIPS 2020, arXiv:2004.00010 (CKS20), Algorithms 1–3, in integer
   arithmetic (:func:`discrete_gaussian`), each draw truncated to ``[−T, T]``, ``T = ⌈13σ⌉`` (:meth:`DistributedDP.
   tail_bound`). So ``|y_k,i| ≤ ⌊Δ̃⌋ + T`` always, and a cohort of K, for which ``⌈Δ̃⌉ + T ≤ L = ⌊(2^63 − 1)/K⌋``
   is checked on public numbers before anything is drawn (:meth:`DistributedDP.check_range`), never wraps modulo
   2^64. No payload makes a client refuse: the clip bounds ‖x̄_k‖₂, the rounding bounds ‖ṽ_k‖₂ ≤ Δ̃ whatever x_k, and
   only the noise is truncated.

The server unmasks only ``Σ_k y_k`` and releases ``γ · Σ_k y_k`` (:meth:`DistributedDP.decode`).

**Sizing the shares.** With noise multiplier z and ``t`` = ``honest_clients``, each share has

    σ² ≥ (z Δ̃)² / t,   so that any t shares sum to variance t σ² ≥ (z Δ̃)²                              (S)

(a rational σ², rounded up, :meth:`DistributedDP.share_variance`): the noise of the release is at least the
target even if only ``t`` of the summed shares are secret from the adversary. Every client of the cohort
adds a share, so the release carries ``K/t`` times the target variance when all K are honest; t = K gives
the central mechanism's noise, at the price of no slack for colluders or drop-outs.

**Accounting** (:class:`DistributedPrivacyAccountant`). Neighbouring federations differ in one client's data
(*replace one client*, K public, as :mod:`~gpflow_fed.federated.protection.dp`), so two neighbouring sums
differ by ``ṽ_k − ṽ'_k`` with ``Δ₂ = 2Δ̃`` and ``Δ₁ = 2 min(√d Δ̃, Δ̃²)`` (an integer vector has
``‖u‖₁ ≤ ‖u‖₂²``). For the sum ``Z`` of n i.i.d. ``N_Z(0, σ²)^d`` vectors (σ ≥ 1/2) KLS21 (Theorem 1; the
three-term Rényi form below is their Proposition 14 / eq. (17), numbering of arXiv:2102.06387) bound, for
every order α ≥ 1,

    D_α(Z + Δ ‖ Z) ≤ min{ α Δ₂²/(2nσ²) + τ d,
                          (α/2) (Δ₂²/(nσ²) + 2 τ Δ₁/(√n σ) + τ² d),
                          (α/2) (Δ₂/(√n σ) + τ √d)² },
    τ = 10 Σ_{k=1}^{n−1} exp(−2π² σ² k/(k+1))                                                              (P)

(τ accounts for the sum of discrete Gaussians not being one; n = 1 gives τ = 0, CKS20's discrete Gaussian).
With α ≥ 1 the first term is at most ``α (Δ₂²/(2nσ²) + τ d)``, so one release is ρ-zCDP (Bun & Steinke,
TCC 2016, Def. 1.1) with

    ρ = min{ Δ₂²/(2nσ²) + τ d,  (Δ₂²/(nσ²) + 2 τ Δ₁/(√n σ) + τ² d)/2,  (Δ₂/(√n σ) + τ √d)²/2 },  n = t.  (Z)

(t shares suffice: more honest shares add independent noise, which is post-processing.) ρ adds over releases
(Bun & Steinke 2016, Lemma 2.3), and the total converts to (ε, δ)-DP by CKS20's conversion (arXiv:2004.00010v3,
p. 13; the one Steinke's reference code implements):

    ε = inf_{α > 1}  α ρ + log(1/δ)/(α − 1) + log(1 − 1/α) − log(α)/(α − 1)                                (C)

(:func:`zcdp_epsilon`), tighter than Bun & Steinke's ``ρ + 2√(ρ log(1/δ))``. dp-accounting 0.6 is not used
for the composition: its RDP accountant refuses a sampled ``ZCDpEvent`` and its PLD accountant does not
support one. **No sampling amplification is claimed**: the server chooses who is in a cohort, so every
release is charged in full to every client.

What is protected, and against whom:

* With secure aggregation, and if **at least t clients of every released sum follow the protocol** (draw their
  shares from the OS, keep them secret and do not drop out before the sum), each release, and everything
  computed from it, is (ε, δ)-DP under replace-one-client adjacency against **everyone**: the server,
  every other client and any coalition of them (colluders may subtract their own shares, which (S) allows for),
  as far as secure aggregation hides the individual messages (a computationally bounded server; see
  :mod:`~gpflow_fed.federated.protection.masking`).
* **Saturation and truncation** (the clients' range, :mod:`~gpflow_fed.federated.protection.wire`): no value of
  ``ṽ_k`` is ever clipped to the range (``|ṽ_k,i| ≤ ‖ṽ_k‖₂ ≤ Δ̃``, and the range holds ``Δ̃ + T``), so the sensitivity
  ``Δ₂ = 2Δ̃`` is the one above. Truncating a share's draw at T does not depend on the data; it changes the release
  only on the event that some draw of the K shares passes 13σ, of probability ``q ≤ K d · 2 e^{−84.5} < K d · 5e-37``
  (the discrete Gaussian is σ²-subgaussian, CKS20). The released pair (the sum, and the count of truncated draws each
  client adds to its masked payload) is then within total variation q of the untruncated mechanism with a constant
  count, so an (ε, δ) guarantee of the latter gives ``(ε, δ + (1 + e^ε) q)``: below ``δ + 1e-27 K d`` for ε ≤ 20,
  which the accountant does not add.
* **Not** protected: a sum with fewer than t honest shares (more colluders, sybils, or drop-outs leaving fewer
  than t honest survivors; with h < t honest shares the noise is ``h/t`` of the target variance, ρ about
  ``t/h`` times larger); messages sent **without** secure aggregation (each then carries only its own share:
  this module refuses nothing there and accounts nothing for it); releases the accountant is not told about
  (a client that answers more exchanges than recorded spends more than reported: the accountant needs only
  public numbers, so a client can run its own); timing of the rounding retries (local, not modelled).

Randomness: the noise and the rounding come from :class:`NoiseSource`: ``os.urandom`` read in 32 KiB blocks
as 64-bit words, turned into exactly uniform integers by rejection (no pseudo-random generator in between).
``NoiseSource(insecure_seed=...)`` (tests only) uses numpy's PCG64 from that seed instead; the mechanism has no
other seed, and nothing in it depends on a run's public seed.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable, Dict, List, NoReturn, Optional, Sequence, Tuple

import numpy as np

from ...randomness import check_insecure_seed
from ...validation import integer, positive_float
from .dp import clip_payload
from .wire import code_limit

__all__ = [
    "MAX_BETA",
    "DistributedDP",
    "DistributedPrivacyAccountant",
    "NoiseSource",
    "conditional_round",
    "discrete_gaussian",
    "release_rho",
    "rounded_norm_bound",
    "zcdp_epsilon",
]

#: a noise share's draw is truncated at TAIL_STDS · σ: P(|N_Z(0, σ²)| > 13σ) ≤ 2 e^{-84.5} ≈ 4e-37 per coordinate
#: (the discrete Gaussian is σ²-subgaussian, CKS20), so truncation changes a share only on such noise
TAIL_STDS = 13
#: the largest c/γ: the scaled payload keeps ≥ 1 bit below the integer grid in float64 (randomized rounding)
MAX_GRID_STEPS = 2.0**52
#: the default granularity puts the clip norm at 2^30 grid steps (rounding adds ≤ d/2^62 relative variance)
DEFAULT_GRID_STEPS = 2.0**30
_WORDS_PER_BLOCK = 4096
_SAFETY = 1e-12  # relative margin for float round-off in bounds (always in the conservative direction)
#: the largest β a client accepts (a request's ``ddp-beta`` above it is refused as malformed): a try of conditional
#: rounding fails with probability ≤ β (KLS21's bound, (R)), so one encoding's :data:`ROUNDING_TRIES` fail with
#: probability ≤ 0.99^10000 = e^{-100.5} < 3e-44, whatever the payload. Nearer 1 a server could pick β so that a
#: payload it targets fails (an oracle on the data); β's term in (R) is ``√(2 log(1/β)) (c/γ + √d/2)``, ≥ 0.14 (c/γ)
#: here, a relative change of Δ̃² below 2e-10 at the default granularity.
MAX_BETA = 0.99
#: tries of conditional rounding before :func:`conditional_round` gives up (``RuntimeError``)
ROUNDING_TRIES = 10_000
#: the rounding clips to ``c (1 − 2^-36)``: the float round-off of the clip and the scaling (a few 2^-53 relative)
#: never takes ‖v‖ past c/γ, and ``‖v‖² ≤ (c/γ)² (1 − 2^-35)`` stays below the ``Δ̃² (1 − 10^-12)`` the loop
#: compares with even at c/γ = 2^52, where β's term of (R) is smaller than 10^-12 Δ̃² (so (R)'s bound on a try's
#: failure holds at every granularity, up to float round-off; the payload moves by < 1.5e-11 c, below a default
#: grid step, 2^-30 c)
_CLIP_MARGIN = 2.0**-36


# --- randomness ---------------------------------------------------------------------------------------
class NoiseSource:
    """Uniform random integers for the noise and the rounding, from the operating system.

    Words are ``os.urandom`` bytes read in blocks of 4,096 64-bit words (a block read in a forked child after
    the fork is discarded, so parent and child never share one). ``below(n)`` is exactly uniform on
    ``{0, …, n−1}`` for any ``n ≥ 1`` (rejection on ``⌈log₂ n⌉`` bits), which the exact sampler needs.

    An instance is never pickled (``TypeError``) and copies share it: a copied buffer would repeat noise.

    :param insecure_seed: **tests only**: draw the words from numpy's PCG64 seeded with this integer, so that
        anyone who knows or guesses it can regenerate and subtract the noise. No default and no CLI option
        uses it.
    """

    __slots__ = ("_generator", "_pid", "_words")

    def __init__(self, insecure_seed: Optional[int] = None) -> None:
        seed = check_insecure_seed(insecure_seed, "NoiseSource: insecure_seed")
        self._generator = None if seed is None else np.random.PCG64(seed)
        self._pid = os.getpid()
        self._words: List[int] = []

    @property
    def secure(self) -> bool:
        """Whether the words come from the OS (False only with ``insecure_seed``)."""
        return self._generator is None

    def __repr__(self) -> str:
        return f"NoiseSource({'os.urandom' if self.secure else 'INSECURE test seed'})"

    def __reduce__(self) -> NoReturn:
        raise TypeError("NoiseSource holds unused random words, which must not be copied out; make a new one")

    def __copy__(self) -> "NoiseSource":
        return self

    def __deepcopy__(self, memo: Dict[int, object]) -> "NoiseSource":
        return self

    def words(self, count: int) -> np.ndarray:
        """``count`` uniform ``uint64`` words (fresh, not from the buffer that :meth:`below` uses)."""
        count = integer(count, "NoiseSource.words: count", minimum=0)
        if self._generator is not None:
            return self._generator.random_raw(count).astype(np.uint64, copy=False)
        return np.frombuffer(os.urandom(8 * count), dtype="<u8").astype(np.uint64, copy=False)

    def uniform(self, count: int) -> np.ndarray:
        """``count`` floats uniform on the grid ``{0, 2^-53, …, 1 − 2^-53}``."""
        return (self.words(count) >> np.uint64(11)).astype(np.float64) * 2.0**-53

    def _refill(self) -> None:
        self._words = self.words(_WORDS_PER_BLOCK).tolist()

    def check_fork(self) -> None:
        """Discard buffered words if this process is not the one that read them (after ``os.fork``)."""
        if os.getpid() != self._pid:
            self._pid = os.getpid()
            self._words = []

    def below(self, n: int) -> int:
        """A uniform integer in ``{0, …, n − 1}`` (``n ≥ 1``, any size), by rejection on ``⌈log₂ n⌉`` bits."""
        bits = (n - 1).bit_length()
        words = self._words
        if bits <= 64:  # one word (the common case, kept short: the sampler calls this ~15 times a draw)
            shift = 64 - bits
            while True:
                if not words:
                    self._refill()
                    words = self._words
                value = words.pop() >> shift
                if value < n:
                    return value
        count = -(-bits // 64)
        shift = 64 * count - bits
        while True:
            value = 0
            for _ in range(count):
                if not words:
                    self._refill()
                    words = self._words
                value = (value << 64) | words.pop()
            value >>= shift
            if value < n:
                return value


# --- the exact discrete Gaussian sampler (CKS20, Algorithms 1-3) --------------------------------------
def _bernoulli_exp_fraction(num: int, den: int, below: Callable[[int], int]) -> bool:
    """Bernoulli(exp(−γ)) for γ = num/den ∈ [0, 1] (CKS20 Algorithm 1, first case).

    K = 1; while Bernoulli(γ/K): K ← K + 1; return K odd. P(K > k) = γ^k / k!, so P(K odd) = Σ_j (−γ)^j / j!.
    """
    k = 1
    while below(den * k) < num:  # Bernoulli(num / (den k)) = Bernoulli(γ/k), exactly
        k += 1
    return k % 2 == 1


def _bernoulli_exp(num: int, den: int, below: Callable[[int], int]) -> bool:
    """Bernoulli(exp(−γ)) for γ = num/den ≥ 0 (CKS20 Algorithm 1): ⌊γ⌋ Bernoulli(e^{-1}), then the rest."""
    whole, num = divmod(num, den)
    for _ in range(whole):
        if not _bernoulli_exp_fraction(1, 1, below):
            return False
    return _bernoulli_exp_fraction(num, den, below)


def _discrete_laplace(t: int, below: Callable[[int], int]) -> int:
    """Y with P(Y = y) ∝ exp(−|y|/t) on Z, t a positive integer (CKS20 Algorithm 2 with s = 1).

    U uniform on {0..t−1} kept with probability exp(−U/t); V geometric with P(V = v) ∝ e^{−v}; X = U + tV has
    P(X = x) ∝ e^{−x/t}; a fair sign, rejecting −0 so that 0 is not counted twice.
    """
    while True:
        u = below(t)
        if not _bernoulli_exp_fraction(u, t, below):
            continue
        v = 0
        while _bernoulli_exp_fraction(1, 1, below):
            v += 1
        x = u + t * v
        negative = below(2)
        if negative and x == 0:
            continue
        return -x if negative else x


def discrete_gaussian(variance: Fraction, size: int, rng: NoiseSource) -> List[int]:
    """``size`` i.i.d. draws of ``N_Z(0, σ²)``, P(X = x) = exp(−x²/2σ²) / Σ_y exp(−y²/2σ²), exactly.

    CKS20 Algorithm 3: with t = ⌊σ⌋ + 1, draw Y from the discrete Laplace of scale t and keep it with
    probability ``exp(−(|Y| − σ²/t)² / (2σ²))``; the product of the two is ∝ exp(−Y²/2σ²). Every probability is a
    rational evaluated in integer arithmetic (σ² = p/q: the exponent is ``(|Y| q t − p)² / (2 p q t²)``), so the
    output distribution is the discrete Gaussian exactly, given uniform ``rng.below``. About 10–20 µs a draw.

    :param variance: σ² > 0, a rational (``Fraction`` or ``int``).
    :param size: the number of draws.
    :param rng: the randomness.
    :return: Python ints (unbounded; the caller range-checks them).
    """
    sigma2 = Fraction(variance)
    if not sigma2 > 0:
        raise ValueError(f"discrete_gaussian: the variance must be positive, got {variance!r}")
    if not isinstance(rng, NoiseSource):
        raise TypeError(f"discrete_gaussian: rng must be a NoiseSource, got {type(rng).__name__}")
    size = integer(size, "discrete_gaussian: size", minimum=0)
    rng.check_fork()
    p, q = sigma2.numerator, sigma2.denominator
    t = math.isqrt(p // q) + 1
    qt, den = q * t, 2 * p * q * t * t
    below = rng.below
    out: List[int] = []
    while len(out) < size:
        y = _discrete_laplace(t, below)
        a = abs(y) * qt - p
        if _bernoulli_exp(a * a, den, below):
            out.append(y)
    return out


# --- rounding -----------------------------------------------------------------------------------------
def rounded_norm_bound(grid_norm: float, dimension: int, beta: float) -> float:
    """Δ̃ of (R): the bound on ‖ṽ‖₂ that conditional randomized rounding enforces for ‖v‖₂ ≤ ``grid_norm``.

    ``min(c/γ + √d, √(c²/γ² + d/4 + √(2 log(1/β)) (c/γ + √d/2)))``, with ``grid_norm`` = c/γ; β = 0 keeps the
    first (deterministic) bound only.
    """
    d = integer(dimension, "rounded_norm_bound: dimension", minimum=1)
    if not (math.isfinite(grid_norm) and grid_norm > 0):
        raise ValueError(f"rounded_norm_bound: grid_norm must be positive and finite, got {grid_norm!r}")
    if not 0 <= beta < 1:
        raise ValueError(f"rounded_norm_bound: beta must lie in [0, 1), got {beta!r}")
    always = grid_norm + math.sqrt(d)
    if beta == 0:
        return always
    likely = grid_norm**2 + d / 4.0 + math.sqrt(2.0 * math.log(1.0 / beta)) * (grid_norm + math.sqrt(d) / 2.0)
    return min(always, math.sqrt(likely))


def _squared_norm(values: np.ndarray) -> int:
    """‖u‖₂² of an int64 vector, exactly (Python integers: no overflow)."""
    return sum(v * v for v in values.tolist())


def conditional_round(
    values: np.ndarray, bound_squared: int, rng: NoiseSource, max_tries: int = ROUNDING_TRIES
) -> np.ndarray:
    """Randomized rounding of ``values`` repeated until ``‖ṽ‖₂² ≤ bound_squared`` (KLS21 §4), as ``int64``.

    Each try rounds every coordinate to ``⌊v⌋ + Bernoulli(v − ⌊v⌋)`` (unbiased); the condition is exact in
    integers. With ``bound_squared ≥ Δ̃²`` of (R) at probability ≥ 1 − β, a try succeeds with probability
    ≥ 1 − β; ``max_tries`` failures (probability ≤ β^max_tries) raise ``RuntimeError``, whose text carries no
    value.

    :param values: the scaled payload v = x̄/γ (float64, |v| < 2^52 so that its fractional part is resolved).
    :param bound_squared: the integer bound on ‖ṽ‖₂².
    """
    v = np.asarray(values, dtype=np.float64).ravel()
    if v.size and not float(np.max(np.abs(v))) < MAX_GRID_STEPS:
        raise ValueError("conditional_round: |v| must be below 2^52 (a coarser granularity)")
    low = np.floor(v)
    frac = v - low
    base = low.astype(np.int64)
    for _ in range(max_tries):
        rounded = base + (rng.uniform(v.size) < frac).astype(np.int64)
        if _squared_norm(rounded) <= bound_squared:
            return rounded
    raise RuntimeError(f"conditional_round: no rounding within the norm bound in {max_tries} tries")


# --- the mechanism ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DistributedDP:
    """The distributed discrete Gaussian's settings (module docstring: mechanism (R), (S), accounting (Z), (C)).

    :param noise_multiplier: z > 0: any ``honest_clients`` shares of a sum carry noise of standard deviation
        ``z Δ̃`` grid steps (≈ ``z c`` in payload units), Δ̃ the rounded norm bound (R); as in
        :class:`~gpflow_fed.federated.protection.dp.DifferentialPrivacy`, z is relative to the per-client bound
        and the replace-one sensitivity is twice that.
    :param clip_norm: c > 0, the bound on the L2 norm of a client's whole payload in a phase.
    :param honest_clients: t ≥ 1, the number of clients of every summed cohort assumed to follow the protocol
        and survive to the sum; each share is sized by (S) for t. A client refuses cohorts smaller than t.
    :param delta: δ ∈ (0, 1) at which ε is reported.
    :param granularity: γ > 0, the integer grid's step in payload units; None: ``c / 2^30``. ``2^-f`` puts the
        messages on :class:`~gpflow_fed.federated.protection.masking.SecureAggregation`'s fixed-point grid with
        ``fractional_bits = f``. ``c/γ`` must be ≤ 2^52.
    :param beta: β ∈ [0, :data:`MAX_BETA`] of conditional rounding (R): a larger β gives a smaller Δ̃ and more
        retries (≤ 1/(1 − β) tries on average); 0 uses the deterministic bound ``c/γ + √d``. Default ``e^{-1/2}``
        (KLS21's choice). At most 0.99, so that the rounding's failure (which depends on the payload) has
        probability below 3e-44 (:data:`MAX_BETA`): β comes from the server's request.
    :raises ValueError: a setting out of range. :raises TypeError: a setting of the wrong type.
    """

    noise_multiplier: float
    clip_norm: float
    honest_clients: int
    delta: float = 1e-5
    granularity: Optional[float] = None
    beta: float = math.exp(-0.5)

    def __post_init__(self) -> None:
        for name in ("noise_multiplier", "clip_norm", "delta"):
            object.__setattr__(self, name, positive_float(getattr(self, name), f"DistributedDP: {name}"))
        object.__setattr__(
            self, "honest_clients", integer(self.honest_clients, "DistributedDP: honest_clients", minimum=1)
        )
        if not self.delta < 1:
            raise ValueError(f"DistributedDP: delta must lie in (0, 1), got {self.delta!r}")
        if self.granularity is not None:
            object.__setattr__(self, "granularity", positive_float(self.granularity, "DistributedDP: granularity"))
        beta = self.beta
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0 <= beta <= MAX_BETA:
            raise ValueError(f"DistributedDP: beta must be a number in [0, {MAX_BETA}], got {beta!r}")
        object.__setattr__(self, "beta", float(beta))
        if not self.grid_norm <= MAX_GRID_STEPS:
            raise ValueError(
                f"DistributedDP: clip_norm / granularity = {self.grid_norm:.3g} exceeds 2^52, below which float64 "
                "resolves the rounding; use a coarser granularity"
            )

    @property
    def step(self) -> float:
        """γ, the grid step (``granularity``, or ``c / 2^30``)."""
        return self.granularity if self.granularity is not None else self.clip_norm / DEFAULT_GRID_STEPS

    @property
    def grid_norm(self) -> float:
        """c/γ, the clip norm in grid steps."""
        return self.clip_norm / self.step

    def norm_bound(self, dimension: int) -> float:
        """Δ̃ of (R) for a payload of ``dimension`` numbers, in grid steps."""
        return rounded_norm_bound(self.grid_norm, dimension, self.beta)

    def _bound_squared(self, dimension: int) -> int:
        """The integer the rounding loop compares ‖ṽ‖₂² with: ⌊Δ̃² (1 − 10⁻¹²)⌋ ≤ Δ̃² despite float round-off."""
        return int(math.floor(self.norm_bound(dimension) ** 2 * (1.0 - _SAFETY)))

    def share_variance(self, dimension: int) -> Fraction:
        """σ² of one client's share by (S): ``(z Δ̃)²/t``, raised by 10⁻¹² and rounded up to a multiple of 2^-20 (to
        an integer from 2^20 on).

        :raises ValueError: σ < 1/2, outside KLS21's theorem (a larger noise multiplier or finer granularity).
        """
        target = (self.noise_multiplier * self.norm_bound(dimension)) ** 2 / self.honest_clients * (1.0 + _SAFETY)
        grid = 1 if target >= 2**20 else 2**20  # an integer σ² when that adds < 2^-20 relative (faster sampling)
        variance = Fraction(math.ceil(target * grid), grid)
        if variance < Fraction(1, 4):
            raise ValueError(
                f"DistributedDP: a share's σ² = {float(variance):.3g} grid steps² is below 1/4, where KLS21's bound "
                "does not hold; raise noise_multiplier or use a finer granularity"
            )
        return variance

    def noise_std(self, dimension: int) -> float:
        """``z Δ̃ γ``: the noise standard deviation of t honest shares in payload units (per coordinate)."""
        return self.noise_multiplier * self.norm_bound(dimension) * self.step

    def message_bound(self, cohort_size: int) -> int:
        """L = ⌊(2^63 − 1)/K⌋: the largest |value| one of K clients may send so that the sum never wraps
        (:func:`~gpflow_fed.federated.protection.wire.code_limit`)."""
        return code_limit(integer(cohort_size, "DistributedDP: cohort_size", minimum=1))

    def tail_bound(self, dimension: int) -> int:
        """T = ⌈13σ⌉ grid steps: where a share's draw is truncated (module docstring, step 4)."""
        return math.ceil(TAIL_STDS * math.sqrt(self.share_variance(dimension)))

    def check_range(self, dimension: int, cohort_size: int) -> None:
        """Raise unless ``⌈Δ̃⌉ + T ≤ L`` (public numbers only: the settings, the payload's size and the cohort's):
        then every message lies in ``[−L, L]``, whatever the payload and the noise."""
        bound = self.message_bound(cohort_size)
        need = math.ceil(self.norm_bound(dimension)) + self.tail_bound(dimension)
        if need > bound:
            raise ValueError(
                f"DistributedDP: a message of {dimension} numbers needs |value| ≤ {need:.3g} grid steps, beyond the "
                f"{bound:.3g} that a sum of {cohort_size} clients allows in 64 bits; use a coarser granularity "
                f"(now {self.step:.3g}) or smaller cohorts"
            )

    def encode(self, x: np.ndarray, cohort_size: int, rng: Optional[NoiseSource] = None) -> np.ndarray:
        """A client's message: clip, scale by 1/γ, conditional randomized rounding, plus its discrete Gaussian share
        (truncated at T): :meth:`encode_counted` without the count.

        The result (``int64``, the shape of ``x``) is what secure aggregation masks: ``.view(np.uint64)`` is
        :func:`~gpflow_fed.federated.protection.masking.mask`'s input. Send it only masked: alone, it carries
        one share of the noise.
        """
        return self.encode_counted(x, cohort_size, rng)[0]

    def encode_counted(
        self, x: np.ndarray, cohort_size: int, rng: Optional[NoiseSource] = None
    ) -> Tuple[np.ndarray, int]:
        """``(message, truncated)``: the message of :meth:`encode` and how many of its noise draws were truncated at
        ``±T`` (0 but with probability below 5e-37 a coordinate; it depends on the noise only, never on ``x``).

        :param x: the payload (real, finite), all arrays of the phase flattened into one vector.
        :param cohort_size: K, the number of clients whose messages are summed (the cohort the client verified).
        :param rng: the randomness; None: a new :class:`NoiseSource` from the OS.
        :raises ValueError: a non-finite or empty payload, a cohort below ``honest_clients``, or a range the 64-bit
            sum cannot hold for K (public numbers: the message names the fix and carries no payload value).
        :raises TypeError: a complex payload.
        """
        if np.iscomplexobj(x):
            raise TypeError("DistributedDP.encode: the payload is complex; send its real and imaginary parts")
        values = np.asarray(x, dtype=np.float64)
        if values.size == 0:
            raise ValueError("DistributedDP.encode: the payload is empty")
        if not np.all(np.isfinite(values)):
            raise ValueError("DistributedDP.encode: the payload has NaN or inf values")
        K = integer(cohort_size, "DistributedDP.encode: cohort_size", minimum=1)
        if K < self.honest_clients:
            raise ValueError(
                f"DistributedDP.encode: a cohort of {K} is below honest_clients = {self.honest_clients}, so its sum "
                "cannot carry the noise the accounting assumes; refused (sample more clients or lower honest_clients)"
            )
        d = int(values.size)
        self.check_range(d, K)
        rng = NoiseSource() if rng is None else rng
        if not isinstance(rng, NoiseSource):
            raise TypeError(f"DistributedDP.encode: rng must be a NoiseSource, got {type(rng).__name__}")
        clipped, _ = clip_payload({"x": values.ravel()}, self.clip_norm * (1.0 - _CLIP_MARGIN))
        rounded = conditional_round(clipped["x"] / self.step, self._bound_squared(d), rng)
        noise = discrete_gaussian(self.share_variance(d), d, rng)
        tail = self.tail_bound(d)
        truncated = sum(1 for n in noise if abs(n) > tail)
        message = [r + max(-tail, min(tail, n)) for r, n in zip(rounded.tolist(), noise)]  # |r| ≤ Δ̃: within ±L
        return np.array(message, dtype=np.int64).reshape(values.shape), truncated

    def decode(self, total: np.ndarray) -> np.ndarray:
        """The released sum in payload units: ``γ · Σ_k y_k``, the total (``int64``, or ``uint64`` modulo 2^64 as
        :func:`~gpflow_fed.federated.protection.masking.sum_masked` returns it) read as signed 64-bit."""
        array = np.asarray(total)
        if array.dtype == np.uint64:
            array = array.view(np.int64)
        elif array.dtype != np.int64:
            raise TypeError(f"DistributedDP.decode: the total must be int64 or uint64, got {array.dtype}")
        return array.astype(np.float64) * self.step

    @classmethod
    def for_target(
        cls,
        epsilon: float,
        delta: float,
        releases: Sequence[Tuple[int, int]],
        *,
        clip_norm: float,
        honest_clients: int,
        tolerance: float = 1e-3,
        **options: Any,
    ) -> "DistributedDP":
        """The mechanism with the smallest noise multiplier z whose releases spend at most ``epsilon`` at ``delta``.

        :param releases: ``(num_sums, dimension)`` pairs: that many noised sums of payloads of that size.
        :param options: the constructor's other keywords (``granularity``, ``beta``).
        :raises ValueError: no release, or a target that no z in [1e-3, 1e4] reaches.

        z is found by bisection on ε(z) (decreasing: σ grows and τ shrinks with z) to relative precision
        ``tolerance``; the accountant of the returned mechanism reports at most ``epsilon`` for these releases.
        """
        if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0):
            raise ValueError(f"DistributedDP.for_target: epsilon must be positive and finite, got {epsilon!r}")
        plan = [
            (integer(P, "for_target: num_sums", minimum=0), integer(d, "for_target: dimension", minimum=1))
            for P, d in releases
        ]
        if not any(P for P, _ in plan):
            raise ValueError("DistributedDP.for_target: the releases are empty; give (num_sums, dimension) pairs")

        def spent(z: float) -> float:
            ddp = cls(z, clip_norm, honest_clients, delta, **options)
            return zcdp_epsilon(sum(P * release_rho(ddp, d) for P, d in plan), delta)

        low, high = 1e-3, 1e4
        if spent(high) > epsilon:
            raise ValueError(
                f"DistributedDP.for_target: ε = {epsilon} at δ = {delta} is out of reach (z = {high:g} spends "
                f"{spent(high):.3g}); allow a larger ε or fewer releases"
            )
        if spent(low) <= epsilon:
            return cls(low, clip_norm, honest_clients, delta, **options)
        while high / low > 1 + tolerance:
            mid = math.sqrt(low * high)
            low, high = (low, mid) if spent(mid) <= epsilon else (mid, high)
        return cls(high, clip_norm, honest_clients, delta, **options)


# --- accounting ---------------------------------------------------------------------------------------
def release_rho(ddp: DistributedDP, dimension: int) -> float:
    """ρ of (Z) for one release of ``dimension`` numbers: n = t shares of σ² (S), Δ₂ = 2Δ̃, Δ₁ = 2 min(√d Δ̃, Δ̃²)."""
    d = integer(dimension, "release_rho: dimension", minimum=1)
    n = ddp.honest_clients
    bound = ddp.norm_bound(d) * (1.0 + _SAFETY)
    sigma2 = float(ddp.share_variance(d))
    l2 = 2.0 * bound
    l1 = 2.0 * min(math.sqrt(d) * bound, bound * bound)
    k = np.arange(1, n, dtype=np.float64)
    tau = 10.0 * float(np.sum(np.exp(-2.0 * math.pi**2 * sigma2 * k / (k + 1.0))))
    scale = math.sqrt(n * sigma2)
    return min(
        l2**2 / (2.0 * n * sigma2) + tau * d,
        0.5 * (l2**2 / (n * sigma2) + 2.0 * tau * l1 / scale + tau**2 * d),
        0.5 * (l2 / scale + tau * math.sqrt(d)) ** 2,
    )


def _conversion(alpha: float, rho: float, log_inverse_delta: float) -> float:
    """The bound (C) at one order α > 1."""
    return alpha * rho + log_inverse_delta / (alpha - 1.0) + math.log1p(-1.0 / alpha) - math.log(alpha) / (alpha - 1.0)


def zcdp_epsilon(rho: float, delta: float) -> float:
    """ε such that ρ-zCDP implies (ε, δ)-DP, by (C) (CKS20's conversion), minimised over α > 1.

    Every α gives a valid bound, so the numerical minimisation can only lose tightness: a log-spaced grid of
    α − 1 ∈ [10⁻⁶, 10⁸], then Brent's method between the best point's neighbours. At most
    ``ρ + 2√(ρ log(1/δ))`` (Bun & Steinke 2016, Prop. 1.3), which is returned if smaller.
    """
    if not (math.isfinite(rho) and rho >= 0):
        raise ValueError(f"zcdp_epsilon: rho must be non-negative and finite, got {rho!r}")
    if not 0 < delta < 1:
        raise ValueError(f"zcdp_epsilon: delta must lie in (0, 1), got {delta!r}")
    if rho == 0:
        return 0.0
    log_inverse_delta = math.log(1.0 / delta)
    grid = 1.0 + np.logspace(-6, 8, 561)
    values = [_conversion(a, rho, log_inverse_delta) for a in grid]
    best = int(np.argmin(values))
    lower, upper = grid[max(best - 1, 0)], grid[min(best + 1, grid.size - 1)]
    from scipy.optimize import minimize_scalar  # here: a client answering a stage loads no SciPy for it

    found = minimize_scalar(lambda a: _conversion(a, rho, log_inverse_delta), bounds=(lower, upper), method="bounded")
    candidates = [values[best], rho + 2.0 * math.sqrt(rho * log_inverse_delta)]
    if found.success and lower <= found.x <= upper:
        candidates.append(_conversion(float(found.x), rho, log_inverse_delta))
    return max(0.0, float(min(candidates)))


class DistributedPrivacyAccountant:
    """Composes the distributed discrete Gaussian's releases (ρ adds, (Z)) and reports (ε, δ) by (C).

    The same public face as :class:`~gpflow_fed.federated.protection.dp.PrivacyAccountant`, with each release's
    dimension added (the bound (Z) depends on it) and no sampling amplification. It needs only public numbers,
    so the server and every client can keep one.

    :param ddp: the mechanism's settings.
    """

    def __init__(self, ddp: DistributedDP) -> None:
        if not isinstance(ddp, DistributedDP):
            raise TypeError(f"DistributedPrivacyAccountant: ddp must be a DistributedDP, got {type(ddp).__name__}")
        self.ddp = ddp
        self._releases: List[Tuple[int, int, int, int]] = []
        self._rho_cache: Dict[int, float] = {}

    @property
    def releases(self) -> Tuple[Tuple[int, int, int, int], ...]:
        """``(K, m, P, d)`` per recorded group: P noised sums of d numbers over a cohort of m of K clients."""
        return tuple(self._releases)

    def _check(self, release: Sequence[int]) -> Tuple[int, int, int, int]:
        if len(release) != 4:
            raise ValueError(f"a release is (num_clients, sample_size, num_sums, dimension), got {tuple(release)}")
        K, m, P, d = (integer(v, f"release {name}", minimum=0) for v, name in zip(release, ("K", "m", "P", "d")))
        if not 1 <= m <= K or d < 1:
            raise ValueError(f"invalid release: a cohort of {m} of {K} clients, {P} sums of dimension {d}")
        if m < self.ddp.honest_clients:
            raise ValueError(
                f"invalid release: a cohort of {m} clients is below honest_clients = {self.ddp.honest_clients}; its "
                "sum may carry less noise than the accounting assumes"
            )
        return K, m, P, d

    def record(self, num_clients: int, sample_size: int, num_sums: int, *, dimension: int) -> None:
        """Record ``num_sums`` noised sums of ``dimension`` numbers over a cohort of ``sample_size`` of
        ``num_clients`` clients (the cohort size must be at least ``honest_clients``; it gives no amplification).

        :raises ValueError: sizes out of range, or a cohort below ``honest_clients``.
        """
        release = self._check((num_clients, sample_size, num_sums, dimension))
        if release[2]:
            self._releases.append(release)

    def restore(self, releases: Sequence[Sequence[int]]) -> None:
        """Replace the recorded releases with ``releases`` (``(K, m, P, d)`` each), e.g. from a checkpoint."""
        checked = [self._check(r) for r in releases]
        self._releases = [r for r in checked if r[2]]

    def _release_rho(self, dimension: int) -> float:
        if dimension not in self._rho_cache:
            self._rho_cache[dimension] = release_rho(self.ddp, dimension)
        return self._rho_cache[dimension]

    def after(self, earlier: "DistributedPrivacyAccountant") -> "DistributedPrivacyAccountant":
        """A new accountant of ``earlier``'s releases and then this one's: two runs on the same data compose (e.g.
        the moments and the training of :func:`gpflow_fed.fit`).

        :raises ValueError: ``earlier`` used other distributed-DP settings.
        """
        if not isinstance(earlier, DistributedPrivacyAccountant) or earlier.ddp != self.ddp:
            raise ValueError("only releases under the same DistributedDP settings compose in one accountant")
        composed = DistributedPrivacyAccountant(self.ddp)
        composed.restore([*earlier.releases, *self.releases])
        return composed

    def rho(self) -> float:
        """ρ spent so far: the sum of (Z) over the recorded releases."""
        return float(sum(P * self._release_rho(d) for _, _, P, d in self._releases))

    def epsilon(self) -> float:
        """ε spent so far at the configured δ, by (C) (0 before any release)."""
        return zcdp_epsilon(self.rho(), self.ddp.delta)

    def report(self) -> Dict[str, object]:
        """What a run exposes as ``result.privacy``: the spend, the mechanism, what it covers and what it does not."""
        t = self.ddp.honest_clients
        return {
            "epsilon": self.epsilon(),
            "delta": self.ddp.delta,
            "rho": self.rho(),
            "mechanism": "distributed discrete Gaussian (Kairouz, Liu & Steinke 2021): each client clips, rounds to "
            "the grid and adds its share before secure aggregation",
            "accountant": "zCDP per release (KLS21), added over releases, converted to (ε, δ) by Canonne, Kamath & "
            "Steinke 2020; no sampling amplification",
            "noise_multiplier": self.ddp.noise_multiplier,
            "clip_norm": self.ddp.clip_norm,
            "granularity": self.ddp.step,
            "honest_clients": t,
            "neighbouring": "replace one client's data (K public)",
            "covers": f"every recorded sum, against the server and any coalition, if at least {t} clients of each "
            "sum follow the protocol and survive to the sum, and only under secure aggregation",
            "not_covered": f"sums with fewer than {t} honest contributors (colluders, sybils, drop-outs); messages "
            "sent without secure aggregation; releases not recorded here",
            "releases": int(sum(P for _, _, P, _ in self._releases)),
        }
