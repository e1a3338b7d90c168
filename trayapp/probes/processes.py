"""Per-process and process-tree memory: RSS from psutil, VRAM from the GPU readings.

Tree RSS is the sum of the members' RSS, so pages shared between them (forked workers,
shared libraries) count more than once: an upper bound, which is the safe side for a guard.
"""

from __future__ import annotations

import heapq
from typing import Iterable, List, Optional, Tuple

import psutil

from trayapp.probes.snapshot import GpuReading, ProcessMemory

_GONE = (psutil.NoSuchProcess, psutil.ZombieProcess)


def tree_pids(pid: int) -> List[int]:
    """``pid`` and all its descendants, parent first; [] when ``pid`` does not exist."""
    try:
        root = psutil.Process(pid)
        children = root.children(recursive=True)
    except _GONE:
        return []
    except psutil.AccessDenied:
        return [pid]
    return [pid] + [c.pid for c in children]


def process_name(pid: int) -> str:
    """The process's name (``python3``, ``Xorg``); "" when it is gone or hidden from us."""
    try:
        return psutil.Process(pid).name()
    except (psutil.Error, OSError, ValueError):
        return ""


def _rss(proc: psutil.Process) -> Optional[int]:
    try:
        with proc.oneshot():
            return int(proc.memory_info().rss)
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None


def tree_vram(pids: Iterable[int], gpu_readings: Iterable[GpuReading]) -> Optional[int]:
    """VRAM used by ``pids`` on all GPUs, from NVML's per-process figures.

    None when there are no GPU readings, or when a process of the tree is on a GPU whose
    driver cannot tell its memory (WDDM, MIG): an unknown is not shown as 0. A tree with no
    process on any GPU uses 0.
    """
    members = set(pids)
    total = 0
    any_gpu = False
    for gpu in gpu_readings:
        any_gpu = True
        for p in gpu.processes:
            if p.pid in members:
                if p.used_memory_bytes is None:
                    return None
                total += p.used_memory_bytes
    return total if any_gpu else None


def tree_memory(pid: int, gpu_readings: Iterable[GpuReading] = ()) -> Optional[ProcessMemory]:
    """RSS of ``pid`` and of its whole tree, with the tree's VRAM; None if ``pid`` is gone
    (or belongs to someone whose memory we may not read).

    Children that exit while being read are left out; ``vram_bytes`` follows ``tree_vram``.
    """
    try:
        root = psutil.Process(pid)
        with root.oneshot():
            name = root.name()
            rss = int(root.memory_info().rss)
        children = root.children(recursive=True)
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None
    pids = [pid]
    tree_rss = rss
    for child in children:
        child_rss = _rss(child)
        if child_rss is None:
            continue
        pids.append(child.pid)
        tree_rss += child_rss
    return ProcessMemory(
        pid=pid,
        name=name,
        rss_bytes=rss,
        tree_rss_bytes=tree_rss,
        tree_pids=tuple(pids),
        vram_bytes=tree_vram(pids, gpu_readings),
    )


def top_consumers(limit: int = 5) -> List[Tuple[int, str, int]]:
    """The ``limit`` processes with the largest RSS as (pid, name, rss bytes), largest first.

    Processes that vanish or refuse access while being listed are skipped.
    """
    rows: List[Tuple[int, str, int]] = []
    for proc in psutil.process_iter(["name", "memory_info"]):
        info = proc.info
        mem = info.get("memory_info")
        if mem is None:
            continue
        rows.append((proc.pid, info.get("name") or "", int(mem.rss)))
    return heapq.nlargest(max(0, limit), rows, key=lambda r: r[2])
