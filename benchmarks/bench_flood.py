"""`headroom status` during floods of connections: answered, and how fast.

A real engine; `headroom status --json` (the real command, a new process each time, as a user
runs it) is timed at rest and then during each flood of tests/scripts/flood.py: 64
authenticated connections held idle, 200 unauthenticated clients reconnecting in a loop, 200
connections stalled half-way through a message (half in the handshake, half authenticated, in a
request), and 200 + 200 of the last two on a job's channel. Each figure: the median, 95th
percentile and maximum time to an answer, the share not answered (goal: none), each against
the goal of 1 s, and the median against the median at rest measured in the same run. The
engine's CPU share during each flood is shown too.

    python benchmarks/bench_flood.py [--tries 20] [--json]
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
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_engine import start_engine  # noqa: E402

from trayapp.config import get_paths  # noqa: E402
from trayapp.engine.client import EngineClient  # noqa: E402

GOAL_S = 1.0
FLOOD = str(REPO / "tests" / "scripts" / "flood.py")
TICKER = str(REPO / "tests" / "scripts" / "jobs" / "ticker.py")


@contextmanager
def flood(address: str, kind: str, count: int, keyfile: Optional[str]) -> Iterator[None]:
    argv = [sys.executable, FLOOD, kind, address, str(count), "600"]
    if keyfile:
        argv.append(keyfile)
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        ready = proc.stdout.readline().split()
        if ready[:1] != ["ready"] or int(ready[1]) < count:
            raise SystemExit(f"the {kind} flood did not start: {ready}")
        time.sleep(1.0)  # let it settle into its loop
        yield
        proc.stdin.close()
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for f in (proc.stdin, proc.stdout):
            if f is not None:
                f.close()


def time_status(home: Path, tries: int) -> Dict[str, Any]:
    """Run the real command ``tries`` times: the times of those answered by the engine."""
    env = dict(os.environ, HEADROOM_HOME=str(home), PYTHONPATH=str(REPO))
    times: List[float] = []
    unanswered = 0
    for _ in range(tries):
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "trayapp", "status", "--json"], env=env,
                           cwd=str(REPO), capture_output=True, text=True, timeout=120)
        took = time.perf_counter() - t0
        try:
            running = r.returncode == 0 and json.loads(r.stdout)["engine"]["running"]
        except (ValueError, KeyError, TypeError):
            running = False
        if running:
            times.append(took)
        else:
            unanswered += 1
    return {"times": times, "unanswered": unanswered, "tries": tries}


def p95(values: List[float]) -> Optional[float]:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tries", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    results: List[Dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="hr-bench-") as tmp:
        home = Path(tmp)
        proc = start_engine(home)
        engine = psutil.Process(proc.pid)
        paths = get_paths()
        job_id = None
        try:
            with EngineClient(paths) as c:
                job_id = c.job_start({"script": TICKER, "args": ["0", "0.2"],
                                      "name": "ticker"}).id
                deadline = time.monotonic() + 30
                while not c.job_get(job_id).connected and time.monotonic() < deadline:
                    time.sleep(0.1)
            time_status(home, 2)  # warm: the first run of a command reads its files cold
            control, key = paths.control_address, str(paths.key_file)
            job = paths.job_address(job_id)
            conditions: List[Tuple[str, List[Tuple[str, str, int, Optional[str]]]]] = [
                ("at rest", []),
                ("64 idle authenticated connections", [(control, "idle", 64, key)]),
                ("200 unauthenticated clients reconnecting", [(control, "reconnect", 200, key)]),
                ("200 connections stalled mid-message", [(control, "stall", 200, key)]),
                ("a job's channel: 200 reconnecting + 200 stalled",
                 [(job, "reconnect", 200, None), (job, "stall", 200, None)]),
            ]
            rest_median = None
            for label, floods in conditions:
                with ExitStack() as stack:
                    for address, kind, count, keyfile in floods:
                        stack.enter_context(flood(address, kind, count, keyfile))
                    c0, t0 = engine.cpu_times(), time.monotonic()
                    m = time_status(home, args.tries)
                    c1, t1 = engine.cpu_times(), time.monotonic()
                cpu = 100.0 * ((c1.user - c0.user) + (c1.system - c0.system)) / (t1 - t0)
                times = m["times"]
                median = statistics.median(times) if times else None
                if rest_median is None:
                    rest_median = median
                for stat, value in (("median", median), ("95th percentile", p95(times)),
                                    ("max", max(times) if times else None)):
                    results.append({"name": f"status, {label}: {stat}",
                                    "value": None if value is None else round(value, 3),
                                    "unit": "s", "goal": GOAL_S,
                                    "ratio": None if value is None else round(value / GOAL_S, 3)})
                results.append({"name": f"status, {label}: not answered",
                                "value": m["unanswered"], "unit": f"of {m['tries']}",
                                "goal": 0})
                if label != "at rest" and median is not None and rest_median:
                    results.append({"name": f"status, {label}: median / median at rest",
                                    "value": round(median / rest_median, 3), "unit": "x"})
                results.append({"name": f"engine CPU, {label}", "value": round(cpu, 1),
                                "unit": "% of a core"})
        finally:
            if job_id is not None:
                try:
                    with EngineClient(paths) as c:
                        c.job_action(job_id, "kill")
                except Exception:  # the engine's end below ends nothing else
                    pass
            proc.terminate()
            proc.wait(10)
    if args.json:
        print(json.dumps(results))
    else:
        for r in results:
            goal = f" (goal {r['goal']} {r['unit']})" if "goal" in r else ""
            print(f"  {r['name']}: {r['value']} {r['unit']}{goal}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
