"""Per-process and process-tree memory: RSS from psutil, VRAM from the GPU readings.

``tree_memory``'s tree RSS is the sum of the members' RSS, so pages shared between them (forked
workers, shared libraries) count more than once: 200 forked workers of a 12 MB parent add up to
2.5 GiB. ``TreeMeter`` counts each page once (see there); a job's memory is read with it.
"""

from __future__ import annotations

import heapq
import os
import sys
import time
from typing import Callable, Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple

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


# ---------------------------------------------------------------------------------------------
# A tree's memory with each page counted once

# Exact readings (smaps_rollup) cost about 6 us per resident MB of each member (the kernel walks
# its page tables), 100 times a statm read and more (benchmarks/bench_tree_memory.py). So they
# take at most this share of a core on average...
EXACT_SHARE = 0.05
# ...and, while the tree keeps changing (a changed tree is read exactly at once), at most this.
CHANGED_SHARE = 0.2
EXACT_MIN_SECONDS = 0.25  # a cheap tree is read exactly at most 4 times a second
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_LINUX = sys.platform.startswith("linux")


def rss_bytes(pid: int, proc_root: str = "/proc") -> Optional[int]:
    """A process's RSS; None when it is gone or unreadable. On Linux one read of its statm."""
    if _LINUX:
        try:
            fd = os.open(f"{proc_root}/{pid}/statm", os.O_RDONLY)
            try:
                data = os.read(fd, 256)
            finally:
                os.close(fd)
            return int(data.split()[1]) * _PAGE
        except (OSError, ValueError, IndexError):
            return None
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return None


def _field_kb(data: bytes, name: bytes) -> Optional[int]:
    at = data.find(b"\n" + name)
    if at < 0:
        return None
    start = at + 1 + len(name)
    end = data.find(b"kB", start)
    try:
        return int(data[start:end]) * 1024 if end > 0 else None
    except ValueError:
        return None


def rss_pss_bytes(pid: int, proc_root: str = "/proc") -> Optional[Tuple[int, int]]:
    """(RSS, PSS) of a process from one read of ``/proc/<pid>/smaps_rollup`` (Linux 4.14 and
    later). PSS counts each page a 1/n share where n processes map it, so PSS summed over a tree
    counts every page once. None when the file is missing or unreadable (another user's
    process, an older kernel, not Linux) or the process is gone."""
    try:
        fd = os.open(f"{proc_root}/{pid}/smaps_rollup", os.O_RDONLY)
    except OSError:
        return None
    try:
        data = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    rss, pss = _field_kb(data, b"Rss:"), _field_kb(data, b"Pss:")
    if rss is None or pss is None:
        return None
    return rss, pss


def pss_available(proc_root: str = "/proc") -> bool:
    """Whether this system has ``smaps_rollup`` (Linux 4.14 and later)."""
    return _LINUX and os.path.exists(f"{proc_root}/self/smaps_rollup")


class TreeMeter:
    """One process tree's memory (a job's), each page counted once, cheaply enough for every
    guard tick.

    ``sample(pids)`` (the launcher, 4 times a second) takes an exact reading, each member's PSS
    from ``smaps_rollup``, when the set of members changed (forked workers share their parent's
    pages: counting them at their RSS is what makes a false budget pause) and otherwise as often
    as ``EXACT_SHARE`` of a core allows. Every other reading (``read``, the guard's fast tick)
    reads each member's RSS from statm and takes off its shared part as the last exact reading
    measured it (RSS - PSS): a new allocation counts in full at once, as it should; only pages a
    member stops sharing (a copy on write) or a sharer's exit, which raise the others' share,
    wait for the next exact reading. A member not yet in an exact reading, or whose
    ``smaps_rollup`` cannot be read, counts at its RSS (the upper bound). Without
    ``smaps_rollup`` (older kernels, Windows, macOS) the meter is the summed RSS (``method``
    "rss").
    """

    def __init__(self, proc_root: str = "/proc", *, exact: Optional[bool] = None,
                 clock: Callable[[], float] = time.monotonic):
        self.proc_root = proc_root
        self._clock = clock
        self.exact_available = pss_available(proc_root) if exact is None else exact
        self._shared: Dict[int, int] = {}  # pid -> RSS - PSS at the last exact reading
        self._members: FrozenSet[int] = frozenset()
        self._next_exact = 0.0  # monotonic: when the next exact reading is due
        self._earliest = 0.0  # monotonic: the soonest one may be taken (a changed tree)
        self.exact_seconds: Optional[float] = None  # what the last exact reading cost
        self.method = "rss"  # "pss" once an exact reading counted some member by its PSS

    def sample(self, pids: Sequence[int]) -> Optional[int]:
        """The tree's bytes now, exactly when due (see the class); None when no member is
        readable."""
        if self.exact_available:
            now = self._clock()
            changed = frozenset(pids) != self._members
            if now >= self._next_exact or (changed and now >= self._earliest):
                return self._exact(pids, now)
        return self.read(pids)

    def read(self, pids: Sequence[int]) -> Optional[int]:
        """The tree's bytes from each member's RSS less its shared part at the last exact
        reading; None when no member is readable. One statm read a member."""
        shared = self._shared
        total, found = 0, False
        for pid in pids:
            rss = rss_bytes(pid, self.proc_root)
            if rss is None:
                continue
            found = True
            total += max(0, rss - shared.get(pid, 0))
        return total if found else None

    def _exact(self, pids: Sequence[int], start: float) -> Optional[int]:
        shared: Dict[int, int] = {}
        total, found = 0, False
        for pid in pids:
            both = rss_pss_bytes(pid, self.proc_root)
            if both is None:
                rss = rss_bytes(pid, self.proc_root)
                if rss is not None:
                    found = True
                    total += rss
                continue
            found = True
            rss, pss = both
            total += pss
            shared[pid] = max(0, rss - pss)
        cost = max(0.0, self._clock() - start)
        self.exact_seconds = cost
        self._shared = shared
        self._members = frozenset(pids)
        self._next_exact = start + max(EXACT_MIN_SECONDS, cost / EXACT_SHARE)
        self._earliest = start + cost / CHANGED_SHARE
        if shared:
            self.method = "pss"
        return total if found else None
