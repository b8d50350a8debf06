"""Data: FederatedDataset, synthetic generators from the papers, offline real datasets, partitioners."""

from .dataset import FederatedDataset, validate_regression_data

__all__ = ["FederatedDataset", "validate_regression_data"]
