"""How far a hog with a RAM budget gets past it: the kernel brake against the guard alone.

    python benchmarks/bench_brake.py [--budget-mb 512] [--rates 512,1024,2048] [--json]

A real engine, and a hog (tests/scripts/guard/hog.py, 8 MiB chunks, every page touched)
launched as its job with ``--ram-budget B`` at 0.5, 1 and 2 GiB/s, bounded by B + 1 GiB of its
own. Once with the kernel brake (``guard.kernel_brake = true``: the job's cgroup is limited to
B, its OOM killer off) and once with the guard alone (``false``: the guard pauses the job at
B, as it reads the tree's memory). For each run:

- the most its memory ever exceeded B: the peak of its resident set (``VmHWM``, the same
  instrument in both modes) less B; with the brake also its cgroup's own peak
  (``memory.max_usage_in_bytes``, what the limit holds) less B, and its OOM kills (goal 0);
- the time from B to held: from the first reading at or past B (its resident set, read every
  millisecond here) to the moment it grew no more (the kernel's hold, or the guard's pause);
- the CPU the held hog burns over the second after that (stalled in the kernel, or stopped).

Ratios: the guard alone's overshoot and time over the brake's, in the same run. Short: about
half a minute. Needs root and a writable cgroup v1 memory hierarchy for the brake (it says so
and measures the guard alone otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from trayapp.config import get_paths  # noqa: E402
from trayapp.engine.client import EngineClient, EngineUnavailable  # noqa: E402
from trayapp.jobs import cgroups  # noqa: E402

MiB = 1 << 20
PAGE = os.sysconf("SC_PAGE_SIZE")
HOG = str(REPO / "tests" / "scripts" / "guard" / "hog.py")
LIVE = {"starting", "running", "pausing", "paused", "parking", "stopping"}
STILL_SECONDS = 0.3  # grown no more for this long: held


def start_engine(home: Path, brake: bool) -> subprocess.Popen:
    (home / "config.toml").write_text(f"[guard]\nkernel_brake = {str(brake).lower()}\n")
    env = dict(os.environ, HEADROOM_HOME=str(home))
    proc = subprocess.Popen([sys.executable, "-m", "trayapp", "engine", "--stay"], env=env,
                            cwd=str(REPO), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.environ["HEADROOM_HOME"] = str(home)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with EngineClient(get_paths(), timeout=2) as c:
                c.ping()
            return proc
        except EngineUnavailable:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("the engine did not start")


def stop_engine(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


class Resident(threading.Thread):
    """Reads a process's resident set every millisecond: (time, bytes) rows."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.path = f"/proc/{pid}/statm"
        self.rows: List[Tuple[float, int]] = []
        self.last_growth = time.monotonic()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                with open(self.path) as f:
                    size = int(f.read().split()[1]) * PAGE
            except (OSError, ValueError, IndexError):
                return
            now = time.monotonic()
            if not self.rows or size > self.rows[-1][1] + PAGE:
                self.last_growth = now
            self.rows.append((now, size))
            time.sleep(0.001)


def peak_rss(pid: int) -> Optional[int]:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def cpu_seconds(pid: int) -> Optional[float]:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def held_at(rows: List[Tuple[float, int]], budget: int) -> Tuple[Optional[float], Optional[float]]:
    """(first time at or past ``budget``... or at its highest where it never got there, the
    time it last grew), from the resident rows."""
    if not rows:
        return None, None
    top = max(b for _, b in rows)
    mark = min(budget, top - 8 * MiB)
    reached = next((t for t, b in rows if b >= mark), None)
    last_growth = rows[0][0]
    for (_, b0), (t1, b1) in zip(rows, rows[1:]):
        if b1 > b0 + PAGE:
            last_growth = t1
    return reached, last_growth


