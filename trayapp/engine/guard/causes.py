"""The guard's causes, one table: for each cause, the level it sets, the most it does, the
setting of its threshold, and its check on a fresh reading (``still_holds``). The ladder in
``core.assess``, the choice of act in ``choice`` and ``core.still_holds`` all read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Optional

from trayapp.engine.guard.model import BUDGET_WATCHES, RANK, Assessment, Condition, CondKey
from trayapp.vocab import GuardAct as A
from trayapp.vocab import GuardCause as C
from trayapp.vocab import GuardLevel as L

# Whether a cause still holds on a fresh assessment: (assessment, cause, the act's job id).
Holds = Callable[[Assessment, str, Optional[str]], bool]


def _seen(a: Assessment, cause: str, job_id: Optional[str]) -> bool:
    """A machine-wide condition of this cause is there."""
    return (cause, None) in a.causes()


def _seen_for_job(a: Assessment, cause: str, job_id: Optional[str]) -> bool:
    """A condition of this cause is there for the same job."""
    return (cause, job_id) in a.causes()


def _below(setting: str) -> Holds:
    """Available memory is under the threshold ``setting`` names."""

    def holds(a: Assessment, cause: str, job_id: Optional[str]) -> bool:
        return a.available_bytes < a.thresholds.at(setting)

    return holds


def _predicted(a: Assessment, cause: str, job_id: Optional[str]) -> bool:
    return _seen(a, cause, None) or a.available_bytes < a.thresholds.pause


def calm_now(a: Assessment, cause: str, job_id: Optional[str]) -> bool:
    """Room to resume: above the resume threshold, nothing machine-wide at pause or more."""
    return a.available_bytes >= a.thresholds.resume and not any(
        RANK[c.level] >= RANK[L.PAUSE] for c in a.conditions if c.key.watch not in BUDGET_WATCHES
    )


@dataclass(frozen=True)
class CauseRule:
    """What a cause means: the level it sets, the most it does, the setting of its threshold
    (None: a job's own budget, a user rule) and its check on a fresh reading."""

    level: L
    act: A
    setting: Optional[str] = None
    holds: Holds = _seen


CAUSES: Mapping[str, CauseRule] = {
    C.MEM_STOP: CauseRule(L.PARK, A.STOP, "stop_available", _below("stop_available")),
    C.MEM_PARK: CauseRule(L.PARK, A.PARK, "park_available", _below("park_available")),
    C.MEM_PAUSE: CauseRule(L.PAUSE, A.PAUSE, "pause_available", _below("pause_available")),
    C.MEM_WARN: CauseRule(L.WARN, A.WARN, "warn_available"),
    C.MEM_PREDICTED: CauseRule(L.PAUSE, A.PAUSE, "pause_horizon_seconds", _predicted),
    C.MEM_TREND: CauseRule(L.WARN, A.WARN, "warn_horizon_seconds"),
    C.MEM_FALLING: CauseRule(L.PARK, A.PARK, "pause_available", _below("pause_available")),
    C.PSI_PAUSE: CauseRule(L.PAUSE, A.PAUSE, "psi_pause_threshold"),
    C.PSI_WARN: CauseRule(L.WARN, A.WARN, "psi_full_threshold"),
    C.BUDGET_RAM: CauseRule(L.PAUSE, A.PAUSE, None, _seen_for_job),
    C.BUDGET_VRAM: CauseRule(L.PAUSE, A.PAUSE, None, _seen_for_job),
    C.BUDGET_RAM_WARN: CauseRule(L.WARN, A.WARN, "budget_warn_percent", _seen_for_job),
    C.BUDGET_VRAM_WARN: CauseRule(L.WARN, A.WARN, "budget_warn_percent", _seen_for_job),
    C.GPU_VRAM: CauseRule(L.WARN, A.WARN, "vram_warn_percent"),
    C.NO_CHECKPOINT: CauseRule(L.WARN, A.WARN, "park_available", _seen_for_job),
    C.RULE_WARN: CauseRule(L.WARN, A.WARN),
    C.CALM: CauseRule(L.OK, A.RESUME, "resume_available", calm_now),
    C.OK: CauseRule(L.OK, A.OK),
}
UNKNOWN_CAUSE = CauseRule(L.OK, A.OK)  # a cause not in the table holds while it is seen
# The memory ladder, lowest threshold first: the first one crossed names the condition.
MEMORY_LADDER = (C.MEM_STOP, C.MEM_PARK, C.MEM_PAUSE, C.MEM_WARN)


def cond(key: CondKey, cause: str, reason: str, job_id: Optional[str] = None) -> Condition:
    return Condition(key, CAUSES[cause].level, cause, reason, job_id)


def last_resort(c: Optional[Condition]) -> bool:
    """A memory condition so short that the guard parks or stops rather than waits."""
    return c is not None and CAUSES[c.cause].act in (A.PARK, A.STOP)


def pausing(c: Optional[Condition]) -> bool:
    """A condition whose cause pauses (rather than warns, parks or stops)."""
    return c is not None and CAUSES[c.cause].act is A.PAUSE
