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
from typing import (
    Callable,
    Dict,
    FrozenSet,
    Iterable,
    List,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
)

import psutil

from trayapp.probes.names import Namer
from trayapp.readings import GpuReading, ProcessMemory

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


_NAMER = Namer()


def process_name(pid: int) -> str:
    """The process's name as a person knows it (``train.py``, ``Xorg``, ``Headroom engine``:
    ``probes.names``); "" when it is gone or hidden from us."""
    try:
        proc = psutil.Process(pid)
        return _NAMER.name(pid, proc.name(), proc.create_time())
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


# ---------------------------------------------------------------------------------------------
# All processes: the largest, and whether a pid is still the process it was

# A pid is still the process seen before when its create time is within this of the one kept
# (the times psutil reads back are rounded to clock ticks and the boot time they start from; a
# pid reused by a new process starts later than that).
SAME_PROCESS_TOLERANCE_S = 0.05


def same_start(a: float, b: float) -> bool:
    """Whether two start times (``create_time``) are those of the same process."""
    return abs(a - b) <= SAME_PROCESS_TOLERANCE_S


def same_process(pid: int, created: Optional[float]) -> Optional[psutil.Process]:
    """The process ``pid`` if it is still the one that started at ``created`` (any, when
    ``created`` is None); None when it is gone or another process has its pid now."""
    try:
        proc = psutil.Process(pid)
        if created is not None and not same_start(proc.create_time(), created):
            return None
        return proc
    except psutil.Error:
        return None


class ProcessRow(NamedTuple):
    """One process of a sample."""

    pid: int
    name: str
    rss_bytes: int
    create_time: float
    rate_bytes_per_s: Optional[float]  # RSS growth over the rate window (None: nothing before)


# A process's growth is measured from its oldest sample in the window; without one there, from
# the newest before it when that is no older than this many windows (samples are taken only
# while memory is short, at most once a second).
RATE_LOOKBACK_WINDOWS = 4.0
DEFAULT_RATE_WINDOW_SECONDS = 3.0


class ProcessSampler:
    """Reads the process list: the ``limit`` largest by RSS, the ``limit`` growing fastest,
    and any other ``also`` names, each with its RSS growth over the rate window. Every process
    of a pass is remembered (its RSS and start), so one that was small until now still has
    its growth when it first counts among the largest. One pass over the process list a call
    (milliseconds with hundreds of processes: not for every tick)."""

    def __init__(self, clock: Callable[[], float] = time.time):
        self._clock = clock
        # pid -> (created, [(time, rss), ...] oldest first, within the look-back)
        self._seen: Dict[int, Tuple[float, List[Tuple[float, int]]]] = {}

    def sample(
        self,
        limit: int,
        also: Optional[Callable[[str], bool]] = None,
        window: float = DEFAULT_RATE_WINDOW_SECONDS,
    ) -> List[ProcessRow]:
        """The largest ``limit`` processes first (largest first), then those growing fastest
        and those ``also`` picks by name. Processes that vanish or refuse access while being
        listed are left out."""
        now = self._clock()
        rows: List[ProcessRow] = []
        for proc in psutil.process_iter(["name", "memory_info", "create_time"]):
            info = proc.info
            mem = info.get("memory_info")
            if mem is None:
                continue
            created = float(info.get("create_time") or 0.0)
            rss = int(mem.rss)
            rows.append(
                ProcessRow(
                    proc.pid,
                    info.get("name") or "",
                    rss,
                    created,
                    self._growth(proc.pid, created, now, rss, window),
                )
            )
        self._remember(rows, now, window)
        n = max(0, limit)
        keep = {r.pid: r for r in heapq.nlargest(n, rows, key=lambda r: r.rss_bytes)}
        growing = [r for r in rows if r.rate_bytes_per_s is not None and r.rate_bytes_per_s > 0]
        for r in heapq.nlargest(n, growing, key=lambda r: r.rate_bytes_per_s or 0.0):
            keep.setdefault(r.pid, r)
        if also is not None:
            for r in rows:
                if r.pid not in keep and also(r.name):
                    keep[r.pid] = r
        return list(keep.values())

    def _growth(
        self, pid: int, created: float, now: float, rss: int, window: float
    ) -> Optional[float]:
        """Bytes a second since the oldest sample of the process in the window (see above)."""
        seen = self._seen.get(pid)
        if seen is None or not same_start(seen[0], created):
            return None
        start = now - window
        before = [(t, v) for t, v in seen[1] if t < now]
        inside = [(t, v) for t, v in before if t >= start]
        if inside:
            t0, v0 = inside[0]
        elif before and before[-1][0] >= now - RATE_LOOKBACK_WINDOWS * window:
            t0, v0 = before[-1]
        else:
            return None
        return (rss - v0) / (now - t0)

    def _remember(self, rows: Sequence[ProcessRow], now: float, window: float) -> None:
        oldest = now - RATE_LOOKBACK_WINDOWS * window
        seen: Dict[int, Tuple[float, List[Tuple[float, int]]]] = {}
        for r in rows:
            before = self._seen.get(r.pid)
            kept: List[Tuple[float, int]] = []
            if before is not None and same_start(before[0], r.create_time):
                kept = [(t, v) for t, v in before[1] if oldest <= t < now]
            # Of the samples before the window only the newest can count (see _growth).
            older = [s for s in kept if s[0] < now - window]
            kept = older[-1:] + [s for s in kept if s[0] >= now - window]
            kept.append((now, r.rss_bytes))
            seen[r.pid] = (r.create_time, kept)
        self._seen = seen


