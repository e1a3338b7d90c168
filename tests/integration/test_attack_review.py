"""Seams between the trust-boundary fixes: an --env value that replaces one Headroom sets, a job
log that is not a file, hostile fields in a record read back from the store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator, List

import pytest

from tests.conftest import REPO, headroom_cmd, run_cli, wait_for
from tests.integration.test_private_state import CONFIG, modes_and_holders, stop_engine_of
from trayapp.config import Paths
from trayapp.engine.client import EngineClient, EngineError

pytestmark = [pytest.mark.skipif(sys.platform == "win32", reason="POSIX modes and FIFOs")]

JOBS = REPO / "tests" / "scripts" / "jobs"
SECRET = "sekrit-override-value"


@pytest.fixture
def cli_home(home: Path, paths: Paths) -> Iterator[Path]:
    (home / "config.toml").write_text(CONFIG)
    yield home
    stop_engine_of(paths)


def test_an_env_value_replacing_headrooms_own_is_kept_only_in_the_environ_file(
        cli_home: Path, paths: Paths) -> None:
    r = run_cli("run", "--name", "override", "--env", f"PYTHONUNBUFFERED={SECRET}",
                str(JOBS / "exit_with.py"), "0", timeout=90)
    assert r.returncode == 0, r.stderr
    (job,) = json.loads(run_cli("jobs", "--json", "--all", timeout=30).stdout)
    assert SECRET not in json.dumps(job)
    # The warning still names the variable.
    assert any("PYTHONUNBUFFERED" in w for w in job["warnings"]), job["warnings"]
    with EngineClient(paths) as c:
        assert SECRET not in json.dumps([e.to_json() for e in c.events(job=job["id"])])
    found = modes_and_holders(cli_home, SECRET.encode())
    assert found["holders"] == [f"jobs/{job['id']}/environ.json"]


def test_a_job_log_replaced_by_a_fifo_is_refused_without_holding_the_clients_place(
        engine: Any, paths: Paths) -> None:
    """A job's script can replace its own log with a FIFO: reading it must not block the
    answer (each blocked one would keep a client's place for good), and status still answers."""
    with engine.client() as c:
        job = c.job_start({"script": str(JOBS / "ticker.py"), "args": ["0", "0.2"]})
        try:
            log = Path(job.log_path)
            log.unlink()
            os.mkfifo(log, 0o600)
            answers: List[Any] = []

            def read() -> None:
                with engine.client() as other:
                    try:
                        answers.append(other.job_log(job.id))
                    except EngineError as e:
                        answers.append(e)

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            reader.join(30)
            assert not reader.is_alive(), "job_log blocked on a FIFO"
            (answer,) = answers
            assert isinstance(answer, EngineError) and "not a regular file" in str(answer)
            assert "Traceback" not in str(answer)
            assert c.status().engine.running
        finally:
            c.job_action(job.id, "kill")


def test_run_follows_its_job_through_an_engine_that_is_busy_for_a_while(
        engine: Any, paths: Paths, tmp_path: Path) -> None:
    """An engine that answers nothing for longer than the client waits (stopped here, as a
    machine deep in swap would leave it) is busy, not gone: 'headroom run' says so and goes on
    following its job to the end."""
    marker = tmp_path / "started"
    script = tmp_path / "job.py"
    script.write_text(
        "import pathlib, sys, time\n"
        f"pathlib.Path({str(marker)!r}).touch()\n"
        f"while not pathlib.Path({str(marker)!r} + '.go').exists():\n"
        "    time.sleep(0.05)\n"
        "print('the end', flush=True)\n")
    run = subprocess.Popen(headroom_cmd("run", str(script)), env=dict(os.environ),
                           cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    try:
        wait_for(marker.exists, 60, "the job to start")
        os.kill(engine.proc.pid, signal.SIGSTOP)
        try:
            # Longer than a request's 10 s and a reconnection's 10 s after it.
            time.sleep(22)
        finally:
            os.kill(engine.proc.pid, signal.SIGCONT)
        Path(str(marker) + ".go").touch()
        out, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert "went away" not in err, err
    assert run.returncode == 0, (out, err)
    assert "the end" in out
    assert "the engine is busy" in err and "still following" in err


def test_a_flood_of_warnings_from_a_job_neither_fills_the_disk_nor_rotates_the_engine_log(
        engine: Any, paths: Paths) -> None:
    """A job's script holds its key: warnings sent as fast as it can become a bounded number
    of events and log lines (each event is a database row kept for days); what is over the
    engine's rate for a job is dropped unread and counted; the job keeps its last notes."""
    from multiprocessing.connection import Client

    with engine.client() as c:
        job = c.job_start({"script": str(JOBS / "ticker.py"), "args": ["0", "0.2"]})
        try:
            wait_for(lambda: c.job_get(job.id).connected, 30, "the job's channel")
            key = (paths.jobs_dir / job.id / "key").read_bytes()
            conn = Client(paths.job_address(job.id), family="AF_UNIX", authkey=key)
            def last_note() -> bool:
                # Sent again until it lands: the flood may have used up the job's rate.
                conn.send_bytes(json.dumps({"type": "note", "level": "warn",
                                            "message": "the last warning"}).encode())
                notes = c.job_get(job.id).notes
                return bool(notes) and notes[-1].message == "the last warning"

            try:
                for i in range(3000):
                    conn.send_bytes(json.dumps({"type": "note", "level": "warn",
                                                "message": f"warning {i}"}).encode())
                wait_for(last_note, 30, "the last note", every=0.2)
            finally:
                conn.close()
            taken = [n.message for n in c.job_get(job.id).notes]
            assert len(taken) == 50 and taken[0].startswith("warning ")  # the last ones
            # What came over the job's rate (as fast as the engine read) was counted, and said.
            dropped = c.job_get(job.id).dropped_fields
            said = [e for e in c.events(job=job.id, limit=5000)
                    if e.kind == "job_bad_message"]
            assert dropped < 3000 and bool(dropped) == bool(said), (dropped, said)
            events = c.events(job=job.id, limit=5000)
            notes = [e for e in events if e.kind == "job_note"]
            assert 1 <= len(notes) <= 100, len(notes)
            assert any("kept with the job" in e.message for e in events), events[-3:]
            logged = paths.log_file.read_text(errors="replace").count(": warning ")
            assert logged <= 100, logged
        finally:
            c.job_action(job.id, "kill")


def test_a_stopped_job_resumed_from_its_checkpoint_folder_keeps_its_env_value(
        cli_home: Path, paths: Paths, tmp_path: Path) -> None:
    from tests.integration.test_private_state import job_environ
    from trayapp.engine.client import connect
    from trayapp.jobs.options import JobSpec

    spec = JobSpec(script=str(JOBS / "ticker.py"), args=("0", "0.2"),
                   env=(("API_KEY", SECRET),), checkpoint_dir=str(tmp_path / "ckpt"))
    with connect(paths, start=True) as c:
        job = c.job_start(spec.to_json(), environ={"PATH": os.environ.get("PATH", "")})
        try:
            stopped = c.job_action(job.id, "stop")
            wait_for(lambda: c.job_get(job.id).state == "stopped", 30, "the stop")
            assert c.job_get(job.id).resumable, stopped
            resumed = c.job_action(job.id, "resume")
            assert resumed.pid and resumed.pid != job.pid
            assert job_environ(resumed.pid)["API_KEY"] == SECRET
        finally:
            try:
                c.job_action(job.id, "kill")
            except EngineError:
                pass
    found = modes_and_holders(cli_home, SECRET.encode())
    assert found["holders"] == [f"jobs/{job.id}/environ.json"]
