"""GPU backends: NVML, none, and simulated GPUs for the demo.

``make_backend()`` picks one, so callers never check for None: every backend has ``status``
(a GpuStatus), ``read()`` (a tuple of GpuReading, empty without GPUs) and ``close()``.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from trayapp.probes import processes
from trayapp.probes.nvml import NVML_ERROR_FUNCTION_NOT_FOUND, NVML_VALUE_NOT_AVAILABLE, Nvml
from trayapp.readings import GpuProcess, GpuReading, GpuStatus

MiB = 1024**2
GiB = 1024**3

_COMPUTE = (
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses",
)
_GRAPHICS = (
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses_v2",
    "nvmlDeviceGetGraphicsRunningProcesses",
)
_TEMPERATURE = ("nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature")
_CUDA_VERSION = ("nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion")


def _text(value: Any) -> Optional[str]:
    """NVML strings arrive as str from nvidia-ml-py and as bytes from older bindings."""
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def cuda_version_text(value: Optional[int]) -> Optional[str]:
    """NVML's CUDA driver version (``12040``) as ``"12.4"``; None stays None."""
    if value is None or value <= 0:
        return None
    return f"{value // 1000}.{(value % 1000) // 10}"


def _process_memory(value: Any) -> Optional[int]:
    """Per-process memory, None where NVML cannot tell (WDDM, MIG), never 0 for unknown."""
    if value is None:
        return None
    value = int(value)
    if value >= NVML_VALUE_NOT_AVAILABLE or value < 0:
        return None
    return value


def _basename(path: str) -> str:
    return re.split(r"[\\/]", path)[-1] if path else path


@dataclass
class _Device:
    index: int
    handle: Any
    name: str
    uuid: Optional[str]


