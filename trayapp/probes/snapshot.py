"""Immutable readings of the machine, with the unit in every field name.

A value the hardware cannot give is ``None`` (``null`` in JSON), never a made-up number;
the UI shows it as "n/a".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional, Tuple


@dataclass(frozen=True)
class MemoryReading:
    """RAM, swap and pressure as the guard sees them (cgroup-aware)."""

    time: float
    total_bytes: int
    available_bytes: int
    used_bytes: int
    swap_total_bytes: int
    swap_used_bytes: int
    psi_some_avg10: Optional[float]
    psi_full_avg10: Optional[float]
    # "host" when the machine's own RAM bounds what is available, "cgroup" when a limit does.
    limit_source: str = "host"
    host_total_bytes: Optional[int] = None
    host_available_bytes: Optional[int] = None
    cgroup_limit_bytes: Optional[int] = None
    cgroup_used_bytes: Optional[int] = None
    cgroup_version: Optional[int] = None
    # Cumulative microseconds of full stall (PSI "full total"), for pressure-duration rules.
    psi_full_total_us: Optional[int] = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    name: str
    # None where the driver cannot tell (Windows WDDM, MIG): shown as "n/a", never 0.
    used_memory_bytes: Optional[int]
    kind: str = "compute"  # "compute" | "graphics"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class GpuReading:
    index: int
    name: str
    uuid: Optional[str]
    memory_total_bytes: Optional[int]
    memory_used_bytes: Optional[int]
    memory_free_bytes: Optional[int]
    memory_reserved_bytes: Optional[int] = None
    utilization_percent: Optional[float] = None
    temperature_c: Optional[float] = None
    power_watts: Optional[float] = None
    # True when this GPU drives a display (the desktop shares its memory).
    display_active: Optional[bool] = None
    processes: Tuple[GpuProcess, ...] = ()
    # CUDA compute capability, "8.6": decides whether float16 mixed precision pays off.
    compute_capability: Optional[str] = None
    simulated: bool = False

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["processes"] = [p.to_json() for p in self.processes]
        return d


@dataclass(frozen=True)
class GpuStatus:
    """What the GPU backend could find: which backend, the driver, and a line for the user."""

    backend: str  # "nvml" | "none" | "simulated"
    message: Optional[str] = None  # e.g. "no NVIDIA GPU found"
    driver_version: Optional[str] = None
    cuda_driver_version: Optional[str] = None  # the newest CUDA the driver supports, "12.4"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ProcessMemory:
    """One process tree's memory: the root pid, its RSS and the RSS of the whole tree."""

    pid: int
    name: str
    rss_bytes: int
    tree_rss_bytes: int
    tree_pids: Tuple[int, ...] = field(default_factory=tuple)
    vram_bytes: Optional[int] = None


@dataclass(frozen=True)
class Snapshot:
    time: float
    memory: MemoryReading
    gpus: Tuple[GpuReading, ...]
    gpu_status: GpuStatus

    def to_json(self) -> dict[str, Any]:
        return {
            "time": self.time,
            "memory": self.memory.to_json(),
            "gpus": [g.to_json() for g in self.gpus],
            "gpu_status": self.gpu_status.to_json(),
        }
