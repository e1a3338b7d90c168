"""The guard's "relaunch smaller": a job that can shrink is parked (and relaunched at once at
half its micro-batch) where another would stay paused or wait parked; which jobs can shrink."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.unit.test_guard import GiB, Guard, MiB, acts, job, paused, pct, reading
from trayapp.engine.guard import GuardInput, still_holds
from trayapp.jobs.record import JobRecord, smaller_accumulation


def shrinking(**kw):  # type: ignore[no-untyped-def]
    return job(rss=310 * MiB, ram_budget_bytes=300 * MiB, hooked=True, checkpoint=True,
               shrinks_to=2, batch=256, **kw)


def test_a_job_that_can_shrink_is_paused_at_its_budget_then_parked_smaller() -> None:
    g = Guard()
    assert acts(g.tick(0.0, pct(60), [shrinking()])) == [("pause", "j1")]
    d = g.tick(1.0, pct(60))
    assert acts(d) == [("park", "j1")]
    park = d.actions[-1]
    assert park.data["smaller"] == 2 and park.cause == "budget_ram"
    assert "micro-batches of 128 x 2 (the same training)" in park.reason


def test_a_job_paused_at_a_peak_over_its_budget_is_parked_smaller_once_under_it() -> None:
    """A fit's step goes over the budget for a moment (its peak) and the guard's pause lands
    as a suspend in the middle of the step, frozen under the budget: it went over at this
    batch and would again, and it can never resume (its need does not fit the budget), so it
    is parked smaller all the same, not left paused for good."""
    g = Guard()
    assert acts(g.tick(0.0, pct(60), [shrinking()])) == [("pause", "j1")]
    frozen = replace(g.jobs["j1"], rss_bytes=200 * MiB)  # under the 300 MiB budget now
    d = g.tick(1.0, pct(60), [frozen])
    assert acts(d) == [("park", "j1")]
    park = d.actions[-1]
    assert park.data["smaller"] == 2 and park.cause == "budget_ram"
    assert "went over its budget of 300.0 MiB of RAM" in park.reason
    assert "micro-batches of 128 x 2 (the same training)" in park.reason
    # The engine checks the act against a fresh reading before it parks: it still holds
    # while the job is paused for its budget, and not for a job paused for another cause.
    fresh = GuardInput(1.1, reading(pct(60), 1.1), (), (frozen,), ())
    before = g.state  # as the engine has it when it checks (the park not yet carried out)
    assert still_holds(park, fresh, g.history, g.policy, replace(
        before, paused_for={"job:j1": "budget_ram"})) == (True, "")
    assert not still_holds(park, fresh, g.history, g.policy, replace(
        before, paused_for={"job:j1": "mem_pause"}))[0]


def test_a_job_that_cannot_shrink_stays_paused_at_its_budget() -> None:
    g = Guard()
    g.tick(0.0, pct(60), [job(rss=310 * MiB, ram_budget_bytes=300 * MiB, hooked=True,
                               checkpoint=True)])
    for t in range(1, 10):
        assert acts(g.tick(float(t), pct(60))) == []


def test_a_job_paused_by_its_user_is_not_shrunk_behind_their_back() -> None:
    g = Guard()
    j = paused(shrinking(), by="user")
    for t in range(0, 5):
        assert acts(g.tick(float(t), pct(60), [j])) == []


def test_a_last_resort_park_of_a_shrinkable_job_relaunches_it_smaller() -> None:
    g = Guard()
    j = paused(job(rss=2 * GiB, hooked=True, checkpoint=True, shrinks_to=4, batch=512))
    d = g.tick(0.0, pct(4), [j])  # under park (5%)
    assert acts(d) == [("park", "j1")]
    assert d.actions[-1].data["smaller"] == 4
    other = paused(job(rss=2 * GiB, hooked=True, checkpoint=True))
    d = Guard().tick(0.0, pct(4), [other])
    assert acts(d) == [("park", "j1")] and "smaller" not in d.actions[-1].data


def record(**kw):  # type: ignore[no-untyped-def]
    base = dict(id="j1", state="running", hooked=True, shrinkable=True, batch=256,
                micro_batch=256, accumulation=1, checkpoint_dir="/ckpt")
    base.update(kw)
    return JobRecord.from_json(base)


@pytest.mark.parametrize("changes,expected", [
    ({}, 2),
    ({"accumulation": 2, "micro_batch": 128}, 4),
    ({"shrinkable": False}, None),  # Keras 2, a PyDataset, --on-oom stop
    ({"checkpoint_dir": None}, None),  # nothing to relaunch from
    ({"hooked": False}, None),
    ({"batch": None}, None),  # the runner did not say its batch
    ({"accumulation": 16, "micro_batch": 16}, 32),  # 256 / 32 = 8: down to the default floor
    ({"accumulation": 32, "micro_batch": 8}, None),  # 256 / 64 = 4: under it
    ({"spec": {"min_batch": 128}}, 2),
    ({"spec": {"min_batch": 129}}, None),
    ({"batch": 250, "micro_batch": 125, "accumulation": 2}, None),  # 250 / 4 is not whole
])
def test_which_jobs_can_shrink(changes, expected) -> None:  # type: ignore[no-untyped-def]
    assert smaller_accumulation(record(**changes)) == expected
    assert smaller_accumulation(replace(record(**changes))) == expected
