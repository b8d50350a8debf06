"""FederatedDataset: the private data of K clients plus an optional held-out test set."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import gpflow
import numpy as np

from ..validation import party_key, party_name, party_names
from .standardize import Standardizer, agreed_standardizer

RegressionArrays = Tuple[np.ndarray, np.ndarray]


def validate_regression_data(X: object, Y: object, what: str) -> RegressionArrays:
    """Check one ``(X, Y)`` pair and return it as 2-D arrays of ``gpflow.default_float()``.

    :raises TypeError: if X or Y is not numeric or is complex.
    :raises ValueError: wrong rank, mismatched rows, no rows, or NaN/inf values; the message names ``what``.
    """
    arrays = []
    for name, value in (("X", X), ("Y", Y)):
        try:
            array = np.asarray(value)
        except Exception as exc:  # pragma: no cover - numpy conversion errors vary
            raise TypeError(f"{what}: {name} cannot be converted to an array ({exc})") from exc
        if not (np.issubdtype(array.dtype, np.number) or array.dtype == bool):
            raise TypeError(f"{what}: {name} must be numeric, got dtype {array.dtype}")
        if np.iscomplexobj(array):
            raise TypeError(
                f"{what}: {name} is complex ({array.dtype}); casting would drop the imaginary part — "
                "pass real values (e.g. stack .real and .imag as separate columns)"
            )
        if name == "Y" and array.ndim == 1:
            array = array[:, None]
        if array.ndim != 2:
            raise ValueError(f"{what}: {name} must have rank 2 ([N, D] / [N, P]), got shape {array.shape}")
        array = array.astype(gpflow.default_float())
        if not np.all(np.isfinite(array)):
            raise ValueError(f"{what}: {name} contains NaN or inf values")
        arrays.append(array)
    X_arr, Y_arr = arrays
    if X_arr.shape[0] != Y_arr.shape[0]:
        raise ValueError(f"{what}: X has {X_arr.shape[0]} rows but Y has {Y_arr.shape[0]}")
    if X_arr.shape[0] == 0:
        raise ValueError(f"{what}: has no data (0 rows)")
    return X_arr, Y_arr


@dataclass(frozen=True)
class FederatedDataset:
    """The data of K clients, each a private ``(X_k, Y_k)`` pair, and an optional test set.

    The object is a simulation convenience: a runtime hands each client only its own pair. Inputs are
    validated on construction (rank, matching rows, finite values, no empty client, one input dimension
    D and output dimension P across clients) and converted to ``gpflow.default_float()``.

    :param clients: ``[(X_1, Y_1), ..., (X_K, Y_K)]`` with ``X_k: [N_k, D]`` and ``Y_k: [N_k, P]``
        (a 1-D ``Y_k`` is read as ``[N_k, 1]``).
    :param test: optional held-out ``(X, Y)``, never given to a client.
    :param name: a label used in logs and tables.
    :param client_names: optional name of each client (e.g. the party column's values of
        :func:`~gpflow_fed.data.federated_from_table`), distinct, one per client; kept by :meth:`standardized`.
        Each goes through :func:`~gpflow_fed.validation.party_name` (NFKC, control characters refused); look-alike
        names (equal after NFKC and case folding) are refused.
    """

    clients: Sequence[RegressionArrays]
    test: Optional[RegressionArrays] = None
    name: str = "dataset"
    client_names: Optional[Sequence[str]] = None

    def __post_init__(self) -> None:
        clients = list(self.clients) if self.clients is not None else []
        if len(clients) == 0:
            raise ValueError("FederatedDataset needs at least one client, got none")
        checked = []
        for k, pair in enumerate(clients):
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise TypeError(f"client {k}: expected an (X, Y) pair, got {type(pair).__name__}")
            checked.append(validate_regression_data(pair[0], pair[1], f"client {k}"))
        input_dims = {X.shape[1] for X, _ in checked}
        if len(input_dims) != 1:
            dims = [X.shape[1] for X, _ in checked]
            raise ValueError(f"clients have inconsistent input dimensions D: {dims}")
        output_dims = {Y.shape[1] for _, Y in checked}
        if len(output_dims) != 1:
            dims = [Y.shape[1] for _, Y in checked]
            raise ValueError(f"clients have inconsistent output dimensions P: {dims}")
        object.__setattr__(self, "clients", tuple(checked))
        if self.client_names is not None:
            raw = list(self.client_names)
            if len(raw) != len(checked):
                raise ValueError(f"client_names must be {len(checked)} distinct names, one per client, got {len(raw)}")
            names = tuple(party_name(n, f"client_names[{k}]") for k, n in enumerate(raw))
            if len({party_key(n) for n in names}) != len(names):
                party_names(raw, "client_names")  # raises, naming the two look-alike names
                raise ValueError(f"client_names must be {len(checked)} distinct names, one per client, got {names}")
            object.__setattr__(self, "client_names", names)
        if self.test is not None:
            X_test, Y_test = validate_regression_data(self.test[0], self.test[1], "test set")
            if X_test.shape[1] != self.input_dim:
                raise ValueError(f"test set has input dimension {X_test.shape[1]}, clients have {self.input_dim}")
            if Y_test.shape[1] != self.output_dim:
                raise ValueError(f"test set has output dimension {Y_test.shape[1]}, clients have {self.output_dim}")
            object.__setattr__(self, "test", (X_test, Y_test))

    @property
    def num_clients(self) -> int:
        """K."""
        return len(self.clients)

    @property
    def input_dim(self) -> int:
        """D."""
        return int(self.clients[0][0].shape[1])

    @property
    def output_dim(self) -> int:
        """P."""
        return int(self.clients[0][1].shape[1])

    @property
    def names(self) -> Tuple[str, ...]:
        """The clients' names: ``client_names``, or ``client_0 … client_{K-1}`` (the runtimes' client ids)."""
        return tuple(self.client_names or (f"client_{k}" for k in range(self.num_clients)))

    @property
    def client_sizes(self) -> Tuple[int, ...]:
        """``(N_1, ..., N_K)``."""
        return tuple(int(X.shape[0]) for X, _ in self.clients)

    @property
    def num_data(self) -> int:
        """N = Σ_k N_k."""
        return int(sum(self.client_sizes))

    def pooled(self) -> RegressionArrays:
        """All client data stacked: only for centralized baselines and oracles, never for federation."""
        X = np.concatenate([X for X, _ in self.clients], axis=0)
        Y = np.concatenate([Y for _, Y in self.clients], axis=0)
        return X, Y

    def standardized(self) -> Tuple["FederatedDataset", Standardizer]:
        """Standardise inputs and outputs with global statistics computed without pooling raw data.

        Each client contributes only ``(N_k, column means, column sums of squared deviations)`` of its
        ``[X_k, Y_k]``; the server combines them into the pooled mean and standard deviation exactly (see
        :mod:`gpflow_fed.data.standardize`). Every client and the test set are then transformed with them.

        :return: the standardised dataset and the :class:`~gpflow_fed.data.standardize.Standardizer` (use its
            ``inverse_transform`` to report predictions in data units).
        """
        scaler = agreed_standardizer(self.clients)
        return self.transformed(scaler), scaler

    def transformed(self, scaler: Standardizer) -> "FederatedDataset":
        """Every client's rows and the test set transformed with ``scaler`` (e.g. moments the parties agreed), each
        party's with its own rows only; names and the dataset's name kept."""
        clients = [scaler.transform(X, Y) for X, Y in self.clients]
        test = None if self.test is None else scaler.transform(*self.test)
        return FederatedDataset(clients=clients, test=test, name=self.name, client_names=self.client_names)

    def __repr__(self) -> str:
        test = "none" if self.test is None else str(self.test[0].shape[0])
        return (
            f"FederatedDataset(name={self.name!r}, K={self.num_clients}, N={self.num_data}, D={self.input_dim}, "
            f"P={self.output_dim}, sizes={self._sizes()}, test={test})"
        )

    def _sizes(self) -> str:
        if self.client_names is None:
            return str(list(self.client_sizes))
        return "{" + ", ".join(f"{n}: {size}" for n, size in zip(self.client_names, self.client_sizes)) + "}"
