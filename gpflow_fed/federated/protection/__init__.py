"""Protections of the summed messages: secure aggregation, differential privacy, robust aggregation."""

from ...privacy.secure_aggregation import SecureAggregation
from .dp import DifferentialPrivacy, PrivacyAccountant, clip_payload

__all__ = ["DifferentialPrivacy", "PrivacyAccountant", "SecureAggregation", "clip_payload"]
