"""gpflow-fed: federated and privacy-aware Gaussian processes for GPflow 2.

Importing the package activates its GPflow dispatch registrations (``Kuu``/``Kuf``, posteriors, ``prior_kl``).
"""

__version__ = "0.1.0"

from . import (  # noqa: E402
    baselines,
    covariances,
    data,
    federated,
    inducing_variables,
    kernels,
    likelihoods,
    metrics,
    models,
    monitor,
    posteriors,
)

__all__ = [
    "__version__",
    "baselines",
    "covariances",
    "data",
    "federated",
    "inducing_variables",
    "kernels",
    "likelihoods",
    "metrics",
    "models",
    "monitor",
    "posteriors",
]
