"""Never resume a job into the same wall: a job the guard suspended mid-step is resumed by the
guard only when what it needs fits (its forecast, or what it reached plus its growth before the
pause); the wait is said, once, with why. A resume by hand is the job manager's and is always
obeyed (``tests/integration``)."""

from __future__ import annotations

from dataclasses import replace
from typing import List, Optional

import pytest

from tests.unit.test_guard import GiB, Guard, acts, job, notes, pct
from trayapp.engine.guard import Action, Decision, JobView, Policy
from trayapp.engine.guard.choice import resume_fits
from trayapp.formats import format_bytes

MiB = 1 << 20


@pytest.mark.parametrize("reached,need,growth,available,pause_at,budget,expected,why", [
    (1 * GiB, None, 0.0, 4 * GiB, 1 * GiB, None, (True, 0, 3 * GiB),
     "no growth, no forecast: nothing more to find"),
    (1 * GiB, None, 512 * MiB, 4 * GiB, 1 * GiB, None, (True, 3 * 512 * MiB, 3 * GiB),
     "its growth over the rate window fits what is free above the pause threshold"),
    (1 * GiB, None, 1 * GiB, 3 * GiB, 1 * GiB, None, (False, 3 * GiB, 2 * GiB),
     "growing 1 GiB/s: 3 GiB more does not fit 2 GiB"),
    (1 * GiB, 3 * GiB, 0.0, 4 * GiB, 1 * GiB, None, (True, 2 * GiB, 3 * GiB),
     "its forecast, not its growth, says what it needs"),
    (1 * GiB, 3 * GiB, 0.0, 2 * GiB, 1 * GiB, None, (False, 2 * GiB, 1 * GiB),
     "a forecast above what is free: it waits"),
    (2 * GiB, 1 * GiB, 1 * GiB, 2 * GiB, 1 * GiB, None, (True, 0, 1 * GiB),
     "a forecast below what it holds: nothing more"),
    (1 * GiB, 3 * GiB, 0.0, 8 * GiB, 1 * GiB, 2 * GiB, (False, 2 * GiB, 1 * GiB),
     "its budget leaves it 1 GiB: the machine's room does not count above it"),
    (1 * GiB, None, 0.0, 512 * MiB, 1 * GiB, None, (True, 0, 0),
     "nothing free, nothing needed: the guard's calm decides, as before"),
])
def test_what_a_job_suspended_mid_step_needs_against_what_is_free(
        reached: int, need: Optional[int], growth: float, available: int, pause_at: int,
        budget: Optional[int], expected: tuple, why: str) -> None:
    assert resume_fits(reached, need, growth, 3.0, available, pause_at, budget) == expected, why


class SuspendingGuard(Guard):
    """As ``Guard``, its pauses suspend the job mid-step (a step that needs more)."""

    def _apply(self, a: Action) -> None:
        super()._apply(a)
        j = self.jobs[a.job_id or ""]
        self.jobs[j.id] = replace(j, suspended=a.kind == "pause")


def grow_until_paused(g: Guard, j: JobView, rate: int) -> float:
    """Feed ticks of a job growing ``rate`` bytes/s while available memory falls as much,
    until the guard pauses it; returns the time."""
    t, rss, avail = 0.0, j.rss_bytes or 0, pct(12)
    while t < 5:
        d = g.tick(t, avail, [replace(g.jobs.get(j.id, j), rss_bytes=rss)])
        if ("pause", j.id) in acts(d):
            return t
        t, rss, avail = t + 0.1, rss + rate // 10, avail - rate // 10
    raise AssertionError("never paused")


def waits(ds: List[Decision]) -> List[str]:
    return [a.reason for d in ds for a in notes(d) if "waits to resume" in a.reason]


def test_a_job_suspended_mid_step_waits_until_its_growth_fits() -> None:
    g = SuspendingGuard()
    j = job(hooked=True)
    t0 = grow_until_paused(g, j, 1 * GiB)
    assert g.jobs["j1"].suspended
    growth = g.state.paused_growth["job:j1"]
    assert growth > 256 * MiB  # the rate the guard measured as it paused it
    more = int(growth * Policy().rate_window_seconds)
    # Calm at 25% (4 GiB, 2.7 GiB above the pause threshold) but short of what it needs.
    assert more > pct(25) - pct(8)
    ds = [g.tick(t0 + t, pct(25)) for t in range(1, 30)]
    assert all(acts(d) == [] for d in ds), "not resumed into the same wall"
    said = waits(ds)
    free = format_bytes(pct(25) - int(pct(8)))
    assert said == [f"job j1 (j1.py) waits to resume: it needs about {format_bytes(more)} "
                    f"more and {free} is free"], "said once, with why"
    assert any("waits to resume" in r for r in ds[-1].reasons)
    # Once what it needs fits, calm resumes it.
    room = more + pct(8) + 256 * MiB
    ds = [g.tick(t0 + 30 + t, room) for t in range(1, 15)]
    assert [a for d in ds for a in acts(d)] == [("resume", "j1")]


def test_a_forecast_says_what_a_suspended_job_needs() -> None:
    g = SuspendingGuard()
    grow_until_paused(g, job(hooked=True), 1 * GiB)
    rss = g.jobs["j1"].rss_bytes or 0
    # Its forecast: 1 GiB more than it holds. 4 GiB is available, 2.7 GiB above the pause.
    g.jobs["j1"] = replace(g.jobs["j1"], ram_need_bytes=rss + 1 * GiB)
    ds = [g.tick(10.0 + t, pct(25)) for t in range(0, 15)]
    assert [a for d in ds for a in acts(d)] == [("resume", "j1")]
    assert waits(ds) == []


def test_a_forecast_too_large_keeps_it_waiting() -> None:
    g = SuspendingGuard()
    grow_until_paused(g, job(hooked=True), 1 * GiB)
    rss = g.jobs["j1"].rss_bytes or 0
    g.jobs["j1"] = replace(g.jobs["j1"], ram_need_bytes=rss + 3 * GiB)
    ds = [g.tick(10.0 + t, pct(25)) for t in range(0, 20)]
    assert all(acts(d) == [] for d in ds)
    assert waits(ds) == [f"job j1 (j1.py) waits to resume: it needs about 3.0 GiB more and "
                         f"{format_bytes(pct(25) - pct(8))} is free"]


def test_a_job_paused_at_a_batch_end_resumes_as_before() -> None:
    g = Guard()  # a cooperative pause: the step it was in has ended
    t0 = grow_until_paused(g, job(hooked=True), 1 * GiB)
    assert not g.jobs["j1"].suspended
    ds = [g.tick(t0 + t, pct(25)) for t in range(1, 15)]
    assert [a for d in ds for a in acts(d)] == [("resume", "j1")]
    assert waits(ds) == []
