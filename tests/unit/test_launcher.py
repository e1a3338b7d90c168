"""JobManager in this process: a real store, real job processes, ticks driven by the test."""

from __future__ import annotations

import os
import sys
import time
from multiprocessing.connection import Client
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List

import psutil
import pytest

from trayapp.config import Paths, get_paths
from trayapp.engine.store import Store
from trayapp.jobs import eta, ladder, logpages
from trayapp.jobs.manager import JobManager
from trayapp.jobs.options import JobSpec
from trayapp.jobs.record import JobRecord
from trayapp.runner import protocol as rp

REPO = Path(__file__).resolve().parent.parent.parent
TICKER = str(REPO / "tests" / "scripts" / "jobs" / "ticker.py")

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX sessions")


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


class Events:
    def __init__(self) -> None:
        self.seen: List[Dict[str, Any]] = []

    def __call__(self, kind: str, message: str, *, level: str = "info", job_id: Any = None,
                 data: Any = None) -> None:
        self.seen.append({"kind": kind, "message": message, "level": level, "job_id": job_id})

    def kinds(self) -> List[str]:
        return [e["kind"] for e in self.seen]


@pytest.fixture
def events() -> Events:
    return Events()


@pytest.fixture
def manager(paths: Paths, store: Store, events: Events) -> Iterator[JobManager]:
    m = JobManager(paths, store, emit=events)
    yield m
    m.stop_all("test over", timeout=5)
    m.close()


def ticker(*args: Any, **fields: Any) -> Dict[str, Any]:
    return JobSpec(script=TICKER, args=tuple(str(a) for a in args), cwd=str(REPO),
                   **fields).to_json()