class NvmlBackend:
    """GPUs read through NVML. ``nvml_module`` replaces ``pynvml`` (tests pass a fake);
    ``name_of`` names a pid (psutil; NVML's own name is the fallback).

    ``open()`` initialises NVML and lists the GPUs; ``read()`` calls it when needed. A GPU
    that stops answering keeps its place, with its last known name and "not available"
    values, and is looked up again on every read; one that leaves NVML's device list
    disappears from the readings.
    """

    def __init__(
        self,
        nvml_module: Optional[ModuleType] = None,
        name_of: Callable[[int], str] = processes.process_name,
    ) -> None:
        self.nvml = Nvml(nvml_module)
        self._name_of = name_of
        self._devices: List[_Device] = []
        self._known_names: Dict[int, str] = {}
        self._enumerated = False
        self._incomplete = False
        self._driver: Optional[str] = None
        self._cuda: Optional[str] = None
        self._process_names: Dict[int, str] = {}
        self._memory_v2: Optional[bool] = None

    def open(self) -> Optional[str]:
        """Start NVML and list the GPUs. Returns None when at least one GPU answers, else a
        line saying why not (no driver, no GPU)."""
        if not self.nvml.init():
            return self.nvml.init_error or "no NVIDIA GPU found"
        self._enumerate()
        if not any(d.handle is not None for d in self._devices):
            return "no NVIDIA GPU found"
        return None

    def _enumerate(self) -> None:
        nv = self.nvml
        nv.lost = False
        self._enumerated = True
        self._driver = _text(nv.call("nvmlSystemGetDriverVersion"))
        self._cuda = cuda_version_text(nv.first(_CUDA_VERSION))
        count = nv.call("nvmlDeviceGetCount") or 0
        old = {d.index: d for d in self._devices}
        devices = []
        for i in range(int(count)):
            handle = nv.call("nvmlDeviceGetHandleByIndex", i)
            if handle is None:
                # Listed but not answering (fallen off the bus, no permission): keep its place
                # with what was known, and look again on the next read.
                known = old.get(i)
                devices.append(
                    _Device(
                        i, None, self._known_names.get(i, f"GPU {i}"), known.uuid if known else None
                    )
                )
                continue
            name = _text(nv.call("nvmlDeviceGetName", handle)) or self._known_names.get(i)
            self._known_names[i] = name or f"GPU {i}"
            uuid = _text(nv.call("nvmlDeviceGetUUID", handle))
            devices.append(_Device(i, handle, self._known_names[i], uuid))
        self._devices = devices
        self._incomplete = any(d.handle is None for d in devices)
        # Enumeration calls may fail on a GPU that is gone; that is what enumeration is for.
        nv.lost = False

    @property
    def status(self) -> GpuStatus:
        """The backend, the driver and the newest CUDA it supports, and a line for the user."""
        if not self._enumerated:
            problem = self.open()
            if problem is not None:
                return GpuStatus("nvml", message=problem)
        n = len(self._devices)
        return GpuStatus(
            "nvml",
            message=f"{n} NVIDIA GPU{'' if n == 1 else 's'}" if n else "no NVIDIA GPU found",
            driver_version=self._driver,
            cuda_driver_version=self._cuda,
        )

    def read(self) -> Tuple[GpuReading, ...]:
        """One reading per GPU. Never raises for driver errors: what cannot be read is None."""
        if not self._enumerated or self.nvml.lost or self._incomplete:
            if not self.nvml.init():
                return ()
            self._enumerate()
        seen: Dict[int, str] = {}
        readings = tuple(self._read_device(d, seen) for d in self._devices)
        self._process_names = seen
        return readings

    def _memory(self, handle: Any) -> Any:
        nv = self.nvml
        version = nv.constant("nvmlMemory_v2", None)
        if version is not None and self._memory_v2 is not False:
            mem = nv.call("nvmlDeviceGetMemoryInfo", handle, version=version)
            if mem is not None:
                self._memory_v2 = True
                return mem
            if nv.last_error != NVML_ERROR_FUNCTION_NOT_FOUND:
                return None
            self._memory_v2 = False  # a driver before the v2 struct: v1 from now on
        return nv.call("nvmlDeviceGetMemoryInfo", handle)

    def _read_device(self, dev: _Device, seen: Dict[int, str]) -> GpuReading:
        nv = self.nvml
        h = dev.handle
        if h is None:
            return GpuReading(dev.index, dev.name, dev.uuid, None, None, None)
        total = used = free = reserved = None
        mem = self._memory(h)
        if mem is not None:
            total, free, used = int(mem.total), int(mem.free), int(mem.used)
            if getattr(mem, "reserved", None) is not None:
                reserved = int(mem.reserved)
        util = nv.call("nvmlDeviceGetUtilizationRates", h)
        sensor = nv.constant("NVML_TEMPERATURE_GPU", 0)
        temperature = nv.first(_TEMPERATURE, h, sensor)
        power_mw = nv.call("nvmlDeviceGetPowerUsage", h)
        display = nv.call("nvmlDeviceGetDisplayActive", h)
        cc = nv.call("nvmlDeviceGetCudaComputeCapability", h)
        return GpuReading(
            index=dev.index,
            name=dev.name,
            uuid=dev.uuid,
            memory_total_bytes=total,
            memory_used_bytes=used,
            memory_free_bytes=free,
            memory_reserved_bytes=reserved,
            utilization_percent=float(util.gpu) if util is not None else None,
            temperature_c=float(temperature) if temperature is not None else None,
            power_watts=power_mw / 1000.0 if power_mw is not None else None,
            display_active=bool(display) if display is not None else None,
            processes=self._processes(h, seen),
            compute_capability=f"{cc[0]}.{cc[1]}" if cc is not None else None,
        )

    def _processes(self, handle: Any, seen: Dict[int, str]) -> Tuple[GpuProcess, ...]:
        found: Dict[int, Tuple[str, Optional[int]]] = {}
        for kind, names in (("compute", _COMPUTE), ("graphics", _GRAPHICS)):
            for info in self.nvml.first(names, handle) or ():
                pid = int(info.pid)
                memory = _process_memory(getattr(info, "usedGpuMemory", None))
                if pid in found:
                    # A process that both computes and draws is listed twice: keep one entry.
                    if found[pid][1] is None and memory is not None:
                        found[pid] = (found[pid][0], memory)
                    continue
                found[pid] = (kind, memory)
        return tuple(
            GpuProcess(pid, self._process_name(pid, seen), memory, kind=kind)
            for pid, (kind, memory) in found.items()
        )

    def _process_name(self, pid: int, seen: Dict[int, str]) -> str:
        name = seen.get(pid) or self._process_names.get(pid)
        if not name:
            name = self._name_of(pid)
            if not name:
                name = _basename(_text(self.nvml.call("nvmlSystemGetProcessName", pid)) or "")
        seen[pid] = name
        return name

    def close(self) -> None:
        """End the NVML session; a later read() starts a new one."""
        self.nvml.shutdown()
        self.nvml = Nvml(self.nvml.module)
        self._enumerated = False
        self._devices = []


class NoGpuBackend:
    """No NVIDIA GPU (or no driver): an empty reading and a line saying why."""

    def __init__(self, message: str = "no NVIDIA GPU found") -> None:
        self.status = GpuStatus("none", message=message)

    def read(self) -> Tuple[GpuReading, ...]:
        """Always the empty tuple."""
        return ()

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class _SimModel:
    name: str
    total_bytes: int
    reserved_bytes: int
    peak_share: float  # of the total, reached at the end of a training run
    period_s: float  # one training run plus the pause before the next
    offset_s: float
    idle_watts: float
    max_watts: float
    compute_capability: str


