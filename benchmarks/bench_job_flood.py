"""A job flooding its own channel: how many messages a second the engine takes from one job
before its loop slows, and what the flood costs the engine's answers and its ticks.

    python benchmarks/bench_job_flood.py [--seconds 5] [--json]

One engine, one job whose script silences its runner (tests/scripts/jobs/never_reads.py quiet);
this process then speaks for the job on its channel, with its key, as any script of the job
could. For each offered rate (progress messages a second, the last one as fast as one
connection sends), over the same length of time: the messages the engine took a second (the
rest are dropped unread and counted, ``runner_link.MESSAGES_PER_SECOND``), the slowest
``status`` answer and the longest gap between the engine's memory samples, each as a ratio to
the same figure with no flood, measured in the same run. Goals: status and sample gaps at most
2x the quiet figures at every rate, the flood unbounded included.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Client
from pathlib import Path
from typing import Any, Dict, List, Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_engine import start_engine  # noqa: E402

from trayapp.config import get_paths  # noqa: E402
from trayapp.engine.client import EngineClient  # noqa: E402
from trayapp.jobs.record import JobRecord  # noqa: E402
from trayapp.jobs.runner_link import MESSAGES_PER_SECOND  # noqa: E402

NEVER_READS = str(REPO / "tests" / "scripts" / "jobs" / "never_reads.py")
RATES: List[Optional[float]] = [100.0, 500.0, 2000.0, None]  # None: as fast as it goes
GOAL = 2.0


def flood(address: str, key: bytes, rate: Optional[float], seconds: float) -> int:
    """Send progress messages at ``rate`` a second (None: flat out) for ``seconds``; how many
    were sent."""
    conn = Client(address, family="AF_UNIX", authkey=key)
    sent, start = 0, time.monotonic()
    try:
        while (now := time.monotonic()) - start < seconds:
            conn.send_bytes(json.dumps({"type": "progress", "epoch": 1, "epochs": 2,
                                        "step": sent % 1000, "steps": 1000}).encode())
            sent += 1
            if rate is not None:
                ahead = start + sent / rate - now
                if ahead > 0:
                    time.sleep(ahead)
    finally:
        conn.close()
    return sent


def watch(paths: Any, job_id: str, seconds: float, rate: Optional[float], address: str,
          key: bytes) -> Dict[str, Any]:
    """The slowest status answer and the longest gap between samples over ``seconds``, with a
    flood at ``rate`` (0: none) meanwhile."""
    sent: List[int] = []
    flooder = None
    with EngineClient(paths, timeout=30) as c:
        dropped0 = c.job_get(job_id).dropped_fields
    t0 = time.time()
    if rate != 0:
        flooder = threading.Thread(target=lambda: sent.append(flood(address, key, rate,
                                                                    seconds)))
        flooder.start()
    slowest, start = 0.0, time.monotonic()
    while time.monotonic() - start < seconds:
        t = time.monotonic()
        with EngineClient(paths, timeout=30) as c:
            c.status()
        slowest = max(slowest, time.monotonic() - t)
        time.sleep(0.1)
    if flooder is not None:
        flooder.join()
    time.sleep(1.0)  # what was sent is read by now
    with EngineClient(paths, timeout=30) as c:
        times = c.history(t0).series["mem.available"].t
        # Over the rate is dropped unread: counted when the next message is taken.
        c_job = c.job_get(job_id)
    gaps = [b - a for a, b in zip(times, times[1:]) if a >= t0]
    n = sent[0] if sent else 0
    dropped = c_job.dropped_fields - dropped0
    return {"rate": rate, "sent_per_s": n / seconds, "taken_per_s": max(0, n - dropped) / seconds,
            "status_s": slowest, "gap_s": max(gaps) if gaps else None}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        proc = start_engine(home)
        job: Optional[JobRecord] = None
        try:
            paths = get_paths()
            marker = home / "quiet"
            with EngineClient(paths, timeout=30) as c:
                job = c.job_start({"script": NEVER_READS, "args": [str(marker), "quiet"],
                                   "name": "flood"})
            deadline = time.monotonic() + 60
            while not marker.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            key = (paths.jobs_dir / job.id / "key").read_bytes()
            address = paths.job_address(job.id)
            quiet = watch(paths, job.id, args.seconds, 0, address, key)
            rows = [watch(paths, job.id, args.seconds, r, address, key) for r in RATES]
        finally:
            if job is not None:  # an engine does not end its jobs: this one would sleep on for good
                try:
                    with EngineClient(paths, timeout=30) as c:
                        c.job_action(job.id, "kill")
                except Exception as e:  # the engine gone: the job's group by hand
                    print(f"could not end the job through the engine ({e}); killing it")
                    if job.pid:  # never 0: that would be this process's own group
                        os.killpg(job.pid, signal.SIGKILL)
            proc.terminate()
            proc.wait(30)
    for row in rows:
        row["status_ratio"] = row["status_s"] / max(quiet["status_s"], 1e-3)
        row["gap_ratio"] = (row["gap_s"] or 0.0) / max(quiet["gap_s"] or 1.0, 1e-3)
    ok = all(r["status_ratio"] <= GOAL and r["gap_ratio"] <= GOAL for r in rows)
    if args.json:  # benchmarks/report.py's rows: a ratio against the quiet engine, its goal
        results: List[Dict[str, Any]] = []
        for r in rows:
            offered = "flat out" if r["rate"] is None else f"{r['rate']:.0f}/s"
            results.append({"name": f"job flood {offered}: slowest status / quiet",
                            "value": round(r["status_ratio"], 3), "unit": "x", "goal": GOAL})
            results.append({"name": f"job flood {offered}: longest sample gap / quiet",
                            "value": round(r["gap_ratio"], 3), "unit": "x", "goal": GOAL})
            results.append({"name": f"job flood {offered}: messages taken a second",
                            "value": round(r["taken_per_s"]), "unit": "/s"})
        print(json.dumps(results))
        return
    print(f"quiet: slowest status {quiet['status_s'] * 1000:.1f} ms, "
          f"longest sample gap {quiet['gap_s'] or 0:.2f} s")
    for r in rows:
        offered = "flat out" if r["rate"] is None else f"{r['rate']:.0f}/s"
        print(f"offered {offered:>9}: sent {r['sent_per_s']:8.0f}/s, taken "
              f"{r['taken_per_s']:6.0f}/s (bound {MESSAGES_PER_SECOND:.0f}); status "
              f"{r['status_ratio']:.2f}x, sample gap {r['gap_ratio']:.2f}x the quiet figures")
    print("meets the goal" if ok else f"misses the goal (<= {GOAL}x)")


if __name__ == "__main__":
    main()
