"""Jobs under a real engine: real processes, real signals, the real job channel.

Most tests run small plain-Python scripts (fast); the ones marked ``tensorflow`` train a real
Keras model with tensorflow-cpu (about ten seconds each to start).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Optional

import psutil
import pytest

from tests.conftest import REPO, EngineProcess, wait_for
from trayapp.engine.client import EngineClient, EngineError
from trayapp.jobs.options import JobSpec
from trayapp.runner.protocol import PARK_EXIT_CODE

SCRIPTS = REPO / "tests" / "scripts" / "jobs"
QUIET_CONFIG = '[guard]\nmode = "off"\n'
# Suspended: stopped by signal, or frozen in its cgroup by the kernel brake's freezer (D).
SUSPENDED = (psutil.STATUS_STOPPED, psutil.STATUS_DISK_SLEEP)

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and sessions")


def spec(script: str | Path, *args: Any, **fields: Any) -> Dict[str, Any]:
    path = Path(script) if os.path.isabs(str(script)) else SCRIPTS / str(script)
    return JobSpec(script=str(path), args=tuple(str(a) for a in args), cwd=str(REPO),
                   **fields).to_json()


def job_in(c: EngineClient, job_id: str, *states: str) -> Optional[Dict[str, Any]]:
    job = c.job_get(job_id)
    return job if job.state in states else None


def log_text(c: EngineClient, job_id: str) -> str:
    return c.job_log(job_id, offset=0, max_bytes=1 << 17).data


@pytest.fixture
def eng(home: Path, start_engine: Callable[..., EngineProcess]) -> EngineProcess:
    """An engine whose guard watches only (so memory on this machine cannot move the jobs)."""
    (home / "config.toml").write_text(QUIET_CONFIG)
    return start_engine()


@pytest.fixture
def client(eng: EngineProcess):  # type: ignore[no-untyped-def]
    with eng.client(timeout=30.0) as c:
        yield c


def _stop_quietly(c: EngineClient, job_id: str) -> None:
    try:
        c.job_action(job_id, "kill")
    except EngineError:
        pass


# -- plain scripts ------------------------------------------------------------------------------


def test_exit_status_and_output_come_back(client: EngineClient, paths: Any) -> None:
    job = client.job_start(spec("ticker.py", 20, 0.01, 7))
    assert job.state == "starting" and job.pid > 0
    assert job.name == "ticker"
    folder = paths.jobs_dir / job.id
    assert (folder / "key").stat().st_mode & 0o777 == 0o600
    assert (folder / "spec.json").is_file()

    done = wait_for(lambda: job_in(client, job.id, "failed"), 20, "the job to fail")
    assert done.exit_code == 7
    assert done.end_reason == "exit status 7"
    assert done.ended >= done.started

    whole = log_text(client, job.id)
    assert whole.startswith("tick 1\n") and "tick 20\ndone\n" in whole
    # Paging by offset gives the same bytes; the default is the tail.
    pieces, offset = [], 0
    while True:
        chunk = client.job_log(job.id, offset=offset, max_bytes=37)
        if not chunk.data:
            break
        pieces.append(chunk.data)
        offset = chunk.offset
    assert "".join(pieces) == whole
    tail = client.job_log(job.id)
    assert tail.size == len(whole.encode()) and tail.data == whole

    events = client.events(job=job.id)
    kinds = [e.kind for e in events]
    assert "job_started" in kinds and "job_failed" in kinds


def test_plain_script_is_suspended_and_resumed(client: EngineClient) -> None:
    job = client.job_start(spec("ticker.py", 0, 0.05))
    try:
        wait_for(lambda: "tick 3\n" in log_text(client, job.id), 20, "output")
        paused = client.job_action(job.id, "pause")
        # No Keras fit() to pause at a batch end: the whole tree is suspended at once.
        assert paused.state == "paused" and paused.pause_mode == "suspended"
        assert paused.paused_by == "user"
        # SIGSTOP (or the freezer: state D) takes hold when the process next runs.
        wait_for(lambda: psutil.Process(job.pid).status() in SUSPENDED, 5,
                 "the process to stop")
        size = client.job_log(job.id).size
        time.sleep(0.6)
        assert client.job_log(job.id).size == size, "a suspended job wrote output"

        resumed = client.job_action(job.id, "resume")
        assert resumed.state == "running" and resumed.pause_mode is None
        wait_for(lambda: client.job_log(job.id).size > size, 5, "output after resume")

        stopped = client.job_action(job.id, "stop")
        assert stopped.state == "stopped"
        assert stopped.end_reason.startswith("stopped by user")
    finally:
        _stop_quietly(client, job.id)


def test_stop_escalates_to_kill_and_ends_the_whole_tree(client: EngineClient,
                                                        tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    job = client.job_start(spec("stubborn.py", pidfile))
    try:
        wait_for(pidfile.exists, 20, "the stubborn script's pids")
        root, child = (int(x) for x in pidfile.read_text().split())
        assert root == job.pid
        # The tree is sampled: the forked child belongs to the job.
        wait_for(lambda: child in client.job_get(job.id).pids, 5, "the child in the tree")

        stopped = client.job_action(job.id, "stop")
        assert stopped.state == "stopped"
        assert stopped.exit_code == -signal.SIGKILL  # it ignored SIGINT and SIGTERM
        for pid in (root, child):
            # Gone, not even a zombie: the engine reaps the orphaned child too.
            assert not psutil.pid_exists(pid), f"process {pid} survived the stop"
        assert client.job_get(job.id).pids == ()
    finally:
        _stop_quietly(client, job.id)


def test_syntax_error_fails_with_its_traceback_in_the_log(client: EngineClient,
                                                          tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("def broken(:\n    return 1\n")
    job = client.job_start(spec(broken))
    done = wait_for(lambda: job_in(client, job.id, "failed"), 20, "the job to fail")
    assert done.exit_code == 1
    text = log_text(client, job.id)
    assert "SyntaxError" in text and "broken.py" in text
    assert "_headroom_runner" not in text  # the runner's own frames are not shown


def test_refusals_are_one_line(client: EngineClient, tmp_path: Path) -> None:
    with pytest.raises(EngineError) as e:
        client.job_action("nosuchjob", "pause")
    assert e.value.code == "refused" and str(e.value) == "no job named nosuchjob"
    with pytest.raises(EngineError) as e:
        client.job_start(spec(tmp_path / "missing.py"))
    assert e.value.code == "refused" and "script not found" in str(e.value)
    with pytest.raises(EngineError) as e:
        client.job_start({"script": 3})
    assert e.value.code == "refused" and "\n" not in str(e.value)

    job = client.job_start(spec("ticker.py", 0, 0.05, name="twin"))
    other = client.job_start(spec("ticker.py", 0, 0.05, name="twin"))
    try:
        with pytest.raises(EngineError) as e:
            client.job_action("twin", "pause")
        assert "twin matches 2 jobs" in str(e.value)
        # Parking without a checkpoint folder would lose progress: refused, job untouched.
        with pytest.raises(EngineError) as e:
            client.job_action(job.id, "park")
        assert "parking would lose" in str(e.value)
        assert client.job_get(job.id).state in ("starting", "running")
    finally:
        _stop_quietly(client, job.id)
        _stop_quietly(client, other.id)
    with pytest.raises(EngineError) as e:
        client.job_action(job.id, "pause")
    assert "cannot be paused" in str(e.value)


def test_engine_killed_job_runs_on_and_is_adopted(home: Path, paths: Any, tmp_path: Path,
                                                  start_engine: Callable[..., EngineProcess]
                                                  ) -> None:
    (home / "config.toml").write_text(QUIET_CONFIG)
    first = start_engine()
    t_start = time.time()
    gate = tmp_path / "gate"  # the job ticks until the test has seen it adopted
    with first.client() as c:
        job = c.job_start(spec("ticker.py", 0, 0.1, 5, gate))
        wait_for(lambda: job_in(c, job.id, "running"), 20, "the runner's hello")
    time.sleep(2.5)  # some history, flushed or not, before the crash
    t_kill = time.time()
    first.kill()

    proc = psutil.Process(job.pid)
    assert proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    log = paths.jobs_dir / job.id / "log"
    size = log.stat().st_size
    wait_for(lambda: log.stat().st_size > size, 30, "output while no engine runs")

    time.sleep(1.0)
    second = start_engine()
    t_back = time.time()
    with second.client(timeout=30.0) as c:
        adopted = c.job_get(job.id)
        assert adopted.state == "running" and adopted.pid == job.pid
        assert job.id in [j.id for j in c.jobs()]
        wait_for(lambda: c.job_get(job.id).connected, 30, "the runner to reconnect")
        gate.touch()
        done = wait_for(lambda: job_in(c, job.id, "failed", "finished", "lost"), 60,
                        "the adopted job to end")
        # Not the new engine's child: the status comes from the runner's bye.
        assert done.state == "failed" and done.exit_code == 5
        assert "gate open\ndone\n" in log_text(c, job.id)
        kinds = [e.kind for e in c.events(job=job.id)]
        assert "job_adopted" in kinds
        # The history has no hole beyond the time no engine ran (samples of the killed engine
        # that had not reached the disk are the only loss: at most one flush interval, 1 s).
        times = c.history(t_start - 1).series["mem.available"].t
        before = [t for t in times if t < t_kill]
        after = [t for t in times if t > t_back]
        assert before and after, times
        gaps = [b - a for a, b in zip(times, times[1:])]
        assert max(gaps) <= (t_back - t_kill) + 1.0 + 1.5, gaps


def test_a_job_that_ended_unseen_is_lost(home: Path, paths: Any,
                                         start_engine: Callable[..., EngineProcess]) -> None:
    (home / "config.toml").write_text(QUIET_CONFIG)
    first = start_engine()
    with first.client() as c:
        job = c.job_start(spec("ticker.py", 0, 0.05))
        wait_for(lambda: job_in(c, job.id, "running"), 20, "the runner's hello")
    first.kill()
    # SIGKILL leaves the runner no time to say bye: the exit status cannot be known.
    os.killpg(job.pid, signal.SIGKILL)
    wait_for(lambda: not _alive(job.pid), 5, "the job to die")
    second = start_engine()
    with second.client() as c:
        lost = c.job_get(job.id)
        assert lost.state == "lost" and lost.exit_code is None
        assert "exit status unknown" in lost.end_reason
        assert c.jobs() == []
        assert [j.id for j in c.jobs(all=True)] == [job.id]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# -- real Keras jobs ----------------------------------------------------------------------------


@pytest.mark.tensorflow
def test_keras_pause_resume_park_and_resume_from_checkpoint(client: EngineClient,
                                                            tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    job = client.job_start(spec("keras_train.py", 3, 20, 0.05, checkpoint_dir=str(ckpt)))
    try:
        jid = job.id
        running = wait_for(lambda: (lambda j: j if (j.step or 0) >= 2 else None)(
            client.job_get(jid)), 60, "training progress")
        assert running.hooked and running.epochs == 3 and running.steps == 20
        assert "loss" in running.metrics

        paused = client.job_action(jid, "pause")
        assert paused.state == "paused" and paused.pause_mode == "cooperative"
        time.sleep(0.6)  # progress sent before the pause has arrived by now
        held = client.job_get(jid)
        time.sleep(1.0)
        again = client.job_get(jid)
        assert (again.epoch, again.step) == (held.epoch, held.step)
        assert psutil.Process(job.pid).status() not in SUSPENDED
        pauses = [e for e in client.events(job=jid) if e.kind == "job_paused"]
        assert [e.data["pause_mode"] for e in pauses] == ["cooperative"]

        client.job_action(jid, "resume")
        wait_for(lambda: (client.job_get(jid).epoch, client.job_get(jid).step)
                 != (held.epoch, held.step), 10, "progress after resume")
        # Park in the second epoch, so the relaunch must skip the first.
        wait_for(lambda: (client.job_get(jid).epoch or 0) >= 2, 30, "the second epoch")
        parked = client.job_action(jid, "park")
        assert parked.state == "parked", parked
        assert parked.exit_code == PARK_EXIT_CODE
        assert not _alive(job.pid)
        assert (ckpt / "fit-1" / "latest.weights.h5").is_file()
        assert (ckpt / "fit-1" / "training_metadata.json").is_file()
        assert jid in [j.id for j in client.jobs()]  # parked jobs are listed

        relaunched = client.job_action(jid, "resume")
        assert relaunched.id == jid and relaunched.runs == 2
        assert relaunched.pid != job.pid
        assert relaunched.resumed_at and relaunched.spec["resume"] is False
        assert relaunched.argv[-3:] == ("3", "20", "0.05")
        done = wait_for(lambda: job_in(client, jid, "finished", "failed"), 90, "the end")
        assert done.state == "finished" and done.exit_code == 0
        text = log_text(client, jid)
        before, marker, after = text.partition("--- resumed from checkpoint")
        assert marker, text
        assert "epoch-begin 1\n" in before and "epoch-begin 2\n" in before
        # The relaunch trains the remaining epochs only.
        assert "epoch-begin 1\n" not in after and "epoch-begin 3\n" in after
        assert after.rstrip().endswith("training done")
    finally:
        _stop_quietly(client, job.id)


@pytest.mark.tensorflow
def test_keras_job_keeps_training_through_an_engine_restart(
        home: Path, start_engine: Callable[..., EngineProcess]) -> None:
    (home / "config.toml").write_text(QUIET_CONFIG)
    first = start_engine()
    with first.client(timeout=30.0) as c:
        job = c.job_start(spec("keras_train.py", 4, 25, 0.05))
        before = wait_for(lambda: (lambda j: j if (j.step or 0) >= 1 else None)(
            c.job_get(job.id)), 60, "training progress")
    first.kill()
    second = start_engine()
    with second.client(timeout=30.0) as c:
        assert c.job_get(job.id).state == "running"
        # Progress goes on arriving on the new engine's channel.
        wait_for(lambda: (c.job_get(job.id).epoch or 0) > before.epoch, 30,
                 "progress after the restart")
        done = wait_for(lambda: job_in(c, job.id, "finished", "failed", "lost"), 60,
                        "the end")
        assert done.state == "finished" and done.exit_code == 0
        assert done.epoch == 4
