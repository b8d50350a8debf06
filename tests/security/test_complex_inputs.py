"""Complex data is rejected where it enters, never cast to its real part (which would silently drop data)."""

import gpflow
import numpy as np
import pytest

from gpflow_fed.data import FederatedDataset
from gpflow_fed.models import release
from gpflow_fed.release import obfuscate, synthetic_noise_covariance

X = np.linspace(0, 1, 8)[:, None]
Y = np.sin(6 * X)


def test_federated_dataset_rejects_complex_inputs_and_outputs():
    with pytest.raises(TypeError, match=r"X is complex"):
        FederatedDataset([(X + 0j, Y), (X, Y)])
    with pytest.raises(TypeError, match=r"Y is complex"):
        FederatedDataset([(X, Y), (X, Y * 1j)])


def test_privacy_release_rejects_complex_inputs_and_outputs():
    k = gpflow.kernels.SquaredExponential(lengthscales=0.3)
    with pytest.raises(TypeError, match=r"X is complex"):
        release((X + 1j, Y), [[0.5]], 0.1, kernel=k, noise_variance=0.0)
    with pytest.raises(TypeError, match=r"Y is complex"):
        release((X, Y + 1j), [[0.5]], 0.1, kernel=k, noise_variance=0.0)
    with pytest.raises(TypeError, match=r"sensitive inputs is complex"):
        synthetic_noise_covariance(k, X, [[0.5 + 0.1j]], 0.1)
    Sigma = synthetic_noise_covariance(k, X, [[0.5]], 0.1)
    with pytest.raises(TypeError, match=r"Y is complex"):
        obfuscate(Y.astype(np.complex128), Sigma)
    assert obfuscate(Y, Sigma).dtype == np.float64  # real data pass
