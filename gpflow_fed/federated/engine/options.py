"""How a run is run (not what protects it): one validated value shared by every runtime."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Union

from ...validation import config_option, dataclass_from_config, dataclass_to_config, integer
from ..protocol.faults import FaultPolicy

__all__ = ["RunOptions"]


@dataclass(frozen=True)
class RunOptions:
    """The options of a run, the same for every runtime (``run(..., options=RunOptions(...))``).

    :param progress: show a tqdm progress bar over rounds.
    :param keep_payloads: keep every message in the ledger (for privacy audits and tests).
    :param eval_every: evaluate test metrics every this many rounds (0: only at the end). Evaluation runs the
        algorithm's ``evaluation_phases()`` (by default its final phases) on a copy of the state; its messages are
        recorded with purpose ``"evaluate"``.
    :param faults: how faulty clients are treated (:class:`~gpflow_fed.federated.FaultPolicy`); by default the
        first fault stops the run with an error naming the client.
    :param checkpoint_dir: write a checkpoint to this folder after every ``checkpoint_every`` rounds (and after the
        last); see :mod:`gpflow_fed.federated.engine.checkpoint`.
    :param checkpoint_every: rounds between checkpoints (≥ 1).
    :param resume: continue from the latest checkpoint in ``checkpoint_dir`` if there is one (else start afresh);
        the result is identical to an uninterrupted run with the same seed.
    :raises ValueError: a bad ``eval_every``/``checkpoint_every``, or ``resume`` without ``checkpoint_dir``.
    :raises TypeError: ``faults`` that is not a :class:`FaultPolicy`.

    **One vocabulary.** Every field has one config key, its name with ``-`` for ``_`` (the faults' keys inlined):
    ``progress``, ``keep-payloads``, ``eval-every``, ``on-error``, ``min-clients``, ``timeout``, ``checkpoint-dir``,
    ``checkpoint-every``, ``resume``. The same keys are a Flower run config's
    (:func:`~gpflow_fed.federated.runtimes.flower.server_app.options_from_config` is :meth:`from_config`; the
    app's defaults are :meth:`to_config` of ``RunOptions()``) and the command line's options (``--on-error``, …,
    generated from these fields by :func:`gpflow_fed.cli.options.add_run_option_arguments`), each with the default
    here. :meth:`to_config` writes TOML values: None as ``""`` (``checkpoint-dir``) or ``0.0`` (``timeout``);
    :meth:`from_config` reads them strictly (a bool is ``true``/``false``; other keys are ignored, a key spelt with
    ``_`` is refused).
    """

    progress: bool = field(default=False, metadata=config_option("bool", "show a progress bar over rounds"))
    keep_payloads: bool = field(
        default=False, metadata=config_option("bool", "keep every message's arrays in the ledger (privacy audits)")
    )
    eval_every: int = field(
        default=0,
        metadata=config_option("int", "evaluate test metrics every this many rounds (0: only at the end)", minimum=0),
    )
    faults: FaultPolicy = field(
        default_factory=FaultPolicy, metadata=config_option("nested", "the fault policy", type=FaultPolicy)
    )
    checkpoint_dir: Optional[Union[str, os.PathLike]] = field(
        default=None,
        metadata=config_option(
            "path", "write a checkpoint to this folder every --checkpoint-every rounds and after the last"
        ),
    )
    checkpoint_every: int = field(default=1, metadata=config_option("int", "rounds between checkpoints", minimum=1))
    resume: bool = field(
        default=False,
        metadata=config_option(
            "bool", "continue from the latest checkpoint in --checkpoint-dir, if there is one (else start afresh)"
        ),
    )

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

    def to_config(self) -> Dict[str, Any]:
        """Every option as ``{key: TOML value}`` (class docstring); ``from_config(o.to_config()) == o``."""
        return dataclass_to_config(self)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "RunOptions":
        """The options a config describes (:meth:`to_config`'s keys, each optional: a missing key is the default, so
        ``RunOptions.from_config({}) == RunOptions()``; other keys are ignored; see
        :func:`~gpflow_fed.validation.dataclass_from_config`).

        :raises ValueError: a value of the wrong kind (``resume = "yes"``, ``min-clients = 1.5``) or out of range,
            naming its key; a key spelt with ``_``; ``resume`` without ``checkpoint-dir``.
        """
        return dataclass_from_config(cls, config)
