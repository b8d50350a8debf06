"""``gpflow.monitor`` tasks for federated rounds: per-round scalars to TensorBoard.

A runtime calls its monitor after every round ``r`` (0-based) as
``monitor(r, history=history, state=state, algorithm=algorithm)``, where ``history[-1]`` is the round's
record (see :class:`gpflow_fed.federated.FederatedResult`). The tasks here read that record, so they work
for every algorithm without knowing its state::

    from gpflow_fed.monitor import federated_monitor

    monitor = federated_monitor("runs/fsgp")
    result = gpflow_fed.federated.run(algorithm, dataset, monitor=monitor)
    # tensorboard --logdir runs/fsgp

Tag names (one TensorBoard scalar per tag, step = round):

* ``communication/bytes_up``, ``communication/bytes_down``: bytes sent this round by the clients / the
  server; ``communication/total_bytes``: cumulative bytes in both directions up to and including this round;
* ``round/clients``, ``round/seconds``: clients asked and wall time of the round;
* ``test/rmse``, ``test/mae``, ``test/nlpd``: test metrics, on the rounds where the runtime evaluated them
  (``RunOptions(eval_every=...)``);
* ``algorithm/<name>``: every other finite scalar the algorithm reported (e.g. the FSGP clients' mean
  local bound F_k of eq. 9 of the FSGP paper, weighted by N_k).
"""

from __future__ import annotations

from numbers import Real
from typing import Any, Dict, Iterable, Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf
from gpflow.monitor import Monitor, MonitorTask, MonitorTaskGroup, ScalarToTensorBoard, ToTensorBoard

from .validation import integer

__all__ = [
    "BYTES_TAGS",
    "HistoryToTensorBoard",
    "ScalarsToTensorBoard",
    "federated_monitor",
    "round_scalars",
    "write_scalars",
]

#: History keys with a fixed tag; every other numeric key goes under ``algorithm/``.
_FIXED_TAGS: Mapping[str, str] = {
    "bytes_up": "communication/bytes_up",
    "bytes_down": "communication/bytes_down",
    "clients": "round/clients",
    "seconds": "round/seconds",
}
BYTES_TAGS = ("communication/bytes_up", "communication/bytes_down", "communication/total_bytes")
_SKIPPED = frozenset({"round"})