def one_run(c: EngineClient, rate: int, budget_mb: int, brake: bool) -> Dict[str, Any]:
    budget = budget_mb * MiB
    job = c.job_start({"script": HOG, "python": sys.executable, "name": "hog",
                       "args": ["8", str(rate), str(budget_mb + 1024)],
                       "ram_budget_mb": budget_mb})
    job_id, pid = job.id, job.pid
    assert pid is not None, "a launched job has its pid"
    folder = Path(cgroups.detect(probe=False).memory_parent or "/nonexistent") / \
        f"{cgroups.PREFIX}{job_id}"
    sampler = Resident(pid)
    sampler.start()
    try:
        deadline = time.monotonic() + 60
        while True:
            rows = sampler.rows
            if rows and rows[-1][1] >= budget - 32 * MiB and \
                    time.monotonic() - sampler.last_growth >= STILL_SECONDS:
                break  # near B and grown no more for a while: held (kernel) or paused (guard)
            state = c.job_get(job_id).state
            if state not in LIVE:
                raise SystemExit(f"the hog ended ({state})")
            if time.monotonic() > deadline:
                raise SystemExit("the hog was not held in 60 s")
            time.sleep(0.05)
        sampler.done.set()
        sampler.join(2)
        cpu0 = cpu_seconds(pid)
        time.sleep(1.0)
        cpu1 = cpu_seconds(pid)
        peak = peak_rss(pid)
        record = c.job_get(job_id)
        cg_peak = oom_kill = None
        if brake:
            try:
                cg_peak = int((folder / "memory.max_usage_in_bytes").read_text())
                oom_kill = cgroups.parse_keyed(
                    (folder / "memory.oom_control").read_text()).get("oom_kill")
            except OSError:
                pass
    finally:
        sampler.done.set()
        try:
            c.job_action(job_id, "kill", reason="benchmark run over")
        except Exception:
            pass
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
        end = time.monotonic() + 10  # ended and its cgroups removed before the next run
        while time.monotonic() < end and c.job_get(job_id).state in LIVE:
            time.sleep(0.05)
    reached, last = held_at(sampler.rows, budget)
    return {"peak_over_bytes": None if peak is None else peak - budget,
            "cgroup_peak_over_bytes": None if cg_peak is None else cg_peak - budget,
            "oom_kill": oom_kill, "protection": record.protection,
            "state": record.state, "paused_by": record.paused_by,
            "ms_to_held": None if reached is None or last is None else
            max(0.0, (last - reached) * 1000.0),
            "cpu_held": None if cpu0 is None or cpu1 is None else cpu1 - cpu0}


def measure(rates: List[int], budget_mb: int) -> List[Dict[str, Any]]:
    offer = cgroups.detect(probe=False)
    modes = [True, False] if offer.brakes else [False]
    runs: Dict[Tuple[bool, int], Dict[str, Any]] = {}
    for brake in modes:
        with tempfile.TemporaryDirectory(prefix="hr-bench-brake-") as tmp:
            proc = start_engine(Path(tmp), brake)
            try:
                with EngineClient(get_paths(), timeout=60) as c:
                    time.sleep(0.5)
                    for rate in rates:
                        runs[(brake, rate)] = one_run(c, rate, budget_mb, brake)
                        time.sleep(0.5)
            finally:
                stop_engine(proc)
    out: List[Dict[str, Any]] = []
    if not offer.brakes:
        out.append({"name": f"the kernel brake is not available here ({offer.why}): the guard "
                            "alone measured", "value": 0, "unit": ""})
    for rate in rates:
        asked = f"{rate * MiB / 1e9:.2f} GB/s"
        alone = runs[(False, rate)]
        braked = runs.get((True, rate))
        for mode, r in (("brake", braked), ("guard alone", alone)):
            if r is None:
                continue
            out.append({"name": f"most memory past the budget ({asked}, {mode}): peak resident "
                                "set less B", "value": round((r["peak_over_bytes"] or 0) / 1e6, 2),
                        "unit": "MB", "state": r["state"], "protection": r["protection"]})
            out.append({"name": f"time from B to held ({asked}, {mode})",
                        "value": None if r["ms_to_held"] is None else round(r["ms_to_held"], 1),
                        "unit": "ms"})
            out.append({"name": f"CPU the held hog burns ({asked}, {mode})",
                        "value": None if r["cpu_held"] is None else round(r["cpu_held"], 3),
                        "unit": "s per s"})
        if braked is not None:
            out.append({"name": f"the brake: its cgroup's peak less B ({asked})",
                        "value": round((braked["cgroup_peak_over_bytes"] or 0) / 1e3, 1),
                        "unit": "kB", "goal": PAGE / 1e3, "oom_kill": braked["oom_kill"]})
            over_b = max(braked["peak_over_bytes"] or 0, PAGE)
            out.append({"name": f"overshoot past B, the guard alone over the brake ({asked})",
                        "value": round((alone["peak_over_bytes"] or 0) / over_b, 2),
                        "unit": "x", "ratio": round((alone["peak_over_bytes"] or 0) / over_b, 2)})
            ms_b = max(braked["ms_to_held"] or 0.0, 1.0)
            out.append({"name": f"time from B to held, the guard alone over the brake ({asked})",
                        "value": round((alone["ms_to_held"] or 0.0) / ms_b, 2), "unit": "x",
                        "ratio": round((alone["ms_to_held"] or 0.0) / ms_b, 2)})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget-mb", type=int, default=512)
    parser.add_argument("--rates", default="512,1024,2048", help="MiB/s, comma-separated")
    parser.add_argument("--quick", action="store_true", help="1 GiB/s only")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rates = [1024] if args.quick else [int(r) for r in args.rates.split(",") if r]
    results = measure(rates, args.budget_mb)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for r in results:
            value = "n/a" if r["value"] is None else f"{r['value']:g}"
            print(f"{r['name']}: {value} {r['unit']}".rstrip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
