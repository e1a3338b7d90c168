"""The history's series names, and one sample as those series: defined once for the engine,
which records them, and the dashboard, which draws the live ones between two history queries.

Names: ``mem.total``, ``mem.available``, ``mem.used``, ``swap.total``, ``swap.used``,
``psi.some``, ``psi.full``; per GPU ``gpu<i>.total|used|util|temp|power`` and its VRAM split
into the guard's jobs and the rest, ``gpu<i>.job.<id>`` and ``gpu<i>.other``; per job
``job.<id>.rss`` and ``job.<id>.vram``.

By process name, outside the guard's jobs (``process_values``): ``ram.proc.<name>`` (the top
few names' RSS, from ``probes.consumers``) and ``gpu<i>.proc.<name>`` (a GPU's processes, part
of ``gpu<i>.other``). The engine keeps these in memory only (the last hour), not in the store.

Stdlib only, no Qt. The engine passes its readings (``MemoryReading``, ``GpuReading`` and
their ``GpuProcess``), the dashboard the status's JSON of them: the fields have the same names
in both, so ``sample_values`` reads either. Jobs likewise: the manager's job dicts, the status's,
or ``JobRecord``s.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, Mapping, Optional, Tuple

OTHER = "other"  # the VRAM layer of everything that is not one of the guard's jobs
PROC = "proc."  # the layer of a process name: ``ram.proc.<name>``, ``gpu<i>.proc.<name>``
RAM_PROC = "ram." + PROC

# Series name -> the memory reading's field.
MEMORY_SERIES: Tuple[Tuple[str, str], ...] = (
    ("mem.total", "total_bytes"),
    ("mem.available", "available_bytes"),
    ("mem.used", "used_bytes"),
    ("swap.total", "swap_total_bytes"),
    ("swap.used", "swap_used_bytes"),
    ("psi.some", "psi_some_avg10"),
    ("psi.full", "psi_full_avg10"),
)
# gpu<i>.<name> -> the GPU reading's field.
GPU_SERIES: Tuple[Tuple[str, str], ...] = (
    ("total", "memory_total_bytes"),
    ("used", "memory_used_bytes"),
    ("util", "utilization_percent"),
    ("temp", "temperature_c"),
    ("power", "power_watts"),
)


def gpu_series(index: int, name: str) -> str:
    """``gpu<index>.<name>``: ``gpu_series(0, "used")`` is ``"gpu0.used"``."""
    return f"gpu{index}.{name}"


def job_layer(job_id: str) -> str:
    """A job's VRAM layer within its GPU's series: ``gpu<i>.`` + this."""
    return f"job.{job_id}"


def layer_job(layer: str) -> Optional[str]:
    """The job id of a VRAM layer name, or None for ``"other"``."""
    return layer[len("job.") :] if layer.startswith("job.") else None


def proc_name(layer: str) -> Optional[str]:
    """The process name of a layer (``proc.Xorg`` -> ``Xorg``), or None for another layer."""
    return layer[len(PROC) :] if layer.startswith(PROC) else None


def memory_only(name: str) -> bool:
    """Whether a series is one the engine keeps in memory only (a per-name series)."""
    return name.startswith(RAM_PROC) or (name.startswith("gpu") and "." + PROC in name)


def job_series(job_id: str, what: str) -> str:
    """``job.<id>.rss`` or ``job.<id>.vram``."""
    return f"job.{job_id}.{what}"


def _field(item: Any, name: str) -> Any:
    # A reading or a record has the field as an attribute; their JSON has it as a key.
    if isinstance(item, Mapping):
        return item.get(name)
    return getattr(item, name, None)


def pid_owners(jobs: Iterable[Any]) -> Dict[int, str]:
    """Process id -> the id of the job it belongs to (its whole tree, else its main pid)."""
    owners: Dict[int, str] = {}
    for job in jobs:
        pid = _field(job, "pid")
        for p in _field(job, "pids") or ([pid] if pid else []):
            owners[int(p)] = str(_field(job, "id"))
    return owners


def vram_layers(gpu: Any, owners: Mapping[int, str]) -> Dict[str, float]:
    """One GPU's used VRAM by layer: each of the guard's jobs (``job.<id>``, from the GPU's
    processes) and ``other`` (the rest of what is used; absent when the GPU does not report
    its use)."""
    layers: Dict[str, float] = {}
    for proc in _field(gpu, "processes") or ():
        pid, used = _field(proc, "pid"), _field(proc, "used_memory_bytes")
        job_id = owners.get(int(pid)) if isinstance(pid, int) else None
        if job_id is not None and used is not None:
            key = job_layer(job_id)
            layers[key] = layers.get(key, 0) + used
    used_total = _field(gpu, "memory_used_bytes")
    if used_total is not None:
        layers[OTHER] = max(0, used_total - sum(layers.values()))
    return layers


def sample_values(
    memory: Any, gpus: Iterable[Any], jobs: Iterable[Any]
) -> Dict[str, Optional[float]]:
    """One sample as named series (the module docstring). ``memory``: the memory reading (or
    its JSON); ``gpus``: the GPU readings; ``jobs``: the guard's live jobs."""
    jobs = list(jobs)
    values: Dict[str, Optional[float]] = {name: _field(memory, key) for name, key in MEMORY_SERIES}
    for job in jobs:
        job_id = str(_field(job, "id"))
        for what, key in (("rss", "rss_bytes"), ("vram", "vram_bytes")):
            if _field(job, key) is not None:
                values[job_series(job_id, what)] = _field(job, key)
    owners = pid_owners(jobs)
    for g in gpus:
        index = int(_field(g, "index") or 0)
        for name, key in GPU_SERIES:
            values[gpu_series(index, name)] = _field(g, key)
        for layer, used in vram_layers(g, owners).items():
            values[gpu_series(index, layer)] = used
    return values


def process_values(
    gpus: Iterable[Any], jobs: Iterable[Any], consumers: Iterable[Any] = ()
) -> Dict[str, float]:
    """The per-name series of one sample (the module docstring): ``consumers`` are the RAM
    consumers (``readings.Consumer`` or their JSON), the GPUs' processes outside the
    guard's jobs summed by name. A GPU process whose memory the driver does not tell (WDDM)
    has no series."""
    values: Dict[str, float] = {}
    for c in consumers:
        name, rss = _field(c, "name"), _field(c, "rss_bytes")
        if name and rss is not None:
            values[RAM_PROC + str(name)] = float(rss)
    owners = pid_owners(jobs)
    for g in gpus:
        index = int(_field(g, "index") or 0)
        for proc in _field(g, "processes") or ():
            pid, used = _field(proc, "pid"), _field(proc, "used_memory_bytes")
            if used is None or (isinstance(pid, int) and pid in owners):
                continue
            key = gpu_series(index, PROC + str(_field(proc, "name") or pid))
            values[key] = values.get(key, 0.0) + float(used)
    return values


def per_process_unknown(gpu: Any) -> bool:
    """Whether the GPU lists processes whose memory its driver does not tell (Windows WDDM)."""
    return any(_field(p, "used_memory_bytes") is None for p in _field(gpu, "processes") or ())
