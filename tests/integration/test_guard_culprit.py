"""Who a real engine's memory warning names: a job whose memory is all in a child of its root,
filling memory steadily, beside a larger process that does not grow. The warning names the job
(its whole tree, as one) first, with its rate; the large process is no culprit. The hog has its
own bound and a RAM budget, the large process a fixed size under RLIMIT_AS; both end in a
`finally`."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import psutil
import pytest

from tests.conftest import EngineProcess
from tests.integration.test_guard_e2e import SCRIPTS, mib, wait_for, write_guard_config
from trayapp.config import Paths
from trayapp.engine.client import EngineClient
from trayapp.probes.memory import make_memory_probe
from trayapp.probes.processes import ProcessSampler

MiB = 1 << 20
HOG_IN_CHILD = str(SCRIPTS / "hog_in_child.py")
LARGE_MIB = 400

pytestmark = pytest.mark.slow

# A process named "still_big" that holds LARGE_MIB, touched, and never grows; address space
# bounded a little above it.
STILL = textwrap.dedent(
    f"""
    import ctypes, resource, sys, time
    resource.setrlimit(resource.RLIMIT_AS, ({LARGE_MIB + 400} << 20, {LARGE_MIB + 400} << 20))
    ctypes.CDLL(None).prctl(15, b"still_big", 0, 0, 0)
    block = bytearray({LARGE_MIB} << 20)
    block[::4096] = b"\\x01" * (len(block) // 4096)
    print("ready", flush=True)
    sys.stdin.read()
    """
)


def warn_everything(home: Path) -> None:
    """Warn at once (the warning line just below all memory); never pause, park or stop."""
    total = make_memory_probe().read().total_bytes
    write_guard_config(home, warn_available=mib(total - 16 * MiB), pause_available="96 MiB",
                       park_available="64 MiB", stop_available="32 MiB",
                       resume_available="160 MiB", warn_horizon_seconds=0,
                       pause_horizon_seconds=0)


def culprit_line(client: EngineClient) -> Optional[str]:
    for reason in client.status().guard_json.get("reasons") or []:
        if reason.startswith(("filling:", "largest:")):
            return str(reason)
    return None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl names the process")
def test_the_warning_names_the_job_filling_memory_not_the_largest_process(
        start_engine: Callable[..., EngineProcess], paths: Paths, tmp_path: Path) -> None:
    warn_everything(paths.home)
    engine = start_engine()
    still = subprocess.Popen([sys.executable, "-c", STILL], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    client = engine.client()
    job: Dict[str, Any] = {}
    pids: List[int] = []
    try:
        assert still.stdout is not None and still.stdout.readline().strip() == "ready"
        # 8 MiB chunks at 40 MiB/s up to 480 MiB (12 s), in a child of the job's root; its
        # budget (1 GiB) bounds it too.
        job = client.job_start({"script": HOG_IN_CHILD,
                                "args": ["8", "40", "480", str(tmp_path / "progress")],
                                "ram_budget_mb": 1024})
        label = f"job {job.id} (hog_in_child)"

        def named() -> Optional[str]:
            line = culprit_line(client)
            return line if line and line.startswith(f"filling: {label} ") else None

        line = wait_for("the warning to name the job as filling memory", named, 30, 0.25)
        filling = line.split("; largest: ")[0]
        rate = re.match(rf"filling: {re.escape(label)} [\d.]+ [KMG]iB \(\+([\d.]+) MiB/s\)",
                        filling)
        assert rate is not None, line
        assert 15.0 <= float(rate.group(1)) <= 80.0, line  # the hog's 40 MiB/s, as measured
        assert "still_big" not in filling and "headroom engine" not in filling, line

        # The job's tree is the job's: its child is not a process of its own in the warning.
        pids = list(client.job_get(job.id).pids or [])
        assert len(pids) >= 2, pids
        sampled = {p["pid"]: p for p in client.status().guard_json["top_processes"]}
        for pid in pids[1:]:
            if pid in sampled:
                assert sampled[pid]["job_id"] == job.id
        if still.pid in sampled:
            assert sampled[still.pid]["name"] == "still_big"
    finally:
        if job:
            with contextlib.suppress(Exception):
                pids = pids or list(client.job_get(job.id).pids or [])
                client.job_action(job.id, "kill", reason="test over")
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
        client.close()
        still.kill()
        still.wait(10)
        for pipe in (still.stdin, still.stdout):
            if pipe is not None:
                pipe.close()


def test_the_sampler_measures_growth_over_the_window_for_a_process_new_to_the_top() -> None:
    """A process small at the first sample and growing fast is among those the next sample
    keeps (the three growing fastest), with its growth from the first sample."""
    grower = subprocess.Popen([sys.executable, "-c", textwrap.dedent(
        """
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
        blocks = []
        print("ready", flush=True)
        for line in sys.stdin:
            blocks.append(b"\\x01" * (int(line) << 20))
            print("grown", flush=True)
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert grower.stdout is not None and grower.stdin is not None
        assert grower.stdout.readline().strip() == "ready"
        now = [time.time()]
        sampler = ProcessSampler(clock=lambda: now[0])
        assert grower.pid not in {r.pid for r in sampler.sample(1)}  # small: not the largest
        grower.stdin.write("256\n")
        grower.stdin.flush()
        assert grower.stdout.readline().strip() == "grown"
        now[0] += 1.0
        rows = {r.pid: r for r in sampler.sample(3)}
        assert grower.pid in rows
        assert rows[grower.pid].rate_bytes_per_s is not None
        assert rows[grower.pid].rate_bytes_per_s >= 250 * MiB
    finally:
        grower.kill()
        grower.wait(10)
        for pipe in (grower.stdin, grower.stdout):
            if pipe is not None:
                pipe.close()
