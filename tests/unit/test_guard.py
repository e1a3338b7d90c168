"""The guard's decision as tables of readings: thresholds, hysteresis, prediction, budgets,
pressure, dry-run, cooldown, and which job goes first."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import pytest

from trayapp.config import Config, Paths, Threshold
from trayapp.engine.guard import (
    MAX_RELAPSES,
    Action,
    Decision,
    FillHistory,
    GuardInput,
    GuardState,
    JobView,
    Policy,
    ProcessView,
    Rule,
    acted,
    decide,
    still_holds,
)
from trayapp.engine.guarding import ConfigPolicy, GuardService
from trayapp.engine.service import Engine
from trayapp.engine.store import Store
from trayapp.probes.gpu import NoGpuBackend
from trayapp.probes.memory import MemoryProbe
from trayapp.readings import GpuProcess, GpuReading, MemoryReading

MiB = 1 << 20
GiB = 1 << 30
TOTAL = 16 * GiB
# The default ladder on 16 GiB: warn 15% = 2.4 GiB, pause 8% = 1.28 GiB, park 5% = 0.8 GiB,
# stop 2% = 0.32 GiB, resume 20% = 3.2 GiB.


def pct(p: float) -> int:
    return int(TOTAL * p / 100)


def reading(avail: int, t: float = 0.0, total: int = TOTAL, psi: Optional[float] = 0.0,
            source: str = "host") -> MemoryReading:
    return MemoryReading(time=t, total_bytes=total, available_bytes=int(avail),
                         used_bytes=total - int(avail), swap_total_bytes=0, swap_used_bytes=0,
                         psi_some_avg10=psi, psi_full_avg10=psi, limit_source=source)


def job(id: str = "j1", state: str = "running", rss: int = 1 * GiB, **kw) -> JobView:
    kw.setdefault("name", f"{id}.py")
    kw.setdefault("pids", (1000 + len(id) + sum(map(ord, id)),))
    return JobView(id=id, state=state, rss_bytes=rss, **kw)


def paused(j: JobView, by: str = "guard") -> JobView:
    return replace(j, state="paused", paused_by=by)


class Guard:
    """Feeds readings through ``decide`` the way GuardService does, recording acts."""

    def __init__(self, policy: Policy = Policy()):
        self.policy = policy
        self.history = FillHistory()
        self.state = GuardState()
        self.jobs: Dict[str, JobView] = {}

    def tick(self, t: float, avail: int, jobs: Iterable[JobView] = (), psi: float = 0.0,
             gpus: Sequence[GpuReading] = (), processes: Sequence[ProcessView] = (),
             total: int = TOTAL, carry_out: bool = True) -> Decision:
        for j in jobs:
            self.jobs[j.id] = j
        inp = GuardInput(t, reading(avail, t, total, psi), tuple(gpus),
                         tuple(self.jobs.values()), tuple(processes))
        self.history.record(inp)
        d = decide(inp, self.history, self.policy, self.state)
        self.state = d.next
        for a in d.actions:
            if a.acts:
                self.state = acted(self.state, a, t, self.policy)
                if carry_out and not a.dry_run and a.job_id:
                    self._apply(a)
        return d

    def _apply(self, a: Action) -> None:
        """What the JobManager would do."""
        j = self.jobs[a.job_id]
        if a.kind == "pause":
            self.jobs[j.id] = replace(j, state="paused", paused_by="guard")
        elif a.kind == "resume":
            self.jobs[j.id] = replace(j, state="running", paused_by=None)
        elif a.kind == "park":
            self.jobs[j.id] = replace(j, state="parked", rss_bytes=None, paused_by=None,
                                      parked_by="guard", pids=())
        elif a.kind == "stop":
            self.jobs[j.id] = replace(j, state="stopped", rss_bytes=None)


def acts(d: Decision) -> List[Tuple[str, Optional[str]]]:
    return [(a.kind, a.job_id or (f"pid:{a.pid}" if a.pid else None)) for a in d.actions
            if a.acts]


def notes(d: Decision, kind: str = "warn") -> List[Action]:
    return [a for a in d.actions if a.kind == kind]


# -- the ladder -------------------------------------------------------------------------------

LADDER = [
    # available, the job's state, has a checkpoint, expected level, expected act
    (pct(50), "running", True, "ok", []),
    (pct(16), "running", True, "ok", []),
    (pct(14), "running", True, "warn", []),
    (pct(7), "running", True, "pause", [("pause", "j1")]),
    (pct(4), "running", True, "park", [("pause", "j1")]),  # stop growing first, at once
    (pct(4), "paused", True, "park", [("park", "j1")]),
    (pct(4), "paused", False, "park", []),  # kept paused: parking would lose progress
    (pct(1), "paused", False, "park", [("stop", "j1")]),  # nothing else is left
    (pct(1), "paused", True, "park", [("park", "j1")]),  # parking still beats stopping
    (pct(7), "paused", True, "pause", []),  # nothing more to pause
]


@pytest.mark.parametrize("avail,state,ckpt,level,expected", LADDER)
def test_the_ladder(avail: int, state: str, ckpt: bool, level: str, expected: list) -> None:
    j = job(state=state, checkpoint=ckpt, hooked=ckpt,
            paused_by="guard" if state == "paused" else None)
    d = Guard().tick(100.0, avail, [j])
    assert d.state == level
    assert acts(d) == expected
    if level in ("warn", "pause", "park"):
        assert any("available memory" in r for r in d.reasons)


def test_a_job_kept_paused_says_why() -> None:
    j = job(state="paused", paused_by="guard", checkpoint=False)
    d = Guard().tick(0.0, pct(4), [j])
    lines = [a.reason for a in notes(d)]
    assert any("no checkpoint folder: parking it would lose its progress" in x for x in lines)
    assert any(a.job_id == "j1" for a in notes(d) if "checkpoint" in a.reason)


def test_suspend_at_once_past_the_park_threshold_even_for_keras() -> None:
    j = job(hooked=True, checkpoint=True)
    d = Guard().tick(0.0, pct(4), [j])
    (a,) = [a for a in d.actions if a.acts]
    assert a.kind == "pause" and a.deadline_seconds == 0.0


@pytest.mark.parametrize("setting,avail,level", [
    ("2048 MiB", int(2.1 * GiB), "ok"),
    ("2048 MiB", int(1.9 * GiB), "warn"),
    ("2 GiB", int(1.9 * GiB), "warn"),
    ("25%", pct(24), "warn"),
    ("25%", pct(26), "ok"),
])
def test_warning_threshold_as_a_size_or_a_share(setting: str, avail: int, level: str) -> None:
    p = Policy(warn_available=Threshold.parse(setting))
    assert Guard(p).tick(0.0, avail).state == level


def test_thresholds_follow_a_cgroup_limit() -> None:
    # 1 GiB limit: pause at 8% = 82 MiB.
    g = Guard()
    d = g.tick(0.0, 70 * MiB, [job(rss=900 * MiB)], total=1 * GiB)
    assert d.state == "pause" and acts(d) == [("pause", "j1")]
    assert d.thresholds.pause == int(0.08 * GiB)


def test_warning_hysteresis() -> None:
    g = Guard()
    seq = [(pct(14), "warn"), (pct(15.5), "warn"), (pct(16.5), "warn"), (pct(17.5), "ok"),
           (pct(16.5), "ok")]
    ok_notes = []
    for i, (avail, level) in enumerate(seq):
        d = g.tick(float(i), avail)
        assert d.state == level, (i, avail)
        ok_notes += notes(d, "ok")
    assert len(ok_notes) == 1 and "back to normal" in ok_notes[0].message


def test_a_warning_is_announced_once_and_again_when_worse() -> None:
    g = Guard()
    counts = [len(notes(g.tick(float(t), pct(14)))) for t in range(5)]
    assert counts == [1, 0, 0, 0, 0]
    d = g.tick(5.0, pct(7))
    assert "mem_pause" in [a.cause for a in notes(d)]
    assert [len(notes(g.tick(t, pct(7)))) for t in (6.0, 7.0, 8.0)] == [0, 0, 0]


def test_a_flapping_warning_is_not_repeated() -> None:
    g = Guard()
    total = 0
    for t in range(20):
        total += len(notes(g.tick(float(t), pct(14) if t % 2 == 0 else pct(30))))
        total += len(notes(g.tick(t + 0.5, pct(30)), "ok"))
    assert total <= 2  # one warning, one "back to normal"


# -- prediction -------------------------------------------------------------------------------


def falling(g: Guard, start: int, rate: float, t0: float, t1: float, step: float = 0.1,
            jobs: Iterable[JobView] = (), grower: Optional[JobView] = None) -> List[Decision]:
    """Available memory falling at ``rate`` bytes/s; ``grower`` (if any) takes it all."""
    out = []
    n = int(round((t1 - t0) / step))
    for i in range(n + 1):
        t = t0 + i * step
        now = list(jobs)
        if grower is not None:
            g0 = grower.rss_bytes or 0
            current = g.jobs.get(grower.id, grower)
            if current.state == "running":
                now.append(replace(current, rss_bytes=int(g0 + rate * (t - t0))))
        out.append(g.tick(t, int(start - rate * (t - t0)), now))
    return out


def test_prediction_warns_then_pauses_before_any_threshold() -> None:
    g = Guard()
    grower = job(rss=2 * GiB)
    # 500 MB/s from 12 GiB: the park threshold (0.8 GiB) is ~23 s away at the start.
    ds = falling(g, 12 * GiB, 500e6, 0.0, 20.0, grower=grower)
    first_warn = next(i for i, d in enumerate(ds) if d.state == "warn")
    first_pause = next(i for i, d in enumerate(ds) if acts(d))
    t_warn, t_pause = first_warn * 0.1, first_pause * 0.1
    assert t_warn <= 2.5  # within 60 s from the start, after the 2 s hold
    d = ds[first_pause]
    assert acts(d) == [("pause", "j1")]
    assert d.seconds_to_exhaustion is not None and d.seconds_to_exhaustion <= 10.0
    avail_then = 12 * GiB - 500e6 * t_pause
    assert avail_then > pct(15)  # no threshold crossed yet: this is the prediction's doing
    assert abs(d.fill_rate_bytes_per_s - 500e6) < 25e6
    expected_tte = (avail_then - pct(5)) / 500e6
    assert abs(d.seconds_to_exhaustion - expected_tte) < 0.5


@pytest.mark.parametrize("pattern", ["flat", "jitter", "spike", "rising"])
def test_no_prediction_from_noise(pattern: str) -> None:
    g = Guard()
    base = 4 * GiB  # well above the warning threshold
    jitter = [0, 30, -25, 10, -40, 35, -5, 20, -30, 15] * 5
    for i, j in enumerate(jitter):
        t = i * 0.1
        if pattern == "flat":
            avail = base
        elif pattern == "jitter":
            avail = base + j * MiB
        elif pattern == "spike":
            avail = base - (600 * MiB if i == 25 else 0)
        else:
            avail = base + int(200e6 * t)
        d = g.tick(t, avail)
        if pattern != "spike" or i != 25:
            assert d.seconds_to_exhaustion is None, (pattern, i)
        assert d.state == "ok" and not acts(d), (pattern, i)


def test_prediction_can_be_turned_off() -> None:
    g = Guard(Policy(warn_horizon_seconds=0, pause_horizon_seconds=0))
    ds = falling(g, 6 * GiB, 1e9, 0.0, 3.0, jobs=[job()])
    assert all(d.state == "ok" for d in ds)
    assert ds[-1].seconds_to_exhaustion is not None  # still shown in the status


def test_a_short_burst_does_not_warn() -> None:
    # TensorFlow's import: 400 MB in one second, then flat; 8 GiB available.
    g = Guard()
    falling(g, 8 * GiB, 400e6, 0.0, 1.0)
    ds = [g.tick(1.0 + i * 0.1, int(8 * GiB - 400e6)) for i in range(1, 60)]
    assert all(d.state == "ok" for d in ds)


def test_predicted_pause_spares_jobs_that_do_not_grow() -> None:
    g = Guard()
    steady = job("steady", rss=6 * GiB)
    ds = falling(g, 6 * GiB, 500e6, 0.0, 3.0, jobs=[steady])
    assert any(d.state == "pause" for d in ds)
    assert all(acts(d) == [] for d in ds)


# -- which job first --------------------------------------------------------------------------


def test_the_fastest_growing_job_first_then_the_largest() -> None:
    g = Guard()
    big = job("big", rss=4 * GiB)
    fast = job("fast", rss=1 * GiB)
    small = job("small", rss=512 * MiB)
    for i in range(10):  # "fast" grows 200 MB/s; the others stay
        t = i * 0.1
        g.tick(t, pct(30), [big, small, replace(fast, rss_bytes=int(GiB + 200e6 * t))])
    order = []
    for i in range(4):
        t = 1.0 + i * 0.1
        d = g.tick(t, pct(7))
        order += acts(d)
        assert len(acts(d)) <= 1  # one act per cycle
    assert order == [("pause", "fast"), ("pause", "big"), ("pause", "small")]


def test_keras_jobs_get_a_cooperative_pause_others_are_suspended() -> None:
    g = Guard()
    keras = job("keras", rss=2 * GiB, hooked=True)
    plain = job("plain", rss=1 * GiB)
    d1 = g.tick(0.0, pct(7), [keras, plain])
    d2 = g.tick(0.1, pct(7))
    deadlines = {a.job_id: a.deadline_seconds for d in (d1, d2) for a in d.actions if a.acts}
    assert deadlines == {"keras": 2.0, "plain": 0.0}


def test_the_pause_deadline_shrinks_when_exhaustion_is_near() -> None:
    g = Guard()
    keras = job("keras", rss=2 * GiB, hooked=True)
    # 1 GB/s from 4.5 GiB: the predicted pause comes with ~3.5 s left, so the job gets less
    # than half of that to stop at a batch end.
    ds = falling(g, int(4.5 * GiB), 1e9, 0.0, 3.0, step=0.05, grower=keras)
    a = next(a for d in ds for a in d.actions if a.acts)
    assert a.kind == "pause" and 0 < a.deadline_seconds < 2.0
    assert a.deadline_seconds <= a.data["seconds_to_exhaustion"] / 2 + 1e-6


def test_user_paused_job_may_be_parked_but_guard_ones_first() -> None:
    g = Guard()
    mine = job("mine", state="paused", paused_by="user", rss=3 * GiB, checkpoint=True)
    theirs = job("guards", state="paused", paused_by="guard", rss=1 * GiB, checkpoint=True)
    assert acts(g.tick(0.0, pct(4), [mine, theirs])) == [("park", "guards")]
    assert acts(g.tick(0.1, pct(4))) == [("park", "mine")]


@pytest.mark.parametrize("auto,after_park,relaunched", [
    (True, pct(25) + 2 * GiB, True),  # room for the 2 GiB it held, above the resume threshold
    (True, pct(25), False),  # calm, but relaunching it would bring the shortage back
    (False, pct(60), False),  # --manual-resume: waits for `headroom resume`
])
def test_a_parked_job_is_relaunched_when_there_is_room(auto: bool, after_park: int,
                                                       relaunched: bool) -> None:
    g = Guard()
    j = job(state="paused", paused_by="guard", rss=2 * GiB, checkpoint=True, hooked=True,
            auto_resume=auto)
    assert acts(g.tick(0.0, pct(4), [j])) == [("park", "j1")]
    ds = [g.tick(float(t), after_park) for t in range(1, 15)]
    assert ds[0].state == "park"
    got = [a for d in ds for a in d.actions if a.acts]
    if relaunched:
        assert [(a.kind, a.job_id) for a in got] == [("resume", "j1")]
        assert "relaunched from its checkpoint" in got[0].message
    else:
        assert got == []
        assert ds[-1].state == "park" and any("parked by the guard" in r for r in ds[-1].reasons)


def test_park_when_memory_keeps_falling_with_the_jobs_paused() -> None:
    g = Guard()
    j = job(state="paused", paused_by="guard", checkpoint=True, hooked=True)
    ds = falling(g, pct(7.5), 30e6, 0.0, 3.0, jobs=[j])
    parks = [a for d in ds for a in d.actions if a.kind == "park"]
    assert parks and parks[0].cause == "mem_falling"
    assert "keeps falling" in parks[0].reason


def test_a_pending_act_is_not_repeated() -> None:
    g = Guard()
    j = job(hooked=True)
    d1 = g.tick(0.0, pct(7), [j], carry_out=False)  # the job stays "running" (pausing slowly)
    d2 = g.tick(0.1, pct(7))
    assert acts(d1) == [("pause", "j1")] and acts(d2) == []


# -- budgets ----------------------------------------------------------------------------------

BUDGETS = [
    # rss, vram, expected level, expected acts, a reason fragment
    (200 * MiB, None, "ok", [], None),
    (271 * MiB, None, "warn", [], "90% of its budget of 300.0 MiB"),
    (300 * MiB, None, "pause", [("pause", "j1")], "over its budget of 300.0 MiB"),
    (100 * MiB, 1900 * MiB, "warn", [], "of VRAM, 93% of its budget of 2.0 GiB"),
    (100 * MiB, 2100 * MiB, "pause", [("pause", "j1")], "of VRAM, over its budget"),
]


@pytest.mark.parametrize("rss,vram,level,expected,fragment", BUDGETS)
def test_budgets(rss: int, vram: Optional[int], level: str, expected: list,
                 fragment: Optional[str]) -> None:
    j = job(rss=rss, vram_bytes=vram, ram_budget_bytes=300 * MiB,
            vram_budget_bytes=2 * GiB)
    d = Guard().tick(0.0, pct(60), [j])
    assert d.state == level
    assert acts(d) == expected
    if fragment:
        assert any(fragment in r for r in d.reasons), d.reasons
        warn = notes(d)[0]
        assert warn.job_id == "j1"  # so `headroom run` shows it


def test_a_job_resumed_by_hand_over_its_budget_gets_room_to_grow() -> None:
    g = Guard()
    j = job(rss=310 * MiB, ram_budget_bytes=300 * MiB)
    assert acts(g.tick(0.0, pct(60), [j])) == [("pause", "j1")]
    # The user resumes it: it may grow by a tenth of its budget before the next pause.
    g.jobs["j1"] = replace(g.jobs["j1"], state="running", paused_by=None)
    assert acts(g.tick(5.0, pct(60))) == []
    g.jobs["j1"] = replace(g.jobs["j1"], rss_bytes=335 * MiB)
    assert acts(g.tick(6.0, pct(60))) == []
    g.jobs["j1"] = replace(g.jobs["j1"], rss_bytes=345 * MiB)
    d = g.tick(7.0, pct(60))
    assert acts(d) == [("pause", "j1")]
    assert "raised when you resumed it" in d.actions[-1].reason


def test_a_budget_pause_is_not_resumed_automatically() -> None:
    g = Guard()
    g.tick(0.0, pct(60), [job(rss=310 * MiB, ram_budget_bytes=300 * MiB)])
    d = None
    for t in range(1, 40):
        d = g.tick(float(t), pct(60))
        assert acts(d) == []
    assert d is not None and any("resume it by hand" in r for r in d.reasons)


# -- pressure ---------------------------------------------------------------------------------


def test_pressure_must_last_before_it_counts() -> None:
    g = Guard()
    j = job()
    levels = {}
    for t in range(0, 36):
        psi = 30.0 if t < 12 else 70.0
        d = g.tick(float(t), pct(60), [j], psi=psi)
        levels[t] = (d.state, acts(d))
    assert levels[19][0] == "ok"  # 30% for 19 s: not yet
    assert levels[20][0] == "warn"  # 20 s above 20%
    assert levels[35][0] == "warn"
    # 70% from t=12: the pause waits for 30 s of it (t=42), past this table's end.
    assert all(a == [] for _, a in levels.values())


def test_sustained_high_pressure_pauses() -> None:
    g = Guard()
    j = job()
    pause_at = None
    for t in range(0, 40):
        d = g.tick(float(t), pct(60), [j], psi=70.0)
        if acts(d) and pause_at is None:
            pause_at = t
            assert acts(d) == [("pause", "j1")] and d.actions[-1].cause == "psi_pause"
    assert pause_at == 30


def test_pressure_that_drops_restarts_the_count() -> None:
    g = Guard()
    for t in range(0, 40):
        psi = 0.0 if t == 15 else 30.0
        d = g.tick(float(t), pct(60), psi=psi)
        if t < 35:
            assert d.state == "ok", t
    assert d.state == "warn"


def test_no_pressure_reading_is_no_pressure() -> None:
    g = Guard()
    for t in range(0, 60):
        inp = GuardInput(float(t), reading(pct(60), float(t), psi=None))
        g.history.record(inp)
        d = decide(inp, g.history, g.policy, g.state)
        g.state = d.next
        assert d.state == "ok"


# -- resume and cooldown ----------------------------------------------------------------------


def pause_then_recover(g: Guard, j: JobView, until: float) -> List[Decision]:
    g.tick(0.0, pct(7), [j])
    assert g.jobs[j.id].state == "paused"
    return [g.tick(float(t), pct(25)) for t in range(1, int(until) + 1)]


def test_automatic_resume_after_ten_calm_seconds() -> None:
    g = Guard()
    ds = pause_then_recover(g, job(), 12)
    resumes = [(i + 1, acts(d)) for i, d in enumerate(ds) if acts(d)]
    assert resumes == [(11, [("resume", "j1")])]  # calm from t=1, 10 s later
    assert ds[5].state == "pause" and any("resumes when" in r for r in ds[5].reasons)
    assert ds[-1].state == "ok"


@pytest.mark.parametrize("j", [
    job(auto_resume=False),
    job(paused_by="user", state="paused"),
])
def test_no_automatic_resume_when_not_allowed(j: JobView) -> None:
    g = Guard()
    if j.state == "paused":
        g.tick(0.0, pct(7), [j])
        ds = [g.tick(float(t), pct(25)) for t in range(1, 20)]
    else:
        ds = pause_then_recover(g, j, 20)
    assert all(acts(d) == [] for d in ds)


def test_no_automatic_resume_when_the_policy_says_so() -> None:
    g = Guard(Policy(auto_resume=False))
    assert all(acts(d) == [] for d in pause_then_recover(g, job(), 20))


def test_resume_waits_for_calm_above_the_resume_threshold() -> None:
    g = Guard()
    g.tick(0.0, pct(7), [job()])
    ds = [g.tick(float(t), pct(19)) for t in range(1, 30)]  # above warn, below resume
    assert all(acts(d) == [] for d in ds)


def test_one_resume_at_a_time() -> None:
    g = Guard()
    g.tick(0.0, pct(7), [job("a", rss=1 * GiB), job("b", rss=2 * GiB)])
    g.tick(0.1, pct(7))
    assert {j.state for j in g.jobs.values()} == {"paused"}
    got = [(t, acts(d)) for t in range(1, 30) if acts(d := g.tick(float(t), pct(30)))]
    assert got == [(11, [("resume", "a")]), (21, [("resume", "b")])]  # smallest first


def test_cooldown_spares_a_resumed_job_from_a_predicted_pause() -> None:
    g = Guard()
    j = job(rss=1 * GiB)
    pause_then_recover(g, j, 11)
    assert g.jobs["j1"].state == "running"
    # It grows again fast: a predicted shortage within the cooldown does not pause it...
    ds = []
    for i in range(40):
        t = 12.0 + i * 0.1
        ds.append(g.tick(t, int(6 * GiB - 500e6 * i * 0.1),
                         [replace(g.jobs["j1"], rss_bytes=int(GiB + 500e6 * i * 0.1))]))
    assert any(d.state == "pause" for d in ds)
    assert all(acts(d) == [] for d in ds)
    # ...but an actual shortage does.
    d = g.tick(20.0, pct(7))
    assert acts(d) == [("pause", "j1")]


def test_a_job_that_keeps_relapsing_is_left_to_the_user() -> None:
    g = Guard()
    t = 0.0
    resumes = 0
    for _ in range(MAX_RELAPSES + 2):
        d = g.tick(t, pct(7), [g.jobs.get("j1") or job()])
        for s in range(1, 12):
            d = g.tick(t + s, pct(25))
            resumes += len([a for a in d.actions if a.kind == "resume"])
        t += 12
    assert resumes == MAX_RELAPSES
    assert g.jobs["j1"].state == "paused"
    assert any("resume it by hand" in r for r in d.reasons)


# -- modes ------------------------------------------------------------------------------------


def test_dry_run_reports_once_and_acts_on_nothing() -> None:
    g = Guard(Policy(mode="dry-run"))
    j = job()
    d1 = g.tick(0.0, pct(7), [j])
    (a,) = [a for a in d1.actions if a.acts]
    assert a.dry_run and a.event_level == "info"
    assert a.message.startswith("would pause job j1 (j1.py): available memory")
    assert g.jobs["j1"].state == "running"
    assert [a for a in g.tick(0.5, pct(7)).actions if a.acts] == []
    g.tick(1.0, pct(60))  # back to normal: a new shortage is reported again
    d3 = g.tick(2.0, pct(7))
    assert [a.kind for a in d3.actions if a.acts] == ["pause"]


def test_off_watches_only() -> None:
    g = Guard(Policy(mode="off"))
    d = g.tick(0.0, pct(1), [job()])
    assert d.state == "park" and d.reasons
    assert d.actions == ()


# -- GPUs -------------------------------------------------------------------------------------


def gpu(used: int, total: int = 8 * GiB, display: bool = False,
        procs: Tuple[GpuProcess, ...] = ()) -> GpuReading:
    return GpuReading(index=0, name="RTX 4070", uuid="GPU-x", memory_total_bytes=total,
                      memory_used_bytes=used, memory_free_bytes=total - used,
                      display_active=display, processes=procs)


@pytest.mark.parametrize("display,used,fragment", [
    (True, int(7.8 * GiB), "drives the desktop"),
    (False, int(7.8 * GiB), "of its memory is used; job j1 (j1.py) holds 6.0 GiB"),
    (True, int(7.0 * GiB), None),
])
def test_vram_warning_names_the_job(display: bool, used: int, fragment: Optional[str]) -> None:
    j = job(pids=(4242,))
    procs = (GpuProcess(4242, "python", 6 * GiB), GpuProcess(77, "Xorg", 300 * MiB, "graphics"))
    d = Guard().tick(0.0, pct(60), [j], gpus=[gpu(used, display=display, procs=procs)])
    if fragment is None:
        assert d.state == "ok"
        return
    assert d.state == "warn" and acts(d) == []
    (w,) = notes(d)
    assert fragment in w.message and "job j1" in w.message and w.job_id == "j1"


def test_vram_warning_without_per_process_figures() -> None:
    procs = (GpuProcess(4242, "python", None),)  # WDDM: no per-process memory
    d = Guard().tick(0.0, pct(60), gpus=[gpu(int(7.9 * GiB), procs=procs)])
    assert d.state == "warn" and "holds" not in d.reasons[0]


# -- other people's processes -----------------------------------------------------------------


def proc(pid: int, name: str, rss: int, rate: Optional[float] = None,
         rule: Optional[Rule] = None, paused_by_guard: bool = False) -> ProcessView:
    return ProcessView(pid, name, rss, rate, None, rule, paused_by_guard)


def test_foreign_processes_are_named_but_never_touched_without_a_rule() -> None:
    g = Guard()
    ps = [proc(10, "firefox", 6 * GiB, 300 * MiB), proc(11, "code", 2 * GiB)]
    d = g.tick(0.0, pct(1), processes=ps)
    assert d.state == "park" and acts(d) == []
    assert "filling: firefox 6.0 GiB (+300.0 MiB/s); largest: code 2.0 GiB" in notes(d)[0].message
    assert d.wants_processes


@pytest.mark.parametrize("action,kind", [("pause", "pause"), ("stop", "stop")])
def test_a_user_rule_acts_on_a_foreign_process(action: str, kind: str) -> None:
    g = Guard()
    rule = Rule("chrom*", action)
    ps = [proc(10, "chromium", 6 * GiB, 300 * MiB, rule), proc(11, "code", 2 * GiB)]
    d = g.tick(0.0, pct(7), processes=ps)
    assert acts(d) == [(kind, "pid:10")]
    assert "your rule 'chrom*'" in d.actions[-1].message


def test_a_warn_rule_only_warns() -> None:
    rule = Rule("chrom*", "warn")
    d = Guard().tick(0.0, pct(7), processes=[proc(10, "chromium", 6 * GiB, None, rule)])
    assert acts(d) == []
    assert any("your rule 'chrom*'" in a.message for a in notes(d))


def test_a_process_the_guard_suspended_is_continued_when_calm() -> None:
    g = Guard()
    p = proc(10, "chromium", 6 * GiB, None, Rule("chrom*", "pause"), paused_by_guard=True)
    got = [acts(g.tick(float(t), pct(30), processes=[p])) for t in range(0, 12)]
    assert got[10] == [("resume", "pid:10")] and sum(map(len, got)) == 1


# -- the fresh reading before acting ----------------------------------------------------------


def test_an_act_whose_cause_passed_is_dropped() -> None:
    g = Guard()
    j = job()
    d = g.tick(0.0, pct(7), [j], carry_out=False)
    (a,) = [a for a in d.actions if a.acts]
    for avail, holds in ((pct(7.5), True), (pct(9), False)):
        fresh = GuardInput(0.05, reading(avail, 0.05), jobs=(j,))
        ok, why = still_holds(a, fresh, g.history, g.policy, g.state)
        assert ok is holds
        if not holds:
            assert "has passed" in why
    gone = GuardInput(0.05, reading(pct(7), 0.05), jobs=())
    assert still_holds(a, gone, g.history, g.policy, g.state) == (False, "job j1 is gone")
    already = GuardInput(0.05, reading(pct(7), 0.05), jobs=(paused(j),))
    assert still_holds(a, already, g.history, g.policy, g.state)[0] is False


def test_a_budget_act_is_checked_against_a_fresh_size() -> None:
    g = Guard()
    j = job(rss=301 * MiB, ram_budget_bytes=300 * MiB)
    (a,) = [a for a in g.tick(0.0, pct(60), [j], carry_out=False).actions if a.acts]
    fresh = GuardInput(0.05, reading(pct(60), 0.05), jobs=(replace(j, rss_bytes=250 * MiB),))
    assert still_holds(a, fresh, g.history, g.policy, g.state)[0] is False
    fresh = GuardInput(0.05, reading(pct(60), 0.05), jobs=(replace(j, rss_bytes=320 * MiB),))
    assert still_holds(a, fresh, g.history, g.policy, g.state)[0] is True


# -- the policy from settings -----------------------------------------------------------------


def test_policy_from_settings() -> None:
    cfg = Config()
    cfg.values.update({"guard.warn_available": "2 GiB", "guard.mode": "dry-run",
                       "guard.psi_pause_threshold": 70.0})
    cfg.rules = [{"process": "chrome*", "action": "pause"}]
    p = Policy.from_config(cfg)
    assert p.warn_available.bytes_of(TOTAL) == 2 * GiB
    assert p.mode == "dry-run" and p.psi_pause_threshold == 70.0
    assert p.rules == (Rule("chrome*", "pause"),)
    assert Policy.from_config(Config()) == Policy()  # the table's defaults are the policy's


def test_decide_is_pure() -> None:
    g = Guard()
    falling(g, 6 * GiB, 300e6, 0.0, 2.0, jobs=[job()])
    inp = GuardInput(2.1, reading(pct(7), 2.1), jobs=tuple(g.jobs.values()))
    before = (g.state, g.history.samples("mem"))
    d1 = decide(inp, g.history, g.policy, g.state)
    d2 = decide(inp, g.history, g.policy, g.state)
    assert d1 == d2 and (g.state, g.history.samples("mem")) == before


# -- the service in an engine (no job manager), on a fake /proc ------------------------------


class FakeProc:
    """A /proc tree with a meminfo and a PSI file the test rewrites between ticks."""

    def __init__(self, root: Path, total: int = TOTAL):
        self.root = root
        self.total = total
        (root / "pressure").mkdir(parents=True)
        self.set(total // 2)

    def set(self, avail: int, psi_full: float = 0.0) -> None:
        kb = 1024
        (self.root / "meminfo").write_text(
            f"MemTotal: {self.total // kb} kB\nMemFree: {avail // kb} kB\n"
            f"MemAvailable: {avail // kb} kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\n")
        (self.root / "pressure" / "memory").write_text(
            f"some avg10={psi_full:.2f} avg60=0.00 avg300=0.00 total=0\n"
            f"full avg10={psi_full:.2f} avg60=0.00 avg300=0.00 total=0\n")


@pytest.fixture
def engine_on_fake_proc(tmp_path: Path, paths: Paths) -> Iterator[Tuple[Any, FakeProc, list]]:
    now = [1_800_000_000.0]
    proc = FakeProc(tmp_path / "proc")
    probe = MemoryProbe(proc_root=str(proc.root), cgroup_root=str(tmp_path / "no-cgroups"),
                        clock=lambda: now[0])
    paths.ensure()
    engine = Engine(paths, Config(), memory_probe=probe, gpu_backend=NoGpuBackend(),
                    clock=lambda: now[0])
    engine.store = Store(paths.db_file, clock=lambda: now[0])
    try:
        yield engine, proc, now
    finally:
        engine.store.close()


def service_for(engine: Any) -> GuardService:
    """A guard service on ``engine``'s readings, events and settings, without a job manager."""
    return GuardService(jobs=list, acts=None, emit=engine.emit_event,
                        read_snapshot=engine.read_snapshot,
                        policy=ConfigPolicy(lambda: engine.config))


