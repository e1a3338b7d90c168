"""How well a job's log holds its cap against a job printing as fast as it can, and what the cap
costs it.

A job started from ``build_launch``'s plan (the runner, as the engine starts it) writes SIZE bytes
in 1000-byte lines to its log, capped at CAP, while the engine's log keeper (the same class, in
this process) looks at the log ten times a second (fifty while it trims). Two ways of writing:
``print()`` (through the runner's streams, which trim the log themselves every cap/16 bytes) and
``os.write(1, ...)`` (past Python's streams, like TensorFlow's C++ logs or a child process: only
the keeper trims). The job records the log's size before each write plus the line: the peak the
file reached (it is the only writer). The same print spew into an uncapped file under plain
``python`` is the baseline of the time ratio. Goals: the peak of the print spew at most 1.1 times
the cap, its time at most 1.5 times the uncapped one; the fd spew's peak is shown (it follows the
keeper's interval and the rate).

    python benchmarks/bench_joblog.py [--size-mb 1024] [--cap-mb 32] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trayapp.jobs.logcap import LogKeeper  # noqa: E402
from trayapp.jobs.options import JobSpec  # noqa: E402
from trayapp.jobs.plan import JobProcess, build_launch  # noqa: E402

MiB = 1 << 20
PEAK_GOAL = 1.1
TIME_GOAL = 1.5

SPEW = """
import os, sys
size, how, report = int(sys.argv[1]), sys.argv[2], sys.argv[3]
line = b"x" * 999 + b"\\n"
text = line.decode()
peak = 0
for _ in range(size // len(line)):
    peak = max(peak, os.fstat(1).st_size + len(line))
    if how == "print":
        sys.stdout.write(text)
    else:
        os.write(1, line)
with open(report, "w") as f:
    f.write(str(peak))
"""


def spew(folder: Path, size: int, cap: int, how: str, capped: bool) -> Dict[str, Any]:
    script = folder / "spew.py"
    script.write_text(SPEW)
    log, report = folder / f"log-{how}-{capped}", folder / "peak"
    log.write_bytes(b"")
    if capped:
        plan = build_launch(JobSpec(script=str(script), args=(str(size), how, str(report)),
                                    python=sys.executable, cwd=str(folder)),
                            base_env=dict(os.environ), process=JobProcess(log_max_bytes=cap),
                            log_path=str(log))
        argv, env = list(plan.argv), plan.env
    else:
        argv = [sys.executable, str(script), str(size), how, str(report)]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
    keeper = LogKeeper(lambda: [(str(log), cap)] if capped else [])
    keeper.start()
    started = time.perf_counter()
    with open(log, "ab") as out:
        rc = subprocess.run(argv, env=env, cwd=str(folder), stdin=subprocess.DEVNULL,
                            stdout=out, stderr=subprocess.STDOUT).returncode
    seconds = time.perf_counter() - started
    keeper.close()
    if rc != 0:
        raise RuntimeError(f"the {how} spew exited with {rc}")
    return {"seconds": seconds, "peak": int(report.read_text()), "final": log.stat().st_size}


def run(size: int, cap: int) -> List[Dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="bench-joblog-") as tmp:
        folder = Path(tmp)
        plain = spew(folder, size, cap, "print", capped=False)
        printed = spew(folder, size, cap, "print", capped=True)
        raw = spew(folder, size, cap, "write", capped=True)
    return [
        {"name": "print spew: peak log size / cap", "value": round(printed["peak"] / cap, 3),
         "unit": "x", "goal": PEAK_GOAL,
         "detail": f"{printed['peak'] / MiB:.1f} MiB peak, {printed['final'] / MiB:.1f} MiB at "
                   f"the end, {size / MiB:.0f} MiB printed, cap {cap / MiB:.0f} MiB"},
        {"name": "print spew: time capped / uncapped", "value": round(printed["seconds"], 3),
         "unit": "s", "ratio": round(printed["seconds"] / plain["seconds"], 3),
         "baseline": round(plain["seconds"], 3), "goal": TIME_GOAL},
        {"name": "fd spew (past Python): peak log size / cap",
         "value": round(raw["peak"] / cap, 3), "unit": "x",
         "detail": f"{raw['peak'] / MiB:.1f} MiB peak, {raw['final'] / MiB:.1f} MiB at the end, "
                   f"{size / MiB / raw['seconds']:.0f} MiB/s"},
    ]


def main(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(description="a job's log cap against a fast spew")
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--cap-mb", type=int, default=32)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.size_mb < 1 or args.cap_mb < 1:
        print("bench_joblog: --size-mb and --cap-mb must be at least 1", file=sys.stderr)
        return 2
    results = run(args.size_mb * MiB, args.cap_mb * MiB)
    if args.json:
        print(json.dumps(results))
    else:
        for r in results:
            extra = f" (ratio {r['ratio']}, goal {r['goal']})" if "ratio" in r else \
                f" (goal {r['goal']})" if "goal" in r else ""
            print(f"{r['name']}: {r['value']} {r['unit']}{extra}")
            if r.get("detail"):
                print(f"    {r['detail']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
