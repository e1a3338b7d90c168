"""The job manager's side of the kernel brake, tick by tick, on a job whose cgroup is a fake
that records what was written: the limit it gets, a stall handled (ended to be relaunched
smaller, or held), the reserve of a job asked to park, a cgroup lost under a job."""

from __future__ import annotations

import logging
from typing import Any, List, Optional

import pytest

from trayapp import config as configmod
from trayapp.jobs import cgroups
from trayapp.jobs.braking import STALL, STALL_SECONDS, Brakes, BrakeState
from trayapp.jobs.cgroups import CgroupError, Reading
from trayapp.jobs.job import Event, Job
from trayapp.jobs.record import JobRecord
from trayapp.jobs.table import JobTable
from trayapp.readings import GpuStatus, MemoryReading, Snapshot
from trayapp.vocab import EventKind as E
from trayapp.vocab import JobState as S

MiB = 1 << 20
GiB = 1 << 30


class FakeGroup:
    """A job's cgroups as the brake uses them; ``usage``/``under_oom`` set by the test."""

    def __init__(self) -> None:
        self.memory, self.freezer = "/fake/headroom-job-j1", None
        self.usage, self.under_oom = 100 * MiB, False
        self.limit: Optional[int] = None
        self.writes: List[int] = []
        self.killed = 0
        self.gone = False

    def read(self) -> Reading:
        if self.gone:
            raise CgroupError(f"its cgroup {self.memory} is gone")
        return Reading(self.usage, self.limit, self.usage, 0, 0, self.under_oom, 0, 0)

    def set_limit(self, limit: int) -> None:
        self.limit = None if limit < 0 else limit  # -1: no limit, read back as none (v1)
        self.writes.append(limit)

    def kill(self) -> int:
        self.killed += 1
        return 1

    def remove(self) -> None:
        pass


class Manager(Brakes):
    """The brake's part of a job manager, alone: a table with a reading of memory and the
    settings."""

    def __init__(self, available: int = 20 * GiB, total: int = 24 * GiB) -> None:
        super().__init__(JobTable(None, None, emit=lambda *a, **k: None))  # type: ignore[arg-type]
        memory = MemoryReading(time=0.0, total_bytes=total, available_bytes=available,
                               used_bytes=total - available, swap_total_bytes=0,
                               swap_used_bytes=0, psi_some_avg10=None, psi_full_avg10=None)
        self.table.snapshot = Snapshot(0.0, memory, (), GpuStatus("none"))
        # What the machine offers, as found already (nothing of this machine's is read).
        self._offer = (True, cgroups.Offer(cgroups.V1, "", "/fake"))


def braked_job(**rec: Any) -> Job:
    fields: dict = dict(id="j1", name="wide", state=S.RUNNING.value, hooked=True,
                        shrinkable=True, batch=4096, checkpoint_dir="/ckpt",
                        ram_budget_bytes=1350 * MiB)
    fields.update(rec)
    job = Job(JobRecord(**fields), b"")
    job.cgroup, job.brake = FakeGroup(), BrakeState()
    return job


def tick(m: Manager, job: Job, t: float) -> List[Event]:
    events: List[Event] = []
    m.brake(job, t, events)
    return events


def test_the_limit_is_the_budget_on_a_machine_with_room_and_written_once() -> None:
    m, job = Manager(), braked_job()
    tick(m, job, 0.0)
    tick(m, job, 0.1)
    assert job.cgroup.writes == [1350 * MiB]
    assert job.rec.memory_method == "cgroup" and job.rec.rss_bytes == 100 * MiB
    assert job.rec.cgroup_memory is not None and job.rec.cgroup_memory["limit_bytes"] == \
        1350 * MiB


def test_the_limit_follows_what_the_machine_can_give() -> None:
    m, job = Manager(available=2 * GiB, total=20 * GiB), braked_job(ram_budget_bytes=None)
    tick(m, job, 0.0)
    reserve = 1 * GiB  # park_available 5% of 20 GiB
    assert job.cgroup.writes == [100 * MiB + 2 * GiB - reserve]


