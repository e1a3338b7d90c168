"""The tray: CPU share and RSS at rest, with the dashboard open, and with the jobs window open
on a running Keras job, measured one after the other in one run; and start to icon visible.

    python benchmarks/bench_tray.py [--seconds 60] [--starts 3] [--json]

Goals: at rest (every window closed; an engine in --demo mode pushing its status, the tray
redrawing its icon and tooltip) at most 0.3% of one core and 150 MB RSS; the dashboard open at
most 1.5%; the jobs window open on a running Keras job (its progress, curves and memory
updating) at most 3%; the icon visible in the tray at most 1.5 s after `headroom` starts with no
engine running.

On a virtual desktop (Xvfb with the trayer system tray; Debian packages xvfb trayer x11-utils)
the tray is the real `headroom --demo` and "visible" means its icon window is embedded in the
tray host. Without those tools the rest figures come from a tray on the offscreen platform and
the start figure is left out.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from trayapp.config import Paths, get_paths  # noqa: E402
from trayapp.engine.client import EngineClient, EngineError, EngineUnavailable  # noqa: E402

CPU_GOAL_PERCENT = 0.3  # every window closed
DASHBOARD_GOAL_PERCENT = 1.5
JOBS_GOAL_PERCENT = 3.0
KERAS_TRAIN = REPO / "tests" / "scripts" / "jobs" / "keras_train.py"
RSS_GOAL_MB = 150.0
START_GOAL_S = 1.5
SECOND_START_GOAL_S = 2.0
HAVE_DESKTOP = all(shutil.which(t) for t in ("Xvfb", "trayer", "xwininfo"))
_LINE = re.compile(r'^(\s*)(0x[0-9a-f]+) (?:".*?"|\(has no name\)): \((.*?)\)')
_CLIENT_MASK = ~0x1FFFFF


def paths_for(home: Path) -> Paths:
    os.environ["HEADROOM_HOME"] = str(home)
    return get_paths()


def wait_engine(paths: Paths, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with EngineClient(paths, timeout=2) as c:
                c.ping()
            return
        except EngineUnavailable:
            time.sleep(0.05)
    raise SystemExit("bench_tray: the engine did not start")


def shutdown_engine(paths: Paths) -> None:
    try:
        with EngineClient(paths, timeout=5) as c:
            c.shutdown(force=True)
    except (EngineUnavailable, EngineError):
        pass


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


class Desktop:
    """Xvfb with trayer on a free display."""

    def __init__(self) -> None:
        read_fd, write_fd = os.pipe()
        self.xvfb = subprocess.Popen(["Xvfb", "-displayfd", str(write_fd), "-screen", "0",
                                      "1280x800x24", "-nolisten", "tcp"], pass_fds=(write_fd,),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(write_fd)
        with os.fdopen(read_fd) as f:
            self.display = ":" + f.readline().strip()
        self.env = dict(os.environ, DISPLAY=self.display, QT_QPA_PLATFORM="xcb")
        self.env.pop("DBUS_SESSION_BUS_ADDRESS", None)
        self.trayer = subprocess.Popen(["trayer", "--edge", "top", "--align", "right",
                                        "--widthtype", "request", "--height", "32",
                                        "--transparent", "false"], env=self.env,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not self._hosts(self._tree()):
            time.sleep(0.05)

    def _tree(self) -> List[tuple]:
        out = subprocess.run(["xwininfo", "-root", "-tree"], env=self.env, capture_output=True,
                             text=True, timeout=10).stdout
        rows: List[tuple] = []
        stack: List[Any] = []
        for line in out.splitlines():
            m = _LINE.match(line)
            if not m:
                continue
            indent, wid = len(m.group(1)), int(m.group(2), 16)
            while stack and stack[-1][0] >= indent:
                stack.pop()
            rows.append((wid, m.group(3), stack[-1][1] if stack else None))
            stack.append((indent, wid))
        return rows

    @staticmethod
    def _hosts(rows: List[tuple]) -> set:
        return {wid & _CLIENT_MASK for wid, cls, _ in rows if "Trayer" in cls}

    def icon_embedded(self) -> bool:
        rows = self._tree()
        hosts = self._hosts(rows)
        return any('"headroom"' in cls and parent is not None and
                   (parent & _CLIENT_MASK) in hosts for _, cls, parent in rows)

    def close(self) -> None:
        stop(self.trayer)
        stop(self.xvfb)


def start_tray(home: Path, desktop: Optional[Desktop], window: str = "") -> subprocess.Popen:
    opened = ["--open", window] if window else []
    if desktop is not None:
        env = dict(desktop.env, HEADROOM_HOME=str(home))
        return subprocess.Popen([sys.executable, "-m", "trayapp", "--demo", *opened], env=env,
                                cwd=str(REPO), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    env = dict(os.environ, HEADROOM_HOME=str(home), QT_QPA_PLATFORM="offscreen",
               HEADROOM_BENCH_OPEN=window)
    return subprocess.Popen([sys.executable, __file__, "--child"], env=env, cwd=str(REPO),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def child() -> int:
    """A tray on the offscreen platform (no tray host there, so it is forced)."""
    from PySide6.QtWidgets import QApplication

    from trayapp.ui.app import HeadroomApp

    app = QApplication([sys.argv[0]])
    tray = HeadroomApp(get_paths(), demo=True, tray_available=True)
    tray.start()
    if os.environ.get("HEADROOM_BENCH_OPEN"):
        tray.open_window(os.environ["HEADROOM_BENCH_OPEN"])
    signal.signal(signal.SIGTERM, lambda *_: app.quit())
    from PySide6.QtCore import QTimer

    ticker = QTimer()
    ticker.timeout.connect(lambda: None)
    ticker.start(500)
    try:
        return int(app.exec())
    finally:
        tray.close()


def start_training(paths: Paths) -> str:
    """A Keras job that trains for longer than the measure (its progress every batch)."""
    with EngineClient(paths) as c:
        job = c.job_start({"script": str(KERAS_TRAIN), "args": ["200", "50", "0.05"],
                           "name": "bench-train"})
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            got = c.job_get(job.id)
            if got.epoch:
                return job.id
            if got.state not in ("starting", "running"):
                break
            time.sleep(0.2)
    raise SystemExit("bench_tray: the Keras job did not start training")


def at_rest(seconds: float, warmup: float, desktop: Optional[Desktop], window: str = "",
            training: bool = False) -> Dict[str, float]:
    """The tray's CPU share and RSS over ``seconds``, with ``window`` open (none: at rest) and,
    with ``training``, a Keras job running."""
    with tempfile.TemporaryDirectory(prefix="hr-bench-") as tmp:
        home = Path(tmp)
        paths = paths_for(home)
        engine = subprocess.Popen([sys.executable, "-m", "trayapp", "--demo", "engine", "--stay"],
                                  env=dict(os.environ, HEADROOM_HOME=str(home)), cwd=str(REPO),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        tray = None
        try:
            wait_engine(paths)
            if training:
                start_training(paths)
            tray = start_tray(home, desktop, window)
            time.sleep(warmup)
            if tray.poll() is not None:
                raise SystemExit(f"bench_tray: the tray exited with {tray.returncode}")
            p = psutil.Process(tray.pid)
            c0, t0 = p.cpu_times(), time.monotonic()
            time.sleep(seconds)
            c1, wall = p.cpu_times(), time.monotonic() - t0
            rss = p.memory_info().rss
            second = second_start(home, desktop, window or "jobs")
        finally:
            if tray is not None:
                stop(tray)
            shutdown_engine(paths)
            stop(engine)
    cpu = (c1.user - c0.user) + (c1.system - c0.system)
    return {"cpu_percent": 100.0 * cpu / wall, "rss_mb": rss / 2**20, "seconds": wall,
            "second_start_s": second}


def second_start(home: Path, desktop: Optional[Desktop], window: str) -> float:
    """Seconds until a second `headroom --open WINDOW` has been answered by the running tray
    and exited."""
    env = dict(desktop.env if desktop is not None else os.environ, HEADROOM_HOME=str(home))
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "trayapp", "--open", window], env=env,
                          cwd=str(REPO), capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise SystemExit(f"bench_tray: a second start failed: {done.stderr.strip()}")
    return time.monotonic() - t0


def start_times(starts: int, desktop: Desktop) -> Iterator[float]:
    """Seconds from starting `headroom --demo` (no engine running) to its icon in the tray;
    the first start warms the disk cache and is not counted."""
    for n in range(starts + 1):
        with tempfile.TemporaryDirectory(prefix="hr-bench-") as tmp:
            home = Path(tmp)
            paths = paths_for(home)
            t0 = time.monotonic()
            tray = start_tray(home, desktop)
            try:
                while not desktop.icon_embedded():
                    if time.monotonic() - t0 > 30 or tray.poll() is not None:
                        raise SystemExit("bench_tray: the icon did not show")
                    time.sleep(0.01)
                elapsed = time.monotonic() - t0
                wait_engine(paths)  # the tray started it: stop it before the folder goes
            finally:
                stop(tray)
                shutdown_engine(paths)
            if n:
                yield elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="how long the rest is measured")
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--starts", type=int, default=3, help="timed starts (after one warm-up)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child()
    desktop = Desktop() if HAVE_DESKTOP else None
    try:
        rest = at_rest(args.seconds, args.warmup, desktop)
        dashboard = at_rest(args.seconds, args.warmup, desktop, "dashboard")
        jobs = at_rest(args.seconds, args.warmup, desktop, "jobs", training=True)
        starts = list(start_times(args.starts, desktop)) if desktop is not None else []
    finally:
        if desktop is not None:
            desktop.close()
    where = "Xvfb + trayer" if desktop is not None else "offscreen platform, tray forced"
    results = [
        {"name": "tray at rest, every window closed: CPU share of one core",
         "value": round(rest["cpu_percent"], 4), "unit": "%", "goal": CPU_GOAL_PERCENT,
         "ratio": round(rest["cpu_percent"] / CPU_GOAL_PERCENT, 3)},
        {"name": "tray with the dashboard open: CPU share of one core",
         "value": round(dashboard["cpu_percent"], 4), "unit": "%",
         "goal": DASHBOARD_GOAL_PERCENT,
         "ratio": round(dashboard["cpu_percent"] / DASHBOARD_GOAL_PERCENT, 3)},
        {"name": "tray with the jobs window open on a training Keras job: CPU share of one core",
         "value": round(jobs["cpu_percent"], 4), "unit": "%", "goal": JOBS_GOAL_PERCENT,
         "ratio": round(jobs["cpu_percent"] / JOBS_GOAL_PERCENT, 3)},
        {"name": "a second start answered by the tray with the dashboard open (and exited)",
         "value": round(dashboard["second_start_s"], 3), "unit": "s",
         "goal": SECOND_START_GOAL_S,
         "ratio": round(dashboard["second_start_s"] / SECOND_START_GOAL_S, 3)},
        {"name": "tray at rest: RSS", "value": round(rest["rss_mb"], 1),
         "unit": "MB", "goal": RSS_GOAL_MB, "ratio": round(rest["rss_mb"] / RSS_GOAL_MB, 3)},
    ]
    if starts:
        median = statistics.median(starts)
        results.append({"name": "start to tray icon visible (median)",
                        "value": round(median, 3), "unit": "s", "goal": START_GOAL_S,
                        "ratio": round(median / START_GOAL_S, 3)})
    if args.json:
        print(json.dumps(results))
    else:
        print(f"tray ({where}), at rest over {rest['seconds']:.0f} s"
              + (f"; {len(starts)} timed starts: " + ", ".join(f"{s:.2f} s" for s in starts)
                 if starts else "; start time not measured (needs Xvfb, trayer, xwininfo)"))
        for r in results:
            print(f"  {r['name']}: {r['value']} {r['unit']} (goal {r['goal']} {r['unit']}, "
                  f"{r['ratio']:.2f}x of the goal)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
