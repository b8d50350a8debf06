"""Protections of the federated exchange, pure numpy and ``cryptography`` (no TensorFlow).

* :mod:`.randomness`: randomness that protects, from the OS (never from the run's seed).
* :mod:`.masking`: secure aggregation: fixed point, X25519 pair secrets, a sparse masking graph, pads.
* :mod:`.robust`: robust aggregation of "mean" phases (coordinate-wise weighted median, trimmed mean).
* :mod:`.dp`: client-level differential privacy of the sums (clipping, Gaussian noise, the accountant).
"""

from .distributed_dp import DistributedDP, DistributedPrivacyAccountant, NoiseSource
from .dp import DifferentialPrivacy, PrivacyAccountant, clip_payload
from .masking import (
    Exchange,
    MaskingKeys,
    SecureAggregation,
    check_exchange,
    check_senders,
    from_limb_sums,
    keystream,
    mask,
    masking_graph,
    sum_masked,
    to_limbs,
)
from ...randomness import new_run_id, protective_rng, protective_seed_sequence
from .robust import RobustAggregation, weighted_median

__all__ = [
    "DifferentialPrivacy",
    "DistributedDP",
    "DistributedPrivacyAccountant",
    "NoiseSource",
    "PrivacyAccountant",
    "clip_payload",
    "Exchange",
    "MaskingKeys",
    "RobustAggregation",
    "SecureAggregation",
    "check_exchange",
    "check_senders",
    "from_limb_sums",
    "keystream",
    "mask",
    "masking_graph",
    "new_run_id",
    "protective_rng",
    "protective_seed_sequence",
    "sum_masked",
    "to_limbs",
    "weighted_median",
]