def test_a_job_asked_to_park_may_use_memory_down_to_the_stop_threshold() -> None:
    m, job = Manager(available=2 * GiB, total=20 * GiB), braked_job(ram_budget_bytes=None,
                                                                    state=S.PARKING.value)
    tick(m, job, 0.0)
    reserve = int(0.02 * 20 * GiB)  # stop_available 2%
    assert job.cgroup.writes == [100 * MiB + 2 * GiB - reserve]


def test_a_stalled_job_that_can_shrink_is_ended_to_be_relaunched() -> None:
    m, job = Manager(), braked_job()
    group = job.cgroup
    tick(m, job, 0.0)
    group.usage, group.under_oom = 1350 * MiB, True
    tick(m, job, 1.0)  # seen waiting: not yet stalled
    assert group.killed == 0 and job.rec.rss_bytes == 1350 * MiB  # held: its whole use
    tick(m, job, 1.0 + STALL_SECONDS)
    assert group.killed == 1 and job.brake.ended == (STALL, 1350 * MiB)
    assert m.brake_ending_now(job)
    end = m.brake_ending(job, -9)
    assert end is not None and end.state == S.PARKED and end.accumulation == 2
    assert end.cause == "stalled at its cgroup's limit of 1.3 GiB"


def test_a_limit_raised_as_memory_comes_back_lets_a_waiting_job_go_on() -> None:
    m, job = Manager(available=2 * GiB, total=20 * GiB), braked_job(ram_budget_bytes=None)
    group = job.cgroup
    tick(m, job, 0.0)
    group.usage, group.under_oom = group.limit or 0, True
    tick(m, job, 1.0)
    m.table.snapshot = Manager(available=3 * GiB, total=20 * GiB).table.snapshot  # memory back
    tick(m, job, 1.0 + STALL_SECONDS)
    assert group.killed == 0  # its limit went up: it is not taken for stalled
    tick(m, job, 1.0 + 2 * STALL_SECONDS)
    tick(m, job, 1.0 + 4 * STALL_SECONDS)
    assert group.killed == 1  # still waiting with no more to come: stalled


def test_a_job_that_cannot_shrink_is_held_and_it_is_said_once() -> None:
    m, job = Manager(), braked_job(hooked=False, shrinkable=False, batch=None)
    group = job.cgroup
    tick(m, job, 0.0)
    group.usage, group.under_oom = 1350 * MiB, True
    said = tick(m, job, 1.0) + tick(m, job, 2.0) + tick(m, job, 3.0)
    assert group.killed == 0 and job.brake.ended is None
    assert [e[0] for e in said] == [E.JOB_NOTE]
    assert "is held by the kernel at its cgroup's limit of 1.3 GiB (its budget of 1.3 GiB)" \
        in said[0][2]


def test_a_job_at_its_min_batch_held_at_its_budget_is_ended_to_be_stopped() -> None:
    m, job = Manager(), braked_job(spec={"min_batch": 4096})
    group = job.cgroup
    tick(m, job, 0.0)
    group.usage, group.under_oom = 1350 * MiB, True
    tick(m, job, 1.0)
    tick(m, job, 2.0)
    assert group.killed == 1
    end = m.brake_ending(job, -9)
    assert end is not None and end.state == S.STOPPED and end.accumulation is None


def test_a_stop_asked_for_stays_a_stop() -> None:
    m, job = Manager(), braked_job(state=S.STOPPING.value)
    group = job.cgroup
    group.usage, group.under_oom = 1350 * MiB, True
    tick(m, job, 0.0)
    tick(m, job, 5.0)
    assert group.killed == 0 and m.brake_ending(job, -9) is None


def test_a_cgroup_lost_under_a_job_is_one_line_and_the_guard_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    m, job = Manager(), braked_job()
    job.cgroup.gone = True
    with caplog.at_level(logging.WARNING, "headroom.jobs"):
        tick(m, job, 0.0)
        tick(m, job, 1.0)
    assert job.cgroup is None
    assert job.rec.protection == "none: the guard only (its cgroup /fake/headroom-job-j1 is gone)"
    assert [r.getMessage() for r in caplog.records] == [
        "job j1: its cgroup /fake/headroom-job-j1 is gone; the kernel brake is off for it, the "
        "guard goes on"]


