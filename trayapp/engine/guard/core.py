"""The guard's decisions: readings, their recent history and the policy in; actions out.

Nothing here reads the machine or touches a process (``GuardService`` in ``guarding.py`` does
both), so every rule is tested with tables of readings.

The ladder, for available memory (cgroup-aware) and for each job's budgets:

* warn: below ``warn_available``, or exhaustion predicted within ``warn_horizon_seconds``,
  or PSI "full avg10" above its threshold for its duration, or a job at 90% of a budget, or a
  GPU's memory past ``vram_warn_percent``.
* pause: below ``pause_available``, or exhaustion predicted within ``pause_horizon_seconds``,
  or PSI above the pause threshold for its duration, or a job at its budget.
* park: below ``park_available`` (a paused job with a checkpoint folder is parked), or memory
  still falling with the guard's jobs paused.
* stop: below ``stop_available`` when nothing else is left to do.

Exhaustion means available memory reaching the *park* threshold: past it the guard must end a
job, so "seconds to exhaustion" is the time left to act without losing anything. It is
predicted from the fill rate (``rate``). Each cause's level, threshold and check are in one
table (``causes.CAUSES``); the choice of the one act of a tick is ``choice.choose``.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Dict, FrozenSet, List, Mapping, Optional, Tuple

from trayapp.engine.guard import text
from trayapp.engine.guard.causes import CAUSES, MEMORY_LADDER, UNKNOWN_CAUSE, calm_now, cond
from trayapp.engine.guard.choice import (
    GUARD,
    PENDING_SECONDS,
    WENT_OVER,
    Target,
    choose,
    held_line,
    targets,
    wall,
)
from trayapp.engine.guard.model import (
    ENDED_STATES,
    MEM_KEY,
    MEMORY_WATCHES,
    PARKED_STATES,
    PAUSED_STATES,
    PSI_KEY,
    RANK,
    RUNNING_STATES,
    TREND_KEY,
    Action,
    Assessment,
    Condition,
    CondKey,
    Decision,
    GuardInput,
    GuardState,
    JobView,
    Policy,
    Thresholds,
    Watch,
)
from trayapp.engine.guard.rate import NOISE_RATE_BYTES_PER_S, FillHistory, fill_rate
from trayapp.readings import GpuReading
from trayapp.vocab import GuardAct as A
from trayapp.vocab import GuardCause as C
from trayapp.vocab import GuardLevel as L
from trayapp.vocab import GuardMode as M

# A predicted shortage that only warns must last this long (a job importing TensorFlow fills
# memory fast for a second or two, then stops).
TREND_HOLD_SECONDS = 2.0
# A warning that cleared is not announced again unless it stays away this long.
ANNOUNCE_HOLD_SECONDS = 30.0
TOP_NAMED = 3  # processes a memory warning names


# -- what the readings mean -------------------------------------------------------------------


def assess(inp: GuardInput, history: FillHistory, policy: Policy, state: GuardState) -> Assessment:
    """The conditions the readings show (no choice of action yet). Pure."""
    now = inp.time
    m = inp.memory
    total = max(1, m.total_bytes)
    th = Thresholds.of(policy, total)
    avail = m.available_bytes
    rate = fill_rate(history, now, policy, state.rate_since)
    tte: Optional[float] = None
    if avail <= th.park:
        tte = 0.0
    elif rate:
        tte = (avail - th.park) / rate

    conds: List[Condition] = []
    mem = _memory_condition(
        avail, text.memory_have(avail, total, m.limit_source), th, policy, state, rate
    )
    if mem is not None:
        conds.append(mem)
    trend, trend_since = _trend_condition(now, avail, th, rate, tte, policy, state)
    if trend is not None:
        conds.append(trend)
    psi, psi_warn_since, psi_pause_since = _psi_condition(now, m.psi_full_avg10, policy, state)
    if psi is not None:
        conds.append(psi)
    job_rates = _budget_conditions(inp, history, policy, state, conds)
    for g in inp.gpus:
        c = _gpu_condition(g, inp, policy)
        if c is not None:
            conds.append(c)
    if avail < th.park:
        conds.extend(
            cond(
                CondKey(Watch.NOCKPT, job.id),
                C.NO_CHECKPOINT,
                text.no_checkpoint_line(job.label, job.rss_bytes),
                job.id,
            )
            for job in inp.jobs
            if job.state in PAUSED_STATES and not job.checkpoint
        )
    if any(c.key.watch in MEMORY_WATCHES for c in conds):
        conds.extend(
            cond(
                CondKey(Watch.RULE, str(p.pid)),
                C.RULE_WARN,
                text.rule_line(p.name, p.pid, p.rule.pattern, p.rss_bytes, p.rate_bytes_per_s),
            )
            for p in inp.processes
            if p.rule is not None and p.rule.action == A.WARN and not p.job_id
        )
    return Assessment(
        th, avail, rate, tte, tuple(conds), job_rates, psi_warn_since, psi_pause_since, trend_since
    )


def _memory_condition(
    avail: int, have: str, th: Thresholds, policy: Policy, state: GuardState, rate: Optional[float]
) -> Optional[Condition]:
    for cause in MEMORY_LADDER:
        setting = CAUSES[cause].setting
        assert setting is not None
        line = th.at(setting)
        if avail < line:
            return cond(
                MEM_KEY, cause, text.below_line(cause, have, line, getattr(policy, setting), rate)
            )
    if MEM_KEY in state.keys and avail < th.warn + th.hysteresis:
        return cond(
            MEM_KEY,
            C.MEM_WARN,
            text.just_above_line(have, th.warn, policy.warn_available, th.warn + th.hysteresis),
        )
    return None


def _trend_condition(
    now: float,
    avail: int,
    th: Thresholds,
    rate: Optional[float],
    tte: Optional[float],
    policy: Policy,
    state: GuardState,
) -> Tuple[Optional[Condition], Optional[float]]:
    """The prediction's condition, if any, and since when it has been predicted."""
    if tte is None or not rate or avail <= th.park:
        return None, None
    since = state.trend_since if state.trend_since is not None else now
    if 0 < policy.pause_horizon_seconds and tte <= policy.pause_horizon_seconds:
        return cond(TREND_KEY, C.MEM_PREDICTED, text.trend_line(rate, tte, th.park)), since
    if 0 < policy.warn_horizon_seconds and tte <= policy.warn_horizon_seconds:
        if now - since >= TREND_HOLD_SECONDS:
            return cond(TREND_KEY, C.MEM_TREND, text.trend_line(rate, tte, th.park)), since
        return None, since
    return None, None


