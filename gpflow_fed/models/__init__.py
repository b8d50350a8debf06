"""GPflow models of gpflow-fed."""

__all__: list = []