def _scalar(value: Any) -> Optional[float]:
    """``value`` as a finite float, or ``None`` when it is not a finite real scalar."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (Real, np.number)) or (isinstance(value, np.ndarray) and value.size == 1):
        out = float(np.asarray(value).reshape(()))
        return out if np.isfinite(out) else None
    return None


def _tag(key: str) -> str:
    if key in _FIXED_TAGS:
        return _FIXED_TAGS[key]
    if key.startswith("test_"):
        return "test/" + key[len("test_") :]
    return "algorithm/" + key


def round_scalars(history: Sequence[Mapping[str, Any]]) -> Dict[str, float]:
    """The TensorBoard scalars of the latest round of ``history``, ``{tag: value}``.

    Non-numeric and non-finite entries are left out (a NaN bound is not plotted as a point). The
    cumulative ``communication/total_bytes`` is ``Σ_{r' ≤ r} (bytes_up_{r'} + bytes_down_{r'})``.

    :param history: the per-round records so far (``history[-1]`` is the current round).
    :raises ValueError: if ``history`` is empty.
    """
    if len(history) == 0:
        raise ValueError("round_scalars needs at least one round in the history; call it after a round")
    out: Dict[str, float] = {}
    for key, value in history[-1].items():
        if key in _SKIPPED:
            continue
        scalar = _scalar(value)
        if scalar is not None:
            out[_tag(str(key))] = scalar
    if "bytes_up" in history[-1] or "bytes_down" in history[-1]:
        out["communication/total_bytes"] = float(
            sum(float(h.get("bytes_up", 0)) + float(h.get("bytes_down", 0)) for h in history)
        )
    return out


class HistoryToTensorBoard(ToTensorBoard):
    """Writes the latest round's record (see :func:`round_scalars`) to TensorBoard.

    A :class:`gpflow.monitor.ToTensorBoard` task: call it as ``task(round, history=history, ...)``; other
    keyword arguments (``state``, ``algorithm``) are accepted and ignored.

    :param log_dir: the TensorBoard log directory.
    :param include: if given, only these tags are written (e.g. ``("test/rmse", "algorithm/bound")``).
    """

    def __init__(self, log_dir: str, include: Optional[Iterable[str]] = None) -> None:
        super().__init__(str(log_dir))
        self.include = None if include is None else frozenset(include)

    def run(self, *, history: Sequence[Mapping[str, Any]], **unused_kwargs: Any) -> None:  # type: ignore[override]  # MonitorTaskGroup passes history= by keyword
        for tag, value in round_scalars(history).items():
            if self.include is None or tag in self.include:
                tf.summary.scalar(tag, value, step=self.current_step)


class ScalarsToTensorBoard(ToTensorBoard):
    """Writes a fixed mapping ``{tag: value}`` at the step it is called with (e.g. final comparisons).

    :param log_dir: the TensorBoard log directory.
    :param scalars: the values to write; each must be a finite real number.
    :raises TypeError: if a value is not a real number.
    :raises ValueError: if a value is not finite.
    """

    def __init__(self, log_dir: str, scalars: Mapping[str, float]) -> None:
        super().__init__(str(log_dir))
        checked: Dict[str, float] = {}
        for tag, value in scalars.items():
            if isinstance(value, bool) or not isinstance(value, (Real, np.number)):
                raise TypeError(f"scalar {tag!r} must be a real number, got {type(value).__name__}")
            if not np.isfinite(float(value)):
                raise ValueError(f"scalar {tag!r} is not finite ({value!r}); TensorBoard would plot nothing useful")
            checked[str(tag)] = float(value)
        self.scalars = checked

    def run(self, **unused_kwargs: Any) -> None:
        for tag, value in self.scalars.items():
            tf.summary.scalar(tag, value, step=self.current_step)


def write_scalars(log_dir: str, scalars: Mapping[str, float], step: int) -> None:
    """Write ``{tag: value}`` to TensorBoard at ``step`` once (a one-off :class:`ScalarsToTensorBoard`)."""
    ScalarsToTensorBoard(log_dir, scalars)(step)


def federated_monitor(
    log_dir: str,
    *,
    period: int = 1,
    include: Optional[Iterable[str]] = None,
    extra_tasks: Sequence[MonitorTask] = (),
    callbacks: Optional[Mapping[str, Any]] = None,
) -> Monitor:
    """A :class:`gpflow.monitor.Monitor` that logs every ``period``-th round of a federated run.

    :param log_dir: the TensorBoard log directory (created when first written).
    :param period: write rounds ``r`` with ``r % period == 0`` (a :class:`gpflow.monitor.MonitorTaskGroup`).
    :param include: only write these tags (default: all of :func:`round_scalars`).
    :param extra_tasks: more ``gpflow.monitor`` tasks run in the same group (they receive ``history``,
        ``state`` and ``algorithm`` as keyword arguments).
    :param callbacks: ``{tag: f}`` with ``f(history=..., state=..., algorithm=...) -> float``, each wrapped
        in a :class:`gpflow.monitor.ScalarToTensorBoard` (e.g. a learned hyperparameter read from the state).
    :return: the monitor to pass to :func:`gpflow_fed.federated.run`.
    :raises ValueError: if ``period`` is not a positive integer.
    :raises TypeError: if an extra task is not a ``gpflow.monitor.MonitorTask`` or a callback not callable.
    """
    period = integer(period, "period", minimum=1)
    tasks: list = [HistoryToTensorBoard(log_dir, include=include)]
    for task in extra_tasks:
        if not isinstance(task, MonitorTask):
            raise TypeError(f"extra_tasks must be gpflow.monitor.MonitorTask instances, got {type(task).__name__}")
        tasks.append(task)
    for tag, callback in (callbacks or {}).items():
        if not callable(callback):
            raise TypeError(f"callback for {tag!r} must be callable, got {type(callback).__name__}")
        tasks.append(ScalarToTensorBoard(str(log_dir), callback, str(tag)))
    return Monitor(MonitorTaskGroup(tasks, period=int(period)))
