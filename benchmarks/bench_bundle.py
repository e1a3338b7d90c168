"""The installed app: the bundle's size and the frozen tray's start to icon, against the tray
started from source, in one run.

    python benchmarks/bench_bundle.py [--bundle DIR] [--skip-deb] [--starts 5] [--json]

Without ``--bundle`` it first builds the current source with ``packaging/build.py`` into a
scratch folder (the build time is a figure too). Goals: the unpacked bundle at most 150 MB
(10^6 bytes); the frozen tray's icon in the tray no later than the same tray started from
source (ratio at most 1.1, the noise of a few starts). Start to icon uses bench_tray's virtual
desktop (Xvfb with the trayer system tray; Debian packages xvfb trayer x11-utils): "visible"
means the icon window is embedded in the tray host. Starts alternate frozen / source so both
see the same machine; one warm-up each is not counted. Without those tools only the sizes are
measured.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_tray  # noqa: E402 - its virtual desktop and engine helpers

SIZE_GOAL_MB = 150.0
# No slower than the same tray from source, beyond the noise of a few starts.
START_RATIO_GOAL = 1.1
EXE = "headroom.exe" if sys.platform == "win32" else "headroom"


def tree_mb(path: Path) -> float:
    """MB (10^6 bytes) in the files under ``path`` (symbolic links as links, as they are
    installed)."""
    total = 0
    for p in path.rglob("*"):
        if p.is_symlink() or p.is_file():
            total += p.lstat().st_size
    return total / 1e6


def build(scratch: Path, skip_deb: bool) -> Dict[str, object]:
    cmd = [sys.executable, str(REPO / "packaging" / "build.py"), "--dist", str(scratch / "dist"),
           "--work", str(scratch / "work")]
    if skip_deb:
        cmd += ["--skip-deb", "--skip-installer"]
    t0 = time.monotonic()
    r = subprocess.run(cmd, cwd=str(REPO), capture_output=True, text=True)
    took = time.monotonic() - t0
    if r.returncode != 0:
        tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"bench_bundle: the build failed: {tail}")
    dist = scratch / "dist"
    installers = sorted(dist.glob("*.deb")) + sorted(dist.glob("*-setup.exe"))
    return {"bundle": dist / "headroom", "seconds": took,
            "installer": installers[0] if installers else None}


def start_to_icon(argv: Sequence[str], desktop: bench_tray.Desktop) -> float:
    """Seconds from starting ``argv`` (a tray, no engine running) to its icon in the tray."""
    with tempfile.TemporaryDirectory(prefix="hr-bench-") as tmp:
        home = Path(tmp)
        paths = bench_tray.paths_for(home)
        env = dict(desktop.env, HEADROOM_HOME=str(home))
        t0 = time.monotonic()
        tray = subprocess.Popen(list(argv), env=env, cwd=str(REPO),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while not desktop.icon_embedded():
                if time.monotonic() - t0 > 60 or tray.poll() is not None:
                    raise SystemExit(f"bench_bundle: no icon from {argv[0]}")
                time.sleep(0.01)
            elapsed = time.monotonic() - t0
            bench_tray.wait_engine(paths)  # the tray started one: stop it before the folder goes
        finally:
            bench_tray.stop(tray)
            bench_tray.shutdown_engine(paths)
    return elapsed


def start_times(frozen: Sequence[str], source: Sequence[str], starts: int
                ) -> Dict[str, List[float]]:
    desktop = bench_tray.Desktop()
    times: Dict[str, List[float]] = {"frozen": [], "source": []}
    try:
        for n in range(starts + 1):
            for kind, argv in (("frozen", frozen), ("source", source)):
                elapsed = start_to_icon(argv, desktop)
                if n:
                    times[kind].append(elapsed)
    finally:
        desktop.close()
    return times


def measure(bundle: Optional[Path], skip_deb: bool, starts: int) -> List[Dict[str, object]]:
    results: List[Dict[str, object]] = []
    scratch = None
    try:
        installer = None
        if bundle is None:
            scratch = Path(tempfile.mkdtemp(prefix="hr-bundle-"))
            built = build(scratch, skip_deb)
            bundle, installer = built["bundle"], built["installer"]  # type: ignore[assignment]
            results.append({"name": "build time (packaging/build.py"
                                    + (", bundle only)" if skip_deb else ", with installer)"),
                            "value": round(float(built["seconds"]), 1),  # type: ignore[arg-type]
                            "unit": "s"})
        assert bundle is not None
        exe = bundle / EXE
        if not exe.is_file():
            raise SystemExit(f"bench_bundle: no {EXE} in {bundle}")
        size = tree_mb(bundle)
        results.append({"name": "bundle size, unpacked", "value": round(size, 1),
                        "unit": "MB", "goal": SIZE_GOAL_MB,
                        "ratio": round(size / SIZE_GOAL_MB, 3)})
        if isinstance(installer, Path):
            results.append({"name": f"installer size ({installer.suffix})",
                            "value": round(installer.stat().st_size / 1e6, 1),
                            "unit": "MB"})
        if bench_tray.HAVE_DESKTOP and starts > 0:
            times = start_times([str(exe), "--demo"],
                                [sys.executable, "-m", "trayapp", "--demo"], starts)
            frozen, source = statistics.median(times["frozen"]), statistics.median(times["source"])
            goal = bench_tray.START_GOAL_S
            results += [
                {"name": "start to tray icon, frozen (median)", "value": round(frozen, 3),
                 "unit": "s", "goal": goal, "ratio": round(frozen / goal, 3)},
                {"name": "start to tray icon, from source (median)", "value": round(source, 3),
                 "unit": "s", "goal": goal, "ratio": round(source / goal, 3)},
                {"name": "start to tray icon: frozen / from source",
                 "value": round(frozen / source, 3), "unit": "x", "goal": START_RATIO_GOAL,
                 "ratio": round(frozen / source, 3)},
            ]
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    return results


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", type=Path, help="measure this bundle (dist/headroom) instead of "
                                                "building one")
    ap.add_argument("--skip-deb", action="store_true", help="build the bundle only")
    ap.add_argument("--starts", type=int, default=5, help="timed starts of each (after a warm-up)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    results = measure(args.bundle.resolve() if args.bundle else None, args.skip_deb, args.starts)
    if args.json:
        print(json.dumps(results))
    else:
        for r in results:
            goal = f" (goal {r['goal']} {r['unit']}, ratio {r['ratio']})" if "goal" in r else ""
            print(f"{r['name']}: {r['value']} {r['unit']}{goal}")
        if not bench_tray.HAVE_DESKTOP:
            print("start to icon not measured (needs Xvfb, trayer, xwininfo)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
