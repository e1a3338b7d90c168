"""The VRAM guard on a real NVIDIA GPU: a job that takes GPU memory step by step (PyTorch or
CuPy, whichever an interpreter here has) under `headroom run --vram-budget` is paused by the
guard near its budget. Skipped without an NVML GPU or without either library."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, List, Optional, Tuple

import psutil
import pytest

from tests.conftest import REPO, EngineProcess, headroom_cmd

MiB = 1 << 20
HOG = str(REPO / "tests" / "scripts" / "guard" / "vram_hog.py")
BUDGET_MB = 2048  # room for the CUDA context and a few steps
STEP_MB = 128
EVERY = 0.25  # 512 MiB/s

pytestmark = pytest.mark.gpu


def _gpus() -> Tuple[int, Optional[int]]:
    """(how many NVML GPUs, GPU 0's free memory in bytes)."""
    from trayapp.probes.gpu import make_backend

    backend = make_backend()
    try:
        gpus = backend.read()
        if backend.status.backend != "nvml" or not gpus:
            return 0, None
        return len(gpus), gpus[0].memory_free_bytes
    finally:
        backend.close()


def _python_with_cuda() -> Optional[Tuple[str, str]]:
    """(interpreter, "torch" | "cupy") for the first interpreter that can take GPU memory."""
    checks = (("torch", "import torch; assert torch.cuda.is_available()"),
              ("cupy", "import cupy; assert cupy.cuda.runtime.getDeviceCount() > 0"))
    seen = set()
    for python in (sys.executable, shutil.which("python3"), shutil.which("python")):
        if not python or python in seen:
            continue
        seen.add(python)
        for backend, code in checks:
            try:
                r = subprocess.run([python, "-c", code], capture_output=True, timeout=120)
            except (OSError, subprocess.TimeoutExpired):
                continue
            if r.returncode == 0:
                return python, backend
    return None


COUNT, FREE = _gpus()


@pytest.mark.skipif(COUNT == 0, reason="no NVIDIA GPU reachable through NVML")
def test_a_job_over_its_vram_budget_is_paused(start_engine: Callable[..., EngineProcess],
                                               tmp_path: Path) -> None:
    found = _python_with_cuda()
    if found is None:
        pytest.skip("no interpreter here has PyTorch or CuPy with CUDA")
    python, backend = found
    if FREE is not None and FREE < 8 * BUDGET_MB * MiB:
        pytest.skip("GPU 0 has too little free memory for this test")
    engine = start_engine()
    progress = tmp_path / "progress"
    out = open(tmp_path / "run.out", "wb")
    run = subprocess.Popen(
        headroom_cmd("run", "--python", python, "--gpu", "0", "--vram-budget", str(BUDGET_MB),
                     HOG, backend, str(STEP_MB), str(EVERY), str(6 * BUDGET_MB),
                     str(progress)),
        env=dict(os.environ, HEADROOM_HOME=str(engine.paths.home)), cwd=str(REPO),
        stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    client = engine.client()
    job_id: Optional[str] = None
    pids: List[int] = []
    try:
        deadline = time.monotonic() + 180
        job = None
        while time.monotonic() < deadline:
            jobs = client.jobs(all=True)
            if jobs:
                job = client.job_get(jobs[0].id)
                job_id = job.id
                pids = list(job.pids or pids)
                if job.state not in ("starting", "running", "pausing"):
                    break
            time.sleep(0.1)
        assert job is not None, (tmp_path / "run.out").read_text()
        assert job.state == "paused" and job.paused_by == "guard", \
            (job, (tmp_path / "run.out").read_text())
        events = [e for e in client.events(limit=200)
                  if e.kind == "guard_pause" and e.job_id == job_id]
        assert events and events[-1].data["cause"] == "budget_vram"
        vram = events[-1].data["vram_bytes"]
        assert BUDGET_MB * MiB <= vram <= (BUDGET_MB + 768) * MiB  # near its budget
        taken = float(progress.read_text().splitlines()[-1].split()[0])
        time.sleep(2 * EVERY + 0.5)
        assert float(progress.read_text().splitlines()[-1].split()[0]) == taken  # it stopped
        assert taken < 6 * BUDGET_MB  # the guard, not the hog's own bound, stopped it
    finally:
        if job_id is not None:
            with contextlib.suppress(Exception):
                client.job_action(job_id, "kill", reason="test over")
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(pid)
                p.resume()
                p.kill()
        if run.poll() is None:
            run.send_signal(signal.SIGINT)
            try:
                run.wait(15)
            except subprocess.TimeoutExpired:
                run.kill()
                run.wait(5)
        out.close()
        client.close()
