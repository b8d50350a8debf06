"""Baselines: committee-of-experts combination rules and centralized/local-only SGPR."""

from .expert_models import fit_gpr_experts
from ..models.experts import COMBINATION_RULES, ExpertCommittee, bcm, combine_experts, gpoe, poe, rbcm
from .sgpr import BaselineResult, centralized_sgpr, local_only_sgpr, train_adam

__all__ = [
    "fit_gpr_experts",
    "BaselineResult",
    "COMBINATION_RULES",
    "ExpertCommittee",
    "bcm",
    "centralized_sgpr",
    "combine_experts",
    "gpoe",
    "local_only_sgpr",
    "poe",
    "rbcm",
    "train_adam",
]
