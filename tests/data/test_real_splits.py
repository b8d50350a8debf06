"""PVI's federated splits of the real datasets (``real_split``): standardised, iid or regional clients."""

import numpy as np
import pytest

from gpflow_fed.data import real_split


def test_real_split_is_standardised_and_regional_for_ozone():
    boston = real_split("boston", 0, num_clients=10)
    X, Y = boston.pooled()
    assert boston.num_clients == 10 and X.shape[0] + boston.test[0].shape[0] == 506
    np.testing.assert_allclose([X.mean(0), X.std(0)], [np.zeros(13), np.ones(13)], atol=1e-9)
    with pytest.raises(ValueError, match="no coordinates"):
        real_split("boston", 0, regional=True)

    def spread(fed):  # mean within-client variance of (latitude, longitude), standardised
        return float(np.mean([X[:, :2].var(0).mean() for X, _ in fed.clients]))

    regional, iid = real_split("ozone", 1, 5, max_points=500), real_split("ozone", 1, 5, max_points=500, regional=False)
    assert regional.num_data == iid.num_data == 450
    assert spread(regional) < 0.3 < 0.9 < spread(iid)
