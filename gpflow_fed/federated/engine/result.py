"""FederatedResult: what a run returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import gpflow

from ..protocol.ledger import CommunicationLedger


@dataclass
class FederatedResult:
    """The outcome of :func:`gpflow_fed.federated.run`.

    :param model: a GPflow model built from the server state alone, ready for ``predict_f``/``predict_y``.
    :param history: one dict per round (``round``, ``clients``, ``bytes_up``, ``bytes_down``, ``seconds``,
        the algorithm's metrics, and ``test_rmse``/``test_nlpd`` where evaluated).
    :param ledger: every message that crossed the channel.
    :param state: the server's final state.
    :param metrics: test metrics of ``model`` when the dataset has a test set.
    :param seconds: wall time of the whole run.
    :param privacy: with differential privacy, the spent ``epsilon`` at ``delta`` and the mechanism's
        settings (see :class:`gpflow_fed.federated.DifferentialPrivacy`); None otherwise.
    :param algorithm: the run's own bound copy of the algorithm (``Algorithm.bind``), with whatever it kept.
    :param accountant: with differential privacy, the run's accountant (its releases compose with another run's on
        the same data: :func:`gpflow_fed.fit` reports the moments' and the training's together); None otherwise.
    :param standardizer: set by :func:`gpflow_fed.fit`: the :class:`~gpflow_fed.data.Standardizer` between the
        data's units and the model's (None from ``run``).
    """

    model: gpflow.models.GPModel
    history: List[Dict[str, Any]]
    ledger: CommunicationLedger
    state: Any
    metrics: Dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    privacy: Optional[Dict[str, Any]] = None
    algorithm: Optional[Any] = None
    standardizer: Optional[Any] = None
    accountant: Optional[Any] = field(default=None, repr=False)

    def __repr__(self) -> str:
        """One line: model, rounds, seconds, bytes, test metrics and privacy (the history is not printed)."""
        parts = [
            f"model={type(self.model).__name__}",
            f"rounds={len(self.history)}",
            f"seconds={self.seconds:.2f}",
            f"bytes={self.ledger.total_bytes():,}",
        ]
        parts += [f"{k}={v:.4g}" for k, v in self.metrics.items()]
        if self.privacy:
            parts += [f"{k}={self.privacy[k]:.4g}" for k in ("epsilon", "delta") if k in self.privacy]
        return f"FederatedResult({', '.join(parts)})"
