"""RAM, swap, memory pressure and the cgroup limit that really bounds this process.

On Linux the probe reads ``/proc/meminfo``, ``/proc/pressure/memory`` and the memory cgroup of
the process (v1 or v2, whichever hierarchy holds the memory controller). The available memory
is the smaller of what the host has and what the tightest cgroup limit leaves. Elsewhere a
psutil-based probe gives the same reading without PSI or cgroups.

The file paths are resolved once; a tick is one ``os.read`` per file and a scan for the few
lines that matter, so it costs little more than reading the files.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple, Union

import psutil

from trayapp.readings import MemoryReading

_READ_SIZE = 16384


def _read(path: str) -> bytes:
    """The whole file with one read (pseudo-files are small); raises OSError."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        data = os.read(fd, _READ_SIZE)
        if len(data) == _READ_SIZE:  # larger than expected: read the rest
            chunks = [data]
            while True:
                more = os.read(fd, _READ_SIZE)
                if not more:
                    break
                chunks.append(more)
            data = b"".join(chunks)
        return data
    finally:
        os.close(fd)


def _field(data: bytes, key: bytes) -> Optional[int]:
    """The integer after ``key`` at the start of a line (``key`` ends with its separator)."""
    if data.startswith(key):
        start = len(key)
    else:
        at = data.find(b"\n" + key)
        if at < 0:
            return None
        start = at + 1 + len(key)
    end = data.find(b"\n", start)
    parts = data[start : end if end >= 0 else len(data)].split()
    if not parts:
        return None
    try:
        return int(parts[0])
    except ValueError:
        return None


def parse_meminfo(data: bytes) -> Tuple[int, int, int, int]:
    """``/proc/meminfo`` -> (total, available, swap total, swap free) in bytes.

    A missing ``MemAvailable`` (kernels before 3.14) is estimated the way ``free`` did then:
    free + buffers + page cache. Missing swap lines read as no swap. Raises ValueError when
    ``MemTotal`` is missing.
    """
    total = _field(data, b"MemTotal:")
    if total is None:
        raise ValueError("no MemTotal in meminfo")
    available = _field(data, b"MemAvailable:")
    if available is None:
        available = sum(_field(data, k) or 0 for k in (b"MemFree:", b"Buffers:", b"Cached:"))
    swap_total = _field(data, b"SwapTotal:") or 0
    swap_free = _field(data, b"SwapFree:")
    if swap_free is None:
        swap_free = swap_total
    return total * 1024, available * 1024, swap_total * 1024, swap_free * 1024


def parse_psi(data: bytes) -> Tuple[Optional[float], Optional[float], Optional[int]]:
    """A PSI file -> (some avg10, full avg10, full total in microseconds); None where absent."""
    some = full = None
    full_total = None
    for line in data.split(b"\n"):
        parts = line.split()
        if len(parts) < 5 or not parts[1].startswith(b"avg10="):
            continue
        try:
            avg10 = float(parts[1][6:])
        except ValueError:
            continue
        if parts[0] == b"some":
            some = avg10
        elif parts[0] == b"full":
            full = avg10
            if parts[4].startswith(b"total="):
                try:
                    full_total = int(parts[4][6:])
                except ValueError:
                    full_total = None
    return some, full, full_total


def _parse_limit(data: bytes) -> Optional[int]:
    """``memory.max`` / ``memory.limit_in_bytes`` -> bytes, None for ``max`` or garbage."""
    text = data.strip()
    if not text or text == b"max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class _Level:
    """One cgroup directory on the way from the process's cgroup to the mount root."""

    limit_path: str
    usage_path: str
    stat_path: str


@dataclass(frozen=True)
class CgroupPaths:
    """Where the memory cgroup of a process lives: version 1 or 2, and its levels, leaf first."""

    version: int
    leaf: str
    levels: Tuple[_Level, ...]


def _parse_proc_cgroup(data: bytes) -> Tuple[Optional[str], Optional[str]]:
    """``/proc/<pid>/cgroup`` -> (v1 memory path, v2 path); None where the line is absent."""
    v1 = v2 = None
    for line in data.decode("utf-8", "replace").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        if hid == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    return v1, v2


def _v1_mount(cgroup_root: str) -> Optional[str]:
    """The v1 hierarchy that carries the memory controller (``memory`` or a co-mount)."""
    plain = os.path.join(cgroup_root, "memory")
    if os.path.isfile(os.path.join(plain, "memory.limit_in_bytes")):
        return plain
    try:
        names = sorted(os.listdir(cgroup_root))
    except OSError:
        return None
    for name in names:
        full = os.path.join(cgroup_root, name)
        if "memory" in name.split(",") and os.path.isfile(
            os.path.join(full, "memory.limit_in_bytes")
        ):
            return full
    return None


def _v2_mount(cgroup_root: str) -> Optional[str]:
    """The v2 hierarchy: the root itself (unified hosts) or ``unified`` (hybrid hosts)."""
    for candidate in (cgroup_root, os.path.join(cgroup_root, "unified")):
        if os.path.isfile(os.path.join(candidate, "cgroup.controllers")):
            return candidate
    return None


