"""The guard service built from its parts alone, without an engine: jobs as records, a job
manager's acts, readings, events and a policy handed to its constructor."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import psutil
import pytest

from trayapp.config import Config
from trayapp.engine.guard import Policy
from trayapp.engine.guarding import ConfigPolicy, GuardService
from trayapp.engine.service import Engine
from trayapp.jobs import trees
from trayapp.jobs.record import JobRecord
from trayapp.probes.gpu import NoGpuBackend
from trayapp.probes.processes import ProcessSampler
from trayapp.readings import GpuStatus, MemoryReading, Snapshot

GiB = 1 << 30
TOTAL = 16 * GiB


def pct(p: float) -> int:
    return int(TOTAL * p / 100)


class Machine:
    """The readings the service gets: available memory as the test sets it, on a clock the
    test moves."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0
        self.available = pct(50)
        self.reads: List[bool] = []

    def read(self, gpus_now: bool = False) -> Snapshot:
        self.reads.append(gpus_now)
        m = MemoryReading(time=self.now, total_bytes=TOTAL, available_bytes=self.available,
                          used_bytes=TOTAL - self.available, swap_total_bytes=0,
                          swap_used_bytes=0, psi_some_avg10=0.0, psi_full_avg10=0.0,
                          limit_source="host")
        return Snapshot(self.now, m, (), GpuStatus("none"))


class Manager:
    """A job manager's side of the guard: its records, and the acts it is asked for."""

    def __init__(self, records: Sequence[JobRecord]) -> None:
        self.records = {r.id: r for r in records}
        self.acts: List[Tuple[str, str, str, Optional[float]]] = []
        self.refuse = False
        self.stopped_at_once: List[int] = []

    def jobs(self) -> List[JobRecord]:
        return list(self.records.values())

    def tree_bytes(self, job_id: str, pids: Sequence[int], /) -> Optional[int]:
        return None  # not metered: the service sums the pids' RSS itself

    def pause(self, job_ref: str, /, *, by: str, reason: str,
              deadline: Optional[float], at_once: bool = False) -> Dict[str, Any]:
        if at_once:  # as the job manager does: the group stopped before anything else
            leader = trees.stop_group_now(self.records[job_ref])
            self.stopped_at_once.append(leader)
        if self.refuse:
            raise ValueError(f"job {job_ref} cannot be paused now")
        self.acts.append(("pause", job_ref, by, deadline))
        r = self.records[job_ref]
        self.records[job_ref] = r.moved("paused", paused_by=by)
        return r.to_json()

    def resume(self, job_ref: str, /, *, by: str, reason: str) -> Dict[str, Any]:
        self.acts.append(("resume", job_ref, by, None))
        self.records[job_ref] = self.records[job_ref].moved("running", paused_by=None)
        return self.records[job_ref].to_json()

    def park(self, job_ref: str, /, *, by: str, reason: str) -> Dict[str, Any]:
        raise AssertionError("not parked in these tests")

    def stop(self, job_ref: str, /, *, by: str, reason: str) -> Dict[str, Any]:
        raise AssertionError("not stopped in these tests")


