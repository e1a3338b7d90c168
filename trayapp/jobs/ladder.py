"""The stop ladder: how a job is stopped, step by step, as a pure function of where the stop
stands and the time (after earlyoom's ``kill_wait``).

The steps: ask the runner (its own stop checkpoints, ends ``fit()`` at the next batch and
exits), SIGINT to the process group (CTRL_BREAK_EVENT on Windows), SIGTERM to the tree, SIGKILL
to the tree, again while any of it is left. Each step has its time before the next is due. The
job manager takes the steps (``trayapp.jobs.control``); this module only says which and when.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Optional

# Seconds spent at each step before the next one.
# A runner that answers "stopping" (a fit() runs) gets the longer time to reach the batch and
# save, unless the guard asked (its last resort when memory runs out).
STOP_ASK_SECONDS = 5.0
STOP_RUNNER_SECONDS = 60.0
STOP_INT_SECONDS = 3.0  # SIGINT (CTRL_BREAK_EVENT on Windows)
STOP_TERM_SECONDS = 3.0  # SIGTERM; then SIGKILL
KILL_WAIT_SECONDS = 5.0  # after SIGKILL, how long to wait for the tree to vanish


class Stage(IntEnum):
    """Where a stop stands: the last step taken."""

    NONE = 0
    ASK = 1  # the runner was asked to stop
    INT = 2  # SIGINT to the group
    TERM = 3  # SIGTERM to the tree
    KILL = 4  # SIGKILL to the tree


@dataclass(frozen=True)
class Step:
    """A step to take now: ``stage``; the next one is due at ``due`` (monotonic)."""

    stage: Stage
    due: float


def wait_after(stage: Stage) -> float:
    """Seconds from taking ``stage`` to the next step (read at the call: tests shorten them)."""
    return {
        Stage.NONE: 0.0,
        Stage.ASK: STOP_ASK_SECONDS,
        Stage.INT: STOP_INT_SECONDS,
        Stage.TERM: STOP_TERM_SECONDS,
        Stage.KILL: KILL_WAIT_SECONDS,
    }[stage]


def step(stage: Stage, now: float) -> Step:
    return Step(stage, now + wait_after(stage))


def first_step(now: float, *, hooked: bool, ask: bool = True, force: bool = False) -> Step:
    """The first step of a stop: SIGKILL when forced, the runner when it hooked ``fit`` (and
    asking is wanted: the engine on its way out does not wait), else SIGINT."""
    if force:
        return step(Stage.KILL, now)
    if ask and hooked:
        return step(Stage.ASK, now)
    return step(Stage.INT, now)


def next_step(
    stage: Stage,
    due: float,
    now: float,
    *,
    remnants: bool = True,
    runner_gone: bool = False,
    force: bool = False,
) -> Optional[Step]:
    """The step to take at ``now`` for a stop at ``stage`` whose next step is due at ``due``;
    None when none is due yet (or nothing is left to stop).

    ``runner_gone``: the runner cannot be asked (its channel closed, or it exited with
    processes left): no one left to wait for. ``force``: straight to SIGKILL.
    ``remnants``: processes of the tree still run (after SIGKILL only those matter)."""
    if force and stage < Stage.KILL:
        return step(Stage.KILL, now)
    if stage == Stage.ASK and runner_gone:
        return step(Stage.INT, now)
    if now < due:
        return None
    if stage < Stage.KILL:
        return step(Stage(stage + 1), now)
    if remnants:
        # SIGKILL did not end them all (a process stuck in the kernel): keep trying.
        return step(Stage.KILL, now)
    return None


def grace(
    stage: Stage, due: float, now: float, *, granted: bool, by_guard: bool
) -> Optional[float]:
    """The new due time when the runner answers "stopping" (it ends its fit() at the next batch,
    after a checkpoint); None: no more time. Given once a stop: a runner that says it again and
    again must not put the signals off for good; never to the guard's stop (its last resort)."""
    if stage != Stage.ASK or granted or by_guard:
        return None
    return max(due, now + STOP_RUNNER_SECONDS)


# How long the control channel's stop waits for the job to end, at most: the whole ladder to
# SIGTERM and a little.
def settle_seconds() -> float:
    return STOP_ASK_SECONDS + STOP_INT_SECONDS + STOP_TERM_SECONDS + 3.0
