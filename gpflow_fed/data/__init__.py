"""Data: FederatedDataset, synthetic generators from the papers, offline real datasets, partitioners."""

from .dataset import FederatedDataset, validate_regression_data
from .satellite import SatelliteData, orbit_constants, satellite_data, satellite_trajectory
from .classification import banana, digit_pixels, quadrant_tasks
from .partition import (
    PARTITIONS,
    group_partition,
    iid_partition,
    make_federated,
    most_correlated_feature,
    partition_indices,
    random_size_partition,
    size_imbalance,
    sorted_chunk_partition,
    spatial_partition,
    split_indices,
    holdout_split,
    train_test_split,
)
from .real import RealDataset, available_datasets, load_dataset
from .real_splits import FedBNRTask, fedbnr_real_task, real_split
from .standardize import Standardizer, client_moments, combine_moments
from .tabular import federated_from_table, read_table
from .synthetic import (
    SegmentedRegression,
    SyntheticRegression,
    distributed_segments,
    fedbnr_function,
    fsgp_latent_1,
    fsgp_latent_2,
    fsgp_synthetic_1,
    fsgp_synthetic_2,
    new_client_task,
    pvi_five_partition_toy,
    recyclable_latent,
    recyclable_segments,
    smooth_function,
    smooth_function_bias,
    step_function_data,
    toy_concatenation,
    two_range_clients,
)

__all__ = [
    "federated_from_table", "read_table",
    "SatelliteData", "orbit_constants", "satellite_data", "satellite_trajectory",
    "banana", "digit_pixels", "distributed_segments", "quadrant_tasks", "smooth_function", "smooth_function_bias", "toy_concatenation",
    "FedBNRTask", "fedbnr_function", "fedbnr_real_task", "new_client_task", "step_function_data", "two_range_clients",
    "real_split",
    "FederatedDataset",
    "PARTITIONS",
    "RealDataset",
    "SegmentedRegression",
    "Standardizer",
    "SyntheticRegression",
    "available_datasets",
    "client_moments",
    "combine_moments",
    "fsgp_latent_1",
    "fsgp_latent_2",
    "fsgp_synthetic_1",
    "fsgp_synthetic_2",
    "group_partition",
    "iid_partition",
    "load_dataset",
    "make_federated",
    "most_correlated_feature",
    "partition_indices",
    "pvi_five_partition_toy",
    "random_size_partition",
    "recyclable_latent",
    "recyclable_segments",
    "size_imbalance",
    "sorted_chunk_partition",
    "spatial_partition",
    "split_indices",
    "holdout_split",
    "train_test_split",
    "validate_regression_data",
]
