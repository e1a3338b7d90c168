"""Immutable readings of the machine, with the unit in every field name.

A value the hardware cannot give is ``None`` (``null`` in JSON), never a made-up number;
the UI shows it as "n/a". Stdlib only: the probes make these, the engine sends them as JSON,
and the UI and the CLI read them back (``from_json``) without importing any probe.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, TypeVar

from trayapp.jsonvalue import JSONObject

T = TypeVar("T")


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

    def to_json(self) -> JSONObject:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any, time: float = 0.0) -> Optional[MemoryReading]:
        """A reading from its JSON (a status object's ``memory``, which has no ``time``: it
        is the status's); None when the sizes are not there to read."""
        if not isinstance(data, Mapping):
            return None
        values = typed_fields(cls, data, _MEMORY_TYPES)
        if not all(k in values for k in ("total_bytes", "available_bytes")):
            return None
        base: JSONObject = {
            "time": time,
            "used_bytes": max(0, values["total_bytes"] - values["available_bytes"]),
            "swap_total_bytes": 0,
            "swap_used_bytes": 0,
            "psi_some_avg10": None,
            "psi_full_avg10": None,
        }
        return cls(**{**base, **values, "time": values.get("time", time)})


@dataclass(frozen=True)
class Consumer:
    """The processes of one name outside the guard's jobs, summed (``probes.consumers``)."""

    name: str
    rss_bytes: int
    processes: int

    def to_json(self) -> JSONObject:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> Consumer:
        """A consumer from its JSON; raises ValueError without a name and a size."""
        values = typed_fields(cls, data, _CONSUMER_TYPES)
        if "name" not in values or "rss_bytes" not in values:
            raise ValueError("a consumer needs a name and a size")
        return cls(**{"processes": 0, **values})


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    name: str
    # None where the driver cannot tell (Windows WDDM, MIG): shown as "n/a", never 0.
    used_memory_bytes: Optional[int]
    kind: str = "compute"  # "compute" | "graphics"

    def to_json(self) -> JSONObject:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> GpuProcess:
        """A process from its JSON (``to_json``'s); raises ValueError without a pid."""
        values = typed_fields(cls, data, _PROCESS_TYPES)
        if "pid" not in values:
            raise ValueError("a GPU process needs a pid")
        return cls(**{"name": "", "used_memory_bytes": None, **values})


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

    def to_json(self) -> JSONObject:
        d = asdict(self)
        d["processes"] = [p.to_json() for p in self.processes]
        return d

    @classmethod
    def from_json(cls, data: Any) -> GpuReading:
        """A reading from its JSON (``to_json``'s, a status object's ``gpus``): a field that is
        missing or of the wrong type is not known (None, or its default), an unknown key is
        left out, a process that cannot be read is left out. Raises ValueError without an
        index."""
        values = typed_fields(cls, data, _GPU_TYPES)
        if "index" not in values:
            raise ValueError("a GPU reading needs an index")
        procs = []
        raw = data.get("processes")
        for p in raw if isinstance(raw, (list, tuple)) else ():
            try:
                procs.append(GpuProcess.from_json(p))
            except ValueError:
                continue
        values["processes"] = tuple(procs)
        base: JSONObject = {
            "name": "",
            "uuid": None,
            "memory_total_bytes": None,
            "memory_used_bytes": None,
            "memory_free_bytes": None,
        }
        return cls(**{**base, **values})


@dataclass(frozen=True)
class GpuStatus:
    """What the GPU backend could find: which backend, the driver, and a line for the user."""

    backend: str  # "nvml" | "none" | "simulated"
    message: Optional[str] = None  # e.g. "no NVIDIA GPU found"
    driver_version: Optional[str] = None
    cuda_driver_version: Optional[str] = None  # the newest CUDA the driver supports, "12.4"

    def to_json(self) -> JSONObject:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> GpuStatus:
        """The status from its JSON; anything unreadable reads as backend "none"."""
        values = typed_fields(cls, data, _STATUS_TYPES) if isinstance(data, Mapping) else {}
        return cls(**{"backend": "none", **values})


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

    def to_json(self) -> JSONObject:
        return {
            "time": self.time,
            "memory": self.memory.to_json(),
            "gpus": [g.to_json() for g in self.gpus],
            "gpu_status": self.gpu_status.to_json(),
        }


def gpu_readings(items: Any) -> Tuple[GpuReading, ...]:
    """The readable GPU readings among ``items`` (a status object's ``gpus``); the others are
    left out."""
    return readable(GpuReading.from_json, items)


def readable(parse: Callable[[Any], T], items: Any) -> Tuple[T, ...]:
    """``parse`` of each of ``items`` (a JSON list) that it can read (ValueError: left out)."""
    out = []
    for item in items if isinstance(items, (list, tuple)) else ():
        try:
            out.append(parse(item))
        except ValueError:
            continue
    return tuple(out)


# -- reading JSON back ----------------------------------------------------------------------------

NUMBER = (int, float)  # a JSON number (a bool is none: ``typed_fields``)
_MEMORY_TYPES: Mapping[str, Tuple[type, ...]] = {
    "time": NUMBER,
    "total_bytes": (int,),
    "available_bytes": (int,),
    "used_bytes": (int,),
    "swap_total_bytes": (int,),
    "swap_used_bytes": (int,),
    "psi_some_avg10": NUMBER,
    "psi_full_avg10": NUMBER,
    "limit_source": (str,),
    "host_total_bytes": (int,),
    "host_available_bytes": (int,),
    "cgroup_limit_bytes": (int,),
    "cgroup_used_bytes": (int,),
    "cgroup_version": (int,),
    "psi_full_total_us": (int,),
}
_CONSUMER_TYPES: Mapping[str, Tuple[type, ...]] = {
    "name": (str,),
    "rss_bytes": (int,),
    "processes": (int,),
}
_PROCESS_TYPES: Mapping[str, Tuple[type, ...]] = {
    "pid": (int,),
    "name": (str,),
    "used_memory_bytes": (int,),
    "kind": (str,),
}
_GPU_TYPES: Mapping[str, Tuple[type, ...]] = {
    "index": (int,),
    "name": (str,),
    "uuid": (str,),
    "memory_total_bytes": (int,),
    "memory_used_bytes": (int,),
    "memory_free_bytes": (int,),
    "memory_reserved_bytes": (int,),
    "utilization_percent": NUMBER,
    "temperature_c": NUMBER,
    "power_watts": NUMBER,
    "display_active": (bool,),
    "compute_capability": (str,),
    "simulated": (bool,),
}
_STATUS_TYPES: Mapping[str, Tuple[type, ...]] = {
    "backend": (str,),
    "message": (str,),
    "driver_version": (str,),
    "cuda_driver_version": (str,),
}


def typed_fields(cls: Any, data: Any, types: Mapping[str, Tuple[type, ...]]) -> Dict[str, Any]:
    """The fields of ``cls`` that ``data`` holds with their type (a bool is no number, a
    number is finite); the others are left out."""
    if not isinstance(data, Mapping):
        raise ValueError(f"a {cls.__name__} is an object")
    out: Dict[str, Any] = {}
    for f in fields(cls):
        value = data.get(f.name)
        kinds = types.get(f.name)
        if value is None or kinds is None:
            continue
        if isinstance(value, bool) and bool not in kinds:
            continue
        if not isinstance(value, kinds):
            continue
        if isinstance(value, float) and not math.isfinite(value):
            continue
        out[f.name] = value
    return out


def _check_types() -> None:  # pragma: no cover - caught by any import
    for cls, types in (
        (MemoryReading, _MEMORY_TYPES),
        (Consumer, _CONSUMER_TYPES),
        (GpuProcess, _PROCESS_TYPES),
        (GpuReading, _GPU_TYPES),
        (GpuStatus, _STATUS_TYPES),
    ):
        read_apart = {"processes"} if cls is GpuReading else set()  # read one by one
        if set(types) != {f.name for f in fields(cls)} - read_apart:
            raise ImportError(f"every field of {cls.__name__} needs a type to read it by")


_check_types()
