"""Recorded status dicts, shaped like the engine's ``status()`` answer."""

from __future__ import annotations

import copy
from typing import Any, Dict, List, Optional

GiB = 1024**3

# A status dict as `Engine.status()` answered it in --demo mode (trimmed, values rounded).
DEMO_STATUS: Dict[str, Any] = {
    "time": 1796054922.9,
    "memory": {"total_bytes": 16 * GiB, "available_bytes": 12 * GiB, "used_bytes": 4 * GiB,
               "swap_total_bytes": 2 * GiB, "swap_used_bytes": 0, "psi_some_avg10": 0.0,
               "psi_full_avg10": 0.0, "limit_source": "host"},
    "gpus": [
        {"index": 0, "name": "Simulated RTX 4070 (demo)", "uuid": "GPU-0",
         "memory_total_bytes": 12 * GiB, "memory_used_bytes": 6 * GiB,
         "memory_free_bytes": 6 * GiB, "utilization_percent": 91.3, "temperature_c": 75.0,
         "power_watts": 184.5, "display_active": True,
         "processes": [{"pid": 900001, "name": "Xorg", "used_memory_bytes": 1 * GiB,
                        "kind": "graphics"},
                       {"pid": 4242, "name": "python3", "used_memory_bytes": 4 * GiB,
                        "kind": "compute"}],
         "simulated": True},
    ],
    "gpu_status": {"backend": "simulated", "message": "simulated GPUs (demo)",
                   "driver_version": None, "cuda_driver_version": None},
    "guard": {"state": "ok", "mode": "act", "reasons": [], "seconds_to_exhaustion": None},
    "jobs": [],
    "engine": {"running": True, "pid": 1234, "version": "0.1.0", "demo": True},
}


def job(job_id: str = "j1", name: str = "mnist", state: str = "running",
        **fields: Any) -> Dict[str, Any]:
    """A job dict as the engine lists it."""
    d: Dict[str, Any] = {"id": job_id, "name": name, "state": state, "pid": 4242,
                         "pids": [4242], "epoch": 2, "epochs": 10, "step": 120, "steps": 500,
                         "metrics": {"loss": 0.4321}, "eta_seconds": 754.0,
                         "rss_bytes": 3 * GiB, "vram_bytes": 4 * GiB, "started": 1796054000.0,
                         "exit_code": None}
    d.update(fields)
    return d


def make_status(state: str = "ok", *, available: Optional[float] = None,
                vram_used: Optional[float] = None, jobs: Optional[List[Dict[str, Any]]] = None,
                gpus: bool = True, reasons: Optional[List[str]] = None,
                tte: Optional[float] = None, mode: str = "act",
                t: Optional[float] = None) -> Dict[str, Any]:
    """A recorded status with the parts a test cares about changed."""
    st = copy.deepcopy(DEMO_STATUS)
    st["guard"] = {"state": state, "mode": mode, "reasons": list(reasons or []),
                   "seconds_to_exhaustion": tte}
    if available is not None:
        st["memory"]["available_bytes"] = int(available)
        st["memory"]["used_bytes"] = int(st["memory"]["total_bytes"] - available)
    if vram_used is not None:
        st["gpus"][0]["memory_used_bytes"] = int(vram_used)
    if not gpus:
        st["gpus"] = []
        st["gpu_status"] = {"backend": "none", "message": "no NVIDIA GPU found"}
        st["engine"]["demo"] = False
    if jobs is not None:
        st["jobs"] = jobs
    if t is not None:
        st["time"] = t
    return st
