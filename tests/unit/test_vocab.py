"""The vocabulary: its words are the wire's strings, its sets agree, its transitions are a table."""

from __future__ import annotations

import json
from typing import Optional

import pytest

from trayapp import vocab
from trayapp.vocab import EventKind, GuardAct, GuardCause, GuardLevel, JobState

S = JobState

# (from, to, allowed): every state change the job manager makes, and some it never makes.
TRANSITIONS = [
    (None, S.STARTING, True),  # a new job
    (None, S.RUNNING, False),
    (S.STARTING, S.RUNNING, True),  # hello, first progress
    (S.STARTING, S.PAUSING, True),  # pause before the first batch, hooked
    (S.STARTING, S.PAUSED, True),  # suspended at once
    (S.STARTING, S.PARKING, True),
    (S.STARTING, S.STOPPING, True),
    (S.STARTING, S.LOST, True),
    (S.STARTING, S.FAILED, True),
    (S.STARTING, S.STARTING, True),  # the launch sets what the new job already says
    (S.RUNNING, S.PAUSING, True),
    (S.RUNNING, S.PAUSED, True),
    (S.RUNNING, S.PARKING, True),
    (S.RUNNING, S.STOPPING, True),
    (S.RUNNING, S.FINISHED, True),
    (S.RUNNING, S.FAILED, True),
    (S.RUNNING, S.PARKED, True),  # the runner parked on its own word (bye "parked")
    (S.RUNNING, S.STARTING, False),
    (S.PAUSING, S.PAUSED, True),
    (S.PAUSING, S.RUNNING, True),  # resumed before the batch end
    (S.PAUSING, S.STOPPING, True),
    (S.PAUSED, S.PAUSED, True),  # a cooperative pause becomes a suspend
    (S.PAUSED, S.RUNNING, True),
    (S.PAUSED, S.PARKING, True),
    (S.PAUSED, S.PAUSING, False),
    (S.PARKING, S.PARKED, True),
    (S.PARKING, S.STOPPING, True),
    (S.PARKING, S.LOST, True),  # an adopted job whose process is gone
    (S.PARKING, S.RUNNING, True),  # a kernel whose fit was interrupted runs on
    (S.STOPPING, S.STOPPED, True),
    (S.STOPPING, S.PARKED, True),
    (S.STOPPING, S.RUNNING, False),
    (S.STOPPING, S.FINISHED, False),  # a job being stopped ends as stopped
    (S.PARKED, S.STARTING, True),  # resumed: relaunched from its checkpoint
    (S.PARKED, S.STOPPED, True),  # stopped while parked
    (S.PARKED, S.RUNNING, False),
    (S.STOPPED, S.STARTING, True),  # resumed from its checkpoint
    (S.STOPPED, S.RUNNING, False),
    (S.FINISHED, S.STARTING, False),
    (S.FAILED, S.STARTING, False),
    (S.LOST, S.RUNNING, False),
]


@pytest.mark.parametrize("old,new,allowed", TRANSITIONS)
def test_transition_table(old: Optional[JobState], new: JobState, allowed: bool) -> None:
    assert vocab.can_move(None if old is None else old.value, new.value) is allowed


def test_unknown_states_never_move() -> None:
    assert not vocab.can_move("running", "suspended")
    assert not vocab.can_move("exited", "running")
    assert not vocab.can_move(None, "checkpointing")


def test_every_state_has_a_row_and_the_sets_cover_them() -> None:
    assert set(vocab.TRANSITIONS) == {None, *JobState}
    assert vocab.ALL == {s.value for s in JobState}
    assert vocab.LIVE.isdisjoint(vocab.ENDED | vocab.PARKED)
    assert vocab.ENDED.isdisjoint(vocab.PARKED)
    assert vocab.BUSY <= vocab.LIVE and vocab.RUNNING <= vocab.LIVE and vocab.PAUSED <= vocab.LIVE
    # An ended job never comes back but through a relaunch.
    for state in vocab.ENDED | vocab.PARKED:
        assert vocab.TRANSITIONS[JobState(state)] <= {S.STARTING, S.STOPPED}


