"""gpflow_fed.metrics against values computed by hand."""

import numpy as np
import pytest
from check_shapes.exceptions import CheckShapesError
from scipy import stats

from gpflow_fed import metrics

Y = np.array([[1.0], [2.0], [3.0], [4.0]])
MEAN = np.array([[1.0], [3.0], [3.0], [6.0]])  # errors 0, −1, 0, −2


def test_rmse_and_mae_by_hand():
    assert metrics.rmse(Y, MEAN) == pytest.approx(np.sqrt(5 / 4), rel=1e-15)  # (0 + 1 + 0 + 4)/4
    assert metrics.mae(Y, MEAN) == pytest.approx(3 / 4, rel=1e-15)  # (0 + 1 + 0 + 2)/4
    assert metrics.rmse(Y, Y) == 0.0 and metrics.mae(Y, Y) == 0.0
    # several output columns average over all N·P entries
    assert metrics.rmse(np.zeros((2, 2)), np.array([[1.0, 1.0], [1.0, 3.0]])) == pytest.approx(np.sqrt(3.0))


def test_nlpd_by_hand():
    y, mean, var = np.array([[0.0], [1.0]]), np.array([[0.0], [0.0]]), np.array([[1.0], [4.0]])
    # terms ½log(2π) and ½log(8π) + 1/8: mean = ½log(4π) + 1/16 = 1.2655121234846454 + 0.0625
    assert metrics.nlpd(y, mean, var) == pytest.approx(1.3280121234846454, rel=1e-14)
    # equals the mean negative Gaussian log density
    rng = np.random.default_rng(0)
    y, mean, var = rng.normal(size=(7, 2)), rng.normal(size=(7, 2)), rng.uniform(0.1, 2.0, size=(7, 2))
    expected = -np.mean(stats.norm.logpdf(y, mean, np.sqrt(var)))
    assert metrics.nlpd(y, mean, var) == pytest.approx(expected, rel=1e-13)


def test_interval_coverage_and_calibration_by_hand():
    # standardised residuals |y − mean|/sd = 0.1, 0.5, 1.0, 2.0 (sd = 2)
    y = np.array([[0.2], [1.0], [-2.0], [4.0]])
    mean = np.zeros((4, 1))
    var = np.full((4, 1), 4.0)
    levels, coverage = metrics.interval_coverage(y, mean, var, levels=[0.5, 0.9])
    # z(0.5) = Φ⁻¹(0.75) = 0.674…: residuals 0.1, 0.5 inside; z(0.9) = Φ⁻¹(0.95) = 1.645…: 0.1, 0.5, 1.0 inside
    np.testing.assert_array_equal(levels, [0.5, 0.9])
    np.testing.assert_allclose(coverage, [0.5, 0.75], rtol=0, atol=0)
    ece, mce = metrics.calibration_errors(y, mean, var, levels=[0.5, 0.9])
    assert ece == pytest.approx(0.075, abs=1e-15)  # (|0.5 − 0.5| + |0.75 − 0.9|)/2
    assert mce == pytest.approx(0.15, abs=1e-15)
    assert metrics.ece(y, mean, var, levels=[0.5, 0.9]) == ece
    assert metrics.mce(y, mean, var, levels=[0.5, 0.9]) == mce
    # a residual exactly on the interval boundary counts as covered
    boundary = np.array([[stats.norm.ppf(0.75)]])
    assert metrics.interval_coverage(boundary, np.zeros((1, 1)), np.ones((1, 1)), levels=[0.5])[1][0] == 1.0


def test_default_levels_and_calibrated_predictions():
    np.testing.assert_allclose(metrics.DEFAULT_LEVELS, np.arange(1, 20) / 20, atol=1e-12)
    rng = np.random.default_rng(1)
    y = rng.normal(size=(20000, 1))
    ece, mce = metrics.calibration_errors(y, np.zeros_like(y), np.ones_like(y))
    assert ece < 0.01 and mce < 0.02  # a correct predictive distribution is calibrated
    over, _ = metrics.calibration_errors(y, np.zeros_like(y), 4 * np.ones_like(y))
    assert over > 0.1  # an over-dispersed prediction is not


def test_brier_by_hand():
    y = np.array([[1.0], [0.0], [1.0], [0.0]])
    prob = np.array([[0.9], [0.2], [0.4], [0.5]])
    assert metrics.brier(y, prob) == pytest.approx((0.01 + 0.04 + 0.36 + 0.25) / 4, rel=1e-14)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: metrics.nlpd(Y, MEAN, np.zeros_like(Y)), "positive"),
        (lambda: metrics.nlpd(Y, MEAN, np.full_like(Y, np.inf)), "finite"),
        (lambda: metrics.interval_coverage(Y, MEAN, np.ones_like(Y), levels=[0.5, 1.0]), r"levels .* \(0, 1\)"),
        (lambda: metrics.interval_coverage(Y, MEAN, np.ones_like(Y), levels=[]), "levels"),
        (lambda: metrics.brier(Y, np.full_like(Y, 0.5)), "binary"),
        (lambda: metrics.brier(np.ones((2, 1)), np.full((2, 1), 1.5)), r"\[0, 1\]"),
        (lambda: metrics.rmse(np.zeros((0, 1)), np.zeros((0, 1))), "at least one point"),
    ],
)
def test_bad_input_raises_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_mismatched_shapes_are_rejected():
    with pytest.raises((ValueError, CheckShapesError)):
        metrics.rmse(Y, MEAN[:3])
    with pytest.raises((ValueError, CheckShapesError)):
        metrics.nlpd(Y, MEAN, np.ones((4, 2)))


def test_evaluate_model_in_standardised_and_data_units():
    import gpflow

    from gpflow_fed.data import Standardizer

    rng = np.random.default_rng(0)
    X, Y = rng.normal(3.0, 2.0, (30, 1)), rng.normal(10.0, 5.0, (30, 1))
    scaler = Standardizer.from_data(X, Y)
    model = gpflow.models.GPR(scaler.transform(X, Y), gpflow.kernels.SquaredExponential(), noise_variance=0.3)
    X_test, Y_test = rng.normal(3.0, 2.0, (8, 1)), rng.normal(10.0, 5.0, (8, 1))
    mean, var = (t.numpy() for t in model.predict_y(scaler.transform(X_test)))
    standardised = metrics.evaluate_model(model, scaler.transform(X_test, Y_test))
    assert standardised == {
        "test_rmse": metrics.rmse(scaler.transform(X_test, Y_test)[1], mean),
        "test_mae": metrics.mae(scaler.transform(X_test, Y_test)[1], mean),
        "test_nlpd": metrics.nlpd(scaler.transform(X_test, Y_test)[1], mean, var),
    }
    in_units = metrics.evaluate_model(model, (X_test, Y_test), scaler)
    assert in_units["test_rmse"] == pytest.approx(standardised["test_rmse"] * scaler.Y_std[0], rel=1e-12)
    assert in_units["test_nlpd"] == pytest.approx(standardised["test_nlpd"] + np.log(scaler.Y_std[0]), rel=1e-12)
    # the log-likelihood per point is the mean of predict_log_density: −NLPD for a Gaussian predictive
    ll = metrics.log_likelihood_per_point(model, scaler.transform(X_test, Y_test))
    assert ll == pytest.approx(-standardised["test_nlpd"], rel=1e-12)
