"""The job manager's pure parts (how a job ended, the ETA, the operations table) and its record:
what the wire carries is ``JobRecord.to_json()``, what comes back from the store is read through
``JobRecord.from_json``, and a saved row that cannot be read is left out, never a crash."""

from __future__ import annotations

import dataclasses
import logging
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, Optional

import psutil
import pytest

from tests.unit.test_launcher import Events, ticker, until
from trayapp.config import Paths, get_paths
from trayapp.engine.store import Store
from trayapp.jobs import control, eta
from trayapp.jobs.job import Job
from trayapp.jobs.manager import JobManager, ending
from trayapp.jobs.record import JobRecord
from trayapp.request_args import Args
from trayapp.runner import protocol as rp
from trayapp.vocab import EventKind as E
from trayapp.vocab import JobState as S

FIELDS = {f.name for f in dataclasses.fields(JobRecord)}


@pytest.fixture
def paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Paths:
    monkeypatch.setenv("HEADROOM_HOME", str(tmp_path / "home"))
    p = get_paths()
    p.ensure()
    return p


@pytest.fixture
def store(paths: Paths) -> Iterator[Store]:
    s = Store(paths.db_file)
    yield s
    s.close()


# -- how a job ended ------------------------------------------------------------------------------

USER, GUARD = ("user", ""), ("guard", "memory")


@pytest.mark.parametrize("state, bye, code, gone, expected", [
    (S.PARKING, None, rp.PARK_EXIT_CODE, False, (S.PARKED, "parked by guard: memory",
                                                 E.JOB_PARKED, "info")),
    # A park the engine did not ask for is the job's claim, not a park (nobody parked it).
    (S.RUNNING, {"reason": "parked"}, None, False,
     (S.LOST, "the process ended (exit status unknown); it said it parked, which Headroom had "
      "not asked", E.JOB_LOST, "warn")),
    (S.RUNNING, {"reason": "parked"}, rp.PARK_EXIT_CODE, False,
     (S.FAILED, "exit status 75; it said it parked, which Headroom had not asked", E.JOB_FAILED,
      "error")),
    (S.PARKING, {"reason": "parked"}, None, False, (S.PARKED, "parked by guard: memory",
                                                    E.JOB_PARKED, "info")),
    (S.PARKING, None, 1, False, (S.FAILED, "exit status 1", E.JOB_FAILED, "error")),
    (S.STOPPING, None, -2, False, (S.STOPPED, "stopped by user", E.JOB_STOPPED, "info")),
    (S.RUNNING, {"reason": "stopped"}, rp.STOP_EXIT_CODE, False,
     (S.STOPPED, "stopped by user", E.JOB_STOPPED, "info")),
    (S.RUNNING, {"reason": "stopped"}, 0, False,
     (S.FINISHED, "finished", E.JOB_FINISHED, "info")),
    (S.RUNNING, None, None, False,
     (S.LOST, "the process ended (exit status unknown)", E.JOB_LOST, "warn")),
    (S.RUNNING, None, None, True,
     (S.LOST, "the process ended while no engine watched it (exit status unknown)",
      E.JOB_LOST, "warn")),
    (S.RUNNING, None, -9, False, (S.FAILED, "killed by SIGKILL", E.JOB_FAILED, "error")),
])
def test_how_a_job_ended(state: str, bye: Optional[Dict[str, Any]], code: Optional[int],
                         gone: bool, expected: Any) -> None:
    rec = JobRecord.from_json({"id": "j1", "name": "mnist", "state": state, "bye": bye})
    end = ending(rec, code, GUARD, USER, adopted_gone=gone)
    assert (end.state, end.reason, end.kind, end.level) == expected
    assert end.message.startswith("job j1 (mnist)")


def test_a_stopped_job_with_a_checkpoint_folder_says_how_to_continue() -> None:
    rec = JobRecord(id="j1", name="m", state=S.STOPPING, checkpoint_dir="/ck")
    assert "headroom resume j1" in ending(rec, -2, USER, USER).message
    assert "resume" not in ending(rec.with_(checkpoint_dir=None), -2, USER, USER).message


# -- the ETA --------------------------------------------------------------------------------------


def test_the_eta_follows_the_rate_of_steps() -> None:
    rec = JobRecord(id="j", epoch=1, epochs=2, step=2, steps=10)
    ref, seconds, changed = eta.estimate(rec, None, 100.0)
    assert ref == (100.0, 2.0) and seconds is None and not changed  # a first look: no rate
    later = rec.with_(step=6)
    assert eta.estimate(later, ref, 100.5) == (ref, None, False)  # under a second: wait
    ref2, seconds, changed = eta.estimate(later, ref, 102.0)
    assert ref2 == ref and changed and seconds == pytest.approx(14 / 2.0)
    # Progress went back (a new fit()): measured afresh, the ETA kept meanwhile.
    assert eta.estimate(rec.with_(eta_seconds=7.0, epoch=1, step=1), ref, 103.0) == \
        ((103.0, 1.0), 7.0, False)
    assert eta.estimate(JobRecord(id="j"), ref, 104.0) == (ref, None, True)  # unknown


# -- the operations -------------------------------------------------------------------------------