def _psi_condition(
    now: float, psi: Optional[float], policy: Policy, state: GuardState
) -> Tuple[Optional[Condition], Optional[float], Optional[float]]:
    """The pressure condition, if any, and since when PSI is above each threshold."""
    if psi is None:
        return None, None, None
    warn_since = pause_since = None
    if psi > policy.psi_full_threshold:
        warn_since = state.psi_warn_since if state.psi_warn_since is not None else now
    if psi > policy.psi_pause_threshold:
        pause_since = state.psi_pause_since if state.psi_pause_since is not None else now
    found = None
    if pause_since is not None and now - pause_since >= policy.psi_pause_duration_seconds:
        found = cond(
            PSI_KEY, C.PSI_PAUSE, text.psi_line(psi, policy.psi_pause_threshold, now - pause_since)
        )
    elif warn_since is not None and now - warn_since >= policy.psi_duration_seconds:
        found = cond(
            PSI_KEY, C.PSI_WARN, text.psi_line(psi, policy.psi_full_threshold, now - warn_since)
        )
    return found, warn_since, pause_since


# Each budget of a job: what it watches, the cause over it and the cause near it.
_BUDGETS = (
    (Watch.RAM, C.BUDGET_RAM, C.BUDGET_RAM_WARN),
    (Watch.VRAM, C.BUDGET_VRAM, C.BUDGET_VRAM_WARN),
)


