"""The GPUs a job will use, as its options choose them, and what they can do."""

from __future__ import annotations

from typing import List, Optional, Protocol, Sequence, Tuple

from trayapp.jobs.spec_values import MIB
from trayapp.readings import GpuReading


class GpuChoice(Protocol):
    """What a job's memory options say about its GPUs (``MemoryOptions`` has these)."""

    @property
    def cpu_only(self) -> bool: ...

    @property
    def gpus(self) -> Optional[Tuple[int, ...]]: ...


FLOAT16_MIN_CAPABILITY = (7, 0)


def selected_gpus(options: GpuChoice, gpus: Sequence[GpuReading]) -> List[GpuReading]:
    """The readings of the GPUs the job will use (none with --cpu-only)."""
    if options.cpu_only:
        return []
    if options.gpus is None:
        return list(gpus)
    wanted = set(options.gpus)
    return [g for g in gpus if g.index in wanted]


def compute_capability(gpu: GpuReading) -> Optional[Tuple[int, int]]:
    """The GPU's CUDA compute capability as (major, minor), or None when the reading lacks it."""
    value = getattr(gpu, "compute_capability", None)
    if value is None:
        return None
    try:
        if isinstance(value, str):
            major, _, minor = value.partition(".")
            return int(major), int(minor or 0)
        major, minor = value
        return int(major), int(minor)
    except (TypeError, ValueError):
        return None


def total_mb(gpu: GpuReading) -> Optional[int]:
    if gpu.memory_total_bytes is None:
        return None
    return gpu.memory_total_bytes // MIB


def float16_ok(selected: Sequence[GpuReading]) -> bool:
    caps = [compute_capability(g) for g in selected]
    return bool(caps) and all(c is not None and c >= FLOAT16_MIN_CAPABILITY for c in caps)