_SIM_MODELS = (
    _SimModel(
        "Simulated RTX 4070 (demo)", 12282 * MiB, 262 * MiB, 0.74, 330.0, 0.0, 21.0, 200.0, "8.9"
    ),
    _SimModel(
        "Simulated RTX A4000 (demo)", 16376 * MiB, 302 * MiB, 0.58, 420.0, 140.0, 9.0, 140.0, "8.6"
    ),
    _SimModel(
        "Simulated RTX 3060 (demo)", 12288 * MiB, 256 * MiB, 0.66, 380.0, 60.0, 12.0, 170.0, "8.6"
    ),
)
_SIM_GAP_S = 30.0  # between a job's end and its restart
_SIM_DESKTOP = (("Xorg", 1, 412 * MiB), ("gnome-shell", 2, 188 * MiB))


class SimulatedBackend:
    """Simulated GPUs for ``--demo``: deterministic in the clock, labelled as simulated.

    Each GPU runs a training process whose memory grows over a few minutes, ends, and starts
    again 30 s later with a new pid; GPU 0 also drives the display, with a steady desktop
    (Xorg and gnome-shell, about 600 MB). Utilisation, temperature and power follow the job.
    Simulated pids start at ``pid_base``.
    """

    def __init__(
        self, gpu_count: int = 2, clock: Callable[[], float] = time.time, pid_base: int = 900_000
    ) -> None:
        self.gpu_count = max(0, int(gpu_count))
        self.clock = clock
        self.pid_base = int(pid_base)
        self.status = GpuStatus("simulated", message="simulated GPUs (demo)")

    def read(self) -> Tuple[GpuReading, ...]:
        """One simulated reading per GPU at the clock's current time."""
        now = self.clock()
        return tuple(self._gpu(i, now) for i in range(self.gpu_count))

    def _gpu(self, index: int, now: float) -> GpuReading:
        model = _SIM_MODELS[index % len(_SIM_MODELS)]
        shifted = now + model.offset_s
        cycle = int(shifted // model.period_s)
        t = shifted - cycle * model.period_s
        run_s = model.period_s - _SIM_GAP_S
        procs: List[GpuProcess] = []
        if index == 0:
            for name, n, size in _SIM_DESKTOP:
                wobble = int(8 * MiB * math.sin(now / (17.0 + n)))
                procs.append(GpuProcess(self.pid_base + n, name, size + wobble, kind="graphics"))
        running = t < run_s
        if running:
            start = 1126 * MiB
            peak = int(model.total_bytes * model.peak_share)
            grown = start + (peak - start) * (t / run_s) ** 0.7
            # TensorFlow's allocator grows in chunks: show steps of 64 MiB, not a smooth line.
            size = int(grown // (64 * MiB)) * 64 * MiB
            pid = self.pid_base + 1000 * (index + 1) + cycle % 1000
            procs.append(GpuProcess(pid, "python3", size, kind="compute"))
            warm = min(1.0, t / 10.0)
            util = warm * (88.0 + 8.0 * math.sin(t / 7.0))
            heat = 1.0 - math.exp(-t / 60.0)
        else:
            util = (3.0 + 2.0 * math.sin(now / 5.0)) if index == 0 else 0.0
            end_heat = 1.0 - math.exp(-run_s / 60.0)
            heat = end_heat * math.exp(-(t - run_s) / 25.0)
        used = sum(p.used_memory_bytes or 0 for p in procs) + 42 * MiB
        free = model.total_bytes - model.reserved_bytes - used
        power = model.idle_watts + (model.max_watts - model.idle_watts) * util / 100.0
        return GpuReading(
            index=index,
            name=model.name,
            uuid=f"GPU-00000000-0000-4000-8000-{index:012d}",
            memory_total_bytes=model.total_bytes,
            memory_used_bytes=used,
            memory_free_bytes=free,
            memory_reserved_bytes=model.reserved_bytes,
            utilization_percent=round(max(0.0, min(100.0, util)), 1),
            temperature_c=round(36.0 + 40.0 * heat, 1),
            power_watts=round(power, 1),
            display_active=index == 0,
            processes=tuple(procs),
            simulated=True,
            compute_capability=model.compute_capability,
        )

    def close(self) -> None:
        pass


GpuBackend = Union[NvmlBackend, NoGpuBackend, SimulatedBackend]


def make_backend(demo: bool = False, nvml_module: Optional[ModuleType] = None) -> GpuBackend:
    """The GPU backend for this machine: simulated GPUs with ``demo``; else NVML when it
    starts and finds a GPU; else a NoGpuBackend whose status says why. Never raises."""
    if demo:
        return SimulatedBackend()
    backend = NvmlBackend(nvml_module)
    problem = backend.open()
    if problem is not None:
        backend.close()
        return NoGpuBackend(problem)
    return backend
