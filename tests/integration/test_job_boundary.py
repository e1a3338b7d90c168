"""The guard cannot be blinded by what a job sends: a real engine, a job whose own script sends
poisoned messages on its channel (as any script can: it runs as the user and can read its key),
then a second job that hogs memory. The hog must still be paused by the guard, at its budget,
and the control channel must keep answering. Every hog has a bound of its own (a RAM budget
for the guard, a maximum for itself) and is ended in a ``finally``."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Any, Dict, Iterator

import psutil
import pytest

from tests.conftest import REPO, EngineProcess, suspended, wait_for
from trayapp.config import Config, Paths
from trayapp.engine import service
from trayapp.engine.client import EngineClient
from trayapp.jobs.manager import JobManager

SCRIPTS = REPO / "tests" / "scripts"
HOSTILE = str(SCRIPTS / "jobs" / "hostile.py")
HOG = str(SCRIPTS / "guard" / "hog.py")
MiB = 1 << 20


def progress_mib(path: Path) -> float:
    try:
        return float(path.read_text().splitlines()[-1].split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0


def start_hog(client: EngineClient, progress: Path) -> Dict[str, Any]:
    """A hog of 50 MiB chunks at 100 MiB/s, never more than 600 MiB; budget 300 MiB."""
    return client.job_start({"script": HOG, "args": ["50", "100", "600", str(progress)],
                             "ram_budget_mb": 300, "name": "hog"})


def kill_job(client: EngineClient, job: Dict[str, Any]) -> None:
    with contextlib.suppress(Exception):
        client.job_action(job.id, "kill", reason="test over")
    with contextlib.suppress(psutil.Error):
        p = psutil.Process(job.pid)
        p.resume()
        p.kill()


def assert_hog_paused_by_guard(client: EngineClient, hog: Dict[str, Any],
                               progress: Path) -> None:
    # Held by the kernel at its limit (state D) a moment before the guard pauses it.
    job = wait_for(lambda: (lambda j: j if suspended(hog.pid) and j.state == "paused"
                            else None)(client.job_get(hog.id)), 40,
                   "the guard to pause the hog")
    assert job.state == "paused" and job.paused_by == "guard", job
    assert progress_mib(progress) <= 400  # paused near its 300 MiB budget, not at its bound


def test_a_poisoned_progress_message_does_not_blind_the_guard(engine: EngineProcess,
                                                               tmp_path: Path) -> None:
    marker = tmp_path / "sent"
    progress = tmp_path / "progress"
    client = engine.client(timeout=20)
    hostile: Dict[str, Any] = {}
    hog: Dict[str, Any] = {}
    try:
        hostile = client.job_start({"script": HOSTILE, "args": [str(marker)], "name": "hostile"})
        wait_for(marker.exists, 30, "the hostile script to send its messages")
        hog = start_hog(client, progress)
        assert_hog_paused_by_guard(client, hog, progress)
        assert client.status().guard.state in ("warn", "pause")
        assert {j.id for j in client.jobs()} >= {hostile.id, hog.id}
        # The engine read them all: the dropped fields are counted on the job.
        job = wait_for(lambda: (lambda j: j if (j.dropped_fields or 0) >= 5 else None)(
            client.job_get(hostile.id)), 10, "the dropped fields to be counted")
        assert job.tf_memory is None and job.epoch == 1 and job.epochs == 3
        assert job.step is None and job.checkpoint is None
        assert job.runner_state is None
        note = job.notes[-1].message
        assert "\x1b" not in note and "\r" not in note and "\n" not in note
        assert note.startswith("\\x1b[2J")
        # The job's events say so, once.
        dropped = [e for e in client.events(job=hostile.id, limit=100)
                   if e.kind == "job_bad_message"]
        assert len(dropped) == 1, dropped
        assert "tf_memory" in dropped[0].message
        assert client.status().engine.running
        assert any(j.id == hostile.id for j in client.jobs())
    finally:
        for j in (hog, hostile):
            if j:
                kill_job(client, j)
    wait_for(lambda: all(j.state not in ("running", "paused", "stopping")
                         for j in client.jobs()), 20, "the jobs to end")
    assert client.shutdown() == {"stopping": True}
    client.close()
    engine.proc.wait(20)
    log = engine.paths.home / "engine.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    assert "Traceback" not in engine.stderr + text, engine.stderr
    assert len(text) < 200_000  # no flood of errors


# -- a failure in the other parts of a tick ---------------------------------------------------


@pytest.fixture
def engine_in_process(paths: Paths, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A real engine running in a thread of this process (so a test can break its parts)."""
    monkeypatch.setattr(service, "harden_process", lambda: [])  # not this test process
    engine = service.Engine(paths, Config(), stay=True)
    thread = threading.Thread(target=engine.run, name="engine", daemon=True)
    thread.start()
    wait_for(lambda: engine.server is not None and paths.key_file.exists(), 20,
             "the engine to listen")
    try:
        yield engine
    finally:
        engine.stop("test over")
        thread.join(20)


def test_the_ladder_acts_when_the_rest_of_the_tick_fails(engine_in_process: Any,
                                                          tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    engine = engine_in_process
    progress = tmp_path / "progress"
    with EngineClient(engine.paths, timeout=20) as client:
        hog = start_hog(client, progress)
    try:
        wait_for(lambda: engine.jobs.get(hog.id).state == "running", 30,
                 "the hog's runner to say hello")

        def broken(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("broken on purpose")

        # Job bookkeeping, the job list, history and the snapshot push all fail from now on.
        monkeypatch.setattr(JobManager, "tick", broken)
        monkeypatch.setattr(JobManager, "list", broken)
        monkeypatch.setattr(engine.store, "add_sample", broken)
        monkeypatch.setattr(engine.store, "add_event", broken)
        monkeypatch.setattr(type(engine), "status", broken)
        wait_for(lambda: suspended(hog.pid), 40, "the guard to suspend the hog")
        assert progress_mib(progress) <= 400
        # The guard's own status says so too, once the tick that acted has published it (the
        # suspension is seen a moment before: the state "pause" may be the tick's before).
        wanted = {f"job:{hog.id}"}
        wait_for(lambda: (lambda st: st["state"] == "pause" and st["paused_by_guard"].keys()
                          == wanted)(engine.guard.state_json()), 10, "the guard's status")
    finally:
        monkeypatch.undo()
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(hog.pid)
            p.resume()
            p.kill()
        with contextlib.suppress(Exception):
            engine.jobs.stop(hog.id, force=True)
