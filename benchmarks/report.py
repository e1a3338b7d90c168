"""Run every benchmark and write benchmarks/REPORT.md.

    benchmarks/run [--quick] [--only NAME ...] [--out benchmarks/REPORT.md]

Each benchmark is a script ``benchmarks/bench_*.py`` that prints, with ``--json``, a result or a
list of results ``{"name", "value", "unit", "ratio"?, "goal"?, "baseline"?}``; a ratio is always
measured in the same run as its baseline or floor. ``--quick`` shortens the long measurements
(for trying the runner; the published report uses the full lengths).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

# name -> (arguments for the full report, arguments for --quick)
BENCHMARKS: Dict[str, Tuple[List[str], List[str]]] = {
    "bench_tick": ([], ["--ticks", "500", "--rounds", "3"]),
    "bench_tree_memory": (["--seconds", "30"], ["--sizes", "1,20", "--seconds", "2"]),
    "bench_engine": (["--seconds", "60"], ["--seconds", "10"]),
    "bench_metrics": (["--seconds", "180"], ["--seconds", "30"]),
    "bench_flood": ([], ["--tries", "5"]),
    "bench_job_flood": ([], ["--seconds", "2"]),
    "bench_store": ([], ["--hours", "2"]),
    "bench_guard": ([], ["--quick"]),
    "bench_brake": ([], ["--quick"]),
    "bench_runner": ([], ["--quick"]),
    "bench_shrink": (["--rounds", "9"], ["--quick"]),
    "bench_forecast": ([], ["--quick"]),
    "bench_joblog": ([], ["--size-mb", "256"]),
    "bench_tray": (["--seconds", "60"], ["--seconds", "10"]),
    "bench_dashboard": ([], []),
    "bench_bundle": ([], []),
    "bench_kernel": ([], ["--quick"]),
}


def machine() -> Dict[str, str]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        import psutil

        mem = f"{psutil.virtual_memory().total / 2**30:.1f} GiB"
    except ImportError:
        pass
    return {"os": f"{platform.system()} {platform.release()}", "cpu": cpu,
            "cores": str(os.cpu_count()), "memory": mem,
            "python": platform.python_version(),
            "date": dt.datetime.now().strftime("%Y-%m-%d %H:%M")}


def run_one(name: str, args: List[str], timeout: float) -> Tuple[List[Dict[str, Any]], str]:
    script = HERE / f"{name}.py"
    if not script.exists():
        return [], "not present"
    started = time.monotonic()
    try:
        r = subprocess.run([sys.executable, str(script), "--json", *args], cwd=str(REPO),
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return [], f"timed out after {timeout:.0f} s"
    took = time.monotonic() - started
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        return [], f"failed (exit {r.returncode}): {last}"
    # The JSON is the last line that parses; benchmarks may print progress before it.
    lines = r.stdout.strip().splitlines()
    # The whole output, each tail that starts a JSON value (indented JSON after progress
    # lines), then single lines, last first.
    starts = ["\n".join(lines[i:]) for i, line in enumerate(lines) if line[:1] in "[{"]
    candidates = [r.stdout, *starts, *reversed(lines)]
    for text in candidates:
        try:
            data = json.loads(text)
        except ValueError:
            continue
        results = data if isinstance(data, list) else [data]
        results = [x for x in results if isinstance(x, dict) and "name" in x]
        if results:
            return results, f"ran in {took:.0f} s"
    return [], "printed no results as JSON"


def goal_on_value(res: Dict[str, Any]) -> bool:
    """A goal is either on the value itself (then the ratio is value / goal) or on the ratio
    against a baseline or floor (e.g. "at most 3x the floor")."""
    value, ratio, goal = res.get("value"), res.get("ratio"), res.get("goal")
    if ratio is None or not goal or not isinstance(value, (int, float)):
        return True
    return abs(float(ratio) - value / float(goal)) <= 0.02 * max(1.0, float(ratio))


def verdict(res: Dict[str, Any]) -> str:
    value, ratio, goal = res.get("value"), res.get("ratio"), res.get("goal")
    if goal is None or not isinstance(value, (int, float)):
        return ""
    if goal_on_value(res):
        ok = value <= float(goal)
    else:
        ok = ratio is not None and float(ratio) <= float(goal)
    if res.get("goal_min") is not None:  # a range: "1 ≤ x ≤ 1.15"
        ok = ok and value >= float(res["goal_min"])
    return "meets the goal" if ok else "misses the goal"


def goal_text(res: Dict[str, Any]) -> str:
    goal = res.get("goal")
    if goal is None:
        return ""
    if res.get("goal_min") is not None:
        return f"{fmt(res['goal_min'])} to {fmt(goal)} {res.get('unit', '')}".rstrip()
    if goal_on_value(res):
        return f"≤ {fmt(goal)} {res.get('unit', '')}".rstrip()
    return f"ratio ≤ {fmt(goal)}"


def fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)


def write_report(out: Path, results: Dict[str, Tuple[List[Dict[str, Any]], str]],
                 quick: bool) -> None:
    m = machine()
    lines = ["# Headroom benchmark report", "",
             f"Made by `benchmarks/run`{' --quick (shortened runs)' if quick else ''} on "
             f"{m['date']}.", "",
             f"Machine: {m['os']}, {m['cpu']}, {m['cores']} cores, {m['memory']} RAM, "
             f"Python {m['python']}; no GPU unless a figure says so.", "",
             "Every ratio is measured in the same run as its baseline, floor or goal.", "",
             "| benchmark | figure | value | goal | ratio | |",
             "|---|---|---|---|---|---|"]
    notes = []
    for name, (items, how) in results.items():
        if not items:
            notes.append(f"- `{name}`: {how}")
            continue
        for r in items:
            lines.append(f"| {name} | {r.get('name', '')} | {fmt(r.get('value'))} "
                         f"{r.get('unit', '')} | {goal_text(r)} | {fmt(r.get('ratio'))} | "
                         f"{verdict(r)} |")
    if notes:
        lines += ["", "Not measured in this run:", ""] + notes
    soak = HERE / "SOAK.md"
    if soak.exists():
        lines += ["", "## Soak (run by hand: `python benchmarks/soak.py`)", "",
                  soak.read_text().strip()]
    out.write_text("\n".join(lines) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description="Run the benchmarks and write the report.")
    ap.add_argument("--quick", action="store_true", help="shorter runs")
    ap.add_argument("--only", nargs="*", help="run only these benchmarks")
    ap.add_argument("--out", default=str(HERE / "REPORT.md"))
    ap.add_argument("--timeout", type=float, default=1800)
    args = ap.parse_args()
    # With --only, the other benchmarks' figures come from the last run (kept in out/).
    cache = HERE / "out" / "results.json"
    results: Dict[str, Tuple[List[Dict[str, Any]], str]] = {}
    if args.only and cache.exists():
        try:
            results = {k: (v[0], v[1]) for k, v in json.loads(cache.read_text()).items()}
        except (ValueError, TypeError, IndexError):
            results = {}
    for name, (full, quick) in BENCHMARKS.items():
        if args.only and name not in args.only:
            continue
        print(f"== {name}", flush=True)
        items, how = run_one(name, quick if args.quick else full, args.timeout)
        results[name] = (items, how)
        for r in items:
            print(f"   {r.get('name')}: {fmt(r.get('value'))} {r.get('unit', '')}"
                  f"{'  ratio ' + fmt(r.get('ratio')) if r.get('ratio') is not None else ''}")
        print(f"   ({how})", flush=True)
    results = {name: results[name] for name in BENCHMARKS if name in results}
    cache.parent.mkdir(exist_ok=True)
    cache.write_text(json.dumps(results, indent=1))
    write_report(Path(args.out), results, args.quick)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
