"""gpflow-fed: federated and privacy-aware Gaussian processes for GPflow 2.

Importing the package activates its GPflow dispatch registrations (``Kuu``/``Kuf``, posteriors).
"""

__version__ = "0.1.0"

from . import data, federated, metrics, models  # noqa: E402

__all__ = ["data", "federated", "metrics", "models", "__version__"]
