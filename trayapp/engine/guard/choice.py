"""The guard's choice of the one act of a tick: which job or process to pause, park, stop
or resume, in the ladder's order (the last resort, a job over its budget, a shortage, then a
resume), and whether a paused one may come back by itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from trayapp import vocab
from trayapp.engine.guard import text
from trayapp.engine.guard.causes import CAUSES, last_resort, pausing
from trayapp.engine.guard.model import (
    BUDGET_WATCHES,
    ENDED_STATES,
    MEM_KEY,
    PARKED_STATES,
    PAUSED_STATES,
    PSI_KEY,
    RUNNING_STATES,
    TREND_KEY,
    Action,
    Assessment,
    Condition,
    GuardInput,
    GuardState,
    JobView,
    Policy,
    ProcessView,
)
from trayapp.engine.guard.rate import MIN_INTERVAL_SECONDS, NOISE_RATE_BYTES_PER_S
from trayapp.vocab import GuardAct as A
from trayapp.vocab import GuardCause as C
from trayapp.vocab import JobState as S

# An action on a target blocks further actions on it until its state changes, or this long.
PENDING_SECONDS = 3.0
# A job paused again soon after this many automatic resumes is left for the user to resume.
MAX_RELAPSES = 3
GUARD = vocab.Actor.GUARD  # who paused or parked a job, when the guard did


@dataclass(frozen=True)
class Target:
    """A job or process the guard may act on, as the choice sees it."""

    key: str
    label: str
    job: Optional[JobView]
    proc: Optional[ProcessView]
    rss: int
    rate: float
    running: bool
    paused: bool
    by_guard: bool
    state: str
    parked: bool = False

    @property
    def size(self) -> int:
        vram = (self.job.vram_bytes or 0) if self.job else 0
        return self.rss + vram

    @property
    def growth(self) -> float:
        return self.rate if self.rate >= NOISE_RATE_BYTES_PER_S else 0.0


def targets(inp: GuardInput, a: Assessment, st: GuardState) -> List[Target]:
    """The live jobs, and the processes a rule lets the guard act on (or that it paused)."""
    out: List[Target] = []
    for j in inp.jobs:
        if j.state in ENDED_STATES:
            continue
        parked = j.state in PARKED_STATES
        by = j.parked_by if parked else j.paused_by
        out.append(
            Target(
                f"job:{j.id}",
                j.label,
                j,
                None,
                j.rss_bytes or 0,
                a.job_rates.get(j.id, 0.0),
                j.state in RUNNING_STATES,
                j.state in PAUSED_STATES,
                by == GUARD,
                j.state,
                parked,
            )
        )
    for p in inp.processes:
        if p.job_id is not None or p.rule is None or p.rule.action not in (A.PAUSE, A.STOP):
            if not p.paused_by_guard:
                continue
        state = S.PAUSED if p.paused_by_guard else S.RUNNING
        out.append(
            Target(
                f"pid:{p.pid}",
                p.label,
                None,
                p,
                p.rss_bytes,
                p.rate_bytes_per_s or 0.0,
                not p.paused_by_guard,
                p.paused_by_guard,
                p.paused_by_guard,
                state,
            )
        )
    return out


def _pending(st: GuardState, t: Target, now: float) -> bool:
    entry = st.pending.get(t.key)
    if entry is None:
        return False
    _, when, state_then = entry
    return now - when < PENDING_SECONDS and t.state == state_then


def _free(st: GuardState, t: Target, kind: str, now: float) -> bool:
    return not _pending(st, t, now) and f"{kind}:{t.key}" not in st.would


def _by_urgency(ts: List[Target]) -> List[Target]:
    """The one growing fastest first, then the largest."""
    return sorted(ts, key=lambda t: (-t.growth, -t.size, t.key))


def _park(t: Target, reason: str, cause: str, a: Assessment, policy: Policy) -> Action:
    """Park ``t``; one that can shrink is relaunched at once at half its micro-batch."""
    job = t.job
    if job is not None and job.shrinks_to:
        act = _act(
            A.PARK, t, text.smaller_line(reason, job.batch, job.shrinks_to), cause, a, policy
        )
        act.data["smaller"] = job.shrinks_to
        return act
    return _act(A.PARK, t, text.park_line(reason), cause, a, policy)


def _act(
    kind: str,
    t: Target,
    reason: str,
    cause: str,
    a: Assessment,
    policy: Policy,
    deadline: Optional[float] = None,
) -> Action:
    data: Dict[str, Any] = {
        "available_bytes": a.available_bytes,
        "thresholds": a.thresholds.to_json(),
        "fill_rate_bytes_per_s": a.fill_rate_bytes_per_s,
        "seconds_to_exhaustion": a.seconds_to_exhaustion,
        "rss_bytes": t.rss,
        "growth_bytes_per_s": t.growth,
        "cause": cause,
    }
    if t.job is not None:
        data["vram_bytes"] = t.job.vram_bytes
    if deadline is not None:
        data["deadline_seconds"] = deadline
    if reason.startswith(t.label + " "):
        reason = reason[len(t.label) + 1 :]  # "paused job x: uses ...", not "job x: job x uses"
    return Action(
        kind,
        reason,
        cause,
        job_id=t.job.id if t.job else None,
        pid=t.proc.pid if t.proc else None,
        label=t.label,
        deadline_seconds=deadline,
        key=f"{kind}:{t.key}",
        target_state=t.state,
        data=data,
    )


def _deadline(t: Target, a: Assessment, policy: Policy, cause: str) -> float:
    """0: suspend at once. A Keras job otherwise gets up to ``pause_deadline_seconds`` to stop
    at a batch end, less when exhaustion (or its budget) is nearer."""
    if t.job is None or not t.job.hooked or cause in vocab.LAST_RESORT_CAUSES:
        return 0.0
    d = policy.pause_deadline_seconds
    if a.seconds_to_exhaustion is not None:
        d = min(d, a.seconds_to_exhaustion / 2.0)
    if cause == C.BUDGET_RAM and t.job.ram_budget_bytes and t.growth > 0:
        d = min(d, 0.1 * t.job.ram_budget_bytes / t.growth)
    return 0.0 if d < MIN_INTERVAL_SECONDS else round(d, 3)


def choose(
    inp: GuardInput, a: Assessment, policy: Policy, st: GuardState, targets: List[Target]
) -> Optional[Action]:
    """The one act for now, in the ladder's order: the last resort, a job over its budget, a
    shortage (actual or predicted), then a resume."""
    now = inp.time
    mem = a.condition(MEM_KEY)
    act = _last_resort_act(mem, a, policy, st, targets, now) if last_resort(mem) else None
    if act is not None:
        return act
    for c in a.conditions:
        if c.key.watch in BUDGET_WATCHES and pausing(c):
            t = next((t for t in targets if t.job is not None and t.job.id == c.job_id), None)
            if t is not None and t.running and _free(st, t, A.PAUSE, now):
                return _act(
                    A.PAUSE, t, c.reason, c.cause, a, policy, _deadline(t, a, policy, c.cause)
                )
            if (
                t is not None
                and t.paused
                and t.by_guard
                and t.job is not None
                and t.job.shrinks_to
                and _free(st, t, A.PARK, now)
            ):
                return _park(t, c.reason, c.cause, a, policy)  # paused at its budget: shrink
    act = _over_budget_park(a, policy, st, targets, now)
    if act is not None:
        return act
    act = _shortage_act(a, policy, st, targets, now)
    if act is not None:
        return act
    if st.calm_since is not None and now - st.calm_since >= policy.resume_after_seconds:
        return _resume_act(a, policy, st, targets, now, st.calm_since)
    return None


WENT_OVER = "went_over"  # a park's data: the job was paused for its budget (``still_holds``)


def _over_budget_park(
    a: Assessment, policy: Policy, st: GuardState, targets: List[Target], now: float
) -> Optional[Action]:
    """A job the guard paused for going over its budget, and that can shrink, is parked
    smaller even when it reads under the budget now (a pause that landed as a suspend in the
    middle of a step froze it under its peak): at this batch it would go over again, and its
    need never fits the budget, so it would wait paused for good."""
    for t in targets:
        cause = st.paused_for.get(t.key)
        job = t.job
        if (
            cause in (C.BUDGET_RAM, C.BUDGET_VRAM)
            and t.paused
            and t.by_guard
            and job is not None
            and job.shrinks_to
            and _free(st, t, A.PARK, now)
        ):
            vram = cause == C.BUDGET_VRAM
            budget = job.vram_budget_bytes if vram else job.ram_budget_bytes
            if budget:
                act = _park(t, text.went_over_line(t.label, vram, budget), cause, a, policy)
                act.data[WENT_OVER] = True  # its cause holds while it is paused for it
                return act
    return None


def _pause_or_stop(t: Target, reason: str, cause: str, a: Assessment, policy: Policy) -> Action:
    """Pause ``t``; a process a user rule names is stopped where the rule says so."""
    rule = t.proc.rule if t.proc is not None else None
    if rule is not None and rule.action == A.STOP:
        return _act(A.STOP, t, text.by_rule(reason, rule.pattern), cause, a, policy)
    if rule is not None:
        reason = text.by_rule(reason, rule.pattern)
    return _act(A.PAUSE, t, reason, cause, a, policy, _deadline(t, a, policy, cause))


def _last_resort_act(
    mem: Optional[Condition],
    a: Assessment,
    policy: Policy,
    st: GuardState,
    targets: List[Target],
    now: float,
) -> Optional[Action]:
    """Memory past the park threshold: suspend what grows, else park, else (past the stop
    threshold) stop."""
    assert mem is not None
    running = [t for t in targets if t.running and _free(st, t, A.PAUSE, now)]
    if running:
        return _pause_or_stop(_by_urgency(running)[0], mem.reason, mem.cause, a, policy)
    parkable = [
        t
        for t in targets
        if t.paused and t.job is not None and t.job.checkpoint and _free(st, t, A.PARK, now)
    ]
    if parkable:
        best = sorted(parkable, key=lambda t: (not t.by_guard, -t.size, t.key))[0]
        return _park(best, mem.reason, C.MEM_PARK, a, policy)
    if CAUSES[mem.cause].act is A.STOP:
        stoppable = [
            t
            for t in targets
            if t.job is not None and (t.paused or t.running) and _free(st, t, A.STOP, now)
        ]
        if stoppable:
            best = sorted(stoppable, key=lambda t: (-t.size, t.key))[0]
            return _act(A.STOP, best, text.stop_line(mem.reason), C.MEM_STOP, a, policy)
    return None


def _shortage_act(
    a: Assessment, policy: Policy, st: GuardState, targets: List[Target], now: float
) -> Optional[Action]:
    """A shortage that pauses: pause the most urgent job; a predicted one pauses only what
    grows. With everything paused and memory still falling, park."""
    mem, trend = a.condition(MEM_KEY), a.condition(TREND_KEY)
    actual = [c for c in (mem, a.condition(PSI_KEY)) if pausing(c)]
    if not actual and not pausing(trend):
        return None
    running = [t for t in targets if t.running and _free(st, t, A.PAUSE, now)]
    cause = actual[0] if actual else trend
    assert cause is not None
    if not actual:
        # A predicted shortage pauses only what grows, and not a job resumed a moment ago.
        running = [
            t
            for t in running
            if t.growth > 0 and now - st.resumed_at.get(t.key, -math.inf) >= policy.cooldown_seconds
        ]
    if running:
        return _pause_or_stop(_by_urgency(running)[0], cause.reason, cause.cause, a, policy)
    if (
        mem is not None
        and mem.cause == C.MEM_PAUSE
        and trend is not None
        and not any(t.running for t in targets)
    ):
        parkable = [
            t
            for t in targets
            if t.paused
            and t.by_guard
            and t.job is not None
            and t.job.checkpoint
            and _free(st, t, A.PARK, now)
        ]
        if parkable:
            best = sorted(parkable, key=lambda t: (-t.size, t.key))[0]
            if best.job is not None and best.job.shrinks_to:
                return _park(best, text.falling_line(trend.reason), C.MEM_FALLING, a, policy)
            return _act(A.PARK, best, text.falling_line(trend.reason), C.MEM_FALLING, a, policy)
    return None


def _resume_act(
    a: Assessment,
    policy: Policy,
    st: GuardState,
    targets: List[Target],
    now: float,
    calm_since: float,
) -> Optional[Action]:
    cands = [
        t
        for t in targets
        if (t.paused or t.parked)
        and t.by_guard
        and _free(st, t, A.RESUME, now)
        and _may_resume(t, policy, st)
        and (not t.parked or _room_to_relaunch(t, a, st))
        and wall(t, a, policy, st)[0]
    ]
    if not cands:
        return None
    # A paused job holds its memory already; a parked one needs it back.
    best = sorted(cands, key=lambda t: (t.parked, t.size, t.key))[0]
    reason = text.resume_line(a.thresholds.resume, now - calm_since, a.available_bytes, best.parked)
    return _act(A.RESUME, best, reason, C.CALM, a, policy)


def resume_fits(
    reached: int,
    need: Optional[int],
    growth: float,
    window: float,
    available: int,
    pause_at: int,
    budget: Optional[int],
) -> Tuple[bool, int, int]:
    """Whether a job suspended mid-step fits if resumed: (fits, bytes it needs more, bytes
    free for it). What it needs is its forecast (``need``, the RAM of the micro-batch it
    trains) or, without one, what it ``reached`` plus its ``growth`` (bytes/s, the rate the
    guard measured when it paused it) over the guard's rate ``window``. Free for it is what
    it can take before memory falls to the pause threshold (``available`` - ``pause_at``),
    and no more than is left of its ``budget``. Pure."""
    wanted = need if need is not None else reached + int(max(0.0, growth) * window)
    more = max(0, wanted - reached)
    free = max(0, available - pause_at)
    if budget:
        free = min(free, max(0, budget - reached))
    return more <= free, more, free


def wall(t: Target, a: Assessment, policy: Policy, st: GuardState) -> Tuple[bool, int, int]:
    """``resume_fits`` for target ``t``: never resume a job into the same wall. Only a job
    the guard suspended mid-step is held back (one paused at a batch end has finished its
    step; a parked one is relaunched by ``_room_to_relaunch``); (True, 0, 0) otherwise."""
    job = t.job
    if job is None or t.parked or not t.paused or not job.suspended:
        return True, 0, 0
    return resume_fits(
        t.rss,
        job.ram_need_bytes,
        st.paused_growth.get(t.key, 0.0),
        float(policy.rate_window_seconds),
        a.available_bytes,
        a.thresholds.pause,
        job.ram_budget_bytes,
    )


def _room_to_relaunch(t: Target, a: Assessment, st: GuardState) -> bool:
    """A parked job comes back only when what it held when parked still leaves the resume
    threshold free."""
    return a.available_bytes - st.parked_size.get(t.key, 0) >= a.thresholds.resume


def _may_resume(t: Target, policy: Policy, st: GuardState) -> bool:
    if st.relapses.get(t.key, 0) >= MAX_RELAPSES:
        return False
    job = t.job
    if job is None:
        return policy.auto_resume
    auto = job.auto_resume if job.auto_resume is not None else policy.auto_resume
    if not auto:
        return False
    share = policy.budget_warn_percent / 100.0
    for used, budget in (
        (job.rss_bytes, job.ram_budget_bytes),
        (job.vram_bytes, job.vram_budget_bytes),
    ):
        if budget and used is not None and used >= share * budget:
            return False  # still at its own budget: resuming would only pause it again
    return True


def held_line(t: Target, a: Assessment, policy: Policy, st: GuardState) -> str:
    """Why ``t``, paused or parked by the guard, stays so and what brings it back."""
    by_hand = not _may_resume(t, policy, st)
    fits, more, free = wall(t, a, policy, st)
    if not by_hand and not fits:
        return text.waits_line(t.label, more, free)
    relapsed = by_hand and st.relapses.get(t.key, 0) >= MAX_RELAPSES
    need = a.thresholds.resume + (st.parked_size.get(t.key, 0) if t.parked else 0)
    how = text.resume_how(t.job.id if t.job else None, t.proc.pid if t.proc else None)
    return text.held_line(
        t.label,
        how,
        t.parked,
        by_hand,
        MAX_RELAPSES if relapsed else 0,
        need,
        policy.resume_after_seconds,
    )
