"""Data: FederatedDataset, synthetic generators from the papers, offline real datasets, partitioners.

Names load on first use (PEP 562), so that reading and checking a table (:mod:`.tabular`) imports no TensorFlow:
the command line reports a bad CSV before TensorFlow starts.
"""

from __future__ import annotations

import importlib
from typing import Any, List

#: public name -> the submodule that defines it.
_NAMES = {
    "example_table": "example",
    "write_example_csv": "example",
    "banana": "classification",
    "digit_pixels": "classification",
    "quadrant_tasks": "classification",
    "FederatedDataset": "dataset",
    "validate_regression_data": "dataset",
    "PARTITIONS": "partition",
    "group_partition": "partition",
    "holdout_split": "partition",
    "iid_partition": "partition",
    "make_federated": "partition",
    "most_correlated_feature": "partition",
    "partition_indices": "partition",
    "random_size_partition": "partition",
    "size_imbalance": "partition",
    "sorted_chunk_partition": "partition",
    "spatial_partition": "partition",
    "split_indices": "partition",
    "RealDataset": "real",
    "available_datasets": "real",
    "load_dataset": "real",
    "FedBNRTask": "real_splits",
    "fedbnr_real_task": "real_splits",
    "real_split": "real_splits",
    "SatelliteData": "satellite",
    "orbit_constants": "satellite",
    "satellite_data": "satellite",
    "satellite_trajectory": "satellite",
    "Standardizer": "standardize",
    "client_moments": "standardize",
    "combine_moments": "standardize",
    "SegmentedRegression": "synthetic",
    "SyntheticRegression": "synthetic",
    "distributed_segments": "synthetic",
    "fedbnr_function": "synthetic",
    "fsgp_latent_1": "synthetic",
    "fsgp_latent_2": "synthetic",
    "fsgp_synthetic_1": "synthetic",
    "fsgp_synthetic_2": "synthetic",
    "new_client_task": "synthetic",
    "pvi_five_partition_toy": "synthetic",
    "recyclable_latent": "synthetic",
    "recyclable_segments": "synthetic",
    "smooth_function": "synthetic",
    "smooth_function_bias": "synthetic",
    "step_function_data": "synthetic",
    "toy_concatenation": "synthetic",
    "two_range_clients": "synthetic",
    "federated_from_table": "tabular",
    "read_table": "tabular",
    "TableSplit": "tabular",
    "split_table": "tabular",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    """Import the submodule that defines ``name`` on first use."""
    if name in _NAMES:
        value = getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(__all__))