# ---------------------------------------------------------------------------------------------
# A tree's memory with each page counted once

# Exact readings (smaps_rollup) cost about 6 us per resident MB of each member (the kernel walks
# its page tables), hundreds of times a statm read (benchmarks/bench_tree_memory.py). So a pass
# over the tree is spread over the samples, at most this long in each (at 4 samples a second: 2%
# of a core while a pass runs)...
EXACT_SLICE_SECONDS = 0.005
# ...and passes take at most this share of a core on average (a changed tree starts one at once).
EXACT_SHARE = 0.01
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


def pids_rss(pids: Sequence[int], proc_root: str = "/proc") -> Optional[int]:
    """The summed RSS of ``pids`` (those still there), one ``rss_bytes`` each: cheap enough
    for every tick. None when none is readable."""
    total, found = 0, False
    for pid in pids:
        rss = rss_bytes(pid, proc_root)
        if rss is not None:
            total += rss
            found = True
    return total if found else None


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
    both = rollup_bytes(pid, proc_root)
    return None if both is None else (both[0], both[1])


def rollup_bytes(pid: int, proc_root: str = "/proc") -> Optional[Tuple[int, int, int]]:
    """(RSS, PSS, USS) of a process from ``smaps_rollup``, USS being its private pages; None as
    for ``rss_pss_bytes``."""
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
    uss = (_field_kb(data, b"Private_Clean:") or 0) + (_field_kb(data, b"Private_Dirty:") or 0)
    return rss, pss, min(uss, pss)


def pss_available(proc_root: str = "/proc") -> bool:
    """Whether this system has ``smaps_rollup`` (Linux 4.14 and later)."""
    return _LINUX and os.path.exists(f"{proc_root}/self/smaps_rollup")


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _boot_clock() -> float:
    """Seconds since boot, on the clock /proc/<pid>/stat's start times use."""
    return time.clock_gettime(time.CLOCK_BOOTTIME) if _LINUX else 0.0