def run_ticks(svc: Any, engine: Any, now: list, proc: FakeProc, avails: Sequence[int],
              step: float = 1.0) -> List[Dict[str, Any]]:
    states = []
    for avail in avails:
        now[0] += step
        proc.set(avail)
        svc.step(engine.read_snapshot(gpus_now=svc.wants_gpus()))
        states.append(svc.state_json())
    return states


def test_the_service_warns_and_clears_without_jobs(engine_on_fake_proc) -> None:
    engine, proc, now = engine_on_fake_proc
    assert engine.jobs is None
    svc = service_for(engine)
    states = run_ticks(svc, engine, now, proc, [pct(50), pct(14), pct(7), pct(7), pct(50)])
    assert [s["state"] for s in states] == ["ok", "warn", "pause", "pause", "ok"]
    st = states[2]
    assert st["mode"] == "act" and st["thresholds"]["pause_bytes"] == pct(8)
    assert any("below the pause threshold" in r for r in st["reasons"])
    assert st["available_bytes"] == pct(7) // 1024 * 1024
    events = [e for e in engine.store.events(limit=50) if e.kind.startswith("guard_")]
    causes = {e.data["cause"] for e in events if e.kind == "guard_warn"}
    assert {"mem_warn", "mem_pause"} <= causes  # and the steep fall itself, predicted
    assert [e.kind for e in events].count("guard_ok") == 1
    assert all(e.kind in ("guard_warn", "guard_ok") for e in events)  # nothing to act on


