"""One accountant per data set (issue 43, attack 5): ``fit`` agrees the moments in a noised exchange first, and its
``result.privacy`` composes those releases with the training's (the ε it reported left them out)."""

import warnings

import numpy as np
import pytest

from gpflow_fed import fit
from gpflow_fed.data import FederatedDataset
from gpflow_fed.federated import DifferentialPrivacy, DistributedDP, Protection
from gpflow_fed.federated.protection.distributed_dp import DistributedPrivacyAccountant
from gpflow_fed.federated.protection.dp import PrivacyAccountant
from gpflow_fed.fitting import standardize


def _data(K=4, N=25, seed=0):
    rng = np.random.default_rng(seed)
    clients = []
    for _ in range(K):
        X = rng.uniform(-2, 2, (N, 1))
        clients.append((X, np.sin(2 * X) + 0.1 * rng.standard_normal((N, 1))))
    return FederatedDataset(clients=clients)


# noise std z·c = 0.05: far below the magnitudes' one-hot threshold ½ and the clipped summed count (≈ 2.5), so the
# moments come out right whatever the OS noise; at z = 2 the noised count was ≤ 0 in a few % of runs (the test is
# about the accounting, which does not depend on z)
@pytest.mark.parametrize(
    "dp, accountant_class",
    [
        (DistributedDP(noise_multiplier=0.05, clip_norm=1.0, honest_clients=4), DistributedPrivacyAccountant),
        (DifferentialPrivacy(noise_multiplier=0.05, clip_norm=1.0), PrivacyAccountant),
    ],
    ids=["distributed", "central"],
)
def test_fit_reports_the_moments_and_the_training_together(dp, accountant_class):
    data = _data()
    protection = Protection(differential_privacy=dp)
    with warnings.catch_warnings():  # DP's utility warnings on a run this small
        warnings.simplefilter("ignore")
        result = fit(data, "fsgp", rounds=2, num_inducing=4, local_steps=1, protection=protection, seed=1)
        _, _, moments = standardize(data, protection=protection, seed=1)
    assert moments.accountant.releases, "the moments exchange is a noised release"
    training = [r for r in result.accountant.releases][len(moments.accountant.releases) :]
    assert list(result.accountant.releases[: len(moments.accountant.releases)]) == list(moments.accountant.releases)
    assert training, "and so is the training"
    only_training = accountant_class(dp)
    only_training.restore(training)
    everything = accountant_class(dp)
    everything.restore([*moments.accountant.releases, *training])
    assert result.privacy["epsilon"] == pytest.approx(everything.epsilon(), rel=1e-9)
    assert result.privacy["epsilon"] > only_training.epsilon() * (1 + 1e-6)  # the control: what was reported before
    assert any(p.startswith("moments/") for p in result.privacy["phases"])
    assert result.privacy["releases"] == everything.report()["releases"]


def test_without_dp_fit_reports_no_privacy():
    result = fit(_data(K=3), "fsgp", rounds=1, num_inducing=4, local_steps=1, seed=0)
    assert result.privacy is None and result.accountant is None