def _budget_conditions(
    inp: GuardInput, history: FillHistory, policy: Policy, state: GuardState, conds: List[Condition]
) -> Dict[str, float]:
    """Add a condition for each job at or near one of its budgets; returns each job's RSS
    growth (bytes/s, 0 when noise)."""
    job_rates: Dict[str, float] = {}
    warn_share = policy.budget_warn_percent / 100.0
    for job in inp.jobs:
        if job.state in ENDED_STATES:
            continue
        jf = history.fit(f"rss:{job.id}", inp.time, policy.rate_window_seconds)
        job_rates[job.id] = jf.rate if jf is not None and jf.significant and jf.rate > 0 else 0.0
        for watch, over, near in _BUDGETS:
            used, budget = job.budget(watch)
            if not budget or used is None:
                continue
            key = CondKey(watch, job.id)
            limit = max(float(budget), state.grace.get(key, 0.0))
            if used >= limit:
                conds.append(
                    cond(
                        key,
                        over,
                        text.budget_line(job.label, watch is Watch.VRAM, used, limit, budget),
                        job.id,
                    )
                )
            elif used >= warn_share * budget:
                conds.append(
                    cond(
                        key,
                        near,
                        text.budget_line(job.label, watch is Watch.VRAM, used, limit, budget),
                        job.id,
                    )
                )
    return job_rates


def _gpu_condition(g: GpuReading, inp: GuardInput, policy: Policy) -> Optional[Condition]:
    total, used = g.memory_total_bytes, g.memory_used_bytes
    if not total or used is None or 100.0 * used / total < policy.vram_warn_percent:
        return None
    owner: Dict[int, JobView] = {pid: j for j in inp.jobs for pid in j.pids}
    by_job: Dict[str, int] = {}
    top_proc = None
    for p in g.processes:
        if p.used_memory_bytes is None:
            continue
        job = owner.get(p.pid)
        if job is not None:
            by_job[job.id] = by_job.get(job.id, 0) + p.used_memory_bytes
        elif top_proc is None or p.used_memory_bytes > (top_proc.used_memory_bytes or 0):
            top_proc = p
    job_id = max(by_job, key=lambda k: by_job[k]) if by_job else None
    if job_id is not None:
        label = next(j.label for j in inp.jobs if j.id == job_id)
        holder = text.gpu_holder(label, by_job[job_id])
    elif top_proc is not None:
        holder = text.gpu_holder(
            f"{top_proc.name} (pid {top_proc.pid})", top_proc.used_memory_bytes
        )
    else:
        holder = ""
    return cond(
        CondKey(Watch.GPU, str(g.index)), C.GPU_VRAM, text.gpu_line(g, used, total, holder), job_id
    )


def _top_text(inp: GuardInput, history: FillHistory, policy: Policy) -> str:
    """Who holds and who fills the memory: each job as one whole (its tree's memory, and its
    growth over the rate window from the guard's own history of it), then the other processes
    by name. The engine's own process is named by size only: what a job allocates never shows
    as its growth."""
    rows: List[Tuple[str, int, Optional[float]]] = []
    held: Dict[str, int] = {}  # a job's processes in the sample, when its tree is not read yet
    for p in inp.processes:
        if p.job_id:
            held[p.job_id] = held.get(p.job_id, 0) + p.rss_bytes
            continue
        rate = None if p.own else p.rate_bytes_per_s
        rows.append(
            (
                "headroom engine" if p.own else p.name,
                p.rss_bytes,
                rate if rate is not None and rate >= NOISE_RATE_BYTES_PER_S else None,
            )
        )
    for job in inp.jobs:
        size = job.rss_bytes if job.rss_bytes is not None else held.get(job.id)
        if job.state in ENDED_STATES or not size:
            continue
        fit = history.fit(f"rss:{job.id}", inp.time, policy.rate_window_seconds)
        rate = fit.rate if fit is not None and fit.significant and fit.rate > 0 else None
        rows.append((job.label, size, rate))
    return text.top_text(rows, TOP_NAMED)


