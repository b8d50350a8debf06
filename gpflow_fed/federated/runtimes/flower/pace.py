"""The pace of a Flower run: how many exchanges it makes and how long each takes, measured as it goes.

On a deployment every exchange (one stage sent to the cohort and its replies, :class:`~.transport.GridTransport`)
costs at least a SuperNode's polling and a new ClientApp process per party, so a run's time is about its exchanges
times the seconds of one. A job makes its secure-aggregation set-up once (``advertise``, ``share``, ``store``:
:data:`~..protocol.transport.SETUP_STAGES`) and then, for each phase of each round and each final phase,
one exchange per stage of a protected phase (the update, then the protocol's ``masked_input`` … ``unmask``) or one
for a plain phase.
:func:`job_shape` reads those two numbers off a finished job's stages, :func:`expected_exchanges` applies them to an
algorithm, and :func:`round_line` is the server's progress line for a round, with the time left at its pace.

No TensorFlow and no Flower are imported here.
"""

from __future__ import annotations

from typing import Sequence, Tuple

from ...protocol.transport import SETUP_STAGES

__all__ = ["expected_exchanges", "job_shape", "round_line"]


def _stage(group: str) -> str:
    return group.rsplit("/", 1)[-1]


def job_shape(groups: Sequence[str]) -> Tuple[int, float]:
    """``(set-up exchanges, exchanges per phase)`` of a finished job from its stages' groups
    (``purpose/round/phase[/secagg/stage]/stage``, :attr:`~.transport.GridTransport.groups`); ``(0, 1.0)`` for a
    job without phases."""
    setup = sum(1 for g in groups if _stage(g) in SETUP_STAGES)
    phases = {"/".join(g.split("/")[:3]) for g in groups if _stage(g) not in SETUP_STAGES}
    return setup, (len(groups) - setup) / len(phases) if phases else 1.0


def expected_exchanges(phases_per_round: Sequence[int], final_phases: int, setup: int, per_phase: float) -> int:
    """The exchanges of a job whose rounds have ``phases_per_round`` phases and which ends with ``final_phases``,
    made with ``setup`` set-up exchanges and ``per_phase`` exchanges per phase (:func:`job_shape`)."""
    return int(setup + round((sum(phases_per_round) + final_phases) * per_phase))


def round_line(
    r: int, rounds: int, clients: int, groups: Sequence[str], seconds: Sequence[float], final_phases: int
) -> str:
    """The progress line of round ``r`` (0-based) of ``rounds``: its clients, exchanges and seconds (``groups`` and
    ``seconds``: its stages, :attr:`~.transport.GridTransport.groups` and ``.seconds``), and the time the run has
    left at this round's pace (its exchanges but the set-up's, for every round left and the ``final_phases``)."""
    spent = float(sum(seconds))
    line = f"round {r + 1}/{rounds}: {clients} clients, {len(groups)} exchanges, {spent:.1f} s"
    if not groups:
        return line
    each = spent / len(groups)
    setup, per_phase = job_shape(groups)
    per_round = len(groups) - setup
    left = (rounds - r - 1) * per_round + round(final_phases * per_phase)
    return line + f" ({each:.1f} s each); about {left * each / 60:.1f} min left ({left} exchanges)"
