"""A job's changes of state as a table: what happened to a job (``On``) and the state it was in
give its new state and the fields of its record that change with it (after the style of
``trayapp.jobs.ladder``). Pure: a record in, a state and changes out; the job manager makes
every change of state through ``step``, and every one it makes is allowed by the
vocabulary's ``TRANSITIONS``.

A pair the table does not have is refused (``NotAllowed``, with the state the event names,
``target``): the manager checks a job's state before it acts, so one that reaches the table
is a job whose process went its own way; it is logged and made all the same (the job is where
its process says it is), as ``trayapp.jobs.job.move`` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, FrozenSet, Mapping, Optional, Tuple

from trayapp.errors import Refused
from trayapp.jobs.record import JobRecord
from trayapp.vocab import JobState as S
from trayapp.vocab import Word

COOPERATIVE = "cooperative"  # as ``trayapp.jobs.job``: the runner waits at a batch end
SUSPENDED = "suspended"  # every process of the tree got SIGSTOP (or its cgroup froze)


class On(Word):
    """What happened to a job."""

    RUNNER_UP = "runner-up"  # its runner spoke (hello, progress, "running"): it runs
    PAUSE_ASKED = "pause-asked"  # its runner was asked to pause at the next batch end
    PAUSED = "paused"  # its runner says it waits at a batch end (paused by the runner)
    SUSPENDED = "suspended"  # its tree was suspended (pause-suspended)
    RESUMED = "resumed"  # it runs again (resumed by hand, the guard, or its runner)
    PARK_ASKED = "park-asked"  # its runner was asked to checkpoint and exit (or interrupt)
    INTERRUPTED = "interrupted"  # a kernel's fit was interrupted: the kernel runs on
    STOP_ASKED = "stop-asked"  # its stop ladder began
    CLOSED = "closed"  # a parked job stopped: it has no process, its checkpoint stays
    PARKED = "parked"  # its process ended parked (the runner's bye, or the brake's end)
    STOPPED = "stopped"  # its process ended stopped
    FINISHED = "finished"  # its process ended with status 0
    FAILED = "failed"  # its process ended otherwise
    LOST = "lost"  # its process ended, how is not known
    LAUNCHED = "launched"  # its process started (a new job, or relaunched)


class NotAllowed(Refused):
    """A change the table does not have; ``target`` is the state the event names."""

    def __init__(self, message: str, target: str):
        super().__init__(message)
        self.target = target


@dataclass(frozen=True)
class Move:
    """The new state and the record's fields that change with it."""

    state: str
    changes: Mapping[str, Any]


Fields = Dict[str, Any]  # a record's fields by name, as ``JobRecord.with_`` takes them
Changes = Callable[[JobRecord, Optional[str], str], Fields]


@dataclass(frozen=True)
class Row:
    sources: FrozenSet[str]
    target: S
    changes: Changes


def _states(*states: S) -> FrozenSet[str]:
    return frozenset(str(s.value) for s in states)


_ACTIVE = _states(S.STARTING, S.RUNNING, S.PAUSING, S.PAUSED, S.PARKING)  # not stopping
_LIVE = _ACTIVE | _states(S.STOPPING)


def _none(rec: JobRecord, by: Optional[str], reason: str) -> Fields:
    return {}


def _pause_asked(rec: JobRecord, by: Optional[str], reason: str) -> Fields:
    return {"pause_mode": None, "paused_by": by, "pause_reason": reason or None}


def _paused(mode: str) -> Changes:
    def changes(rec: JobRecord, by: Optional[str], reason: str) -> Fields:
        return {"pause_mode": mode, "paused_by": by, "pause_reason": reason or None}

    return changes


def _pause_cleared(rec: JobRecord, by: Optional[str], reason: str) -> Fields:
    return {"pause_mode": None, "paused_by": None, "pause_reason": None, "paused_at": None}


def _park_asked(rec: JobRecord, by: Optional[str], reason: str) -> Fields:
    return {"pause_mode": None, "parked_by": by, "park_reason": reason or None}


def _interrupted(rec: JobRecord, by: Optional[str], reason: str) -> Fields:
    return {"parked_by": None, "park_reason": None, **_pause_cleared(rec, by, reason)}


def _stop_asked(rec: JobRecord, by: Optional[str], reason: str) -> Fields:
    return {"stopped_by": by, "stop_reason": reason or None}