def test_a_budget_below_what_the_job_uses_is_said_once_and_the_limit_stays_above_its_use(
        caplog: pytest.LogCaptureFixture) -> None:
    m, job = Manager(), braked_job(ram_budget_bytes=500 * MiB)
    job.cgroup.usage = 800 * MiB
    with caplog.at_level(logging.WARNING, "headroom.jobs"):
        tick(m, job, 0.0)
        tick(m, job, 1.0)
    assert job.cgroup.writes == [800 * MiB + cgroups.MARGIN_BYTES]
    assert len(caplog.records) == 1
    assert "its RAM budget of 500.0 MiB is below what it already uses (800.0 MiB)" in \
        caplog.records[0].getMessage()


def test_a_resume_by_hand_gives_the_budget_a_tenth_more() -> None:
    m, job = Manager(), braked_job(ram_budget_bytes=1000 * MiB)
    job.cgroup.usage = 1000 * MiB
    m.brake_resumed(job, 0.1)
    tick(m, job, 0.0)
    assert job.cgroup.writes == [1100 * MiB]


def test_turned_off_the_job_leaves_its_cgroup() -> None:
    m, job = Manager(), braked_job()
    m.table.config = lambda: configmod.Config(values={"guard.kernel_brake": False})
    tick(m, job, 0.0)
    assert job.cgroup is None and job.rec.protection == \
        "none: the guard only (the kernel brake was turned off)"


@pytest.mark.parametrize("mode", ["off", "dry-run"])
def test_with_the_guard_off_or_in_its_dry_run_nothing_holds_the_job(mode: str) -> None:
    m, job = Manager(), braked_job()
    tick(m, job, 0.0)
    assert job.cgroup.writes == [1350 * MiB]  # acting: held at its budget
    config = configmod.Config()
    config.values["guard.mode"] = mode
    m.table.config = lambda: config
    group = job.cgroup
    group.usage, group.under_oom = 1400 * MiB, True
    tick(m, job, 1.0)
    tick(m, job, 1.0 + 2 * STALL_SECONDS)
    assert group.writes == [1350 * MiB, -1]  # the limit lifted, once
    assert group.killed == 0 and job.brake.ended is None  # nothing ended
    assert job.rec.rss_bytes == 1400 * MiB and job.rec.memory_method == "cgroup"


def test_a_cgroup_with_nothing_charged_yet_leaves_the_processes_reading() -> None:
    # Right after its process moved in, its pages are charged where they were made: a count of
    # 0 is not the job's memory (a scrape once read a running job as 0 bytes).
    m, job = Manager(), braked_job(rss_bytes=8 * MiB, memory_method="pss")
    job.cgroup.usage = 0
    tick(m, job, 0.0)
    assert (job.rec.rss_bytes, job.rec.memory_method) == (8 * MiB, "pss")
    job.cgroup.usage = 12 * MiB  # charged from now on: its cgroup's count
    tick(m, job, 0.1)
    assert (job.rec.rss_bytes, job.rec.memory_method) == (12 * MiB, "cgroup")


def test_a_job_counted_by_its_cgroup_or_short_of_memory_is_not_read_exactly() -> None:
    """An exact reading (smaps_rollup) holds the process's pages while it lasts: taken as the
    OOM killer ends it, the kernel ends another process too. None where the cgroup counts the
    job, nor while available memory is below the warning threshold (15% by default)."""
    job = braked_job()
    job.cgroup = None
    assert Manager(available=20 * GiB, total=24 * GiB).exact_readings(job)
    assert not Manager(available=3 * GiB, total=24 * GiB).exact_readings(job)  # 12.5%
    m = Manager()
    m.table.setting = lambda name, default: "2 GiB" if name == "guard.warn_available" \
        else default  # type: ignore[method-assign]
    assert m.exact_readings(job)
    counted = braked_job()
    tick(m, counted, 0.0)
    assert counted.rec.memory_method == "cgroup" and not m.exact_readings(counted)
