"""Soak: the engine at a fast sampling interval with job churn, for a long time (by hand, not CI).

    python benchmarks/soak.py [--minutes 30] [--interval 0.05] [--out benchmarks/SOAK.md]

Starts an engine on a temporary HEADROOM_HOME sampling every ``--interval`` seconds, keeps
launching short jobs (a plain Python script that allocates a little and ends) two at a time,
subscribes a client for the whole run, and records the engine's RSS every 10 s. Reports the RSS
growth per hour from a least-squares line over the second half of the run (the first half lets
caches, the SQLite page cache and the in-memory hour of history fill up).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import List, Tuple

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from trayapp.config import get_paths  # noqa: E402
from trayapp.engine.client import EngineClient, EngineUnavailable, Subscription  # noqa: E402

JOB = textwrap.dedent("""
    import time
    data = [bytearray(1 << 20) for _ in range(20)]  # 20 MiB
    for i in range(20):
        print("step", i, flush=True)
        time.sleep(0.1)
""")


def slope_per_hour(points: List[Tuple[float, float]]) -> float:
    n = len(points)
    if n < 2:
        return 0.0
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    num = sum((t - mt) * (v - mv) for t, v in points)
    den = sum((t - mt) ** 2 for t, _ in points) or 1.0
    return num / den * 3600.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--interval", type=float, default=0.05)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "SOAK.md"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="hr-soak-") as tmp:
        home = Path(tmp)
        (home / "config.toml").write_text(f"[engine]\nsample_interval = {args.interval}\n")
        script = home / "churn.py"
        script.write_text(JOB)
        os.environ["HEADROOM_HOME"] = str(home)
        paths = get_paths()
        engine = subprocess.Popen([sys.executable, "-m", "trayapp", "engine", "--stay"],
                                  cwd=str(REPO), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        try:
            client = EngineClient(paths, timeout=10)
            for _ in range(200):
                try:
                    client.ping()
                    break
                except EngineUnavailable:
                    time.sleep(0.05)
            stop = threading.Event()
            pushes = [0]

            def listen() -> None:
                try:
                    with Subscription(paths) as sub:
                        while not stop.is_set():
                            if sub.get(timeout=1):
                                pushes[0] += 1
                except EngineUnavailable:
                    pass  # the engine is stopped at the end of the run

            threading.Thread(target=listen, daemon=True).start()
            proc = psutil.Process(engine.pid)
            started = time.monotonic()
            end = started + args.minutes * 60
            samples: List[Tuple[float, float]] = []
            launched = 0
            next_sample = started
            while time.monotonic() < end:
                running = [j for j in client.jobs() if j.state in ("starting", "running")]
                if len(running) < 2:
                    client.job_start({"script": str(script), "python": sys.executable,
                                      "name": f"churn-{launched}"})
                    launched += 1
                if time.monotonic() >= next_sample:
                    samples.append((time.monotonic() - started, proc.memory_info().rss / 2**20))
                    next_sample += 10
                time.sleep(0.5)
            stop.set()
            cpu = proc.cpu_times()
        finally:
            engine.terminate()
            engine.wait(30)
    half = [p for p in samples if p[0] >= samples[-1][0] / 2]
    growth = slope_per_hour(half)
    text = (f"Soak of {args.minutes:g} min on {time.strftime('%Y-%m-%d')}: engine sampling every "
            f"{args.interval:g} s, {launched} jobs launched (two at a time), one subscribed client "
            f"({pushes[0]} pushes received).\n\n"
            f"- RSS: {samples[0][1]:.1f} MB after start, {samples[-1][1]:.1f} MB at the end, "
            f"peak {max(v for _, v in samples):.1f} MB\n"
            f"- RSS growth over the second half: {growth:+.2f} MB per hour\n"
            f"- engine CPU time: {cpu.user + cpu.system:.0f} s in {samples[-1][0]:.0f} s "
            f"({100 * (cpu.user + cpu.system) / max(1.0, samples[-1][0]):.1f}% of one core)\n"
            "\nThe engine keeps the last hour of samples in memory (and each job's own series), "
            "so in a run shorter than an hour part of the growth is that hour filling up.\n")
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