def resumable_stop(rec: JobRecord, state: str) -> bool:
    """A stopped job with a checkpoint folder continues from it on ``resume``."""
    return state == S.STOPPED and bool(rec.checkpoint_dir) and not rec.is_kernel


def _closed(rec: JobRecord, by: Optional[str], reason: str) -> Fields:
    return {"end_reason": reason, "resumable": resumable_stop(rec, S.STOPPED)}


def _ended(state: S) -> Changes:
    def changes(rec: JobRecord, by: Optional[str], reason: str) -> Fields:
        return {
            "end_reason": reason,
            "pids": (),
            "rss_bytes": None,
            "vram_bytes": None,
            "eta_seconds": None,
            "pause_mode": None,
            "connected": False,
            "resumable": state == S.PARKED or resumable_stop(rec, state),
        }

    return changes


def _launched(rec: JobRecord, by: Optional[str], reason: str) -> Fields:
    return {
        "exit_code": None,
        "ended": None,
        "end_reason": None,
        "bye": None,
        "hooked": False,
        "answering": True,
        "runs": rec.runs + 1,
        "eta_seconds": None,
        "resumable": False,
        **_pause_cleared(rec, by, reason),
    }


TABLE: Mapping[On, Row] = {
    On.RUNNER_UP: Row(_states(S.STARTING), S.RUNNING, _none),
    On.PAUSE_ASKED: Row(_states(S.STARTING, S.RUNNING), S.PAUSING, _pause_asked),
    On.PAUSED: Row(_states(S.RUNNING, S.PAUSING, S.PAUSED), S.PAUSED, _paused(COOPERATIVE)),
    On.SUSPENDED: Row(_ACTIVE, S.PAUSED, _paused(SUSPENDED)),
    On.RESUMED: Row(_states(S.PAUSING, S.PAUSED), S.RUNNING, _pause_cleared),
    On.PARK_ASKED: Row(_states(S.STARTING, S.RUNNING, S.PAUSING, S.PAUSED), S.PARKING, _park_asked),
    On.INTERRUPTED: Row(_states(S.PARKING), S.RUNNING, _interrupted),
    On.STOP_ASKED: Row(_ACTIVE, S.STOPPING, _stop_asked),
    On.CLOSED: Row(_states(S.PARKED), S.STOPPED, _closed),
    On.PARKED: Row(_LIVE, S.PARKED, _ended(S.PARKED)),
    On.STOPPED: Row(_LIVE, S.STOPPED, _ended(S.STOPPED)),
    On.FINISHED: Row(_ACTIVE, S.FINISHED, _ended(S.FINISHED)),
    On.FAILED: Row(_ACTIVE, S.FAILED, _ended(S.FAILED)),
    On.LOST: Row(_ACTIVE, S.LOST, _ended(S.LOST)),
    On.LAUNCHED: Row(_states(S.STARTING, S.PARKED, S.STOPPED), S.STARTING, _launched),
}

# How a process that ended ends, by the state it ends in.
ENDS: Mapping[str, On] = {
    S.PARKED.value: On.PARKED,
    S.STOPPED.value: On.STOPPED,
    S.FINISHED.value: On.FINISHED,
    S.FAILED.value: On.FAILED,
    S.LOST.value: On.LOST,
}


def target(event: On) -> str:
    """The state ``event`` moves a job to."""
    return str(TABLE[event].target.value)


def step(
    rec: JobRecord,
    event: On,
    *,
    by: Optional[str] = None,
    reason: str = "",
    force: bool = False,
    **given: Any,
) -> Move:
    """The state a job of ``rec`` moves to on ``event``, and the fields that change with it:
    the event's own, then ``given`` (what only the caller knows: an exit code, a pid). ``by``
    and ``reason``: who asked and why (a pause, park or stop), or how a job ended (``reason``:
    its end reason). Raises ``NotAllowed`` for a state the event cannot happen in, unless
    ``force``."""
    row = TABLE[event]
    if rec.state not in row.sources and not force:
        raise NotAllowed(
            f"job {rec.id}: {event.value} cannot happen to a job {rec.state}",
            str(row.target.value),
        )
    return Move(str(row.target.value), {**row.changes(rec, by, reason), **given})


def pairs() -> Tuple[Tuple[str, On, str], ...]:
    """Every (state, event, new state) the table makes."""
    return tuple(
        (source, event, str(row.target.value))
        for event, row in TABLE.items()
        for source in sorted(row.sources)
    )