def test_the_service_samples_faster_as_memory_runs_short(engine_on_fake_proc) -> None:
    engine, proc, now = engine_on_fake_proc
    svc = service_for(engine)
    run_ticks(svc, engine, now, proc, [pct(50)] * 3)
    calm = svc.next_interval(1.0)
    run_ticks(svc, engine, now, proc, [pct(20)] * 4)
    # 300 MB/s toward the warning threshold, sampled at the interval the guard asks for.
    avail = pct(20)
    intervals = []
    for _ in range(40):
        iv = svc.next_interval(1.0)
        intervals.append(iv)
        avail -= int(300e6 * iv)
        run_ticks(svc, engine, now, proc, [avail], step=iv)
    assert calm == 1.0
    assert min(intervals) < 0.2 and intervals[-1] < intervals[0]
    assert svc.state_json()["fill_rate_bytes_per_s"] == pytest.approx(300e6, rel=0.1)


def test_the_service_follows_a_reloaded_mode(engine_on_fake_proc) -> None:
    engine, proc, now = engine_on_fake_proc
    svc = service_for(engine)
    engine.config = Config(values={**Config().values, "guard.mode": "off"})
    states = run_ticks(svc, engine, now, proc, [pct(4)])
    assert states[0]["mode"] == "off" and states[0]["state"] == "park"
    assert [e for e in engine.store.events(limit=50) if e.kind.startswith("guard_")] == []
