"""The Plateau stopping rule, and early stopping of FSGP, FGP and centralized SGPR through it."""

import gpflow
import numpy as np
import pytest

from gpflow_fed.baselines import centralized_sgpr, train_adam
from gpflow_fed.data import FederatedDataset
from gpflow_fed.federated import Plateau, run
from gpflow_fed.federated.algorithms import FGP, FSGP


def _dataset(sizes=(20, 30, 25), seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3, 3, (sum(sizes), 1))
    Y = np.sin(X) + 0.1 * rng.normal(size=X.shape)
    cuts = np.cumsum((0,) + sizes)
    return FederatedDataset([(X[a:b], Y[a:b]) for a, b in zip(cuts, cuts[1:])], test=(X[:10], Y[:10]))


def _kernel():
    return gpflow.kernels.SquaredExponential()


def test_plateau_compares_the_means_of_the_last_two_windows():
    rule = Plateau(window=2, tolerance=0.01)
    assert not rule.reached([1.0, 1.0, 1.0])  # fewer than two windows
    assert rule.reached([5.0, 1.0, 1.0, 1.001, 0.999])  # only the last four values count
    assert not rule.reached([1.0, 1.0, 1.1, 1.1])
    assert rule.reached([-2.0, -2.0, -2.01, -2.0])  # relative to |mean|, whatever the sign


@pytest.mark.parametrize(
    "kwargs, error", [({"window": 0}, ValueError), ({"tolerance": 0.0}, ValueError), ({"window": 1.5}, TypeError)]
)
def test_plateau_rejects_bad_settings(kwargs, error):
    with pytest.raises(error):
        Plateau(**kwargs)


def test_plateau_rejects_a_non_finite_objective():
    with pytest.raises(ValueError, match="not finite"):
        Plateau(window=1).reached([1.0, float("nan")])


@pytest.mark.usefixtures("nearest_rounding")  # runs compared to the last digits: rounding to nearest
@pytest.mark.parametrize("make", [lambda s: FSGP(_kernel(), np.linspace(-2, 2, 5)[:, None], 0.1, 40, stopping=s),
                                  lambda s: FGP(_kernel(), 0.1, 40, stopping=s)])  # fmt: skip
def test_algorithms_stop_at_the_plateau_and_still_predict(make):
    dataset = _dataset()
    full = run(make(None), dataset)
    assert len(full.history) == 40
    stopped = run(make(Plateau(window=3, tolerance=10.0)), dataset)  # any change is below 1000 %: stops at once
    assert len(stopped.history) == 6  # the first two windows
    assert np.isfinite(stopped.metrics["test_rmse"])
    never = run(make(Plateau(window=3, tolerance=1e-15)), dataset)
    assert len(never.history) == 40
    np.testing.assert_allclose(never.metrics["test_rmse"], full.metrics["test_rmse"], rtol=1e-12)


@pytest.mark.parametrize(
    "make", [lambda: FSGP(_kernel(), 3, 5, stopping=0.1), lambda: FGP(_kernel(), 0.1, 5, stopping=3)]
)
def test_algorithms_reject_a_stopping_that_is_not_a_plateau(make):
    with pytest.raises(TypeError, match="Plateau"):
        make()


def test_fgp_reports_the_local_log_likelihood_only_with_a_stopping_rule():
    history = run(FGP(_kernel(), 0.1, 3, stopping=Plateau(window=5)), _dataset()).history
    assert all(np.isfinite(h["local_log_likelihood"]) for h in history)
    assert all(np.isnan(h["local_log_likelihood"]) for h in run(FGP(_kernel(), 0.1, 3), _dataset()).history)


def test_train_adam_stops_at_the_plateau_with_the_same_steps():
    dataset = _dataset()
    X, Y = dataset.pooled()
    Z = np.linspace(-2, 2, 5)[:, None]
    plain = gpflow.models.SGPR((X, Y), _kernel(), Z.copy(), noise_variance=0.1)
    assert train_adam(plain, len(X), 20, 0.1) == 20
    chunked = gpflow.models.SGPR((X, Y), _kernel(), Z.copy(), noise_variance=0.1)
    assert train_adam(chunked, len(X), 20, 0.1, Plateau(window=10, tolerance=10.0)) == 20  # two windows, then stop
    for a, b in zip(plain.trainable_variables, chunked.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-10)  # chunks keep one Adam state
    central = centralized_sgpr(dataset, _kernel(), Z, 0.1, 500, 0.1, Plateau(window=4, tolerance=10.0))
    assert central.steps == 8
    with pytest.raises(TypeError, match="Plateau"):
        train_adam(plain, len(X), 5, 0.1, stopping=1e-3)
