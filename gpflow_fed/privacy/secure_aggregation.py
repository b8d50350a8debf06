"""Secure aggregation by pairwise additive masking, in fixed-point arithmetic modulo 2^64.

Protocol (Bonawitz et al., "Practical Secure Aggregation for Privacy-Preserving Machine Learning", CCS 2017,
§3 "one-time pads", without the secret-sharing layer that recovers from drop-outs). For one exchange with
cohort ``U`` (the clients that answer), every pair ``i < j`` of ``U`` agrees on a seed ``s_ij``; client i
encodes its payload ``x_i`` in fixed point, ``q_i = round(2^f x_i) mod 2^64``, and sends

    y_i = q_i + Σ_{j ∈ U, j > i} PRG(s_ij) − Σ_{j ∈ U, j < i} PRG(s_ij)   (mod 2^64).

Each ``y_i`` is uniformly distributed on ``Z_{2^64}`` to anyone without the seeds, and the masks cancel in
the sum: ``Σ_i y_i = Σ_i q_i (mod 2^64)`` exactly, so the server decodes ``Σ_i x_i`` to fixed-point
precision ``K 2^{-f-1}`` and learns nothing else about the individual ``x_i``.

The key agreement (Diffie–Hellman in the paper) is simulated: ``s_ij`` is derived from the run's seed, the
exchange (purpose, round, phase) and the pair, so a run is reproducible. This models an honest-but-curious
server that does not know the run's seed; it is not a cryptographic implementation.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Dict, Mapping, Sequence

import numpy as np

__all__ = ["SecureAggregation", "from_limb_sums", "pair_seed", "to_limbs"]


def pair_seed(seed: int, context: Sequence[object], a: str, b: str) -> np.random.SeedSequence:
    """The simulated shared secret of clients ``a`` and ``b`` for one exchange (symmetric in ``a``, ``b``).

    :param seed: the run's seed.
    :param context: what identifies the exchange, e.g. ``("train", round, phase)``; a new exchange gets
        fresh masks (a one-time pad is never reused).
    :param a: one client id; ``b``: the other.
    """
    first, second = sorted((str(a), str(b)))
    text = "\x1f".join([str(int(seed)), *(str(c) for c in context), first, second])
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    words = np.frombuffer(digest, dtype=np.uint32)
    return np.random.SeedSequence([int(w) for w in words])


def to_limbs(codes: np.ndarray, bits: int) -> np.ndarray:
    """``uint64`` codes ``[n]`` as ``⌈64/b⌉`` limbs of ``b`` bits, ``[⌈64/b⌉ n]`` float64 (limb-major).

    A transport that adds floats (or small integers) exactly can then sum 64-bit codes modulo 2^64: sum the
    limbs, then :func:`from_limb_sums`. Used to all-reduce masked payloads (``DistributeRuntime``) and to
    pass them through Flower's 32-bit SecAgg+ (``FlowerRuntime``).
    """
    codes = np.asarray(codes, dtype=np.uint64).ravel()
    mask = np.uint64((1 << bits) - 1)
    return np.concatenate([(codes >> np.uint64(bits * j)) & mask for j in range(-(-64 // bits))]).astype(np.float64)


def from_limb_sums(limb_sums: np.ndarray, bits: int) -> np.ndarray:
    """``Σ_k code_k mod 2^64`` (``uint64`` ``[n]``) from the sums of :func:`to_limbs` over k (any size)."""
    sums = np.rint(np.asarray(limb_sums, dtype=np.float64)).astype(np.uint64).reshape(-(-64 // bits), -1)
    total = np.zeros(sums.shape[1], dtype=np.uint64)
    for j, limb in enumerate(sums):
        total += limb << np.uint64(bits * j)  # uint64 arithmetic wraps modulo 2^64
    return total


@dataclass(frozen=True)
class SecureAggregation:
    """Pairwise additive masking of fixed-point payloads (module docstring for the protocol).

    :param fractional_bits: f, the fixed-point resolution is ``2^{-f}``; a cohort of K clients can sum
        values with ``|x| < 2^{63-f} / K`` (larger values raise ``ValueError`` on the client, before
        anything is sent). The default f = 32 gives a resolution of 2.3e-10 and a range of ±2.1e9 / K.
    """

    fractional_bits: int = 32

    def __post_init__(self) -> None:
        f = self.fractional_bits
        if isinstance(f, bool) or not isinstance(f, (int, np.integer)) or not 1 <= f <= 62:
            raise ValueError(f"SecureAggregation: fractional_bits must be an integer in [1, 62], got {f!r}")

    @property
    def scale(self) -> float:
        """``2^f``."""
        return float(2.0**self.fractional_bits)

    def bound(self, cohort_size: int) -> float:
        """The largest magnitude one of ``cohort_size`` clients may encode without overflowing the sum."""
        return float(2.0 ** (63 - self.fractional_bits)) / max(int(cohort_size), 1)

    def encode(self, name: str, value: np.ndarray, cohort_size: int) -> np.ndarray:
        """``round(2^f x) mod 2^64`` as ``uint64``.

        :raises ValueError: non-finite values, or values too large for a sum over ``cohort_size`` clients
            (the message says to lower ``fractional_bits``).
        """
        x = np.asarray(value, dtype=np.float64)
        if not np.all(np.isfinite(x)):
            raise ValueError(f"secure aggregation: payload {name!r} has NaN or inf values, which fixed point cannot encode")
        limit = self.bound(cohort_size)
        largest = float(np.max(np.abs(x))) if x.size else 0.0
        if largest >= limit:
            raise ValueError(
                f"secure aggregation: payload {name!r} has |x| = {largest:.3g}, beyond the fixed-point range "
                f"{limit:.3g} for {cohort_size} clients; lower SecureAggregation(fractional_bits=...)"
            )
        return np.rint(x * self.scale).astype(np.int64).view(np.uint64)

    def decode(self, total: np.ndarray) -> np.ndarray:
        """The real value of a sum of encodings: ``total`` as a signed integer, divided by ``2^f``."""
        return np.asarray(total, dtype=np.uint64).view(np.int64).astype(np.float64) / self.scale

    def mask(
        self,
        client_id: str,
        encoded: Mapping[str, np.ndarray],
        cohort: Sequence[str],
        seed: int,
        context: Sequence[object],
    ) -> Dict[str, np.ndarray]:
        """``y_i``: the encodings plus the masks shared with every other member of ``cohort`` (mod 2^64).

        Arrays are masked in sorted-name order from one pad per pair, so both members of a pair draw the
        same pad.

        :raises ValueError: ``client_id`` not in ``cohort``.
        """
        if client_id not in cohort:
            raise ValueError(f"secure aggregation: {client_id!r} is not in the exchange's cohort {tuple(cohort)}")
        names = sorted(encoded)
        out = {n: np.array(encoded[n], dtype=np.uint64, copy=True) for n in names}
        sizes = [out[n].size for n in names]
        total = int(sum(sizes))
        position = list(cohort).index(client_id)
        for index, other in enumerate(cohort):
            if other == client_id:
                continue
            rng = np.random.Generator(np.random.PCG64(pair_seed(seed, context, client_id, other)))
            pad = rng.bit_generator.random_raw(total).astype(np.uint64)
            offset = 0
            for n, size in zip(names, sizes):
                piece = pad[offset : offset + size].reshape(out[n].shape)
                offset += size
                if position < index:
                    out[n] += piece  # uint64 arithmetic wraps modulo 2^64
                else:
                    out[n] -= piece
        return out

    @staticmethod
    def sum_masked(payloads: Sequence[np.ndarray]) -> np.ndarray:
        """``Σ_i y_i mod 2^64``; equals ``Σ_i q_i mod 2^64`` when the whole cohort is summed."""
        return np.sum(np.stack([np.asarray(p, dtype=np.uint64) for p in payloads]), axis=0, dtype=np.uint64)