def test_every_action_has_its_operation_and_wait(paths: Paths, store: Store) -> None:
    assert control.ACTIONS == ("pause", "resume", "park", "stop", "kill")
    manager = JobManager(paths, store, emit=Events(), subreaper=False)
    try:
        waits = {name: op.wait(manager.control) for name, op in control.OPS.items()}
        assert waits["resume"] == 0 and waits["park"] == control.PARK_SETTLE_SECONDS
        assert waits["pause"] == manager.table.pause_deadline(None) + 1.0
        assert all(w >= 0 for w in waits.values())
        with pytest.raises(ValueError, match=r"^unknown action 'explode' \(one of pause, "):
            manager.control.op_action(None, Args({"action": "explode", "job": "x"}))  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="^unknown action"):
            manager.control.op_action(None, Args({"action": ["stop"], "job": "x"}))  # type: ignore[arg-type]
    finally:
        manager.close()


# -- the record on the wire and in the store ------------------------------------------------------


def test_a_job_on_the_wire_is_its_record(paths: Paths, store: Store) -> None:
    events = Events()
    manager = JobManager(paths, store, emit=events)
    try:
        job = manager.start(ticker(5, 0.01, 0, ram_budget_mb=64))
        wire = job.to_json()
        assert set(wire) == FIELDS and "park_by" not in wire
        assert job.state == "starting" and job.parked_by is None
        assert job.ram_budget_bytes == 64 << 20 and job.checkpoint is None
        done = until(manager, lambda: manager.get(job.id).state == "finished" and
                     manager.get(job.id))
        assert set(done.to_json()) == FIELDS and done.exit_code == 0
        assert store.get_job(job.id).to_json() == done.to_json()
        (rec,) = [r for r in manager.list(include_finished=True) if r.id == job.id]
        assert rec.to_json() == done.to_json()
        # Every event about the job names it.
        assert events.kinds() == ["job_started", "job_finished"]
        assert {e["job_id"] for e in events.seen} == {job.id}
    finally:
        manager.stop_all("test over", timeout=5)
        manager.close()


def test_adoption_leaves_out_a_saved_row_it_cannot_read(paths: Paths, store: Store,
                                                        caplog: pytest.LogCaptureFixture
                                                        ) -> None:
    store.save_row({"id": "0bad0001", "name": "weird", "state": "exploded", "started": 3.0})
    store.save_row({"id": "0bad0002", "name": "old", "state": "parked", "started": 2.0,
                    "park_by": "guard", "checkpoint": True, "pid": "not a pid"})
    store.save_row({"id": "0bad0003", "name": "gone", "state": "running", "started": 1.0,
                    "pid": "abc", "pids": "x"})
    store.flush()
    with sqlite3.connect(paths.db_file) as conn:  # a row an older Headroom left, not an object
        conn.execute("INSERT INTO jobs (id, name, state, started, ended, finished, data) "
                     "VALUES ('0bad0004', 'x', 'running', 0, NULL, 0, '[1, 2]')")
    events = Events()
    manager = JobManager(paths, store, emit=events, subreaper=False)
    try:
        with caplog.at_level(logging.WARNING, logger="headroom.jobs"):
            assert manager.adopt() == []
        assert any("0bad0001" in r.getMessage() and "left out" in r.getMessage()
                   for r in caplog.records)
        parked = manager.get("0bad0002")
        # The old name is read as the new one; a checkpoint that is not a mapping is dropped.
        assert parked.state == "parked" and parked.parked_by == "guard"
        assert parked.checkpoint is None and parked.pid is None
        assert [r.id for r in manager.guard_jobs()] == ["0bad0002"]
        assert manager.get("0bad0003").state == "lost"  # no pid to watch
        assert [e["job_id"] for e in events.seen] == ["0bad0003"]
        ids = [j.id for j in manager.list(include_finished=True)]
        assert "0bad0001" not in ids and "0bad0004" not in ids
        with pytest.raises(LookupError):
            manager.get("0bad0001")
    finally:
        manager.close()


# -- a pause at once ------------------------------------------------------------------------------


def stopped(proc: subprocess.Popen[bytes]) -> bool:
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        if psutil.Process(proc.pid).status() == psutil.STATUS_STOPPED:
            return True
        time.sleep(0.01)
    return False


@pytest.mark.skipif(sys.platform == "win32", reason="process groups")
@pytest.mark.parametrize("state, refused", [(S.RUNNING, False), (S.STOPPING, True)])
def test_a_pause_at_once_stops_the_group_first_and_undoes_it_when_refused(
        paths: Paths, store: Store, state: S, refused: bool) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             start_new_session=True)
    manager = JobManager(paths, store, emit=Events(), subreaper=False)
    try:
        rec = JobRecord(id="a0000001", name="train.py", state=state.value, pid=child.pid,
                        pids=(child.pid,), create_time=psutil.Process(child.pid).create_time())
        job = Job(rec, b"")  # not the manager's child: its tree is not walked here
        manager.table.jobs[rec.id] = job
        if refused:
            with pytest.raises(ValueError, match="cannot be paused now"):
                manager.pause(rec.id, by="guard", reason="memory", deadline=0, at_once=True)
            time.sleep(0.2)
            assert psutil.Process(child.pid).status() != psutil.STATUS_STOPPED  # continued
        else:
            paused = manager.pause(rec.id, by="guard", reason="memory", deadline=0, at_once=True)
            assert paused.state == "paused" and paused.pause_mode == "suspended"
            assert stopped(child)  # by its group, before the manager's bookkeeping
        manager.table.jobs.pop(rec.id)
    finally:
        child.kill()
        child.wait(10)
        manager.close()
