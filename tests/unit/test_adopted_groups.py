"""An adopted job's process group (a Jupyter kernel is Jupyter's child, not the engine's): it is
signalled only while the job's own root leads it. Once such a root has ended, its parent
collects it and its pid may go to another process that leads a group of its own."""

from __future__ import annotations

import signal
import subprocess
import sys
from typing import Iterator

import psutil
import pytest

from trayapp.jobs import trees
from trayapp.jobs.job import Job
from trayapp.jobs.ladder import Stage
from trayapp.jobs.record import JobRecord

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="process groups are POSIX")


@pytest.fixture
def leader() -> Iterator[subprocess.Popen]:
    """Another process, leading a group of its own (as a new terminal's shell does)."""
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def adopted(pid: int, create_time: float) -> Job:
    return Job(JobRecord(id="k1", name="nb", kind="kernel", pid=pid, pids=(pid,),
                         create_time=create_time), b"k")


def test_a_reused_pid_is_not_the_adopted_jobs_group(leader: subprocess.Popen) -> None:
    born = psutil.Process(leader.pid).create_time()
    earlier = adopted(leader.pid, born - 30.0)  # the kernel that had this pid before
    assert trees.group(earlier) == 0
    for stage in (Stage.INT, Stage.TERM, Stage.KILL):
        trees.signal_stage(earlier, stage)
    trees.resume(earlier)
    assert leader.poll() is None  # untouched

    same = adopted(leader.pid, born)
    same.process = psutil.Process(leader.pid)
    assert trees.group(same) == leader.pid
    trees.signal_stage(same, Stage.KILL)
    assert leader.wait(timeout=10) == -signal.SIGKILL


def test_an_adopted_root_that_leads_no_group_still_gets_the_interrupt() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        job = adopted(proc.pid, psutil.Process(proc.pid).create_time())
        job.process = psutil.Process(proc.pid)
        assert trees.group(job) == 0  # in the test's group: not the job's to signal
        trees.signal_stage(job, Stage.INT)
        assert proc.wait(timeout=10) != 0  # KeyboardInterrupt
    finally:
        proc.kill()
        proc.wait()
