"""DifferentialPrivacy.for_target calibrates z to a target ε; DP warns when noise or clipping swamps the sums."""

import warnings

import gpflow
import numpy as np
import pytest

from gpflow_fed.data import FederatedDataset
from gpflow_fed.federated import DifferentialPrivacy, LocalRuntime, PrivacyAccountant, Protection, run
from gpflow_fed.federated.algorithms import FSGP
from gpflow_fed.federated.protection.dp import DPUtilityWarning, utility_warning


def _spent(dp, releases):
    accountant = PrivacyAccountant(dp)
    accountant.restore(releases)
    return accountant.epsilon()


@pytest.mark.parametrize("epsilon", [0.5, 2.0, 8.0])
def test_for_target_meets_the_target_tightly(epsilon):
    dp = DifferentialPrivacy.for_target(
        epsilon, 1e-5, clip_norm=1.0, num_clients=10, rounds=20, clients_per_round=4, final_sums=1
    )
    releases = [(10, 4, 1)] * 20 + [(10, 10, 1)]
    assert _spent(dp, releases) <= epsilon
    slightly_less_noise = DifferentialPrivacy(dp.noise_multiplier * 0.99, 1.0, 1e-5)
    assert _spent(slightly_less_noise, releases) > epsilon  # the smallest such z, to 1 %


def test_for_target_with_the_pld_accountant():
    epsilon = 10.0
    # PLD's memory grows with ε(z): the bracket must not evaluate z far below the answer (z = 1e-3 needed 301 GiB)
    dp = DifferentialPrivacy.for_target(
        epsilon, 1e-5, clip_norm=1.0, num_clients=1000, rounds=0, final_sums=1, accountant="pld", tolerance=0.1
    )
    releases = [(1000, 1000, 1)]
    assert _spent(dp, releases) <= epsilon
    assert _spent(DifferentialPrivacy(dp.noise_multiplier * 0.9, 1.0, 1e-5, accountant="pld"), releases) > epsilon


def test_for_target_orders_and_errors():
    z = [DifferentialPrivacy.for_target(e, clip_norm=1.0, num_clients=3, rounds=5).noise_multiplier for e in (1, 4)]
    assert z[0] > z[1]
    with pytest.raises(ValueError, match="releases nothing"):
        DifferentialPrivacy.for_target(1.0, clip_norm=1.0, num_clients=3, rounds=0)
    with pytest.raises(ValueError, match="clients_per_round"):
        DifferentialPrivacy.for_target(1.0, clip_norm=1.0, num_clients=3, rounds=2, clients_per_round=5)


def _data():
    rng = np.random.default_rng(0)
    clients = []
    for _ in range(3):
        X = rng.uniform(-2, 2, (30, 1))
        clients.append((X, np.sin(2 * X) + 0.1 * rng.normal(size=X.shape)))
    return FederatedDataset(clients, test=clients[0])


def test_a_calibrated_fsgp_run_spends_at_most_the_target():
    dp = DifferentialPrivacy.for_target(
        3.0, 1e-5, clip_norm=50.0, num_clients=3, rounds=0, final_sums=1, phases=("predict",)
    )
    algorithm = FSGP(gpflow.kernels.SquaredExponential(), 5, rounds=2)
    with pytest.warns(DPUtilityWarning):  # three clients at ε = 3: mostly noise, and the run says so
        result = run(algorithm, _data(), runtime=LocalRuntime(protection=Protection(differential_privacy=dp)))
    assert 2.9 < result.privacy["epsilon"] <= 3.0


def test_warning_when_noise_swamps_the_signal():
    loud = DifferentialPrivacy(50.0, 0.01, phases=("predict",))  # tiny C: every client clipped, then much noise
    with pytest.warns(DPUtilityWarning, match=r"noise-to-signal ratio .* \(from the noised release\)") as caught:
        run(
            FSGP(gpflow.kernels.SquaredExponential(), 5, rounds=1),
            _data(),
            runtime=LocalRuntime(protection=Protection(differential_privacy=loud)),
        )
    assert len([w for w in caught if w.category is DPUtilityWarning]) == 1  # once per phase and run
    quiet = DifferentialPrivacy(1e-6, 1e3, phases=("predict",))  # noise std 1e-3, no clipping
    with warnings.catch_warnings():
        warnings.simplefilter("error", DPUtilityWarning)
        run(
            FSGP(gpflow.kernels.SquaredExponential(), 5, rounds=1),
            _data(),
            runtime=LocalRuntime(protection=Protection(differential_privacy=quiet)),
        )


def test_utility_warning_uses_only_the_noised_release():
    rng = np.random.default_rng(0)
    signal = np.full(400, 1.0)
    assert utility_warning("p", {"a": signal + rng.normal(0, 0.1, 400)}, 0.1) is None
    text = utility_warning("p", {"a": signal + rng.normal(0, 10.0, 400)}, 10.0)
    assert "noise-to-signal" in text and "clipped" not in text  # no per-client fact leaks into logs
    assert "inf" in utility_warning("p", {"a": rng.normal(0, 1.0, 400) * 0.5}, 1.0)
