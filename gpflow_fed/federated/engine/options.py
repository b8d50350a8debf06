"""How a run is run (not what protects it): one validated value shared by every runtime."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional, Union

from ...validation import integer
from ..protocol.faults import FaultPolicy

__all__ = ["RunOptions"]


@dataclass(frozen=True)
class RunOptions:
    """The options of a run, the same for every runtime (``run(..., options=RunOptions(...))``).

    :param progress: show a tqdm progress bar over rounds.
    :param keep_payloads: keep every message in the ledger (for privacy audits and tests).
    :param eval_every: evaluate test metrics every this many rounds (0: only at the end). Evaluation runs the
        algorithm's final phases on a copy of the state; its messages are recorded with purpose ``"evaluate"``.
    :param faults: how faulty clients are treated (:class:`~gpflow_fed.federated.FaultPolicy`); by default the
        first fault stops the run with an error naming the client.
    :param checkpoint_dir: write a checkpoint to this folder after every ``checkpoint_every`` rounds (and after the
        last); see :mod:`gpflow_fed.federated.engine.checkpoint`.
    :param checkpoint_every: rounds between checkpoints (≥ 1).
    :param resume: continue from the latest checkpoint in ``checkpoint_dir`` if there is one (else start afresh);
        the result is identical to an uninterrupted run with the same seed.
    :raises ValueError: a bad ``eval_every``/``checkpoint_every``, or ``resume`` without ``checkpoint_dir``.
    :raises TypeError: ``faults`` that is not a :class:`FaultPolicy`.
    """

    progress: bool = False
    keep_payloads: bool = False
    eval_every: int = 0
    faults: FaultPolicy = field(default_factory=FaultPolicy)
    checkpoint_dir: Optional[Union[str, os.PathLike]] = None
    checkpoint_every: int = 1
    resume: bool = False

    def __post_init__(self) -> None:
        integer(self.eval_every, "eval_every", minimum=0)
        integer(self.checkpoint_every, "checkpoint_every", minimum=1)
        faults = FaultPolicy() if self.faults is None else self.faults
        if not isinstance(faults, FaultPolicy):
            raise TypeError(f"faults must be a FaultPolicy, got {type(faults).__name__}")
        object.__setattr__(self, "faults", faults)
        if self.checkpoint_dir is not None:
            object.__setattr__(self, "checkpoint_dir", os.fspath(self.checkpoint_dir))
        object.__setattr__(self, "resume", bool(self.resume))
        if self.resume and self.checkpoint_dir is None:
            raise ValueError("resume=True needs checkpoint_dir, the folder the interrupted run wrote to")
