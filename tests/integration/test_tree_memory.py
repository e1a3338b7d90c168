"""A job's memory counts each page once: forked workers that share their parent's pages do not
multiply it, and a RAM budget above what the job really uses does not pause it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

import pytest

from tests.conftest import REPO, EngineProcess, wait_for
from trayapp.jobs.options import JobSpec
from trayapp.probes.processes import TreeMeter, pss_available, rss_bytes, rss_pss_bytes

SCRIPT = str(REPO / "tests" / "scripts" / "jobs" / "forked_workers.py")
MiB = 1024**2
REAL_MB, WORKERS = 200, 50  # summed RSS about 51 x 200 MB = 10 GB; really 200 MB and more

pytestmark = pytest.mark.skipif(not pss_available(), reason="needs /proc/<pid>/smaps_rollup")


@pytest.fixture
def eng(home: Path, start_engine: Callable[..., EngineProcess]) -> EngineProcess:
    (home / "config.toml").write_text('[guard]\nmode = "act"\n')
    return start_engine()


def start_job(eng: EngineProcess, budget_mb: int, seconds: float) -> Dict[str, Any]:
    spec = JobSpec(script=SCRIPT, args=(str(REAL_MB), str(WORKERS), str(seconds)),
                   python=sys.executable, cwd=str(REPO), ram_budget_mb=budget_mb)
    with eng.client() as c:
        return c.job_start(spec.to_json())


def get(eng: EngineProcess, job_id: str) -> Dict[str, Any]:
    with eng.client() as c:
        return c.job_get(job_id)


def all_forked(eng: EngineProcess, job_id: str) -> Dict[str, Any]:
    def ready() -> Any:
        job = get(eng, job_id)
        return job if len(job.pids or []) == WORKERS + 1 and job.rss_bytes \
            else None

    return wait_for(ready, 60, "the job and all its workers in the engine's view")


def summed_rss(pids: List[int]) -> int:
    return sum(rss_bytes(p) or 0 for p in pids)


def pss_sum(pids: List[int]) -> int:
    """What the tree really uses: the kernel's PSS of each member, summed (slow, exact)."""
    return sum((rss_pss_bytes(p) or (0, 0))[1] for p in pids)


def stop(eng: EngineProcess, job_id: str) -> None:
    with eng.client() as c:
        if c.job_get(job_id).state not in ("stopped", "finished", "failed", "lost"):
            c.job_action(job_id, "kill")


def test_forked_workers_are_counted_once_and_a_budget_above_real_use_holds(
        eng: EngineProcess) -> None:
    job = start_job(eng, budget_mb=2048, seconds=60)
    try:
        seen = all_forked(eng, job.id)
        summed, real = summed_rss(seen.pids), pss_sum(seen.pids)
        assert real >= REAL_MB * MiB and summed > 20 * real  # what RSS alone would say
        # Close to the real use (each page once, as the kernel's PSS tells), from the first
        # reading that has all the workers on.
        assert 0.7 * real <= seen.rss_bytes <= 1.5 * real, (seen.rss_bytes, real)
        assert seen.memory_method in ("pss", "cgroup")  # cgroup: the kernel brake's count
        # The guard reads the budgeted job on every tick; give it a few seconds of them.
        deadline = time.monotonic() + 4.0
        while time.monotonic() < deadline:
            now = get(eng, job.id)
            assert now.state == "running", now
            real = pss_sum(now.pids)
            assert 0.7 * real <= now.rss_bytes <= 1.5 * real, (now.rss_bytes, real)
            time.sleep(0.2)
        with eng.client() as c:
            events = c.events(job=job.id)
        assert not [e for e in events if e.kind in ("job_paused", "guard_pause")], events
    finally:
        stop(eng, job.id)


def test_a_budget_below_real_use_still_pauses_the_same_job(eng: EngineProcess) -> None:
    # The same job with a budget under its real use: the guard does act on it.
    job = start_job(eng, budget_mb=REAL_MB // 2, seconds=60)
    try:
        wait_for(lambda: get(eng, job.id).state == "paused", 60, "the budget pause")
    finally:
        stop(eng, job.id)


def test_the_meter_between_exact_readings_follows_new_allocations() -> None:
    # Cheap readings take off each member's shared part as the last exact reading measured it:
    # memory a member allocates afterwards counts in full.
    code = ("import os, sys, time\n"
            "b = bytearray(100 * 1024 * 1024)\n"
            "for i in range(0, len(b), 4096): b[i] = 1\n"
            "kids = []\n"
            "for _ in range(4):\n"
            "    pid = os.fork()\n"
            "    if pid == 0:\n"
            "        r = sys.stdin.buffer.read(1)\n"
            "        more = bytearray(50 * 1024 * 1024)\n"
            "        for i in range(0, len(more), 4096): more[i] = 1\n"
            "        print('grown', flush=True)\n"
            "        sys.stdin.buffer.read()\n"
            "        os._exit(0)\n"
            "    kids.append(pid)\n"
            "print(' '.join(map(str, kids)), flush=True)\n"
            "for k in kids: os.waitpid(k, 0)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        kids = [int(x) for x in proc.stdout.readline().split()]
        pids = [proc.pid, *kids]
        clock = [0.0]
        meter = TreeMeter(clock=lambda: clock[0])
        exact = meter.sample(pids)
        assert exact is not None and meter.method == "pss"
        assert 100 * MiB <= exact <= 160 * MiB, exact
        assert summed_rss(pids) > 400 * MiB
        cheap = meter.read(pids)
        assert cheap is not None and abs(cheap - exact) < 10 * MiB
        proc.stdin.write(b"g")  # one worker reads it and allocates 50 MB more
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == b"grown"
        grown = meter.read(pids)
        assert grown is not None and 40 * MiB <= grown - cheap <= 60 * MiB, (grown, cheap)
        clock[0] += 10.0
        again = meter.sample(pids)
        assert again is not None and abs(again - grown) < 10 * MiB
    finally:
        if proc.stdin is not None:
            proc.stdin.close()  # the workers end on it, then their parent
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def test_without_smaps_rollup_the_meter_is_the_summed_rss(tmp_path: Path) -> None:
    # An older kernel (or another system): no smaps_rollup, so each member counts at its RSS.
    page = os.sysconf("SC_PAGE_SIZE")
    for pid, pages in ((101, 1000), (102, 250)):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "statm").write_text(f"5000 {pages} 10 1 0 900 0\n")
    assert not pss_available(str(tmp_path))
    meter = TreeMeter(str(tmp_path))
    assert meter.sample([101, 102, 103]) == 1250 * page  # 103 is gone: left out
    assert meter.read([101, 102]) == 1250 * page
    assert meter.method == "rss"
    # A member whose smaps_rollup cannot be read counts at its RSS too.
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "smaps_rollup").write_text("")
    (tmp_path / "101" / "smaps_rollup").write_text(
        "00400000-7fff00000000 ---p 00000000 00:00 0  [rollup]\nRss:  4000 kB\nPss:  1000 kB\n")
    meter = TreeMeter(str(tmp_path))
    assert meter.exact_available
    assert meter.sample([101, 102]) == 1000 * page - (4000 - 1000) * 1024 + 250 * page
    assert meter.method == "pss"
    # No exact reading asked for (memory is short, or a cgroup counts the job): each member at
    # its RSS, smaps_rollup left unread; the next sample that may reads it.
    meter = TreeMeter(str(tmp_path))
    assert meter.sample([101, 102], exact=False) == 1250 * page and meter.method == "rss"
    assert meter.sample([101, 102]) == 1000 * page - (4000 - 1000) * 1024 + 250 * page