def decide(inp: GuardInput, history: FillHistory, policy: Policy, state: GuardState) -> Decision:
    """What to do now. Pure: the same readings, history, policy and state give the same
    decision. At most one act (pause, resume, park, stop) per call; notifications as many as
    there are new conditions. The returned ``next`` state assumes the notifications were
    sent; acts are recorded with ``acted()`` once carried out (or reported, in dry-run)."""
    now = inp.time
    st = _track_jobs(state, inp, policy)
    a = assess(inp, history, policy, st)
    st = replace(
        st,
        psi_warn_since=a.psi_warn_since,
        psi_pause_since=a.psi_pause_since,
        trend_since=a.trend_since,
    )

    conds = sorted(a.conditions, key=lambda c: -RANK[c.level])
    level = conds[0].level if conds else L.OK
    reasons = [c.reason for c in conds]
    cands = targets(inp, a, st)
    for t in cands:
        if (t.paused or t.parked) and t.by_guard:
            held = L.PARK if t.parked else L.PAUSE
            level = level if RANK[level] >= RANK[held] else held
            reasons.append(held_line(t, a, policy, st))
    memory_short = any(c.key.watch in MEMORY_WATCHES for c in conds)
    top = _top_text(inp, history, policy) if memory_short else ""
    if top:
        reasons.append(top)

    # Calm enough to count towards a resume: no prediction or pressure either.
    calm = calm_now(a, C.CALM, None) and not any(c.key in (TREND_KEY, PSI_KEY) for c in conds)
    st = replace(
        st, calm_since=(st.calm_since if st.calm_since is not None else now) if calm else None
    )

    actions: List[Action] = []
    if policy.mode != M.OFF:
        notes, st = _announce(conds, level, st, now, inp, a, top)
        actions.extend(notes)
        act = choose(inp, a, policy, st, cands)
        if (
            act is None
            and st.calm_since is not None
            and now - st.calm_since >= policy.resume_after_seconds
        ):
            notes, st = _say_waits(cands, a, policy, st)  # resumes the wall holds back
            actions.extend(notes)
        if act is not None:
            if policy.mode == M.DRY_RUN:
                act = replace(act, dry_run=True)
            actions.append(act)
    if level == L.OK and st.would:
        st = replace(st, would=frozenset())
    st = replace(st, level=level, keys=frozenset(c.key for c in conds))
    return Decision(
        level,
        tuple(reasons),
        a.seconds_to_exhaustion,
        a.fill_rate_bytes_per_s,
        a.thresholds,
        tuple(actions),
        st,
        memory_short,
    )


