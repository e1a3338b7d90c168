"""Statuses for the UI's tests, made from a real engine's ``status()`` answer.

Once per test process a real engine starts in ``--demo`` mode (simulated GPUs) on a state
folder of its own, runs a real job, and answers ``status()``; every status here is that answer
with the values a test asserts pinned. A value is pinned only where the answer has its key, and a
job's fields only where the job record the engine sent has them: a field the engine renames or
drops fails here, not in a user's tray.
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional
from unittest import mock

from tests.conftest import REPO, EngineProcess, end_processes_of
from trayapp.config import get_paths
from trayapp.engine.status_record import Status
from trayapp.vocab import JobState

GiB = 1024**3
TICKER = str(REPO / "tests" / "scripts" / "jobs" / "ticker.py")

_recorded: Dict[str, Any] = {}


def recorded_status() -> Dict[str, Any]:
    """The engine's ``status()`` with one job running (hello said, its pids known): a deep
    copy of the answer recorded once per test process."""
    if not _recorded:
        _recorded.update(_record())
    return copy.deepcopy(_recorded)


def _record() -> Dict[str, Any]:
    home = Path(tempfile.mkdtemp(prefix="headroom-status-"))
    with mock.patch.dict(os.environ, {"HEADROOM_HOME": str(home)}):
        paths = get_paths()
    engine = EngineProcess(paths, demo=True).wait_ready()
    try:
        with engine.client() as c:
            job_id = c.job_start({"script": TICKER, "args": ["0", "0.2"],
                                  "name": "recorded"}).id
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                status = c.request("status")
                jobs = [j for j in status["jobs"] if j["id"] == job_id]
                if jobs and jobs[0]["state"] == JobState.RUNNING and jobs[0]["pids"] \
                        and jobs[0]["hello"]:
                    break
                time.sleep(0.05)
            else:
                raise AssertionError(f"the recorded job did not run:\n{engine.stderr}")
            c.job_action(job_id, "stop")
        return status
    finally:
        engine.stop()
        end_processes_of(home)
        shutil.rmtree(home, ignore_errors=True)


def pin(into: Dict[str, Any], values: Mapping[str, Any], where: str = "status") -> None:
    """Set ``values`` in ``into`` (nested dicts key by key); a key the engine's answer does not
    have raises KeyError naming it."""
    for key, value in values.items():
        if key not in into:
            raise KeyError(f"the engine's {where} has no field {key!r}")
        if isinstance(value, Mapping) and isinstance(into[key], dict):
            pin(into[key], value, f"{where}.{key}")
        else:
            into[key] = copy.deepcopy(value)


def _process(real: Mapping[str, Any], pid: int, name: str, used: int,
             kind: str) -> Dict[str, Any]:
    proc = copy.deepcopy(dict(real))
    pin(proc, {"pid": pid, "name": name, "used_memory_bytes": used, "kind": kind},
        "GPU process")
    return proc


def demo_status() -> Dict[str, Any]:
    """The recorded answer with one GPU (two processes on it: the desktop's and job j1's)
    and round values, no jobs, the guard at ease."""
    st = recorded_status()
    pin(st, {
        "time": 1796054922.9,
        "memory": {"total_bytes": 16 * GiB, "available_bytes": 12 * GiB,
                   "used_bytes": 4 * GiB, "swap_total_bytes": 2 * GiB, "swap_used_bytes": 0,
                   "psi_some_avg10": 0.0, "psi_full_avg10": 0.0, "limit_source": "host"},
        "gpu_status": {"backend": "simulated", "message": "simulated GPUs (demo)",
                       "driver_version": None, "cuda_driver_version": None},
        "guard": {"state": "ok", "mode": "act", "reasons": [], "seconds_to_exhaustion": None},
        "engine": {"running": True, "pid": 1234, "version": "0.1.0", "demo": True},
    })
    gpu = st["gpus"][0]
    real_proc = gpu["processes"][0]
    pin(gpu, {"index": 0, "name": "Simulated RTX 4070 (demo)", "uuid": "GPU-0",
              "memory_total_bytes": 12 * GiB, "memory_used_bytes": 6 * GiB,
              "memory_free_bytes": 6 * GiB, "utilization_percent": 91.3, "temperature_c": 75.0,
              "power_watts": 184.5, "display_active": True, "simulated": True,
              "processes": [_process(real_proc, 900001, "Xorg", 1 * GiB, "graphics"),
                            _process(real_proc, 4242, "python3", 4 * GiB, "compute")]},
        "GPU reading")
    st["gpus"] = [gpu]
    st["jobs"] = []
    return st


def job(job_id: str = "j1", name: str = "mnist", state: str = "running",
        **fields: Any) -> Dict[str, Any]:
    """The recorded job as the engine lists it, with these values (and progress, loss, ETA,
    memory and pid 4242, which runs on the GPU of ``demo_status``)."""
    d = copy.deepcopy(recorded_status()["jobs"][0])
    pin(d, {"id": job_id, "name": name, "state": state, "pid": 4242, "pids": [4242],
            "epoch": 2, "epochs": 10, "step": 120, "steps": 500, "eta_seconds": 754.0,
            "rss_bytes": 3 * GiB, "vram_bytes": 4 * GiB, "started": 1796054000.0,
            "exit_code": None}, "job record")
    # Free-form maps are set whole (the recorded job reports no metrics yet).
    pin(d, {"metrics": None}, "job record")
    d["metrics"] = fields.pop("metrics", {"loss": 0.4321})
    pin(d, fields, "job record")
    return d


def make_status(*args: Any, **kwargs: Any) -> Status:
    """``status_json(...)`` read as the tray reads a push (``Status.from_json``)."""
    return Status.from_json(status_json(*args, **kwargs))


def status_json(state: str = "ok", *, available: Optional[float] = None,
                vram_used: Optional[float] = None, jobs: Optional[List[Dict[str, Any]]] = None,
                gpus: bool = True, reasons: Optional[List[str]] = None,
                tte: Optional[float] = None, mode: str = "act",
                t: Optional[float] = None,
                consumers: Optional[List[Dict[str, Any]]] = None) -> Dict[str, Any]:
    """A recorded status with the parts a test cares about changed."""
    st = demo_status()
    pin(st, {"guard": {"state": state, "mode": mode, "reasons": list(reasons or []),
                       "seconds_to_exhaustion": tte}})
    if available is not None:
        pin(st, {"memory": {"available_bytes": int(available),
                            "used_bytes": int(st["memory"]["total_bytes"] - available)}})
    if vram_used is not None:
        pin(st["gpus"][0], {"memory_used_bytes": int(vram_used)}, "GPU reading")
    if not gpus:
        st["gpus"] = []
        pin(st, {"gpu_status": {"backend": "none", "message": "no NVIDIA GPU found"},
                 "engine": {"demo": False}})
    if jobs is not None:
        st["jobs"] = jobs
    if t is not None:
        st["time"] = t
    if consumers is not None:
        pin(st, {"consumers": consumers})
    return st
