"""Privacy-aware GP release by synthetic correlated noise (Tuo & Bhattacharya), formerly ``gpflow_fed.release``."""

from .ledger import EarlierRelease, ReleaseLedger, default_ledger_folder
from .lowrank import LowRankCovariance
from .obfuscation import (
    METHODS,
    PROTECT,
    PrivacyCheck,
    Targets,
    obfuscate,
    posterior_covariance,
    prior_variance,
    protected_covariance,
    protected_targets,
    synthetic_noise_covariance,
    verify_privacy,
)
from .regions import (
    Box,
    Interval,
    Region,
    RegionRefinement,
    RegionUnion,
    refine_region,
    region_noise_covariance,
    uniform_privacy_covariance,
)
from .resolution import recording_resolution, resolution_noise
from .sdp import SDPInfo, solve_privacy_sdp
from .tolerance import ProportionalKernel, check_tolerance_kernel, gaussian_tolerance_kernel, resolve_tolerance
from .weak import CertifiedCovariance, WeakCertificate, solve_weak_krylov

__all__ = [
    "Box",
    "CertifiedCovariance",
    "EarlierRelease",
    "Interval",
    "LowRankCovariance",
    "METHODS",
    "PROTECT",
    "PrivacyCheck",
    "ProportionalKernel",
    "Region",
    "RegionRefinement",
    "RegionUnion",
    "ReleaseLedger",
    "SDPInfo",
    "Targets",
    "check_tolerance_kernel",
    "default_ledger_folder",
    "gaussian_tolerance_kernel",
    "obfuscate",
    "posterior_covariance",
    "prior_variance",
    "protected_covariance",
    "protected_targets",
    "recording_resolution",
    "refine_region",
    "region_noise_covariance",
    "resolution_noise",
    "resolve_tolerance",
    "solve_privacy_sdp",
    "synthetic_noise_covariance",
    "uniform_privacy_covariance",
    "verify_privacy",
    "WeakCertificate",
    "solve_weak_krylov",
]
