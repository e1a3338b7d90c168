"""The guard's decision, pure: readings, their recent history and the policy in; actions
out (``decide``). Nothing here reads the machine or touches a process: ``GuardService`` in
``trayapp.engine.guarding`` does both.

- ``model``: what the decision takes and gives (Policy, GuardInput, GuardState, Decision...);
- ``core``: the ladder (``assess``), ``decide``, ``acted``, ``still_holds``;
- ``causes``: the table of causes (level, threshold setting, check on a fresh reading);
- ``choice``: the one act of a tick;
- ``rate``: the fill rate and the sampling interval;
- ``text``: the guard's sentences.

The names most callers need are importable from here.
"""

from trayapp.engine.guard.causes import CAUSES, MEMORY_LADDER, CauseRule
from trayapp.engine.guard.choice import MAX_RELAPSES, PENDING_SECONDS
from trayapp.engine.guard.core import acted, assess, decide, still_holds
from trayapp.engine.guard.model import (
    ENDED_STATES,
    PARKED_STATES,
    PAUSED_STATES,
    RUNNING_STATES,
    Action,
    Assessment,
    Condition,
    CondKey,
    Decision,
    GuardInput,
    GuardState,
    JobView,
    Policy,
    ProcessView,
    Rule,
    Thresholds,
    Watch,
)
from trayapp.engine.guard.rate import (
    BURST_RATE_BYTES_PER_S,
    MIN_INTERVAL_SECONDS,
    SAFETY_FACTOR,
    FillHistory,
    Fit,
    next_interval,
    wants_gpus,
)
from trayapp.engine.guard.text import format_rate

__all__ = [
    "BURST_RATE_BYTES_PER_S",
    "CAUSES",
    "ENDED_STATES",
    "MAX_RELAPSES",
    "MEMORY_LADDER",
    "MIN_INTERVAL_SECONDS",
    "PARKED_STATES",
    "PAUSED_STATES",
    "PENDING_SECONDS",
    "RUNNING_STATES",
    "SAFETY_FACTOR",
    "Action",
    "Assessment",
    "CauseRule",
    "CondKey",
    "Condition",
    "Decision",
    "FillHistory",
    "Fit",
    "GuardInput",
    "GuardState",
    "JobView",
    "Policy",
    "ProcessView",
    "Rule",
    "Thresholds",
    "Watch",
    "acted",
    "assess",
    "decide",
    "format_rate",
    "next_interval",
    "still_holds",
    "wants_gpus",
]