def acted(
    state: GuardState, action: Action, now: float, policy: Policy, done: bool = True
) -> GuardState:
    """The state after ``action`` was carried out (or, in dry-run, reported). ``done`` False:
    it was refused; the target is only left alone for a moment."""
    target = action.target
    if not action.acts or target is None:
        return state
    record = {
        "time": now,
        "kind": action.kind,
        "target": target,
        "message": action.message,
        "dry_run": action.dry_run,
    }
    if action.dry_run:
        return replace(state, would=state.would | {action.key}, last_action=record)
    pending = dict(state.pending)
    pending[target] = (action.kind, now, action.target_state)
    st = replace(state, pending=pending, last_action=record)
    if not done:
        return st
    if action.kind == A.RESUME:
        resumed = dict(st.resumed_at)
        resumed[target] = now
        paused_for = dict(st.paused_for)
        paused_for.pop(target, None)
        # The next automatic resume waits for its own stretch of calm, and fill rates
        # start afresh: what the resumed job does next is news.
        growth = {k: v for k, v in st.paused_growth.items() if k != target}
        return replace(
            st,
            resumed_at=resumed,
            paused_for=paused_for,
            calm_since=now,
            rate_since=now,
            paused_growth=growth,
            waits_said=st.waits_said - {target},
        )
    st = replace(st, rate_since=now, calm_since=None)
    if action.kind in (A.PAUSE, A.PARK):
        paused_for = dict(st.paused_for)
        paused_for[target] = action.cause
        growth = dict(st.paused_growth)
        growth[target] = float(action.data.get("growth_bytes_per_s") or 0.0)
        st = replace(st, paused_growth=growth, waits_said=st.waits_said - {target})
        relapses = dict(st.relapses)
        if now - st.resumed_at.get(target, -math.inf) < policy.cooldown_seconds:
            relapses[target] = relapses.get(target, 0) + 1
        st = replace(st, paused_for=paused_for, relapses=relapses)
    if action.kind == A.PARK:
        sizes = dict(st.parked_size)
        sizes[target] = int(action.data.get("rss_bytes") or 0)
        st = replace(st, parked_size=sizes)
    return st


def still_holds(
    action: Action, inp: GuardInput, history: FillHistory, policy: Policy, state: GuardState
) -> Tuple[bool, str]:
    """Whether ``action``'s cause still holds on a fresh reading ``inp``: (holds, why not).

    An act on a job that is gone or no longer in the state the act needs does not hold."""
    if not action.acts:
        return True, ""
    if action.job_id is not None:
        job = next((j for j in inp.jobs if j.id == action.job_id), None)
        if job is None:
            return False, text.gone_line(action.job_id)
        needs = _ACT_NEEDS.get(action.kind)
        if needs is not None and job.state not in needs:
            return False, text.state_line(job.label, job.state)
        if action.data.get(WENT_OVER) and state.paused_for.get(action.target or "") == action.cause:
            return True, ""  # paused for going over its budget: under it now, frozen
    a = assess(inp, history, policy, state)
    rule = CAUSES.get(action.cause, UNKNOWN_CAUSE)
    if rule.holds(a, action.cause, action.job_id):
        return True, ""
    return False, text.passed_line(action.kind, action.cause, a.available_bytes)


# The states a job must be in for an act on it.
_ACT_NEEDS: Mapping[str, FrozenSet[str]] = {
    A.PAUSE: RUNNING_STATES,
    A.PARK: PAUSED_STATES,
    A.RESUME: PAUSED_STATES | PARKED_STATES,
}


# -- notifications and bookkeeping ------------------------------------------------------------


def _announce(
    conds: List[Condition],
    level: str,
    st: GuardState,
    now: float,
    inp: GuardInput,
    a: Assessment,
    top: str,
) -> Tuple[List[Action], GuardState]:
    """A ``warn`` notification for each condition that is new or got worse; ``ok`` when all
    is well again after one."""
    announced = dict(st.announced)
    out: List[Action] = []
    seen = set()
    for c in conds:
        rank = RANK[c.level]
        seen.add(c.key)
        prev = announced.get(c.key)
        if prev is None or rank > prev[0]:
            reason = c.reason
            if top and c.key.watch in MEMORY_WATCHES:
                reason = f"{reason}; {top}"
            out.append(
                Action(
                    A.WARN,
                    reason,
                    c.cause,
                    job_id=c.job_id,
                    condition=c.key,
                    data={
                        "available_bytes": a.available_bytes,
                        "total_bytes": inp.memory.total_bytes,
                        "fill_rate_bytes_per_s": a.fill_rate_bytes_per_s,
                        "seconds_to_exhaustion": a.seconds_to_exhaustion,
                        "psi_full_avg10": inp.memory.psi_full_avg10,
                        "thresholds": a.thresholds.to_json(),
                        "level": c.level,
                        "cause": c.cause,
                    },
                )
            )
            announced[c.key] = (rank, now)
        elif rank == prev[0]:
            announced[c.key] = (rank, now)
        elif now - prev[1] > ANNOUNCE_HOLD_SECONDS:
            announced[c.key] = (rank, now)  # it eased for a while: a new worsening is news
    for key in [k for k in announced if k not in seen]:
        if now - announced[key][1] > ANNOUNCE_HOLD_SECONDS:
            del announced[key]
    ok_pending = st.ok_pending or bool(out)
    if level == L.OK and st.ok_pending:
        out.append(
            Action(
                A.OK,
                text.back_to_normal_line(a.available_bytes, inp.memory.total_bytes),
                C.OK,
                data={"available_bytes": a.available_bytes},
            )
        )
        ok_pending = False
    return out, replace(st, announced=announced, ok_pending=ok_pending)


