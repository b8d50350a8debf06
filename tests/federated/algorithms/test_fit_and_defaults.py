"""FSGP's defaults and integer M, data-free inducing inputs, gpflow_fed.fit, and FederatedResult's repr."""

import gpflow
import numpy as np
import pytest

import gpflow_fed
from gpflow_fed.data import FederatedDataset
from gpflow_fed.federated import run
from gpflow_fed.federated.algorithms import FSGP, inducing_from_public, inducing_grid


def _table(n=24):
    rng = np.random.default_rng(3)
    party = np.repeat(["a", "b", "c"], n)
    x = rng.uniform(0, 50, party.size)
    return {"party": party, "x": x, "y": 100 + 10 * np.sin(x / 8) + rng.normal(size=party.size)}


def test_fsgp_with_an_integer_m_and_defaults():
    algorithm = FSGP(gpflow.kernels.SquaredExponential(lengthscales=[1.0, 1.0]), 6, rounds=2)
    assert (algorithm.noise_variance, algorithm.local_steps, algorithm.learning_rate) == (0.1, 3, 0.1)
    assert FSGP(gpflow.kernels.SquaredExponential(), 6).rounds == 60
    rng = np.random.default_rng(0)
    data = FederatedDataset([(rng.normal(size=(10, 2)), rng.normal(size=(10, 1))) for _ in range(2)])
    result = run(algorithm, data)
    np.testing.assert_allclose(result.algorithm.inducing_variable.Z.numpy(), inducing_grid([(-2, 2), (-2, 2)], 6))
    assert algorithm._pending_num_inducing == 6  # the user's object is configuration: the run bound its own copy
    assert result.model.inducing_variable.Z.shape == (6, 2) and np.isfinite(result.metrics.get("test_rmse", 0.0))
    with pytest.raises(ValueError, match="M .* must be positive"):
        FSGP(gpflow.kernels.SquaredExponential(), 0)


def test_inducing_grid_and_public_points():
    Z = inducing_grid([(18, 90)], 5)
    np.testing.assert_allclose(Z[:, 0], [18, 36, 54, 72, 90])
    Z2 = inducing_grid([(0, 1), (10, 20)], 7)
    assert Z2.shape == (7, 2) and len(np.unique(Z2, axis=0)) == 7
    assert np.all((Z2 >= [0, 10]) & (Z2 <= [1, 20]))
    with pytest.raises(ValueError, match="finite low < high"):
        inducing_grid([(1, 0)], 3)
    with pytest.raises(ValueError, match="positive integer"):
        inducing_grid([(0, 1)], 0)
    public = np.concatenate([np.full((5, 1), 0.0), np.full((5, 1), 10.0)]) + np.arange(10)[:, None] * 1e-3
    centres = np.sort(inducing_from_public(public, 2)[:, 0])
    np.testing.assert_allclose(centres, [0.002, 10.007], atol=1e-9)
    with pytest.raises(ValueError, match="exceeds the 10 distinct public inputs"):
        inducing_from_public(public, 11)


@pytest.mark.usefixtures("nearest_rounding")  # two secure runs compared to 1e-6: rounding to nearest
def test_fit_on_a_table_reports_data_units():
    table = _table()
    result = gpflow_fed.fit(table, party_column="party", target="y", rounds=5, num_inducing=8)
    scaler = result.standardizer
    assert scaler is not None and float(scaler.Y_mean[0]) > 90  # standardised internally
    # the same run by hand, in standardised units: RMSE scales by σ_Y, NLPD shifts by log σ_Y
    from gpflow_fed.data import federated_from_table

    dataset, _ = federated_from_table(table, party_column="party", target="y").standardized()
    by_hand = run(FSGP(gpflow.kernels.SquaredExponential(lengthscales=np.ones(1)), 8, rounds=5), dataset)
    sigma = float(scaler.Y_std[0])
    assert result.metrics["test_rmse"] == pytest.approx(by_hand.metrics["test_rmse"] * sigma, rel=1e-6)
    assert result.metrics["test_nlpd"] == pytest.approx(by_hand.metrics["test_nlpd"] + np.log(sigma), rel=1e-6)
    text = repr(result)
    assert text.startswith("FederatedResult(model=StandardizedModel, rounds=") and "test_rmse=" in text
    assert "history" not in text and len(text) < 320


def test_fit_errors():
    with pytest.raises(ValueError, match="method must be one of"):
        gpflow_fed.fit(_table(), "svgp", party_column="party", target="y")
    with pytest.raises(ValueError, match="needs party_column"):
        gpflow_fed.fit(_table())
