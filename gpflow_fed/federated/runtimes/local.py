"""LocalRuntime: every client in one process; the reference behaviour of every algorithm."""

from __future__ import annotations

import os
from typing import Dict, Mapping, Optional, Sequence, Union

from ..protection.dp import DifferentialPrivacy
from ..protection.masking import SecureAggregation
from ..protection.robust import RobustAggregation
from ..messages import Message
from ..aggregator import Aggregator, ExchangeContext
from ..faults import FaultPolicy
from ..transport import Broadcast, Reply
from .loop import RoundLoopRuntime


class LocalRuntime(RoundLoopRuntime):
    """Runs an :class:`Algorithm` with all clients in this process.

    :param progress: show a tqdm progress bar over rounds.
    :param keep_payloads: keep every message in the ledger (for privacy audits and tests).
    :param faults: how faulty clients are treated (see :class:`FaultPolicy`); by default the first fault
        stops the run with an error naming the client.
    :param eval_every: evaluate test metrics every this many rounds (0: only at the end). Evaluation runs
        the algorithm's final phases on a copy of the state; its messages are recorded with purpose
        ``"evaluate"`` so they can be told apart from training traffic.
    :param secure_aggregation: ``True`` (or a :class:`~gpflow_fed.federated.SecureAggregation`) to mask every
        ``"sum"``/``"mean"`` payload with pads from X25519 key agreement between neighbours of a sparse masking
        graph, so the server and the ledger see only masked payloads and the exact sum (see
        :mod:`gpflow_fed.federated.aggregator` and the threat-model guide). A cohort below
        ``SecureAggregation.min_cohort`` (≥ 2) fails the round before anything is sent.
    :param differential_privacy: a :class:`~gpflow_fed.federated.DifferentialPrivacy`: clients clip their
        payloads, the server adds Gaussian noise to each sum; the spent (ε, δ) is in ``result.privacy`` and
        the cumulative ε in each round's history (``"epsilon"``).
    :param robust: a :class:`~gpflow_fed.federated.RobustAggregation` (coordinate-wise weighted median or
        trimmed mean) for every ``"mean"`` phase, so a few malicious clients cannot drag the average; not with
        secure aggregation or DP (they hide or noise the individual payloads it needs).
    :param checkpoint_dir: write a checkpoint to this folder after every ``checkpoint_every`` rounds (and
        after the last); see :mod:`gpflow_fed.federated.checkpoint`.
    :param checkpoint_every: rounds between checkpoints (≥ 1).
    :param resume: continue from the latest checkpoint in ``checkpoint_dir`` if there is one (else start
        afresh); the result is identical to an uninterrupted run with the same seed.
    :raises ValueError: a collect phase with secure aggregation or DP (at the start of the run), a bad
        ``eval_every``/``checkpoint_every``, ``resume`` without ``checkpoint_dir``, or a checkpoint written
        by a different run.
    """

    def __init__(
        self,
        *,
        progress: bool = False,
        keep_payloads: bool = False,
        eval_every: int = 0,
        faults: Optional[FaultPolicy] = None,
        secure_aggregation: Union[bool, SecureAggregation] = False,
        differential_privacy: Optional[DifferentialPrivacy] = None,
        robust: Optional[RobustAggregation] = None,
        checkpoint_dir: Optional[Union[str, os.PathLike]] = None,
        checkpoint_every: int = 1,
        resume: bool = False,
    ) -> None:
        super().__init__(
            progress=progress,
            keep_payloads=keep_payloads,
            eval_every=eval_every,
            faults=faults,
            aggregator=Aggregator(secure=secure_aggregation, dp=differential_privacy, robust=robust),
            checkpoint_dir=checkpoint_dir,
            checkpoint_every=checkpoint_every,
            resume=resume,
        )

    def exchange(self, broadcast: Broadcast, cohort: Sequence[str]) -> Dict[str, Reply]:
        """The clients one after the other, in this process (the first fault raises at once under
        ``FaultPolicy(on_error="raise")``)."""
        return {cid: self.pool.ask(cid, broadcast, len(cohort), raise_now=True) for cid in cohort}

    def masked(self, context: ExchangeContext, replies: Mapping[str, Reply]) -> Dict[str, Message]:
        """Each client of the fixed cohort masks its prepared message against it."""
        return {cid: self.aggregator.mask(reply.prepared, context) for cid, reply in replies.items()}


__all__ = ["LocalRuntime"]