def _locate(mount: str, path: str) -> str:
    """The directory of ``path`` under ``mount``.

    Inside a container the path seen in ``/proc/self/cgroup`` may be the host's: try it, then
    ever shorter tails of it (the part below the container's own root), then the mount root.
    """
    parts = [p for p in path.split("/") if p and p != ".."]
    for start in range(len(parts)):
        candidate = os.path.join(mount, *parts[start:])
        if os.path.isdir(candidate):
            return candidate
    return mount


def _levels(mount: str, leaf: str, names: Tuple[str, str, str]) -> Tuple[_Level, ...]:
    """The levels from ``leaf`` up to ``mount`` that have a limit file, leaf first.

    On v2 the root and any cgroup whose parent does not enable the memory controller have no
    ``memory.max``; they bound nothing and are left out.
    """
    levels: List[_Level] = []
    here = os.path.normpath(leaf)
    mount = os.path.normpath(mount)
    while True:
        level = _Level(*(os.path.join(here, n) for n in names))
        if os.path.isfile(level.limit_path):
            levels.append(level)
        if here == mount:
            break
        parent = os.path.dirname(here)
        if parent == here or len(parent) < len(mount):
            break
        here = parent
    return tuple(levels)


def resolve_cgroup(proc_root: str, cgroup_root: str, pid: str = "self") -> Optional[CgroupPaths]:
    """Find the memory cgroup of ``pid``; None when no hierarchy has the memory controller.

    A hybrid host (v1 controllers plus v2 at ``unified``) uses whichever hierarchy has the
    memory controller for this process: v1 when a v1 ``memory`` line is present and mounted,
    else v2 when the v2 root offers the ``memory`` controller.
    """
    try:
        data = _read(os.path.join(proc_root, str(pid), "cgroup"))
    except OSError:
        return None
    v1_path, v2_path = _parse_proc_cgroup(data)
    if v1_path is not None:
        mount = _v1_mount(cgroup_root)
        if mount is not None:
            leaf = _locate(mount, v1_path)
            names = ("memory.limit_in_bytes", "memory.usage_in_bytes", "memory.stat")
            levels = _levels(mount, leaf, names)
            if levels:
                return CgroupPaths(1, leaf, levels)
    if v2_path is not None:
        mount = _v2_mount(cgroup_root)
        if mount is not None and _offers_memory(mount):
            leaf = _locate(mount, v2_path)
            levels = _levels(mount, leaf, ("memory.max", "memory.current", "memory.stat"))
            # A process in the v2 root (or below cgroups without the memory controller) is
            # still in a memory hierarchy, only an unlimited one.
            return CgroupPaths(2, leaf, levels)
    return None


def _offers_memory(v2_mount: str) -> bool:
    try:
        return b"memory" in _read(os.path.join(v2_mount, "cgroup.controllers")).split()
    except OSError:
        return False


# The kernel's "no limit" on v1 is PAGE_COUNTER_MAX pages: 9223372036854771712 on 4 KiB pages.
# Any limit at or above the host's RAM bounds nothing, so it counts as no limit too.


