"""Randomness that protects privacy: drawn from the operating system, never from a user or run seed.

Synthetic release noise (and, in the federated runtimes, DP noise, secure-aggregation secrets and DP client
sampling) must be unpredictable to anyone who reads the code and knows the public configuration: a noise vector
drawn from ``default_rng(0)`` can be regenerated and subtracted. :func:`private_rng` seeds a generator with 128
bits from :func:`secrets.randbits` (the OS CSPRNG). Tests that need a reproducible private draw pass an explicit
``insecure_noise_seed``; no default and no command-line default ever does.
"""

from __future__ import annotations

import secrets
from typing import Optional

import numpy as np


def private_rng(insecure_noise_seed: Optional[int] = None) -> np.random.Generator:
    """A generator for privacy-protecting noise.

    :param insecure_noise_seed: None (always, outside tests): seed from 128 OS-random bits. An ``int ≥ 0`` makes
        the draw reproducible *and predictable to anyone who knows it* — for tests only, never in a release.
    :raises TypeError: if ``insecure_noise_seed`` is not None or an int (bools are refused).
    :raises ValueError: if it is negative.
    """
    if insecure_noise_seed is None:
        return np.random.default_rng(np.random.SeedSequence(secrets.randbits(128)))
    if isinstance(insecure_noise_seed, bool) or not isinstance(insecure_noise_seed, (int, np.integer)):
        raise TypeError(f"insecure_noise_seed must be None (OS randomness) or an int, got "
                        f"{type(insecure_noise_seed).__name__}; leave it None outside tests")
    if insecure_noise_seed < 0:
        raise ValueError(f"insecure_noise_seed must be ≥ 0, got {insecure_noise_seed}; leave it None outside tests")
    return np.random.default_rng(int(insecure_noise_seed))


__all__ = ["private_rng"]
