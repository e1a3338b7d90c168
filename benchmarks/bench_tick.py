"""What one memory tick costs, against the floor of reading the same files.

The floor is a plain ``open(path, "rb").read()`` of every file one ``MemoryProbe.read()``
reads (``probe.files()``), the same number of times; the goal is a ratio probe / floor of at
most 3. A stricter floor (bare ``os.open``/``os.read``, the probe's own I/O) is shown too: the
ratio to it is what parsing and deciding add.

    python benchmarks/bench_tick.py [--ticks 2000] [--rounds 7] [--json]
                                    [--proc-root /proc --cgroup-root /sys/fs/cgroup]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trayapp.probes.memory import MemoryProbe  # noqa: E402

GOAL = 3.0


def _floor(files: Sequence[str]) -> Callable[[], None]:
    def tick() -> None:
        for path in files:
            with open(path, "rb") as f:
                f.read()

    return tick


def _raw_floor(files: Sequence[str]) -> Callable[[], None]:
    """The strictest floor: one os.open/os.read/os.close per file, as the probe does."""

    def tick() -> None:
        for path in files:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.read(fd, 16384)
            finally:
                os.close(fd)

    return tick


def _time(fn: Callable[[], object], ticks: int) -> float:
    start = time.perf_counter()
    for _ in range(ticks):
        fn()
    return (time.perf_counter() - start) / ticks


def run(ticks: int, rounds: int, proc_root: str, cgroup_root: str) -> dict:
    probe = MemoryProbe(proc_root=proc_root, cgroup_root=cgroup_root)
    files = probe.files()
    floor, raw = _floor(files), _raw_floor(files)
    for _ in range(ticks // 10 + 1):  # warm caches and the page cache
        probe.read()
        floor()
        raw()
    probe_times, floor_times, raw_times = [], [], []
    for _ in range(rounds):  # interleaved, best of each: noise from other work only adds
        probe_times.append(_time(probe.read, ticks))
        floor_times.append(_time(floor, ticks))
        raw_times.append(_time(raw, ticks))
    tick_s, floor_s, raw_s = min(probe_times), min(floor_times), min(raw_times)
    reading = probe.read()
    return {
        "tick_us": tick_s * 1e6,
        "floor_us": floor_s * 1e6,
        "ratio": tick_s / floor_s,
        "raw_floor_us": raw_s * 1e6,
        "raw_ratio": tick_s / raw_s,
        "files": list(files),
        "limit_source": reading.limit_source,
        "cgroup_version": reading.cgroup_version,
    }


def main(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(description="MemoryProbe.read() against plain reads")
    ap.add_argument("--ticks", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--proc-root", default="/proc")
    ap.add_argument("--cgroup-root", default="/sys/fs/cgroup")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.ticks < 1 or args.rounds < 1:
        print("bench_tick: --ticks and --rounds must be at least 1", file=sys.stderr)
        return 2
    try:
        r = run(args.ticks, args.rounds, args.proc_root, args.cgroup_root)
    except OSError as e:
        print(f"bench_tick: cannot read {e.filename}: {e.strerror}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"name": "memory_tick", "value": round(r["tick_us"], 2), "unit": "us",
                          "ratio": round(r["ratio"], 3), "goal": GOAL}))
    else:
        print(f"files per tick: {len(r['files'])} (cgroup v{r['cgroup_version']}, "
              f"bounded by {r['limit_source']})")
        for path in r["files"]:
            print(f"  {path}")
        print(f"MemoryProbe.read():   {r['tick_us']:8.1f} us")
        print(f"plain reads (floor):  {r['floor_us']:8.1f} us")
        print(f"raw os.read floor:    {r['raw_floor_us']:8.1f} us")
        verdict = "ok" if r["ratio"] <= GOAL else "over the goal"
        print(f"ratio:                {r['ratio']:8.2f}  (goal <= {GOAL:g}: {verdict})")
        print(f"ratio to os.read:     {r['raw_ratio']:8.2f}  (parsing and deciding)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