def _say_waits(
    cands: List[Target], a: Assessment, policy: Policy, st: GuardState
) -> Tuple[List[Action], GuardState]:
    """A ``warn`` notification, once a pause, for each job calm would resume but that waits
    because what it needs does not fit (``choice.wall``)."""
    out: List[Action] = []
    said = set(st.waits_said)
    for t in cands:
        if t.key in said or not (t.paused and t.by_guard and t.job is not None):
            continue
        fits, more, free = wall(t, a, policy, st)
        if fits:
            continue
        said.add(t.key)
        out.append(
            Action(
                A.WARN,
                text.waits_line(t.label, more, free),
                C.CALM,
                job_id=t.job.id,
                data={
                    "available_bytes": a.available_bytes,
                    "need_more_bytes": more,
                    "free_bytes": free,
                    "cause": C.CALM,
                },
            )
        )
    return out, replace(st, waits_said=frozenset(said))


def _track_jobs(st: GuardState, inp: GuardInput, policy: Policy) -> GuardState:
    """Forget what belongs to jobs that are gone; raise the budget of a job the user resumed
    by hand while it was over it (by another tenth of the budget), so the resume sticks."""
    now = inp.time
    live = {j.id: j for j in inp.jobs if j.state not in ENDED_STATES}
    grace = {k: v for k, v in st.grace.items() if k.ref in live}
    paused_for = dict(st.paused_for)
    margin = 1.0 - policy.budget_warn_percent / 100.0
    for j in live.values():
        prev = st.job_states.get(j.id)
        key = f"job:{j.id}"
        pend = st.pending.get(key)
        ours = pend is not None and pend[0] == A.RESUME and now - pend[1] < PENDING_SECONDS
        by_guard = (
            prev is not None and prev[0] in PAUSED_STATES and prev[1] == GUARD
        ) or key in st.paused_for
        if by_guard and j.state in RUNNING_STATES and j.paused_by is None and not ours:
            for watch, _over, _near in _BUDGETS:
                used, budget = j.budget(watch)
                if budget and used is not None and used >= budget * (1.0 - margin):
                    grace[CondKey(watch, j.id)] = used + margin * budget
            paused_for.pop(key, None)
    keys = {f"job:{i}" for i in live} | {f"pid:{p.pid}" for p in inp.processes}

    def keep(d: Dict[str, Any]) -> Dict[str, Any]:
        return {k: v for k, v in d.items() if k in keys or not k.startswith("job:")}

    return replace(
        st,
        grace=grace,
        job_states={i: (j.state, j.paused_by) for i, j in live.items()},
        pending=keep(st.pending),
        resumed_at=keep(st.resumed_at),
        relapses=keep(st.relapses),
        paused_for=keep(paused_for),
        parked_size=keep(st.parked_size),
        paused_growth=keep(st.paused_growth),
        waits_said=frozenset(k for k in st.waits_said if k in keys),
    )
