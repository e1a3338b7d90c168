"""Things breaking on purpose: a full disk under the state folder, a Keras job whose data
pipeline forks workers. Headroom must keep guarding, and leave no process or zombie behind.

(The engine killed under a running job, a corrupt database, a broken config and a job that
ignores SIGTERM are in test_jobs_engine.py and test_engine.py; the guard under a flooded control
channel in test_guard_e2e.py.)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import psutil
import pytest

from tests.conftest import REPO, EngineProcess, wait_for
from trayapp.config import get_paths
from trayapp.engine.client import EngineError, Subscription
from trayapp.jobs.options import JobSpec

SCRIPTS = REPO / "tests" / "scripts"

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


def tree(pid: int) -> List[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def alive(procs: List[psutil.Process]) -> List[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def zombies_of(pid: int) -> List[int]:
    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)
                if c.status() == psutil.STATUS_ZOMBIE]
    except psutil.NoSuchProcess:
        return []


# -- the state folder's disk fills up -----------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """HEADROOM_HOME on an 8 MiB tmpfs of its own (root only)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a small tmpfs")
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    monkeypatch.setenv("HEADROOM_HOME", str(mnt))
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fill(folder: Path) -> Path:
    filler = folder / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * (256 << 10))
                f.flush()
        except OSError:
            pass
    return filler


ADOPT_ME = """
import os
from trayapp.config import get_paths
from trayapp.engine.client import EngineClient, EngineError
try:
    print("job", EngineClient(get_paths()).request("kernel_adopt", pid=os.getpid(), name="nb")
          ["job"], flush=True)
except EngineError as e:
    print("refused", e, flush=True)
"""


def adopt_me(home: Path) -> str:
    """What the engine answers a process (one that says --kernel) asking to be a kernel job."""
    r = subprocess.run([sys.executable, "-c", ADOPT_ME, "--kernel"], capture_output=True,
                       text=True, timeout=60, cwd=str(REPO),
                       env={**os.environ, "HEADROOM_HOME": str(home)})
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
    return r.stdout.strip()


def test_a_kernel_asking_on_a_full_disk_is_refused_in_one_line_and_leaves_nothing(
        small_disk: Path) -> None:
    engine = EngineProcess(get_paths()).wait_ready()
    jobs_dir = engine.paths.jobs_dir
    try:
        before = set(os.listdir(jobs_dir))
        filler = fill(small_disk)
        answer = adopt_me(small_disk)
        assert answer.startswith("refused") and "cannot keep the job" in answer, answer
        assert "\n" not in answer
        assert set(os.listdir(jobs_dir)) == before  # no half-made job folder left behind
        filler.unlink()  # room again: the same request is taken
        assert adopt_me(small_disk).startswith("job "), "not adopted once there was room"
        assert engine.proc.poll() is None, engine.stderr
    finally:
        engine.stop()
    assert "Traceback" not in engine.stderr

def test_a_full_disk_warns_once_and_the_guard_keeps_working(small_disk: Path,
                                                             tmp_path: Path) -> None:
    (small_disk / "config.toml").write_text('[guard]\nmode = "act"\n')
    engine = EngineProcess(get_paths()).wait_ready()
    trigger = tmp_path / "go"
    job_id: Optional[str] = None
    try:
        with engine.client(timeout=30) as c, Subscription(engine.paths) as sub:
            job = c.job_start(JobSpec(script=str(SCRIPTS / "faults" / "quiet_hog.py"),
                                      args=(str(trigger), "600"), ram_budget_mb=250,
                                      cwd=str(tmp_path)).to_json())
            job_id = job.id
            wait_for(lambda: c.job_get(job_id).state == "running", 30, "the job to run")
            fill(small_disk)
            warnings: List[Dict[str, Any]] = []
            deadline = time.monotonic() + 8
            while time.monotonic() < deadline:
                msg = sub.get(timeout=0.5)
                if msg and msg["push"] == "event" and msg["data"]["kind"] == "store_error":
                    warnings.append(msg["data"])
            assert len(warnings) == 1, warnings
            assert "guard keeps working" in warnings[0]["message"]
            assert c.status().engine.store_error
            # With the disk still full, the guard still acts: the hog passes its budget.
            trigger.write_text("go")
            paused = wait_for(lambda: (j := c.job_get(job_id)).state == "paused" and j, 30,
                              "the guard to pause the hog at its budget")
            assert paused.paused_by == "guard"
            assert paused.rss_bytes < 400 * 2**20
            # Recent history still answers, from memory.
            h = c.history(time.time() - 30)
            assert len(h.series["mem.available"].t) >= 5
    finally:
        if job_id is not None:
            try:
                with engine.client(timeout=30) as c:
                    c.job_action(job_id, "kill")
            except EngineError:
                pass
        assert engine.proc.poll() is None, "the engine died of the full disk:\n" + engine.stderr
        engine.stop()
    assert "Traceback" not in engine.stderr


# -- a Keras data pipeline with worker processes ------------------------------------------------


@pytest.mark.tensorflow
def test_pause_park_and_stop_reach_every_worker(home: Path, tmp_path: Path,
                                                start_engine: Callable[..., EngineProcess]
                                                ) -> None:
    (home / "config.toml").write_text('[guard]\nmode = "off"\n')
    engine = start_engine()
    ckpt = tmp_path / "ckpt"
    with engine.client(timeout=60) as c:
        job = c.job_start(JobSpec(fit_batch=False,
                                  script=str(SCRIPTS / "faults" / "keras_workers.py"),
                                  args=("50", "40", "0.05"), checkpoint_dir=str(ckpt),
                                  cwd=str(tmp_path)).to_json())
        jid = job.id
        try:
            wait_for(lambda: (c.job_get(jid).step or 0) >= 3, 90, "training steps")
            workers = wait_for(lambda: len(tree(job.pid)) >= 3 and tree(job.pid), 30,
                               "the data pipeline's worker processes")
            # Pause: the training holds still, and a hard suspend stops every process.
            c.job_action(jid, "pause")
            paused = wait_for(lambda: (j := c.job_get(jid)).state == "paused" and j, 30,
                              "the pause")
            step = paused.step
            time.sleep(1.5)
            assert c.job_get(jid).step == step
            # Park: checkpoint, end; nothing of the tree may stay behind.
            c.job_action(jid, "park")
            wait_for(lambda: c.job_get(jid).state == "parked", 90, "the park")
            wait_for(lambda: not alive(workers), 20, "every worker to end with the job")
            assert any(ckpt.rglob("*")), "a checkpoint on disk"
            # Resume, then stop: again the whole tree goes.
            c.job_action(jid, "resume")
            again = wait_for(lambda: (j := c.job_get(jid)).state == "running" and j.pid
                             and len(tree(j.pid)) >= 3 and j, 120, "the relaunch's workers")
            workers = tree(again.pid)
            c.job_action(jid, "stop")
            wait_for(lambda: c.job_get(jid).state in ("stopped", "failed", "finished"), 60,
                     "the stop")
            wait_for(lambda: not alive(workers), 20, "every worker to end with the stop")
            # The engine reaps what the tree left at its next look at orphans (once a second).
            wait_for(lambda: zombies_of(engine.proc.pid) == [], 5, "no zombie left")
        finally:
            try:
                c.job_action(jid, "kill")
            except EngineError:
                pass
