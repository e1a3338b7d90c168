"""The job's changes of state as a table: every (state, event) pair gives the state expected or
is refused, and every change the table makes is one the vocabulary allows."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import pytest

from trayapp import vocab
from trayapp.jobs import transitions
from trayapp.jobs.record import JobRecord
from trayapp.jobs.transitions import NotAllowed, On, step
from trayapp.vocab import JobState as S

LIVE_BUT_STOPPING = (S.STARTING, S.RUNNING, S.PAUSING, S.PAUSED, S.PARKING)
LIVE = (*LIVE_BUT_STOPPING, S.STOPPING)

# event -> (the states it happens in, the state it moves to); every other state refuses it.
EXPECTED: Dict[On, Tuple[Tuple[S, ...], S]] = {
    On.RUNNER_UP: ((S.STARTING,), S.RUNNING),
    On.PAUSE_ASKED: ((S.STARTING, S.RUNNING), S.PAUSING),
    On.PAUSED: ((S.RUNNING, S.PAUSING, S.PAUSED), S.PAUSED),
    On.SUSPENDED: (LIVE_BUT_STOPPING, S.PAUSED),
    On.RESUMED: ((S.PAUSING, S.PAUSED), S.RUNNING),
    On.PARK_ASKED: ((S.STARTING, S.RUNNING, S.PAUSING, S.PAUSED), S.PARKING),
    On.INTERRUPTED: ((S.PARKING,), S.RUNNING),
    On.STOP_ASKED: (LIVE_BUT_STOPPING, S.STOPPING),
    On.CLOSED: ((S.PARKED,), S.STOPPED),
    On.PARKED: (LIVE, S.PARKED),
    On.STOPPED: (LIVE, S.STOPPED),
    On.FINISHED: (LIVE_BUT_STOPPING, S.FINISHED),
    On.FAILED: (LIVE_BUT_STOPPING, S.FAILED),
    On.LOST: (LIVE_BUT_STOPPING, S.LOST),
    On.LAUNCHED: ((S.STARTING, S.PARKED, S.STOPPED), S.STARTING),
}


def test_every_event_is_in_the_table() -> None:
    assert set(EXPECTED) == set(On) == set(transitions.TABLE)


@pytest.mark.parametrize("event", list(On), ids=lambda e: e.value)
@pytest.mark.parametrize("state", list(S), ids=lambda s: s.value)
def test_every_state_and_event_gives_the_state_expected_or_is_refused(state: S, event: On) -> None:
    rec = JobRecord(id="j1", state=state.value)
    sources, target = EXPECTED[event]
    if state in sources:
        move = step(rec, event, by="user", reason="why")
        assert move.state == target
        assert vocab.can_move(state.value, move.state)
        rec.moved(move.state, **move.changes)  # the record takes it
    else:
        with pytest.raises(NotAllowed) as refused:
            step(rec, event)
        assert refused.value.target == target
        # Forced (a process that went its own way): the event's state all the same.
        assert step(rec, event, force=True).state == target


def test_every_change_the_table_makes_the_vocabulary_allows() -> None:
    made = transitions.pairs()
    assert made and all(vocab.can_move(old, new) for old, _, new in made)


@pytest.mark.parametrize(
    "event, by, fields",
    [
        (On.PAUSE_ASKED, "guard", {"pause_mode": None, "paused_by": "guard",
                                   "pause_reason": "why"}),
        (On.PAUSED, "user", {"pause_mode": "cooperative", "paused_by": "user",
                             "pause_reason": "why"}),
        (On.SUSPENDED, "guard", {"pause_mode": "suspended", "paused_by": "guard",
                                 "pause_reason": "why"}),
        (On.PARK_ASKED, "guard", {"pause_mode": None, "parked_by": "guard",
                                  "park_reason": "why"}),
        (On.STOP_ASKED, "engine", {"stopped_by": "engine", "stop_reason": "why"}),
    ],
)
def test_who_asked_and_why_go_with_the_state(event: On, by: str, fields: Dict) -> None:
    rec = JobRecord(id="j1", state=S.RUNNING.value)
    assert dict(step(rec, event, by=by, reason="why").changes) == fields


def test_a_resume_clears_the_pause() -> None:
    rec = JobRecord(id="j1", state=S.PAUSED.value, pause_mode="suspended", paused_by="guard",
                    pause_reason="memory", paused_at=5.0)
    move = step(rec, On.RESUMED)
    assert move.state == S.RUNNING
    assert dict(move.changes) == {"pause_mode": None, "paused_by": None, "pause_reason": None,
                                  "paused_at": None}


@pytest.mark.parametrize(
    "end, checkpoint, kernel, resumable",
    [
        (On.PARKED, None, False, True),
        (On.STOPPED, "/ckpt", False, True),
        (On.STOPPED, None, False, False),
        (On.STOPPED, "/ckpt", True, False),  # a kernel is not relaunched
        (On.FINISHED, "/ckpt", False, False),
        (On.FAILED, "/ckpt", False, False),
        (On.LOST, None, False, False),
    ],
)
def test_an_end_says_whether_it_can_be_resumed(
        end: On, checkpoint: Optional[str], kernel: bool, resumable: bool) -> None:
    rec = JobRecord(id="j1", state=S.RUNNING.value if end != On.STOPPED else S.STOPPING.value,
                    checkpoint_dir=checkpoint, kind="kernel" if kernel else "script",
                    pids=(1, 2), rss_bytes=10, connected=True)
    move = step(rec, end, reason="the reason", exit_code=3, ended=9.0)
    assert move.state == transitions.target(end) == transitions.ENDS[move.state]
    assert move.changes["resumable"] is resumable
    assert move.changes["end_reason"] == "the reason" and move.changes["exit_code"] == 3
    done = rec.moved(move.state, **move.changes)
    assert done.pids == () and done.rss_bytes is None and done.connected is False


def test_a_launch_counts_the_run_and_clears_the_last_end() -> None:
    rec = JobRecord(id="j1", state=S.PARKED.value, runs=2, exit_code=75, ended=9.0,
                    end_reason="parked by you", paused_by="guard", resumable=True)
    move = step(rec, On.LAUNCHED, pid=42)
    assert move.state == S.STARTING
    done = rec.moved(move.state, **move.changes)
    assert done.runs == 3 and done.pid == 42 and done.exit_code is None and done.ended is None
    assert done.end_reason is None and done.paused_by is None and done.resumable is False
    assert done.answering is True and done.hooked is False


def test_closing_a_parked_job_keeps_what_it_can_resume_from() -> None:
    rec = JobRecord(id="j1", state=S.PARKED.value, checkpoint_dir="/ckpt")
    move = step(rec, On.CLOSED, reason="stopped by you while parked", ended=1.0)
    assert move.state == S.STOPPED and move.changes["resumable"] is True
    assert move.changes["end_reason"] == "stopped by you while parked"