class MemoryProbe:
    """Reads RAM, swap, PSI and the effective cgroup limit of one process (Linux).

    ``proc_root``, ``cgroup_root`` and ``pid`` point the probe at another tree (tests feed
    files captured from real machines); ``clock`` stamps the readings.
    """

    def __init__(
        self,
        proc_root: str = "/proc",
        cgroup_root: str = "/sys/fs/cgroup",
        pid: str = "self",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.proc_root = proc_root
        self.cgroup_root = cgroup_root
        self.pid = str(pid)
        self.clock = clock
        self._meminfo = os.path.join(proc_root, "meminfo")
        psi = os.path.join(proc_root, "pressure", "memory")
        self._psi: Optional[str] = psi if os.path.exists(psi) else None
        self.cgroup: Optional[CgroupPaths] = None
        self._resolve()

    def _resolve(self) -> None:
        self.cgroup = resolve_cgroup(self.proc_root, self.cgroup_root, self.pid)
        self._stat_key = b"total_inactive_file " if self._version() == 1 else b"inactive_file "

    def _version(self) -> Optional[int]:
        return self.cgroup.version if self.cgroup is not None else None

    def files(self) -> Tuple[str, ...]:
        """The files one tick reads now, in order: what a plain loop must read to compare."""
        paths = [self._meminfo]
        if self._psi is not None:
            paths.append(self._psi)
        if self.cgroup is not None:
            host_total = parse_meminfo(_read(self._meminfo))[0]
            try:
                self._cgroup_bound(host_total, paths)
            except OSError:
                pass
        return tuple(paths)

    def read(self) -> MemoryReading:
        """One reading. Raises OSError only when ``meminfo`` itself cannot be read.

        PSI missing (older kernels, ``psi=0``) gives None for the pressure fields; a cgroup
        file that fails makes the probe look for its cgroup again, and a second failure
        leaves the reading host-only for this tick.
        """
        now = self.clock()
        total, host_available, swap_total, swap_free = parse_meminfo(_read(self._meminfo))
        psi_some = psi_full = None
        psi_full_total = None
        if self._psi is not None:
            try:
                psi_some, psi_full, psi_full_total = parse_psi(_read(self._psi))
            except FileNotFoundError:
                self._psi = None  # no PSI in this kernel: stop asking
            except OSError:
                pass  # psi=0 on the kernel command line gives EOPNOTSUPP on read

        limit = used = None
        if self.cgroup is not None:
            try:
                limit, used = self._cgroup_bound(total)
            except OSError:
                self._resolve()
                try:
                    limit, used = self._cgroup_bound(total) if self.cgroup else (None, None)
                except OSError:
                    limit = used = None

        available = host_available
        source = "host"
        bound_total = total
        if limit is not None and used is not None:
            cgroup_available = max(0, limit - used)
            if cgroup_available < host_available:
                available = cgroup_available
                source = "cgroup"
                bound_total = limit
        swap_used = max(0, swap_total - swap_free)
        return MemoryReading(
            time=now,
            total_bytes=bound_total,
            available_bytes=available,
            used_bytes=max(0, bound_total - available),
            swap_total_bytes=swap_total,
            swap_used_bytes=swap_used,
            psi_some_avg10=psi_some,
            psi_full_avg10=psi_full,
            limit_source=source,
            host_total_bytes=total,
            host_available_bytes=host_available,
            cgroup_limit_bytes=limit,
            cgroup_used_bytes=used,
            cgroup_version=self._version(),
            psi_full_total_us=psi_full_total,
        )

    def _cgroup_bound(
        self, host_total: int, seen: Optional[List[str]] = None
    ) -> Tuple[Optional[int], Optional[int]]:
        """(limit, usage less inactive file cache) at the level with the least room left.

        Every level from the leaf up to the mount root is checked, because a parent's limit
        (a systemd slice, a container) binds the processes below it. Usage is read at the
        level that is limited, since its siblings count against that limit too. On v1 the
        leaf's ``hierarchical_memory_limit`` also covers ancestors that are not visible here.
        ``seen`` collects the paths read. Raises OSError when a file cannot be read.
        """
        cgroup = self.cgroup
        assert cgroup is not None
        best_room: Optional[int] = None
        best: Tuple[Optional[int], Optional[int]] = (None, None)
        leaf_stat: Optional[bytes] = None
        for i, level in enumerate(cgroup.levels):
            if seen is not None:
                seen.append(level.limit_path)
            limit = _parse_limit(_read(level.limit_path))
            if limit is None or limit >= host_total:
                continue
            stat = _read(level.stat_path)
            used = self._usage(level, stat, seen)
            if i == 0:
                leaf_stat = stat
            room = limit - used
            if best_room is None or room < best_room:
                best_room, best = room, (limit, used)
        if cgroup.version == 1 and cgroup.levels:
            leaf = cgroup.levels[0]
            if leaf_stat is None:
                if seen is not None:
                    seen.append(leaf.stat_path)
                leaf_stat = _read(leaf.stat_path)
            hierarchical = _field(leaf_stat, b"hierarchical_memory_limit ")
            if hierarchical is not None and hierarchical < host_total:
                if best[0] is None or hierarchical < best[0]:
                    # The binding level is above what this mount shows (a container).
                    used = self._usage(leaf, leaf_stat, seen)
                    room = hierarchical - used
                    if best_room is None or room < best_room:
                        best = (hierarchical, used)
        return best

    def _usage(self, level: _Level, stat: bytes, seen: Optional[List[str]]) -> int:
        if seen is not None:
            seen.extend((level.stat_path, level.usage_path))
        current = int(_read(level.usage_path).strip() or b"0")
        inactive = _field(stat, self._stat_key) or 0
        return max(0, current - inactive)


class PsutilMemoryProbe:
    """The probe for systems without ``/proc`` (Windows, macOS): psutil's view, no PSI.

    On Windows the swap figures are the page file's.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock

    def read(self) -> MemoryReading:
        """One reading; psutil errors propagate (they mean the OS refused basic counters)."""
        now = self.clock()
        vm = psutil.virtual_memory()
        sm = psutil.swap_memory()
        total = int(vm.total)
        available = int(vm.available)
        return MemoryReading(
            time=now,
            total_bytes=total,
            available_bytes=available,
            used_bytes=max(0, total - available),
            swap_total_bytes=int(sm.total),
            swap_used_bytes=int(sm.used),
            psi_some_avg10=None,
            psi_full_avg10=None,
            limit_source="host",
            host_total_bytes=total,
            host_available_bytes=available,
        )


def make_memory_probe(**kw: object) -> Union[MemoryProbe, PsutilMemoryProbe]:
    """The probe for this platform: MemoryProbe on Linux, PsutilMemoryProbe elsewhere.

    Keyword arguments go to the probe; the psutil probe takes only ``clock``.
    """
    if sys.platform.startswith("linux"):
        return MemoryProbe(**kw)  # type: ignore[arg-type]
    clock = kw.get("clock", time.time)
    return PsutilMemoryProbe(clock=clock)  # type: ignore[arg-type]
