"""What reading a job's tree memory costs per tick: summed RSS against each page counted once.

A tree is a parent that touches MB megabytes and forks N - 1 workers that only wait (they share
its pages, copy on write): trees of 1, 20 and 200 processes. For each, per tick:

- RSS sum: one ``/proc/<pid>/statm`` read a member (what the guard read before; it counts the
  shared pages once per member);
- PSS sum: one ``/proc/<pid>/smaps_rollup`` read a member (exact; the kernel walks each
  member's page tables, so it costs in proportion to what is resident);
- psutil ``memory_full_info`` (USS/PSS from ``smaps``), for the smaller trees;
- ``TreeMeter.read``: statm less each member's shared part as the last exact reading measured
  it: what the guard reads on its fast ticks;
- the CPU share of one core with the guard reading every 20 ms and the launcher sampling 4
  times a second: RSS sums against the meter (its exact passes included), measured over
  SECONDS each; and what PSS on every 20 ms tick would take.

Ratios are to the RSS sum of the same tree, in the same run.

    python benchmarks/bench_tree_memory.py [--mb 100] [--sizes 1,20,200] [--ticks 200]
                                           [--seconds 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trayapp.probes.processes import (  # noqa: E402
    TreeMeter,
    pss_available,
    rss_bytes,
    rss_pss_bytes,
)

GUARD_TICK_SECONDS = 0.02  # the guard's fastest tick
SAMPLE_SECONDS = 0.25  # the launcher's tree sample
METER_GOAL = 1.5  # the meter's cheap tick against the plain RSS sum


def make_tree(size: int, mb: int) -> List[int]:
    """Fork a parent that touches ``mb`` MB and ``size - 1`` workers sharing it; their pids.
    They wait on a pipe and end when this process closes it (or ends)."""
    read_end, write_end = os.pipe()
    ready_r, ready_w = os.pipe()
    parent = os.fork()
    if parent == 0:
        os.close(write_end)
        os.close(ready_r)
        block = bytearray(mb * 1024 * 1024)
        for i in range(0, len(block), 4096):
            block[i] = 1
        kids = []
        for _ in range(size - 1):
            pid = os.fork()
            if pid == 0:
                os.read(read_end, 1)
                os._exit(0)
            kids.append(pid)
        os.write(ready_w, (" ".join(str(p) for p in [os.getpid(), *kids]) + "\n").encode())
        os.read(read_end, 1)
        for pid in kids:
            os.waitpid(pid, 0)
        os._exit(0)
    os.close(read_end)
    os.close(ready_w)
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(ready_r, 65536)
        if not chunk:
            break
        data += chunk
    os.close(ready_r)
    _trees.append((parent, write_end))
    return [int(x) for x in data.split()]


_trees: List[tuple] = []


def end_trees() -> None:
    for parent, write_end in _trees:
        try:
            os.close(write_end)  # every member reads EOF and ends
        except OSError:
            pass
        try:
            os.waitpid(parent, 0)
        except OSError:
            pass
    _trees.clear()


def rss_sum(pids: Sequence[int]) -> int:
    return sum(rss_bytes(p) or 0 for p in pids)


def pss_sum(pids: Sequence[int]) -> int:
    total = 0
    for p in pids:
        both = rss_pss_bytes(p)
        total += both[1] if both else 0
    return total


def full_info_sum(pids: Sequence[int]) -> int:
    import psutil

    return sum(int(psutil.Process(p).memory_full_info().pss) for p in pids)


def per_tick(fn: Callable[[], object], ticks: int, rounds: int = 3) -> float:
    """Seconds one call takes: the best of ``rounds`` runs of ``ticks`` calls."""
    fn()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(ticks):
            fn()
        best = min(best, (time.perf_counter() - start) / ticks)
    return best


def loop_share(tick: Callable[[], object], sample: Callable[[], object], seconds: float) -> float:
    """The share of one core that ``tick`` every 20 ms (the guard) and ``sample`` 4 times a
    second (the launcher) take, in CPU time of this thread (user and system), so other work on
    the machine does not count."""
    busy = 0.0
    start = time.monotonic()
    next_sample = start
    next_tick = start
    while True:
        now = time.monotonic()
        if now - start >= seconds:
            break
        if now >= next_sample:
            t = time.thread_time()
            sample()
            busy += time.thread_time() - t
            next_sample += SAMPLE_SECONDS
        if now >= next_tick:
            t = time.thread_time()
            tick()
            busy += time.thread_time() - t
            next_tick += GUARD_TICK_SECONDS
        time.sleep(max(0.0, min(next_sample, next_tick) - time.monotonic()))
    return busy / (time.monotonic() - start)


def measure(pids: Sequence[int], mb: int, ticks: int, seconds: float) -> List[Dict[str, object]]:
    """The figures for one tree."""
    size = len(pids)
    n = max(3, ticks // max(1, size // 10))  # fewer calls for the bigger trees
    rss_s = per_tick(lambda: rss_sum(pids), n)
    pss_s = per_tick(lambda: pss_sum(pids), max(3, n // 10))
    meter = TreeMeter()
    while meter.pass_seconds is None:  # one whole exact pass, as after the tree's first samples
        meter.sample(pids)
    meter_s = per_tick(lambda: meter.read(pids), n)
    label = f"tree of {size} ({mb} MB shared)"
    results: List[Dict[str, object]] = [
        {"name": f"{label}: RSS sum per tick", "value": round(rss_s * 1e6, 1), "unit": "us",
         "counted_mb": round(rss_sum(pids) / 2**20)},
        {"name": f"{label}: PSS sum (smaps_rollup) per tick", "value": round(pss_s * 1e6, 1),
         "unit": "us", "ratio": round(pss_s / rss_s, 2), "baseline": "RSS sum",
         "counted_mb": round(pss_sum(pids) / 2**20)},
        {"name": f"{label}: counted once, cheap tick (TreeMeter.read)",
         "value": round(meter_s * 1e6, 1), "unit": "us", "ratio": round(meter_s / rss_s, 2),
         "goal": METER_GOAL, "baseline": "RSS sum",
         "counted_mb": round((meter.read(pids) or 0) / 2**20)},
    ]
    if size <= 20:
        full_s = per_tick(lambda: full_info_sum(pids), max(3, n // 20), rounds=1)
        results.append({"name": f"{label}: psutil memory_full_info per tick",
                        "value": round(full_s * 1e6, 1), "unit": "us",
                        "ratio": round(full_s / rss_s, 2), "baseline": "RSS sum"})
    # Steady state, as the engine runs them: the old way (RSS sums) and the meter, once it knows
    # the tree (its first sample, a one-off for each new member, is left out).
    rss_share = loop_share(lambda: rss_sum(pids), lambda: rss_sum(pids), seconds)
    steady = TreeMeter()
    steady.sample(pids)
    share = loop_share(lambda: steady.read(pids), lambda: steady.sample(pids), seconds)
    results += [
        {"name": f"{label}: RSS sums at 20 ms ticks and 4 Hz samples, CPU share",
         "value": round(100 * rss_share, 3), "unit": "%"},
        {"name": f"{label}: TreeMeter at 20 ms ticks and 4 Hz samples, CPU share",
         "value": round(100 * share, 3), "unit": "%", "ratio": round(share / rss_share, 2),
         "baseline": "RSS sums"},
        {"name": f"{label}: PSS on every 20 ms tick would take",
         "value": round(100 * pss_s / GUARD_TICK_SECONDS, 2), "unit": "%"},
    ]
    return results


def run(sizes: Sequence[int], mb: int, ticks: int, seconds: float) -> List[Dict[str, object]]:
    results: List[Dict[str, object]] = []
    for size in sizes:
        pids = make_tree(size, mb)
        try:
            results += measure(pids, mb, ticks, seconds)
        finally:
            end_trees()
    return results


def main(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(description="tree memory: RSS sum against PSS, per tick")
    ap.add_argument("--mb", type=int, default=100, help="MB the tree's parent touches")
    ap.add_argument("--sizes", default="1,20,200", help="tree sizes (processes)")
    ap.add_argument("--ticks", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if not pss_available():
        print("bench_tree_memory: this system has no /proc/<pid>/smaps_rollup", file=sys.stderr)
        return 1
    try:
        sizes = [int(x) for x in args.sizes.split(",")]
    except ValueError:
        print("bench_tree_memory: --sizes takes numbers like 1,20,200", file=sys.stderr)
        return 2
    if any(s < 1 for s in sizes) or args.mb < 1 or args.ticks < 1 or args.seconds <= 0:
        print("bench_tree_memory: sizes, --mb, --ticks and --seconds must be positive",
              file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(1))
    try:
        results = run(sizes, args.mb, args.ticks, args.seconds)
    finally:
        end_trees()
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        for r in results:
            ratio = f"  ({r['ratio']}x {r['baseline']})" if "ratio" in r else ""
            counted = f"  [{r['counted_mb']} MB]" if "counted_mb" in r else ""
            print(f"{r['value']:>10} {r['unit']:<3} {r['name']}{ratio}{counted}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
