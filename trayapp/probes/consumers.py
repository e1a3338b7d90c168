"""RAM by process name: the few names that hold the most memory, for the dashboard's stack.
Names are those a person knows (``probes.names``: "train.py", not "python3").

One pass over the process list, summed by name (30 ``chrome`` processes are one consumer). On
Linux it reads one file a process, ``/proc/<pid>/stat``, which has both the name and the RSS:
about a tenth of what psutil spends on the same list. Elsewhere psutil.
"""

from __future__ import annotations

import os
import sys
from typing import Collection, Dict, Iterator, List, Optional, Tuple

import psutil

from trayapp.probes.names import Namer
from trayapp.readings import Consumer

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_RSS_FIELD = 21  # /proc/<pid>/stat's 24th field, counted after the name's closing ")"
_START_FIELD = 19  # its 22nd, the start time (a pid reused by a new process is told apart)
_NAMER = Namer()


def _proc_stat(proc_root: str) -> Iterator[Tuple[int, str, object, int]]:
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"{proc_root}/{entry}/stat", "rb") as f:
                raw = f.read()
        except OSError:  # gone since the listing, or hidden from us
            continue
        open_at, close_at = raw.find(b"("), raw.rfind(b")")
        rest = raw[close_at + 2 :].split()
        if open_at < 0 or len(rest) <= _RSS_FIELD:
            continue
        name = raw[open_at + 1 : close_at].decode("utf-8", "replace")
        yield int(entry), name, rest[_START_FIELD], int(rest[_RSS_FIELD]) * _PAGE


def _psutil_rows() -> Iterator[Tuple[int, str, object, int]]:
    for proc in psutil.process_iter(["name", "memory_info", "create_time"]):
        mem = proc.info.get("memory_info")
        if mem is not None:
            yield proc.pid, proc.info.get("name") or "", proc.info.get("create_time"), int(mem.rss)


def ram_by_name(
    skip: Collection[int] = (), limit: int = 4, min_bytes: int = 0, proc_root: Optional[str] = None
) -> List[Consumer]:
    """The ``limit`` names with the most RSS (largest first), leaving out the pids in
    ``skip`` (the guard's jobs, drawn on their own) and names under ``min_bytes``. Processes
    that vanish while being read are left out; never raises."""
    if proc_root is None and sys.platform.startswith("linux"):
        proc_root = "/proc"
    rows = _proc_stat(proc_root) if proc_root else _psutil_rows()
    namer = _NAMER if proc_root in (None, "/proc") else Namer(proc_root)
    sums: Dict[str, List[int]] = {}
    seen: List[int] = []
    try:
        for pid, name, start, rss in rows:
            seen.append(pid)
            if rss <= 0 or pid in skip:
                continue
            cell = sums.setdefault(namer.name(pid, name, start) or "?", [0, 0])
            cell[0] += rss
            cell[1] += 1
    except (psutil.Error, OSError):
        pass  # the list changed under us: what was read so far
    namer.keep_only(seen)
    top = sorted(sums.items(), key=lambda kv: -kv[1][0])[: max(0, limit)]
    return [Consumer(name, rss, n) for name, (rss, n) in top if rss >= min_bytes]
