"""The metrics exporter's cost to the engine: CPU time per minute with a scrape every 5 s
against the same engine without the exporter, and what one scrape costs.

    python benchmarks/bench_metrics.py [--seconds 180] [--json]

Three engines run side by side over the same minutes (so a burst of something else on the
machine falls on all): one without the exporter, one with `--metrics` on a free loopback port
that a scraper hits every 5 s, as Prometheus would, and a second one without it, a control
for the difference two engines make by themselves. Figures: each engine's CPU seconds per
minute over the whole run, their ratio (goal: at most 1.2x: the exporter does not slow the
loop), their RSS, and a scrape's wall time (median of 300, from this process) and CPU time in
the engine (300 scrapes back to back, less what the engine without the exporter spent in the
same time).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Tuple

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_engine import start_engine  # noqa: E402

from tests.prometheus_server import free_port  # noqa: E402

RATIO_GOAL = 1.2
SCRAPE_EVERY = 5.0
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def scrape(url: str) -> int:
    with _OPENER.open(url, timeout=10) as r:
        return len(r.read())


def cpu(p: psutil.Process) -> float:
    """The process's CPU seconds, every thread's, the ended ones' too (a scrape is served by a
    thread that then ends). In clock ticks (10 ms): hence whole runs, not short windows."""
    t = p.cpu_times()
    return t.user + t.system


def side_by_side(procs: List[psutil.Process], url: str, seconds: float) -> List[float]:
    """CPU seconds per minute of each engine over the same ``seconds``, with a scrape of
    ``url`` every 5 s."""
    stop = threading.Event()

    def scraper() -> None:
        while not stop.wait(SCRAPE_EVERY):
            scrape(url)

    thread = threading.Thread(target=scraper, daemon=True)
    thread.start()
    try:
        before, t0 = [cpu(p) for p in procs], time.monotonic()
        time.sleep(seconds)
        minutes = (time.monotonic() - t0) / 60
        return [(cpu(p) - b) / minutes for p, b in zip(procs, before)]
    finally:
        stop.set()
        thread.join(10)


def one_scrape(exporting: psutil.Process, url: str, idle_per_s: float,
               n: int = 300) -> Tuple[float, float, int]:
    """(median wall seconds, engine CPU seconds per scrape, bytes) over ``n`` scrapes."""
    walls = []
    size = 0
    c0, t0 = cpu(exporting), time.monotonic()
    for _ in range(n):
        s = time.perf_counter()
        size = scrape(url)
        walls.append(time.perf_counter() - s)
    spent = cpu(exporting) - c0 - idle_per_s * (time.monotonic() - t0)
    return statistics.median(walls), max(0.0, spent) / n, size


def results(plain: float, exporting: float, control: float, rss: Tuple[float, float],
            scrape_cost: Tuple[float, float, int]) -> List[Dict[str, Any]]:
    ratio = exporting / plain if plain > 0 else float("inf")
    noise = control / plain if plain > 0 else float("inf")
    wall, spent, size = scrape_cost
    return [
        {"name": "engine without the exporter: CPU per minute", "value": round(plain, 4),
         "unit": "s"},
        {"name": f"engine with the exporter, a scrape every {SCRAPE_EVERY:g} s: CPU per "
                 "minute", "value": round(exporting, 4), "unit": "s"},
        {"name": "the exporter's engine CPU against the engine without it (same minutes)",
         "value": round(ratio, 3), "unit": "x", "goal": RATIO_GOAL,
         "ratio": round(ratio / RATIO_GOAL, 3)},
        {"name": "control: a second engine without the exporter against the first (same "
                 "minutes; the difference two engines make by themselves)",
         "value": round(noise, 3), "unit": "x"},
        {"name": "engine RSS with the exporter against without", "value":
         round(rss[1] / rss[0], 3), "unit": "x"},
        {"name": f"one scrape, wall time at the scraper (median of 300, {size} bytes)",
         "value": round(wall * 1000, 2), "unit": "ms"},
        {"name": "one scrape, CPU time in the engine", "value": round(spent * 1000, 2),
         "unit": "ms"},
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=180.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    with tempfile.TemporaryDirectory(prefix="hr-bench-") as tmp:
        procs = [start_engine(Path(tmp) / "plain"),
                 start_engine(Path(tmp) / "exporting", args=("--metrics", str(port))),
                 start_engine(Path(tmp) / "control")]
        try:
            plain, exporting, control = (psutil.Process(p.pid) for p in procs)
            time.sleep(args.warmup)
            scrape(url)
            a, b, c = side_by_side([plain, exporting, control], url, args.seconds)
            rss = (plain.memory_info().rss / 2**20, exporting.memory_info().rss / 2**20)
            cost = one_scrape(exporting, url, a / 60)
        finally:
            for p in procs:
                p.terminate()
                p.wait(10)
    out = results(a, b, c, rss, cost)
    if args.json:
        print(json.dumps(out))
    else:
        for r in out:
            goal = f" (goal {r['goal']} {r['unit']})" if "goal" in r else ""
            print(f"{r['name']}: {r['value']} {r['unit']}{goal}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
