"""The words the parts of Headroom use with each other: job states, guard levels and causes,
event kinds, defined once.

Stdlib only, imports nothing of Headroom: the engine, the job manager, the CLI and the UI all
use it. Every name is a ``str`` enum whose value is the word on the wire, so the JSON of
DESIGN.md does not change and a member compares, hashes and formats as its plain string
(``"running" in LIVE``, ``f"{JobState.RUNNING}"`` is ``running``). The sets hold the plain
strings.

Job states and how a job moves between them (``TRANSITIONS``)::

    (new) -> starting -> running <-> pausing -> paused -> running
    any live state -> parking -> parked -> starting (resumed from the checkpoint)
    parking -> paused (suspended: a job that does not answer cannot park)
    any live state -> stopping -> stopped (-> starting, when it has a checkpoint folder)
    any live state -> finished | failed | lost

The runner inside the job has states of its own (``trayapp.runner.protocol``: "checkpointing"
is one): those are not job states.
"""

from __future__ import annotations

from enum import Enum
from typing import FrozenSet, Mapping, Optional


class Word(str, Enum):
    """A ``str`` enum that is its value wherever a string goes: formatting, hashing, JSON."""

    __str__ = str.__str__
    __hash__ = str.__hash__


def words(*members: Word) -> FrozenSet[str]:
    """The plain strings of ``members``, as a set any string can be looked up in."""
    return frozenset(str(m.value) for m in members)


# -- jobs -------------------------------------------------------------------------------------


class JobState(Word):
    STARTING = "starting"
    RUNNING = "running"
    PAUSING = "pausing"
    PAUSED = "paused"
    PARKING = "parking"
    STOPPING = "stopping"
    PARKED = "parked"
    FINISHED = "finished"
    FAILED = "failed"
    STOPPED = "stopped"
    LOST = "lost"


S = JobState
# A job in one of these states has (or had, a moment ago) a process.
LIVE = words(S.STARTING, S.RUNNING, S.PAUSING, S.PAUSED, S.PARKING, S.STOPPING)
# Transitional states: an action is under way.
BUSY = words(S.STARTING, S.PAUSING, S.PARKING, S.STOPPING)
# The process has ended and the job does not come back by itself (a stopped job with a
# checkpoint folder can still be resumed by hand).
ENDED = words(S.FINISHED, S.FAILED, S.STOPPED, S.LOST)
# Checkpointed and ended on purpose: no process, but still one of the manager's jobs, waiting
# for ``resume``.
PARKED = words(S.PARKED)
# Growing and guarded: what the guard may pause.
RUNNING = words(S.STARTING, S.RUNNING)
# Not growing: the tree is suspended or the runner waits at a batch end.
PAUSED = words(S.PAUSED)
# ``resume`` takes these back without more ado (a stopped job needs its checkpoint folder).
RESUMABLE = words(S.PAUSING, S.PAUSED, S.PARKED)
ALL = LIVE | ENDED | PARKED

_ENDS = frozenset({S.FINISHED, S.FAILED, S.STOPPED, S.LOST, S.PARKED})
# Every change of state the job manager makes; a state may always stay what it is.
TRANSITIONS: Mapping[Optional[JobState], FrozenSet[JobState]] = {
    None: frozenset({S.STARTING}),
    S.STARTING: frozenset({S.RUNNING, S.PAUSING, S.PAUSED, S.PARKING, S.STOPPING}) | _ENDS,
    S.RUNNING: frozenset({S.PAUSING, S.PAUSED, S.PARKING, S.STOPPING}) | _ENDS,
    S.PAUSING: frozenset({S.RUNNING, S.PAUSED, S.PARKING, S.STOPPING}) | _ENDS,
    S.PAUSED: frozenset({S.RUNNING, S.PARKING, S.STOPPING}) | _ENDS,
    # running: a kernel's interrupt; paused: a job that does not answer cannot park (suspended)
    S.PARKING: frozenset({S.STOPPING, S.RUNNING, S.PAUSED}) | _ENDS,
    S.STOPPING: frozenset({S.STOPPED, S.PARKED}),  # the runner's bye may say it parked
    S.PARKED: frozenset({S.STARTING, S.STOPPED}),  # relaunched, or closed for good
    S.STOPPED: frozenset({S.STARTING}),  # relaunched from its checkpoint
    S.FINISHED: frozenset(),
    S.FAILED: frozenset(),
    S.LOST: frozenset(),
}


def job_state(value: object) -> Optional[JobState]:
    """The state ``value`` names, or None for anything else."""
    try:
        return JobState(value)
    except ValueError:
        return None


def can_move(old: Optional[str], new: str) -> bool:
    """Whether a job may go from state ``old`` (None: a new job) to ``new``."""
    target = job_state(new)
    if target is None:
        return False
    if old is None:
        return target in TRANSITIONS[None]
    source = job_state(old)
    if source is None:
        return False
    return target == source or target in TRANSITIONS[source]


class PauseMode(Word):
    """How a paused job was paused (the job record's ``pause_mode``)."""

    COOPERATIVE = "cooperative"  # the runner waits at a batch end
    SUSPENDED = "suspended"  # every process of the tree got SIGSTOP


