"""Protections of the federated exchange, pure numpy and ``cryptography`` (no TensorFlow).

* :mod:`.request`: :class:`Protection`, the server's request; :mod:`.policy`: :class:`ClientPolicy`, a client's own;
* :mod:`.encoder`: the client's side (refusals, clipping, fixed point, masking); :mod:`.reduction`: the server's;
* :mod:`.masking`, :mod:`.secagg`, :mod:`.shamir`, :mod:`.wire`: secure aggregation (fixed point, X25519 pair
  secrets, a sparse masking graph, pads, Shamir-shared self-masks and drop-out recovery);
* :mod:`.dp`, :mod:`.distributed_dp`: central and distributed differential privacy and their accountants;
* :mod:`.robust`: robust aggregation of "mean" phases (coordinate-wise weighted median, trimmed mean).

The values a user configures are re-exported here; the protocol's functions are in their modules.
"""

from .distributed_dp import DistributedDP, DistributedPrivacyAccountant
from .dp import DifferentialPrivacy, PrivacyAccountant
from .masking import SecureAggregation
from .policy import ClientPolicy
from .request import Protection
from .robust import RobustAggregation

__all__ = [
    "ClientPolicy",
    "DifferentialPrivacy",
    "DistributedDP",
    "DistributedPrivacyAccountant",
    "PrivacyAccountant",
    "Protection",
    "RobustAggregation",
    "SecureAggregation",
]
