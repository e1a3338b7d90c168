"""A job's process beside the desktop: its CPU priority and OOM score (below the engine's, never
above the desktop), its log (capped, head and tail kept), a disk that fills under it (the job
lives on), a full disk at start (refused with the reason), and the store's warnings in
engine.log. Real engines, real jobs, a real tmpfs filled to the last byte.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Optional

import pytest

from tests.conftest import REPO, EngineProcess, run_cli, wait_for
from tests.integration.test_faults import fill, small_disk  # noqa: F401 - a fixture
from trayapp.config import get_paths
from trayapp.engine.client import EngineClient, EngineError
from trayapp.jobs.options import JobSpec

SCRIPTS = REPO / "tests" / "scripts" / "jobproc"
QUIET = '[guard]\nmode = "off"\n'

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc")


def spec(script: str, *args: Any, cwd: Path) -> Dict[str, Any]:
    return JobSpec(script=str(SCRIPTS / script), args=tuple(str(a) for a in args),
                   cwd=str(cwd)).to_json()


def nice_of(pid: int, tid: Optional[int] = None) -> int:
    path = f"/proc/{pid}/task/{tid}/stat" if tid else f"/proc/{pid}/stat"
    with open(path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[16])  # field 19 of stat(5); the first after the name is field 3


def oom_score_adj_of(pid: int) -> int:
    with open(f"/proc/{pid}/oom_score_adj") as f:
        return int(f.read())


def ended(c: EngineClient, job_id: str) -> Optional[Dict[str, Any]]:
    job = c.job_get(job_id)
    return job if job.state in ("finished", "failed", "stopped", "lost") else None


def kill_quietly(engine: EngineProcess, job_id: Optional[str]) -> None:
    if job_id is None:
        return
    try:
        with engine.client(timeout=30) as c:
            c.job_action(job_id, "kill")
    except EngineError:
        pass


# -- priority -----------------------------------------------------------------------------------


@pytest.mark.parametrize("config, nice, oom", [
    ("", 0, 500),
    ("[jobs]\nnice = 10\noom_score_adj = 800\n", 10, 800),
], ids=["defaults", "configured"])
def test_a_job_and_its_children_run_below_the_engine(home: Path, tmp_path: Path,
                                                      start_engine: Callable[..., EngineProcess],
                                                      config: str, nice: int, oom: int) -> None:
    (home / "config.toml").write_text(QUIET + config)
    engine = start_engine()
    # The engine raises its own priority where it may (root: nice -5; oom_score_adj -100 where
    # the kernel lets even root lower it, which this one may not).
    engine_nice, engine_oom = nice_of(engine.proc.pid), oom_score_adj_of(engine.proc.pid)
    if os.geteuid() == 0:
        assert engine_nice == -5
    report, release = tmp_path / "pids", tmp_path / "release"
    with engine.client(timeout=30) as c:
        job = c.job_start(spec("forker.py", report, release, cwd=tmp_path))
        try:
            wait_for(report.exists, 30, "the job to report its pids")
            pid, tid, child = (int(x) for x in report.read_text().split())
            assert pid == job.pid
            for p, t in ((pid, None), (pid, tid), (child, None)):
                assert nice_of(p, t) == nice, (p, t)
            assert oom_score_adj_of(pid) == oom
            assert oom_score_adj_of(child) == oom
            # The engine keeps its own protection.
            assert nice_of(engine.proc.pid) == engine_nice
            assert oom_score_adj_of(engine.proc.pid) == engine_oom
            # What the job runs at is in its record, for the jobs window.
            process = c.job_get(job.id).process
            assert process is not None
            assert process.nice == nice and process.oom_score_adj == oom
            release.write_text("go")
            done = wait_for(lambda: ended(c, job.id), 30, "the job to end")
            assert done.state == "finished", done
        finally:
            release.write_text("go")
            kill_quietly(engine, job.id)


def test_dry_run_shows_the_priority(home: Path, tmp_path: Path) -> None:
    (home / "config.toml").write_text("[jobs]\nnice = 7\noom_score_adj = 900\n")
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    r = run_cli("run", "--dry-run", str(script))
    assert r.returncode == 0, r.stderr
    assert re.search(r"^  CPU priority: nice 7\b", r.stdout, re.M), r.stdout
    assert re.search(r"^  OOM killer: oom_score_adj \+900\b", r.stdout, re.M), r.stdout
    assert re.search(r"^  Log: capped at 32\.0 MiB\b", r.stdout, re.M), r.stdout
    (home / "config.toml").write_text("[jobs]\nnice = -5\n")
    r = run_cli("run", "--dry-run", str(script))
    assert r.returncode == 0, r.stderr
    assert re.search(r"^  CPU priority: nice 0\b", r.stdout, re.M), r.stdout


# -- the log's cap ------------------------------------------------------------------------------

MiB = 1 << 20


def test_a_fast_spew_is_capped_with_its_head_and_tail(home: Path, tmp_path: Path,
                                                       start_engine: Callable[..., EngineProcess]
                                                       ) -> None:
    (home / "config.toml").write_text(QUIET + "[jobs]\nlog_max_mb = 1\n")
    engine = start_engine()
    count, line = 100_000, 1000  # 100 MiB, printed as fast as print() goes
    report = tmp_path / "peak"
    with engine.client(timeout=30) as c:
        job = c.job_start(spec("spew.py", count, line, report, cwd=tmp_path))
        try:
            done = wait_for(lambda: ended(c, job.id), 120, "the spew to end")
            assert done.state == "finished", done
            log = Path(done.log_path)
            # The last bytes may wait for the engine's next look (a tenth of a second).
            wait_for(lambda: log.stat().st_size <= MiB, 10, "the log within its cap")
            peak = int(report.read_text())
            text = log.read_text()
            tail = c.job_log(job.id).data
            # A follower that was further on than the trimmed log goes on at the marker.
            follower = c.job_log(job.id, offset=50 * MiB)
        finally:
            kill_quietly(engine, job.id)
    lines = text.splitlines()
    assert lines[0] == "FIRST LINE OF THE SPEW"
    assert lines[-1] == f"LAST LINE OF THE SPEW after {count} lines"
    markers = [s for s in lines if s.startswith("[headroom: ")]
    assert len(markers) == 1, markers
    found = re.match(r"\[headroom: ([0-9]+) bytes of output dropped", markers[0])
    assert found
    # What was dropped plus what is kept is what was printed: nothing vanished unaccounted.
    printed = len(lines[0]) + 1 + count * line + len(lines[-1]) + 1
    kept = len(text.encode()) - (len(markers[0]) + 2)  # the marker is a line of its own
    assert int(found[1]) + kept == printed
    # The cap holds while the job prints, not only once it has ended.
    assert peak <= MiB + MiB // 4, f"the log reached {peak} bytes"
    assert tail.rstrip("\n").endswith(lines[-1])
    assert follower.start == MiB // 8 and follower.data.startswith("\n[headroom: ")


# -- a full disk --------------------------------------------------------------------------------


def test_a_job_lives_on_when_its_log_disk_fills(small_disk: Path, tmp_path: Path) -> None:  # noqa: F811
    (small_disk / "config.toml").write_text(QUIET)
    engine = EngineProcess(get_paths()).wait_ready()
    after, progress = tmp_path / "filled", tmp_path / "progress"
    job_id = None
    try:
        with engine.client(timeout=30) as c:
            job = c.job_start(spec("chatty.py", after, progress, 40, 0.02, 7, cwd=tmp_path))
            job_id = job.id
            wait_for(lambda: progress.exists() and int(progress.read_text()) >= 5, 30,
                     "the job to print")
            fill(small_disk)
            at_fill = int(progress.read_text())
            after.write_text("go")
            done = wait_for(lambda: ended(c, job_id), 60, "the job to end")
            assert done.exit_code == 7, done
            assert done.end_reason == "exit status 7"
            # "go" may be seen in the same turn that wrote at_fill: 39 more at least.
            assert int(progress.read_text()) >= at_fill + 39
            notes = [n for n in done.notes if "output" in n.message]
            assert len(notes) == 1, done.notes
            assert notes[0].level == "warn"
            assert "no space left on device" in notes[0].message.lower()
    finally:
        kill_quietly(engine, job_id)
        assert engine.proc.poll() is None, engine.stderr
        engine.stop()
    assert "Traceback" not in engine.stderr


def test_a_full_disk_at_start_says_why(small_disk: Path, tmp_path: Path) -> None:  # noqa: F811
    (small_disk / "config.toml").write_text(QUIET)
    engine = EngineProcess(get_paths()).wait_ready()
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    try:
        fill(small_disk)
        with engine.client(timeout=30) as c:
            with pytest.raises(EngineError) as refused:
                c.job_start(JobSpec(script=str(script), cwd=str(tmp_path)).to_json())
        message = str(refused.value)
        assert refused.value.code == "refused", message
        assert message.startswith("cannot start the job: no space left on device under ")
        assert str(small_disk) in message and "\n" not in message
        r = run_cli("run", str(script), env={"HEADROOM_HOME": str(small_disk)})
        assert r.returncode == 2, r  # the CLI's status for a request the engine refused
        assert "no space left on device" in r.stderr and "internal" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        with engine.client(timeout=30) as c:
            assert c.jobs() == []
        assert not any((small_disk / "jobs").iterdir())
    finally:
        assert engine.proc.poll() is None, engine.stderr
        engine.stop()


def test_a_start_whose_folder_cannot_be_made_says_why(home: Path, tmp_path: Path,
                                                       start_engine: Callable[..., EngineProcess]
                                                       ) -> None:
    (home / "config.toml").write_text(QUIET)
    engine = start_engine()
    jobs = engine.paths.jobs_dir
    jobs.rmdir()
    jobs.write_text("not a folder")  # every write under it fails, though the disk has room
    with engine.client(timeout=30) as c:
        with pytest.raises(EngineError) as refused:
            c.job_start(spec("forker.py", tmp_path / "a", tmp_path / "b", cwd=tmp_path))
        assert c.jobs() == []
    assert refused.value.code == "refused"
    assert str(refused.value) == f"cannot start the job: not a directory under {jobs}"


# -- the store's warnings -----------------------------------------------------------------------


def test_a_store_warning_reaches_engine_log(home: Path,
                                            start_engine: Callable[..., EngineProcess]) -> None:
    (home / "config.toml").write_text(QUIET)
    (home / "headroom.db").write_bytes(b"this is not a database\n" * 100)
    engine = start_engine()
    log = engine.paths.log_file
    found = wait_for(lambda: [s for s in log.read_text().splitlines()
                              if " headroom.store: " in s and "was unusable" in s], 10,
                     "the store's warning in engine.log")
    assert " WARNING " in found[0]
