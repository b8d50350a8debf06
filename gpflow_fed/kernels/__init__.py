"""Kernels of gpflow-fed: the Unifying Random Kernel (URK), its random feature maps, and a deep kernel."""

from .builders import deep_urk, distribution_shifter, mlp
from .deep import DeepKernel
from .feature_maps import (
    CallableFeatureMap,
    ExponentialFeatureMap,
    FeatureMap,
    FourierFeatureMap,
    PolynomialFeatureMap,
    make_feature_map,
)
from .urk import URK

__all__ = [
    "CallableFeatureMap",
    "DeepKernel",
    "ExponentialFeatureMap",
    "FeatureMap",
    "FourierFeatureMap",
    "PolynomialFeatureMap",
    "URK",
    "deep_urk",
    "distribution_shifter",
    "make_feature_map",
    "mlp",
]