def _origin(pid: int, proc_root: str) -> Optional[Tuple[int, float, bytes]]:
    """(parent pid, start in seconds since boot, command line) of a process; None if gone."""
    try:
        with open(f"{proc_root}/{pid}/stat", "rb") as f:
            stat = f.read()
        with open(f"{proc_root}/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
        fields = stat[stat.rindex(b")") + 2 :].split()
        return int(fields[1]), int(fields[19]) / _TICKS, cmdline
    except (OSError, ValueError, IndexError):
        return None


class _Record(NamedTuple):
    """What the meter knows of one member."""

    rss: int  # bytes resident when recorded
    shared: int  # of them, the part other members count too (RSS - PSS)
    exact: bool  # measured from smaps_rollup (else a guess until it is)
    when: float  # seconds since boot when recorded
    parent: int = 0  # the member it was forked from (0: none known)
    start: float = 0.0  # when it started, seconds since boot
    uss: int = 0  # measured: its private pages (its PSS less its share of the shared ones)
    parent_share: int = 0  # measured: its parent's share of shared pages (PSS - USS) then...
    parent_when: float = 0.0  # ...as the parent was last measured before (0.0: not measured)

    @property
    def share(self) -> int:
        """Its share of the pages it shares (PSS - USS); 0 when not measured."""
        return max(0, self.rss - self.shared - self.uss) if self.exact else 0


class TreeMeter:
    """One process tree's memory (a job's), each page counted once, cheaply enough for every
    guard tick.

    Exact readings take each member's PSS (and RSS) from ``smaps_rollup``: their sum counts
    every page once, where the summed RSS counts a page shared by 200 forked workers 200 times.
    They cost in proportion to what is resident, so ``sample(pids)`` (the launcher, up to 4
    times a second) spreads a pass over the members across samples (``EXACT_SLICE_SECONDS``
    each). A pass starts when the tree gains a member (the parents of the new members first,
    then the new members) and otherwise as often as ``EXACT_SHARE`` of a core allows.

    Every reading (``read``, also the guard's fast tick) is each member's RSS from statm less
    its shared part (RSS - PSS) as last measured: memory a member allocates counts in full at
    once; pages a member stops sharing (a copy on write) or a sharer's exit, which raise the
    others' share, count from the next exact reading; but when a member's parent is measured
    again and its share of their shared pages (PSS less its private pages) fell, more sharers
    came, and the member's share falls as much. A member not measured yet that was forked
    (without exec: the same command line as its parent) shares its parent's pages: it counts
    the parent's share of them when the parent was measured since the fork, else nothing of
    what the parent has (the parent counts those in full). Any other member counts at its RSS
    until measured, as does one whose ``smaps_rollup`` is unreadable. Without ``smaps_rollup``
    (older kernels, Windows, macOS) the meter is the summed RSS (``method`` "rss").
    """

    def __init__(
        self,
        proc_root: str = "/proc",
        *,
        exact: Optional[bool] = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.proc_root = proc_root
        self._clock = clock
        self.exact_available = pss_available(proc_root) if exact is None else exact
        # Replaced, never changed in place: a reading on another thread sees one whole version.
        self._rec: Dict[int, _Record] = {}
        self._queue: List[int] = []  # members still to measure in this pass
        self._pass_started = 0.0
        self._pass_cost = 0.0
        self._next_pass = 0.0  # monotonic: when the next periodic pass is due
        self.pass_seconds: Optional[float] = None  # what the last whole pass cost
        self.method = "rss"  # "pss" once a member was counted by its PSS

    def sample(self, pids: Sequence[int], exact: bool = True) -> Optional[int]:
        """The tree's bytes now (see the class), after this sample's share of exact readings
        (none with ``exact`` False: a pass waits until it is true again); None when no member
        is readable."""
        if not self.exact_available or not exact:
            return self.read(pids)
        now = self._clock()
        rec = self._rec
        new = [p for p in pids if p not in rec]
        if new:
            rec = dict(rec)
            for p in new:
                rec[p] = self._guess(p, rec)
            self._rec = rec
            # Sharing changed for all: a pass over every member, the new ones' parents first,
            # then those not measured yet.
            parents = {rec[p].parent for p in new}
            first = [p for p in pids if p in parents] + [p for p in pids if not rec[p].exact]
            first = list(dict.fromkeys(first))
            self._queue = first + [p for p in pids if p not in set(first)]
            if not self._pass_cost:
                self._pass_started = now
        elif not self._queue and now >= self._next_pass:
            self._queue = [p for p in pids if not rec[p].exact] + [p for p in pids if rec[p].exact]
            self._pass_started, self._pass_cost = now, 0.0
        if self._queue:
            self._measure(frozenset(pids))
        return self.read(pids)

    def read(self, pids: Sequence[int]) -> Optional[int]:
        """The tree's bytes from each member's RSS less its shared part as last measured (see
        the class); None when no member is readable. One statm read a member."""
        rec = self._rec
        seen: Dict[int, int] = {}
        total, found = 0, False
        for pid in pids:
            rss = rss_bytes(pid, self.proc_root)
            if rss is None:
                continue
            found = True
            seen[pid] = rss
            r = rec.get(pid)
            if r is None:
                total += rss
                continue
            shared = r.shared
            parent = rec.get(r.parent) if r.parent else None
            if not r.exact and r.parent:
                if parent is None:
                    shared = 0
                elif parent.exact and parent.when >= r.start:
                    # Measured since the fork: it holds the parent's share of their pages.
                    shared = rss - min(rss, parent.share)
                else:
                    shared = seen.get(r.parent, parent.rss)  # all the parent has
            elif (
                parent is not None
                and parent.exact
                and parent.when > r.parent_when
                and r.parent_when
            ):
                # The parent was measured again since: more sharers of their pages lowered its
                # share, and every sharer's alike (never raised here: that waits for a pass).
                shared += max(0, r.parent_share - parent.share)
            total += rss - min(rss, shared)
        return total if found else None

    def _guess(self, pid: int, rec: Dict[int, _Record]) -> _Record:
        """A new member's record until it is measured (see the class)."""
        now = _boot_clock()
        rss = rss_bytes(pid, self.proc_root) or 0
        mine = _origin(pid, self.proc_root)
        if mine is not None and mine[0] in rec:
            theirs = _origin(mine[0], self.proc_root)
            if theirs is not None and theirs[2] == mine[2]:
                return _Record(rss, 0, False, now, parent=mine[0], start=mine[1])
        return _Record(rss, 0, False, now)

    def _measure(self, members: FrozenSet[int]) -> None:
        start = self._clock()
        rec = dict(self._rec)
        while self._queue:
            pid = self._queue.pop(0)
            if pid not in members:
                continue
            when = _boot_clock()
            old = rec.get(pid)
            link = old.parent if old is not None else 0
            parent = rec.get(link) if link else None
            then = (parent.share, parent.when) if parent is not None and parent.exact else (0, 0.0)
            got = rollup_bytes(pid, self.proc_root)
            if got is None:
                rss = rss_bytes(pid, self.proc_root)
                rec[pid] = _Record(rss or 0, 0, True, when)  # unreadable: counted at its RSS
            else:
                rss, pss, uss = got
                rec[pid] = _Record(
                    rss,
                    max(0, rss - pss),
                    True,
                    when,
                    link,
                    old.start if old is not None else 0.0,
                    uss,
                    *then,
                )
                self.method = "pss"
            if self._clock() - start >= EXACT_SLICE_SECONDS:
                break
        self._pass_cost += max(0.0, self._clock() - start)
        if not self._queue:
            rec = {p: r for p, r in rec.items() if p in members}
            self.pass_seconds = self._pass_cost
            self._next_pass = self._pass_started + max(
                EXACT_MIN_SECONDS, self._pass_cost / EXACT_SHARE
            )
            self._pass_cost = 0.0
        self._rec = rec
