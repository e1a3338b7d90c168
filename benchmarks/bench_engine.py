"""The engine at rest: CPU share and RSS over a quiet period at the default sampling interval.

    python benchmarks/bench_engine.py [--seconds 60] [--json]

Goals: at most 0.3% of one core and 35 MB RSS (no numpy, no Qt in the engine). The figure is
the engine's own CPU time over the wall time it ran, measured from /proc by psutil, after a
warm-up, with no client connected.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from trayapp.config import get_paths  # noqa: E402
from trayapp.engine.client import EngineClient, EngineUnavailable  # noqa: E402

CPU_GOAL_PERCENT = 0.3
RSS_GOAL_MB = 35.0


def start_engine(home: Path, extra_env: dict | None = None,
                 args: tuple = ()) -> subprocess.Popen:
    """``headroom engine --stay ARGS`` on ``home``, once it answers a ping."""
    env = dict(os.environ, HEADROOM_HOME=str(home), **(extra_env or {}))
    proc = subprocess.Popen([sys.executable, "-m", "trayapp", "engine", "--stay", *args],
                            env=env, cwd=str(REPO), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    os.environ["HEADROOM_HOME"] = str(home)
    paths = get_paths()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with EngineClient(paths, timeout=2) as c:
                c.ping()
            return proc
        except EngineUnavailable:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("the engine did not start")


def measure(pid: int, seconds: float, windows: int = 3) -> dict:
    """CPU share in ``windows`` equal windows over ``seconds``; the median, so one burst of
    something else on the machine does not decide the figure. RSS at the end."""
    p = psutil.Process(pid)
    shares = []
    started = time.monotonic()
    for _ in range(windows):
        c0 = p.cpu_times()
        t0 = time.monotonic()
        time.sleep(seconds / windows)
        c1 = p.cpu_times()
        cpu = (c1.user - c0.user) + (c1.system - c0.system)
        shares.append(100.0 * cpu / (time.monotonic() - t0))
    rss = p.memory_info().rss
    return {"cpu_percent": statistics.median(shares), "rss_mb": rss / 2**20,
            "seconds": time.monotonic() - started}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="hr-bench-") as tmp:
        proc = start_engine(Path(tmp))
        try:
            time.sleep(args.warmup)
            m = measure(proc.pid, args.seconds)
        finally:
            proc.terminate()
            proc.wait(10)
    results = [
        {"name": "engine at rest: CPU share of one core", "value": round(m["cpu_percent"], 4),
         "unit": "%", "goal": CPU_GOAL_PERCENT,
         "ratio": round(m["cpu_percent"] / CPU_GOAL_PERCENT, 3)},
        {"name": "engine at rest: RSS", "value": round(m["rss_mb"], 1), "unit": "MB",
         "goal": RSS_GOAL_MB, "ratio": round(m["rss_mb"] / RSS_GOAL_MB, 3)},
    ]
    if args.json:
        print(json.dumps(results))
    else:
        print(f"engine at rest over {m['seconds']:.0f} s (default 1 s sampling, no clients; "
              "CPU: the median of three windows):")
        for r in results:
            print(f"  {r['name']}: {r['value']} {r['unit']} (goal {r['goal']} {r['unit']}, "
                  f"{r['ratio']:.2f}x of the goal)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