class Actor(Word):
    """Who acted on a job (the job record's ``paused_by``, ``parked_by``, ``stopped_by``, an
    event's ``by``)."""

    USER = "user"
    GUARD = "guard"
    ENGINE = "engine"


# -- the guard --------------------------------------------------------------------------------


class GuardLevel(Word):
    """The guard's level, lowest first (the order is the ladder's)."""

    OK = "ok"
    WARN = "warn"
    PAUSE = "pause"
    PARK = "park"


LEVELS = tuple(str(level.value) for level in GuardLevel)
RANK: Mapping[str, int] = {name: i for i, name in enumerate(LEVELS)}


class GuardCause(Word):
    """Why the guard warns or acts; an act's cause is checked again before acting."""

    MEM_STOP = "mem_stop"  # available memory under the last-resort threshold
    MEM_PARK = "mem_park"
    MEM_PAUSE = "mem_pause"
    MEM_WARN = "mem_warn"
    MEM_PREDICTED = "mem_predicted"  # the fill rate reaches exhaustion soon: pause
    MEM_TREND = "mem_trend"  # ... later: warn
    MEM_FALLING = "mem_falling"  # memory keeps falling with the guard's jobs paused: park
    PSI_PAUSE = "psi_pause"
    PSI_WARN = "psi_warn"
    BUDGET_RAM = "budget_ram"
    BUDGET_VRAM = "budget_vram"
    BUDGET_RAM_WARN = "budget_ram_warn"
    BUDGET_VRAM_WARN = "budget_vram_warn"
    GPU_VRAM = "gpu_vram"
    NO_CHECKPOINT = "no_checkpoint"
    RULE_WARN = "rule_warn"
    CALM = "calm"  # headroom is back: resume
    OK = "ok"  # all is well again (the notification)


class GuardMode(Word):
    """What the guard does (setting ``guard.mode``)."""

    ACT = "act"  # warn, pause, park and stop
    DRY_RUN = "dry-run"  # record what it would do, do nothing
    OFF = "off"  # watch only


C = GuardCause
BUDGET_CAUSES = words(C.BUDGET_RAM, C.BUDGET_VRAM)
# Memory so short that the guard parks or stops rather than waits.
LAST_RESORT_CAUSES = words(C.MEM_PARK, C.MEM_STOP)


class GuardAct(Word):
    """What one guard action does: a notification (warn, ok) or an act on a target."""

    WARN = "warn"
    OK = "ok"
    PAUSE = "pause"
    RESUME = "resume"
    PARK = "park"
    STOP = "stop"


ACTS = words(GuardAct.PAUSE, GuardAct.RESUME, GuardAct.PARK, GuardAct.STOP)


# -- events -----------------------------------------------------------------------------------


class EventLevel(Word):
    """An event's level (a runner's note keeps its own: ``trayapp.runner.protocol.NOTE_LEVELS``
    are these words)."""

    INFO = "info"
    WARN = "warn"
    ERROR = "error"


EVENT_LEVELS = words(*EventLevel)


class EventKind(Word):
    ENGINE_STARTED = "engine_started"
    ENGINE_STOPPED = "engine_stopped"
    STORE_ERROR = "store_error"
    STORE_OK = "store_ok"
    STORE_RECOVERED = "store_recovered"
    CONFIG_CHANGED = "config_changed"
    CONFIG_PROBLEM = "config_problem"
    JOB_STARTED = "job_started"
    JOB_ADOPTED = "job_adopted"
    JOB_PAUSED = "job_paused"
    JOB_RESUMED = "job_resumed"
    JOB_PARKED = "job_parked"
    JOB_STOPPED = "job_stopped"
    JOB_FINISHED = "job_finished"
    JOB_FAILED = "job_failed"
    JOB_LOST = "job_lost"
    JOB_NOTE = "job_note"
    JOB_SHRUNK = "job_shrunk"  # trains smaller micro-batches with gradient accumulation
    JOB_FORECAST = "job_forecast"  # the memory a fit needs, against what is free
    JOB_BAD_MESSAGE = "job_bad_message"
    JOB_INTERRUPTED = "job_interrupted"  # a kernel's fit, interrupted at a batch; the kernel lives
    JOB_BRAKED = "job_braked"  # held at its cgroup's limit (or OOM-killed): relaunched smaller
    GUARD_WARN = "guard_warn"
    GUARD_OK = "guard_ok"
    GUARD_PAUSE = "guard_pause"
    GUARD_RESUME = "guard_resume"
    GUARD_PARK = "guard_park"
    GUARD_STOP = "guard_stop"


E = EventKind
# The event each guard action is recorded as.
GUARD_EVENTS: Mapping[str, str] = {
    "warn": E.GUARD_WARN.value,
    "ok": E.GUARD_OK.value,
    "pause": E.GUARD_PAUSE.value,
    "resume": E.GUARD_RESUME.value,
    "park": E.GUARD_PARK.value,
    "stop": E.GUARD_STOP.value,
}
# How a job ended, as its event says.
JOB_END_EVENTS = words(E.JOB_FINISHED, E.JOB_FAILED, E.JOB_STOPPED, E.JOB_PARKED, E.JOB_LOST)