def until(m: JobManager, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    """Tick the manager until ``check()`` is true (``timeout``: a bound for a loaded machine,
    not a wait)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m.tick(None)
        value = check()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("condition not reached in time")


# -- pure helpers -------------------------------------------------------------------------------


@pytest.mark.parametrize("data, keep", [
    (b"", 0),
    (b"abc", 3),
    ("é".encode(), 2),
    ("é".encode()[:1], 0),
    (b"ab" + "€".encode()[:2], 2),
    (b"ab" + "😀".encode()[:3], 2),
    (b"ab" + "😀".encode(), 6),
])
def test_complete_utf8_keeps_whole_characters(data: bytes, keep: int) -> None:
    assert logpages.complete_utf8(data) == keep


def test_progress_units() -> None:
    assert eta.progress_units(JobRecord(id="j", epoch=2, epochs=5, step=10, steps=40)) == \
        (50.0, 200.0)
    assert eta.progress_units(JobRecord(id="j", epoch=3, epochs=4)) == (2.0, 4.0)
    assert eta.progress_units(JobRecord(id="j")) == (None, None)


# -- logs and names -----------------------------------------------------------------------------


def _saved_job(store: Store, paths: Paths, job_id: str, name: str, text: str = "",
               state: str = "finished") -> Path:
    log = paths.jobs_dir / job_id / "log"
    log.parent.mkdir(parents=True)
    log.write_bytes(text.encode())
    store.save_row({"id": job_id, "name": name, "state": state, "started": time.time(),
                    "ended": time.time(), "log_path": str(log)})
    return log


def test_log_pages_never_split_a_character(manager: JobManager, store: Store,
                                           paths: Paths) -> None:
    text = "".join(f"line {i}: é € 😀\n" for i in range(300))
    _saved_job(store, paths, "aaaa1111", "multi", text)
    out, offset = [], 0
    while True:
        chunk = manager.log("aaaa1111", offset=offset, max_bytes=7)
        if not chunk.data and chunk.offset >= chunk.size:
            break
        assert chunk.offset > offset or chunk.data == ""
        out.append(chunk.data)
        offset = chunk.offset
    assert "".join(out) == text

    big = "€" * 40_000  # 120 000 bytes: the tail starts inside a character
    _saved_job(store, paths, "bbbb2222", "big", big)
    tail = manager.log("bbbb2222")
    assert tail.offset == tail.size == len(big.encode())
    assert set(tail.data) == {"€"} and len(tail.data.encode()) <= logpages.LOG_TAIL_BYTES
    with pytest.raises(ValueError):
        manager.log("bbbb2222", offset=-1)


def test_jobs_are_found_by_id_prefix_or_unique_name(manager: JobManager, store: Store,
                                                    paths: Paths) -> None:
    _saved_job(store, paths, "cafe0001", "train")
    _saved_job(store, paths, "cafe0002", "train")
    _saved_job(store, paths, "beef0003", "eval")
    assert manager.get("eval").id == "beef0003"
    assert manager.get("beef").id == "beef0003"
    assert manager.get("cafe0002").id == "cafe0002"
    with pytest.raises(LookupError, match=r"^train matches 2 jobs \(cafe000\d, cafe000\d\)"):
        manager.get("train")
    with pytest.raises(LookupError, match="^cafe matches 2 jobs"):
        manager.get("cafe")
    with pytest.raises(LookupError, match="^no job named nothing$"):
        manager.get("nothing")
    with pytest.raises(ValueError, match="only a paused, parked or stopped job can be resumed"):
        manager.resume("eval")


# -- processes ----------------------------------------------------------------------------------


def test_bad_specs_leave_nothing_behind(manager: JobManager, paths: Paths) -> None:
    with pytest.raises(ValueError, match="^script not found"):
        manager.start(JobSpec(script=str(REPO / "nope.py"), cwd=str(REPO)).to_json())
    with pytest.raises(ValueError, match="unknown field"):
        manager.start({"script": TICKER, "colour": "blue"})
    assert list(paths.jobs_dir.iterdir()) == []
    assert manager.list(include_finished=True) == []


def test_a_job_runs_to_its_exit_status(manager: JobManager, store: Store,
                                       events: Events) -> None:
    job = manager.start(ticker(5, 0.01, 3))
    assert manager.active_count() == 1
    done = until(manager, lambda: manager.get(job.id).state == "failed" and
                 manager.get(job.id))
    assert done.exit_code == 3 and done.pids == ()
    assert manager.active_count() == 0
    assert store.get_job(job.id).state == "failed"
    assert events.kinds() == ["job_started", "job_failed"]
    assert events.seen[1]["level"] == "error"


def test_memory_of_the_tree_is_sampled(manager: JobManager) -> None:
    job = manager.start(ticker(0, 0.05))
    until(manager, lambda: manager.get(job.id).connected)  # the runner has started
    rss = psutil.Process(job.pid).memory_info().rss
    time.sleep(0.3)
    # In a cgroup of its own (the kernel brake) the job counts what its cgroup is charged: not
    # the shared library pages another process faulted in first, which its RSS counts.
    sampled = until(manager, lambda: (manager.get(job.id).rss_bytes or 0) >=
                    (1 if manager.get(job.id).memory_method == "cgroup" else rss // 2)
                    and manager.get(job.id))
    assert sampled.pids[0] == job.pid
    assert sampled.vram_bytes is None  # no GPU readings: unknown, not 0


def test_a_closed_manager_leaves_jobs_running_for_the_next(paths: Paths, store: Store,
                                                           events: Events) -> None:
    first = JobManager(paths, store, emit=events)
    job = first.start(ticker(0, 0.05))
    until(first, lambda: (first.get(job.id).rss_bytes or 0) > 0)
    first.close()
    assert psutil.Process(job.pid).is_running()
    assert not os.path.exists(paths.job_address(job.id))  # the listener is gone

    second = JobManager(paths, store, emit=events)
    try:
        assert second.adopt() == [job.id]
        assert os.path.exists(paths.job_address(job.id))  # same address, same key
        assert second.get(job.id).state in ("starting", "running")
        until(second, lambda: second.get(job.id).connected)
        second.stop(job.id)
        stopped = until(second, lambda: second.get(job.id).state == "stopped" and
                        second.get(job.id))
        # Not this manager's child: the runner's bye says how it ended (KeyboardInterrupt).
        assert stopped.exit_code == -2
        # Reaped (on a later tick), although another's child.
        until(second, lambda: not psutil.pid_exists(job.pid))
        assert "job_adopted" in events.kinds()
    finally:
        second.stop_all("test over", timeout=5)
        second.close()


def _zombie_or_gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_killed_jobs_unseen_child_is_reaped(manager: JobManager, tmp_path: Path) -> None:
    # The manager's process is the subreaper: a killed job's forked child comes to it once the
    # job's root is gone. Killed before any sample saw it, it is still reaped, not left as a
    # zombie (to this process, or to whoever is next up the tree once the engine exits).
    pidfile = tmp_path / "pids"
    job = manager.start(JobSpec(script=str(REPO / "tests" / "scripts" / "jobs" / "stubborn.py"),
                                args=(str(pidfile),), cwd=str(REPO)).to_json())
    until(manager, pidfile.exists)
    root, child = (int(x) for x in pidfile.read_text().split())
    manager.kill(job.id)
    until(manager, lambda: manager.get(job.id).state not in ("starting", "running",
                                                                    "stopping"))
    until(manager, lambda: _zombie_or_gone(child), timeout=10)
    # Reaped within the next ticks while the engine runs, and at the latest when it closes.
    until(manager, lambda: not psutil.pid_exists(child), timeout=5)
    manager.close()
    assert not psutil.pid_exists(root) and not psutil.pid_exists(child)


def _fake_python(tmp_path: Path) -> str:
    """An "interpreter" that runs no runner: the test speaks the job channel itself."""
    fake = tmp_path / "fakepython"
    fake.write_text("#!/bin/sh\nexec sleep 60\n")
    fake.chmod(0o755)
    return str(fake)


def test_the_job_channel_drives_the_job(manager: JobManager, paths: Paths, events: Events,
                                        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ladder, "STOP_ASK_SECONDS", 0.2)
    job = manager.start(ticker(python=_fake_python(tmp_path)))
    jid = job.id
    key = (paths.jobs_dir / jid / "key").read_bytes()
    conn = Client(paths.job_address(jid), family="AF_UNIX", authkey=key)
    try:
        def send(kind: str, **fields: Any) -> None:
            conn.send_bytes(rp.encode(rp.make(kind, **fields)))

        def command() -> str:
            assert conn.poll(5), "no command came"
            return rp.decode(conn.recv_bytes(), rp.ENGINE_COMMANDS)["type"]

        conn.send_bytes(b"not json")  # ignored; the channel stays open
        send(rp.HELLO, job_id=jid, fit_hook="installed")
        hello = until(manager, lambda: manager.get(jid).connected and manager.get(jid))
        assert hello.hooked and hello.state == "running"

        send(rp.PROGRESS, epoch=1, epochs=2, step=2, steps=10, logs={"loss": 0.5})
        time.sleep(1.1)
        send(rp.PROGRESS, epoch=1, epochs=2, step=6, steps=10, logs={"loss": 0.4})
        moving = until(manager, lambda: manager.get(jid).step == 6 and manager.get(jid))
        assert moving.metrics == {"loss": 0.4}
        # 4 steps in about 1.1 s, 14 to go: about 4 s.
        assert 2.0 < moving.eta_seconds < 5.0
        # The next epoch begins (its report has no logs yet): the last loss is still the job's.
        send(rp.PROGRESS, epoch=2, epochs=2, step=0, steps=10, logs={})
        begun = until(manager, lambda: manager.get(jid).epoch == 2 and manager.get(jid))
        assert begun.metrics == {"loss": 0.4} and begun.step == 0

        manager.pause(jid, reason="testing")
        assert command() == rp.PAUSE
        assert manager.get(jid).state == "pausing"
        send(rp.STATE, state="paused", epoch=0, step=6)
        paused = until(manager, lambda: manager.get(jid).state == "paused" and manager.get(jid))
        assert paused.pause_mode == "cooperative" and paused.pause_reason == "testing"

        manager.resume(jid)
        assert command() == rp.RESUME
        assert manager.get(jid).state == "running"

        send(rp.NOTE, level="warn", message="loss is not a number (NaN or inf)")
        send(rp.CHECKPOINTED, path="/x/fit-1", epoch=1, step=6)
        until(manager, lambda: manager.get(jid).checkpoint)
        assert manager.get(jid).notes[-1].message == "loss is not a number (NaN or inf)"

        manager.stop(jid)
        assert command() == rp.STOP  # the runner is asked first; "sleep" ignores it
        stopped = until(manager, lambda: manager.get(jid).state == "stopped" and
                        manager.get(jid))
        assert stopped.exit_code == -2  # then SIGINT ended it
    finally:
        conn.close()
    # The message that was not JSON is counted, and said once in the job's events.
    assert events.kinds() == ["job_started", "job_bad_message", "job_paused", "job_resumed",
                              "job_note", "job_stopped"]
    assert "not JSON" in events.seen[1]["message"] and stopped.dropped_fields == 1
    assert events.seen[4]["level"] == "warn"
    assert {e["job_id"] for e in events.seen} == {jid}  # every event names its job


def test_a_pause_that_does_not_land_in_time_suspends(manager: JobManager, paths: Paths,
                                                     tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ladder, "STOP_ASK_SECONDS", 0.2)
    job = manager.start(ticker(python=_fake_python(tmp_path)))
    jid = job.id
    conn = Client(paths.job_address(jid), family="AF_UNIX",
                  authkey=(paths.jobs_dir / jid / "key").read_bytes())
    try:
        conn.send_bytes(rp.encode(rp.make(rp.HELLO, fit_hook="installed")))
        until(manager, lambda: manager.get(jid).hooked)
        manager.pause(jid, by="guard", reason="memory", deadline=0.3)
        assert manager.get(jid).state == "pausing"
        paused = until(manager, lambda: manager.get(jid).state == "paused" and
                       manager.get(jid))
        assert paused.pause_mode == "suspended" and paused.paused_by == "guard"
        # SIGSTOP (or the freezer: state D) takes hold when the process next runs.
        suspended = (psutil.STATUS_STOPPED, psutil.STATUS_DISK_SLEEP)
        until(manager, lambda: psutil.Process(job.pid).status() in suspended, timeout=5)
        resumed = manager.resume(jid, by="guard")
        assert resumed.state == "running"
        until(manager, lambda: psutil.Process(job.pid).status() not in suspended,
              timeout=5)
    finally:
        conn.close()


def test_budgets_come_from_the_spec_or_its_preset(manager: JobManager) -> None:
    mib = 1024 * 1024
    job = manager.start(ticker(0, 0.05, ram_budget_mb=512, vram_budget_mb=256))
    assert (job.ram_budget_bytes, job.vram_budget_bytes) == (512 * mib, 256 * mib)
    safe = manager.start(ticker(0, 0.05, preset="desktop-safe"))
    total = psutil.virtual_memory().total
    assert safe.ram_budget_bytes == total * 75 // 100 // mib * mib
    assert safe.spec["preset"] == "desktop-safe" and safe.spec["ram_budget_mb"] is None
