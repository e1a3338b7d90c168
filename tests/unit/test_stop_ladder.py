"""The stop ladder as a table: where a stop stands, the time, whether the runner hooked fit()
-> the step to take and when the next one is due."""

from __future__ import annotations

from typing import Optional, Tuple

import pytest

from trayapp.jobs import ladder
from trayapp.jobs.ladder import Stage, Step

T = 1000.0  # now, monotonic
ASK, INT, TERM, KILL = (ladder.STOP_ASK_SECONDS, ladder.STOP_INT_SECONDS,
                        ladder.STOP_TERM_SECONDS, ladder.KILL_WAIT_SECONDS)


@pytest.mark.parametrize("hooked, ask, force, expected", [
    (True, True, False, Step(Stage.ASK, T + ASK)),  # the runner's own stop first
    (False, True, False, Step(Stage.INT, T + INT)),  # a plain script: SIGINT
    (True, False, False, Step(Stage.INT, T + INT)),  # the engine on its way out does not ask
    (True, True, True, Step(Stage.KILL, T + KILL)),  # kill: straight to SIGKILL
    (False, False, True, Step(Stage.KILL, T + KILL)),
])
def test_the_first_step(hooked: bool, ask: bool, force: bool, expected: Step) -> None:
    assert ladder.first_step(T, hooked=hooked, ask=ask, force=force) == expected


# (stage, due, remnants, runner gone, force) -> the step (None: nothing yet)
LADDER: Tuple[Tuple[Stage, float, bool, bool, bool, Optional[Step]], ...] = (
    # Not due yet: wait.
    (Stage.ASK, T + 1, True, False, False, None),
    (Stage.INT, T + 1, True, False, False, None),
    (Stage.TERM, T + 0.001, True, False, False, None),
    (Stage.KILL, T + 1, True, False, False, None),
    # Due: one step up, with its own wait.
    (Stage.ASK, T, True, False, False, Step(Stage.INT, T + INT)),
    (Stage.INT, T - 1, True, False, False, Step(Stage.TERM, T + TERM)),
    (Stage.TERM, T, True, False, False, Step(Stage.KILL, T + KILL)),
    # SIGKILL again while anything of the tree is left (stuck in the kernel), else done.
    (Stage.KILL, T, True, False, False, Step(Stage.KILL, T + KILL)),
    (Stage.KILL, T, False, False, False, None),
    # The runner cannot be asked (it exited, its channel closed): SIGINT now, due or not.
    (Stage.ASK, T + 4, True, True, False, Step(Stage.INT, T + INT)),
    (Stage.INT, T + 2, True, True, False, None),  # past asking: runner_gone changes nothing
    # Forced: SIGKILL now from any stage below it.
    (Stage.ASK, T + 4, True, False, True, Step(Stage.KILL, T + KILL)),
    (Stage.TERM, T + 2, True, False, True, Step(Stage.KILL, T + KILL)),
    (Stage.KILL, T + 2, True, False, True, None),
)


@pytest.mark.parametrize("stage, due, remnants, gone, force, expected", LADDER)
def test_the_next_step(stage: Stage, due: float, remnants: bool, gone: bool, force: bool,
                       expected: Optional[Step]) -> None:
    assert ladder.next_step(stage, due, T, remnants=remnants, runner_gone=gone,
                            force=force) == expected


@pytest.mark.parametrize("stage, granted, by_guard, expected", [
    (Stage.ASK, False, False, T + ladder.STOP_RUNNER_SECONDS),  # time to reach its batch
    (Stage.ASK, True, False, None),  # once a stop: the runner cannot put it off for good
    (Stage.ASK, False, True, None),  # the guard's stop is its last resort: no waiting
    (Stage.INT, False, False, None),  # the signals have begun
])
def test_a_runner_that_answers_gets_time_once(stage: Stage, granted: bool, by_guard: bool,
                                              expected: Optional[float]) -> None:
    assert ladder.grace(stage, T + 1, T, granted=granted, by_guard=by_guard) == expected


def test_grace_never_brings_the_next_step_closer() -> None:
    assert ladder.grace(Stage.ASK, T + 500, T, granted=False, by_guard=False) == T + 500


def test_a_whole_stop_of_a_runner_that_ignores_it_walks_every_step() -> None:
    step: Optional[Step] = ladder.first_step(T, hooked=True)
    taken = []
    t = T
    while step is not None and len(taken) < 10:
        taken.append(step.stage)
        t = step.due
        step = ladder.next_step(step.stage, step.due, t, remnants=len(taken) < 5)
    assert taken == [Stage.ASK, Stage.INT, Stage.TERM, Stage.KILL, Stage.KILL]
    assert t == T + ASK + INT + TERM + 2 * KILL


def test_the_waits_are_read_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ladder, "STOP_ASK_SECONDS", 0.2)
    assert ladder.first_step(T, hooked=True) == Step(Stage.ASK, T + 0.2)
    assert ladder.settle_seconds() == 0.2 + INT + TERM + 3.0
