"""FederatedDataset validation: every bad input is named before any training."""

import gpflow
import numpy as np
import pytest

from gpflow_fed.data import FederatedDataset


def _pair(n, d=2, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)), rng.normal(size=(n, 1))


def test_valid_dataset_properties():
    ds = FederatedDataset(clients=[_pair(3), _pair(5, seed=1)], test=_pair(4, seed=2), name="x")
    assert ds.num_clients == 2 and ds.input_dim == 2 and ds.output_dim == 1
    assert ds.client_sizes == (3, 5) and ds.num_data == 8
    X, Y = ds.pooled()
    assert X.shape == (8, 2) and Y.shape == (8, 1)
    assert all(a.dtype == gpflow.default_float() for pair in ds.clients for a in pair)
    assert "K=2" in repr(ds)


def test_one_dimensional_y_is_read_as_a_column():
    X, Y = _pair(4)
    ds = FederatedDataset(clients=[(X, Y[:, 0])])
    assert ds.clients[0][1].shape == (4, 1)


def test_integer_inputs_are_converted_to_default_float():
    ds = FederatedDataset(clients=[(np.arange(4)[:, None], np.arange(4)[:, None])])
    assert ds.clients[0][0].dtype == gpflow.default_float()


@pytest.mark.parametrize(
    "clients, match",
    [
        ([], "at least one client"),
        ([(np.zeros((3, 2)), np.zeros((4, 1)))], "client 0: X has 3 rows but Y has 4"),
        ([(np.zeros(3), np.zeros((3, 1)))], "client 0: X must have rank 2"),
        ([(np.zeros((3, 2, 1)), np.zeros((3, 1)))], "rank 2"),
        ([_pair(3), (np.full((2, 2), np.nan), np.zeros((2, 1)))], "client 1: X contains NaN or inf"),
        ([(np.zeros((2, 2)), np.array([[np.inf], [0.0]]))], "client 0: Y contains NaN or inf"),
        ([_pair(3), (np.zeros((0, 2)), np.zeros((0, 1)))], "client 1: has no data"),
        ([_pair(3, d=2), _pair(3, d=3)], r"inconsistent input dimensions D: \[2, 3\]"),
        (
            [(np.zeros((2, 1)), np.zeros((2, 1))), (np.zeros((2, 1)), np.zeros((2, 2)))],
            "inconsistent output dimensions",
        ),
    ],
)
def test_bad_clients_raise_value_error(clients, match):
    with pytest.raises(ValueError, match=match):
        FederatedDataset(clients=clients)


def test_non_numeric_and_non_pairs_raise_type_error():
    with pytest.raises(TypeError, match="numeric"):
        FederatedDataset(clients=[(np.array([["a"], ["b"]]), np.zeros((2, 1)))])
    with pytest.raises(TypeError, match="pair"):
        FederatedDataset(clients=[np.zeros((2, 2))])


def test_complex_data_is_rejected_not_cast():
    X, Y = _pair(4)
    with pytest.raises(TypeError, match=r"client 0.*X is complex \(complex128\)"):
        FederatedDataset(clients=[(X + 1j, Y)])
    with pytest.raises(TypeError, match="Y is complex"):
        FederatedDataset(clients=[(X, Y)], test=(X, Y.astype(np.complex64)))


def test_test_set_is_validated():
    with pytest.raises(ValueError, match="test set has input dimension 3"):
        FederatedDataset(clients=[_pair(3)], test=_pair(2, d=3))
    with pytest.raises(ValueError, match="test set: Y contains NaN"):
        FederatedDataset(clients=[_pair(3)], test=(np.zeros((1, 2)), np.array([[np.nan]])))