@pytest.fixture
def child() -> Iterator[subprocess.Popen]:
    """A real process leading its own group, as a job's root does."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            start_new_session=True)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(10)


def build(manager: Manager, machine: Machine, events: List[Dict[str, Any]],
          policy: Policy = Policy()) -> GuardService:
    def emit(kind: str, message: str, *, level: str = "info", job_id: Optional[str] = None,
             data: Optional[Dict[str, Any]] = None) -> None:
        events.append({"kind": kind, "message": message, "level": level, "job_id": job_id,
                       "data": data or {}})

    return GuardService(jobs=manager.jobs, acts=manager, emit=emit,
                        read_snapshot=machine.read, policy=lambda: policy,
                        processes=ProcessSampler())


def tick(svc: GuardService, machine: Machine, available: int, step: float = 1.0) -> None:
    machine.now += step
    machine.available = available
    svc.step(machine.read(svc.wants_gpus()))


def test_a_service_without_an_engine_pauses_and_resumes_a_job(child) -> None:  # type: ignore[no-untyped-def]
    record = JobRecord(id="a1", name="train.py", state="running", pid=child.pid,
                       pids=(child.pid,), rss_bytes=2 * GiB)
    manager, machine, events = Manager([record]), Machine(), []
    svc = build(manager, machine, events, Policy(resume_after_seconds=2.0))
    tick(svc, machine, pct(50))
    assert svc.state_json()["state"] == "ok" and manager.acts == [] and events == []
    # Short: the job is suspended at once (no Keras hook), its group before the manager.
    tick(svc, machine, pct(7))
    assert manager.acts == [("pause", "a1", "guard", 0.0)]
    assert manager.stopped_at_once == [child.pid]  # asked of the manager: at once
    deadline = time.monotonic() + 5.0
    while psutil.Process(child.pid).status() != psutil.STATUS_STOPPED:
        assert time.monotonic() < deadline, "the job's group was not stopped"
        time.sleep(0.01)
    kinds = [e["kind"] for e in events]
    assert "guard_warn" in kinds and kinds[-1] == "guard_pause"
    assert events[-1]["job_id"] == "a1" and events[-1]["data"]["cause"] == "mem_pause"
    assert svc.state_json()["paused_by_guard"] == {"job:a1": "mem_pause"}
    # Back above the resume threshold long enough: resumed.
    for _ in range(4):
        tick(svc, machine, pct(60))
    assert manager.acts[-1] == ("resume", "a1", "guard", None)
    assert manager.records["a1"].state == "running"
    kinds = [e["kind"] for e in events]
    # "All is well" once the guard holds nothing any more.
    assert kinds[kinds.index("guard_pause"):] == ["guard_pause", "guard_resume", "guard_ok"]
    assert svc.state_json()["state"] == "ok"


def test_an_act_whose_cause_passed_on_the_fresh_reading_is_dropped() -> None:
    record = JobRecord(id="b2", state="running", pids=(), rss_bytes=GiB, hooked=True)
    manager, machine, events = Manager([record]), Machine(), []
    svc = build(manager, machine, events)
    real_read = machine.read

    def recovered(gpus_now: bool = False) -> Snapshot:
        machine.available = pct(50)  # memory came back between the decision and the act
        return real_read(gpus_now)

    machine.now += 1.0
    machine.available = pct(7)
    snap = real_read()
    svc._read_snapshot = recovered  # the fresh reading before acting
    svc.step(snap)
    assert manager.acts == []
    assert "guard_pause" not in [e["kind"] for e in events]


def test_a_refused_act_is_said_once_and_the_job_left_alone_a_moment() -> None:
    record = JobRecord(id="c3", state="running", pids=(), rss_bytes=GiB, hooked=True)
    manager, machine, events = Manager([record]), Machine(), []
    manager.refuse = True
    svc = build(manager, machine, events)
    tick(svc, machine, pct(7))
    tick(svc, machine, pct(7), step=0.5)
    refused = [e for e in events if e["message"].startswith("could not pause")]
    assert len(refused) == 1 and "cannot be paused now" in refused[0]["message"]


def test_jobs_as_records_and_a_policy_from_settings() -> None:
    record = JobRecord.from_json({"id": "d4", "state": "parked", "park_by": "guard",
                                  "spec": {"auto_resume": False}, "checkpoint_dir": "/x",
                                  "hooked": True, "rss_bytes": GiB})
    manager, machine = Manager([record]), Machine()
    cfg = Config(values={**Config().values, "guard.mode": "dry-run"})
    svc = GuardService(jobs=manager.jobs, acts=manager, emit=lambda *a, **k: None,
                       read_snapshot=machine.read, policy=ConfigPolicy(lambda: cfg))
    tick(svc, machine, pct(50))
    st = svc.state_json()
    assert st["mode"] == "dry-run" and st["state"] == "park"  # parked by the guard
    assert any("resume it by hand ('headroom resume d4')" in r for r in st["reasons"])
    view = svc._last_input.jobs[0] if svc._last_input is not None else None
    assert view is not None and view.parked_by == "guard" and view.auto_resume is False
    assert view.checkpoint is True


def test_a_job_list_that_fails_keeps_the_last_jobs() -> None:
    record = JobRecord(id="e5", state="running", pids=(), rss_bytes=GiB)
    manager, machine, events = Manager([record]), Machine(), []
    svc = build(manager, machine, events)
    tick(svc, machine, pct(50))
    manager.jobs = lambda: (_ for _ in ()).throw(RuntimeError("broken"))  # type: ignore
    svc._job_records = manager.jobs
    tick(svc, machine, pct(50))
    assert svc._last_input is not None and [j.id for j in svc._last_input.jobs] == ["e5"]


def test_the_fresh_reading_before_a_vram_budget_pause_reads_the_gpus() -> None:
    record = JobRecord(id="f6", state="running", pids=(), rss_bytes=GiB, hooked=True,
                       vram_bytes=3 * GiB, vram_budget_bytes=2 * GiB)
    manager, machine, events = Manager([record]), Machine(), []
    svc = build(manager, machine, events)
    tick(svc, machine, pct(50))
    assert manager.acts and manager.acts[0][:2] == ("pause", "f6")
    assert machine.reads[-1] is True  # the act's fresh reading asked for the GPUs now


def test_the_engine_hands_the_guard_records(paths) -> None:  # type: ignore[no-untyped-def]
    """The job manager answers ``guard_jobs`` with dicts (older) or records: the guard gets
    records either way, read where the engine hands them over."""

    class Jobs:
        def guard_jobs(self) -> List[Any]:
            return [{"id": "a1", "state": "parked", "park_by": "guard", "pids": [12],
                     "spec": {"auto_resume": None}, "rss_bytes": None},
                    JobRecord(id="b2", state="running")]

    engine = Engine(paths, Config(), gpu_backend=NoGpuBackend())
    assert engine._guard_jobs() == []  # no job manager yet
    engine.jobs = Jobs()  # type: ignore[assignment]
    got = engine._guard_jobs()
    assert [type(r) for r in got] == [JobRecord, JobRecord]
    assert (got[0].id, got[0].state, got[0].parked_by, got[0].pids) == \
        ("a1", "parked", "guard", (12,))
    assert got[1] == JobRecord(id="b2", state="running")