def test_words_are_their_strings() -> None:
    """What goes on the wire, into the database and into a message is the plain word."""
    state = JobState.PARKED
    assert state == "parked" and str(state) == "parked" and f"{state}" == "parked"
    assert hash(state) == hash("parked") and "parked" in {state} and state in vocab.PARKED
    assert json.dumps({"state": state, "level": GuardLevel.WARN}) == \
        '{"state": "parked", "level": "warn"}'
    assert vocab.job_state("paused") is JobState.PAUSED
    assert vocab.job_state("suspended") is None and vocab.job_state(None) is None


def test_guard_words() -> None:
    assert vocab.LEVELS == ("ok", "warn", "pause", "park")
    assert [vocab.RANK[x] for x in vocab.LEVELS] == [0, 1, 2, 3]
    assert set(vocab.GUARD_EVENTS) == {a.value for a in GuardAct}
    assert set(vocab.GUARD_EVENTS.values()) <= {k.value for k in EventKind}
    assert vocab.BUDGET_CAUSES | vocab.LAST_RESORT_CAUSES <= {c.value for c in GuardCause}
    assert vocab.ACTS == {"pause", "resume", "park", "stop"}
    assert vocab.JOB_END_EVENTS <= {k.value for k in EventKind}


def test_the_job_table_logs_a_change_the_transitions_lack_and_makes_it(
        caplog: pytest.LogCaptureFixture) -> None:
    from trayapp.jobs.job import Job
    from trayapp.jobs.record import JobRecord
    from trayapp.jobs.table import JobTable
    from trayapp.jobs.transitions import On

    table = JobTable(None, None, emit=lambda *a, **k: None)  # type: ignore[arg-type]
    job = Job(JobRecord(id="j1", state="parking"), b"key")
    with caplog.at_level("WARNING", logger="headroom.jobs"):
        table.move(job, On.PARKED)
    assert job.rec.state == "parked" and type(job.rec.state) is str
    assert caplog.records == []
    # A runner that says it runs while its job is parked: the job is where its process is.
    with caplog.at_level("WARNING", logger="headroom.jobs"):
        table.move(job, On.RUNNER_UP)
    assert job.rec.state == "running"
    assert [r.getMessage() for r in caplog.records] == \
        ["job j1: runner-up cannot happen to a job parked; moved to running all the same"]


def test_actors_pause_modes_and_event_levels_are_the_wire_words() -> None:
    from trayapp.jobs import job
    from trayapp.runner import protocol as rp

    assert [a.value for a in vocab.Actor] == ["user", "guard", "engine"]
    assert [m.value for m in vocab.PauseMode] == ["cooperative", "suspended"]
    assert vocab.EVENT_LEVELS == {"info", "warn", "error"}
    # The job manager's names are the members; a record read back from JSON compares equal.
    assert job.BY_USER is vocab.Actor.USER and job.BY_GUARD is vocab.Actor.GUARD
    assert job.BY_ENGINE is vocab.Actor.ENGINE
    assert job.COOPERATIVE is vocab.PauseMode.COOPERATIVE
    assert job.SUSPENDED is vocab.PauseMode.SUSPENDED
    wire = json.dumps({"by": job.BY_GUARD, "mode": job.SUSPENDED, "level": vocab.EventLevel.WARN})
    assert wire == '{"by": "guard", "mode": "suspended", "level": "warn"}'
    assert json.loads(wire)["by"] == job.BY_GUARD and job.who("guard") == "the guard"
    # A runner's note becomes an event at the note's level.
    assert rp.NOTE_LEVELS == vocab.EVENT_LEVELS


def test_the_runner_words_are_defined_once() -> None:
    from trayapp.jobs import messages, record
    from trayapp.runner import kernel
    from trayapp.runner import protocol as rp

    assert messages.RUNNER_STATES is rp.RUNNER_STATES and record.RUNNER_IDLE == rp.STATE_IDLE
    assert kernel.IDLE == rp.STATE_IDLE
    assert messages.BYE_REASONS is rp.BYE_REASONS and messages.FIT_HOOKS is rp.FIT_HOOKS
    assert messages.NOTE_LEVELS is rp.NOTE_LEVELS and messages.NOTE_TOPICS is rp.NOTE_TOPICS
    # Runner states are not job states, but the ones that share a word mean the same thing.
    shared = rp.RUNNER_STATES & vocab.ALL
    assert shared == {"running", "pausing", "paused", "parking", "stopping", "stopped"}
