#!/usr/bin/env python3
"""Screenshots of the tray icon, its menu and the dashboard in demo mode, for the README.

    .venv/bin/python scripts/screenshots.py [--out docs/screenshots] [--seconds 60]

Runs `headroom --demo` on a virtual desktop (Xvfb with the trayer system tray) with its own
state folder, trains a small Keras model under it (a plain Python loop when TensorFlow is not
installed), raises the warning threshold so the guard warns, and saves tray.png, menu.png,
dashboard.png, launch.png, jobs.png and settings.png. Needs the Debian packages xvfb, trayer,
xdotool, x11-utils, x11-xserver-utils and imagemagick.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple, TypeVar

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from trayapp.config import get_paths  # noqa: E402
from trayapp.engine.client import EngineClient, EngineError, EngineUnavailable  # noqa: E402

TOOLS = {"Xvfb": "xvfb", "trayer": "trayer", "xdotool": "xdotool", "xwininfo": "x11-utils",
         "import": "imagemagick", "convert": "imagemagick", "xsetroot": "x11-xserver-utils"}
SCREEN = (1280, 800)
T = TypeVar("T")

TRAINING = '''"""A small Keras model on random data, slowed down so progress can be watched."""
import time
import keras
import numpy as np

class Slow(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.04)

rng = np.random.default_rng(0)
x = rng.normal(size=(4000, 32)).astype("float32")
y = (x.sum(axis=1, keepdims=True) > 0).astype("float32")
model = keras.Sequential([keras.Input(shape=(32,)), keras.layers.Dense(64, activation="relu"),
                          keras.layers.Dense(1, activation="sigmoid")])
model.compile(optimizer="adam", loss="binary_crossentropy")
import sys
epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 40
model.fit(x, y, batch_size=32, epochs=epochs, verbose=0, callbacks=[Slow()])
'''
LOOP = '''"""A stand-in job when TensorFlow is not installed: a growing list, printed progress."""
import time
data = []
for i in range(100000):
    data.append(bytearray(256 * 1024))
    print("step", i, flush=True)
    time.sleep(0.5)
'''

_LINE = re.compile(r'^\s*(0x[0-9a-f]+) (?:"(.*?)"|\(has no name\)): \((.*?)\)\s+(\d+)x(\d+)'
                   r'[+-]-?\d+[+-]-?\d+\s+\+(-?\d+)\+(-?\d+)')


def windows(env: Dict[str, str]) -> List[Tuple[int, str, str, int, int, int, int]]:
    """(id, name, class, width, height, x, y) of every window."""
    out = subprocess.run(["xwininfo", "-root", "-tree"], env=env, capture_output=True,
                         text=True, timeout=10).stdout
    found = []
    for line in out.splitlines():
        m = _LINE.match(line)
        if m:
            found.append((int(m.group(1), 16), m.group(2) or "", m.group(3), int(m.group(4)),
                          int(m.group(5)), int(m.group(6)), int(m.group(7))))
    return found


def window_type(env: Dict[str, str], wid: int) -> str:
    return subprocess.run(["xprop", "-id", hex(wid), "_NET_WM_WINDOW_TYPE"], env=env,
                          capture_output=True, text=True, timeout=10).stdout


def viewable(env: Dict[str, str], wid: int) -> bool:
    return "IsViewable" in subprocess.run(["xwininfo", "-id", hex(wid)], env=env,
                                          capture_output=True, text=True, timeout=10).stdout


def wait_for(what: str, probe: Callable[[], Optional[T]], timeout: float = 30.0) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.2)
    raise SystemExit(f"screenshots: no {what} after {timeout:.0f} s")


def shot(env: Dict[str, str], dest: Path, crop: Optional[Tuple[int, int, int, int]] = None,
         scale: int = 1, window: Optional[int] = None) -> None:
    raw = dest.with_suffix(".raw.png")
    target = ["-window", hex(window)] if window else ["-window", "root"]
    subprocess.run(["import", *target, str(raw)], env=env, check=True, timeout=30)
    args = ["convert", str(raw)]
    if crop:
        w, h, x, y = crop
        args += ["-crop", f"{w}x{h}+{x}+{y}", "+repage"]
    if scale > 1:
        args += ["-filter", "point", "-resize", f"{scale * 100}%"]
    subprocess.run([*args, str(dest)], check=True, timeout=30)
    raw.unlink()
    print(f"screenshots: wrote {dest}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "docs" / "screenshots"),
                        help="folder for tray.png, menu.png and dashboard.png")
    parser.add_argument("--seconds", type=float, default=60.0,
                        help="how long the job runs before the pictures are taken")
    args = parser.parse_args()
    missing = sorted({pkg for tool, pkg in TOOLS.items() if shutil.which(tool) is None})
    if missing:
        print(f"screenshots: install the Debian packages {' '.join(missing)}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="headroom-shots-"))
    home = work / "home"
    env = dict(os.environ, HEADROOM_HOME=str(home), QT_QPA_PLATFORM="xcb")
    env.pop("DBUS_SESSION_BUS_ADDRESS", None)  # XEmbed, which trayer speaks
    os.environ["HEADROOM_HOME"] = str(home)
    paths = get_paths()
    procs: List[subprocess.Popen] = []
    read_fd, write_fd = os.pipe()
    procs.append(subprocess.Popen(["Xvfb", "-displayfd", str(write_fd), "-screen", "0",
                                   f"{SCREEN[0]}x{SCREEN[1]}x24", "-nolisten", "tcp"],
                                  pass_fds=(write_fd,), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL))
    os.close(write_fd)
    try:
        with os.fdopen(read_fd) as f:
            env["DISPLAY"] = ":" + f.readline().strip()
        # A desktop-like colour, so the pictures do not float on black.
        subprocess.run(["xsetroot", "-solid", "#5a6b7b"], env=env, check=True, timeout=10)
        procs.append(subprocess.Popen(["trayer", "--edge", "top", "--align", "right",
                                       "--widthtype", "percent", "--width", "100",
                                       "--height", "28",
                                       "--transparent", "true", "--alpha", "0",
                                       "--tint", "0x2b2b2b"],
                                      env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
        wait_for("tray host", lambda: [w for w in windows(env) if "Trayer" in w[2]])
        log = open(work / "tray.log", "wb")
        procs.append(subprocess.Popen([sys.executable, "-m", "trayapp", "--demo"], env=env,
                                      cwd=str(REPO), stdout=log, stderr=subprocess.STDOUT))
        icon = wait_for("tray icon", lambda: next(
            (w for w in windows(env) if '"headroom"' in w[2] and w[3] <= 64 and w[4] <= 64
             and w[6] < 40 and viewable(env, w[0])), None))
        client = wait_for("engine", lambda: _client(paths))
        script = work / "train.py"
        has_tf = importlib.util.find_spec("keras") is not None
        script.write_text(TRAINING if has_tf else LOOP)
        if has_tf:
            # A day of work in small: two short runs of "train" that end, a notebook-sized
            # sweep beside the long one, so the pictures show several jobs.
            for _ in range(2):
                client.job_start({"script": str(script), "args": ["1"], "name": "train"})
            client.job_start({"script": str(script), "args": ["40"],
                              "name": "sweep_lr_0.001_bs_32"})
        job = client.job_start({"script": str(script), "name": "mnist-demo" if has_tf
                                else "loop-demo"})
        print(f"screenshots: job {job['id']} started; waiting {args.seconds:.0f} s")
        time.sleep(args.seconds * 0.7)
        # A threshold above what is free now, so the guard warns (icon, banner, shaded span).
        memory = client.status().memory
        assert memory is not None, "the engine reads no memory"
        avail = memory.available_bytes / memory.total_bytes * 100
        # No notification balloon over the tray in the pictures (the banner says it all).
        client.config_set("ui.notifications", False)
        client.config_set("guard.warn_available", f"{min(99, int(avail) + 8)}%")
        time.sleep(args.seconds * 0.3)

        cx, cy = icon[5] + icon[3] // 2, icon[6] + icon[4] // 2
        shot(env, out / "tray.png", crop=(96, 30, SCREEN[0] - 96, 0), scale=4)
        subprocess.run(["xdotool", "mousemove", str(cx), str(cy), "click", "3"], env=env,
                       check=True)
        popup = wait_for("menu", lambda: next(
            (w for w in windows(env) if '"headroom"' in w[2] and w[3] >= 100 and w[4] >= 100
             and viewable(env, w[0]) and "POPUP_MENU" in window_type(env, w[0])), None),
            timeout=10)
        # Open the Jobs submenu (the third entry) for the picture.
        subprocess.run(["xdotool", "mousemove", str(popup[5] + 30), str(popup[6] + 54)],
                       env=env, check=True)
        time.sleep(1.5)
        shot(env, out / "menu.png", crop=(620, 260, SCREEN[0] - 620, 0))
        subprocess.run(["xdotool", "key", "Escape", "key", "Escape"], env=env, check=True)
        time.sleep(0.5)
        subprocess.run(["xdotool", "mousemove", str(cx), str(cy), "click", "1"], env=env,
                       check=True)
        dash = wait_for("dashboard", lambda: next(
            (w for w in windows(env) if "simulated GPUs" in w[1] and w[3] >= 600
             and viewable(env, w[0])), None), timeout=20)
        time.sleep(3)
        # Point at the RAM timeline so the readout and the cursor line show.
        subprocess.run(["xdotool", "mousemove", str(dash[5] + int(dash[3] * 0.8)),
                        str(dash[6] + 160)], env=env, check=True)
        time.sleep(1.0)
        shot(env, out / "dashboard.png", window=dash[0])
        shoot_windows(env, out, paths, script)  # launch.png, jobs.png, settings.png (below)
        if os.environ.get("HEADROOM_SHOTS_SCREEN"):
            shot(env, out / "screen.png")
        client.close()
        return 0
    finally:
        try:
            with EngineClient(paths, timeout=5) as c:
                c.shutdown(force=True)
        except (EngineUnavailable, EngineError):
            pass
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(work, ignore_errors=True)


# -- The launch dialog, the jobs window and the settings dialog -------------------------------

# (name for --open, words in the window title, picture, seconds to let it fill in)
WINDOW_SHOTS = (("launch", "Launch training", "launch.png", 12.0),
                ("jobs", "Jobs", "jobs.png", 4.0),
                ("settings", "Settings", "settings.png", 3.0))


def shoot_windows(env: Dict[str, str], out: Path, paths, script: Path) -> None:  # type: ignore
    """Open each window in the running tray (a second ``headroom --open NAME`` asks the first)
    and save a picture of it. The launch dialog opens on the demo job's script, as it does on
    the script launched last; it is given time to probe the interpreters."""
    from trayapp.jobs.options import JobSpec, MemoryOptions
    from trayapp.ui.launch import RECENT_FILE, RecentLaunches

    spec = JobSpec(script=str(script), args=("--epochs", "40"), name="mnist-demo",
                   options=MemoryOptions(gpus=(0,), vram_limit_mb=6144), ram_budget_mb=8192,
                   checkpoint_dir=str(script.parent / "checkpoints"))
    RecentLaunches(paths.data_dir / RECENT_FILE).remember(spec.to_json())
    for name, words, picture, settle in WINDOW_SHOTS:
        subprocess.run([sys.executable, "-m", "trayapp", "--demo", "--open", name], env=env,
                       cwd=str(REPO), check=True, timeout=60, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        found = wait_for(f"{name} window", lambda words=words: next(
            (w for w in windows(env) if words in w[1] and "Headroom" in w[1] and w[3] >= 300
             and viewable(env, w[0])), None), timeout=30)
        time.sleep(settle)
        shot(env, out / picture, window=found[0])
        # Focus, then a real key press: a key sent to a window (key --window) is a synthetic
        # event, and after one the tray opened no more windows on Xvfb.
        subprocess.run(["xdotool", "windowfocus", "--sync", str(found[0]), "key", "Escape"],
                       env=env, check=False, timeout=10)
        time.sleep(0.5)


def _client(paths) -> Optional[EngineClient]:  # type: ignore[no-untyped-def]
    try:
        c = EngineClient(paths, timeout=5)
        c.ping()
        return c
    except EngineUnavailable:
        return None


if __name__ == "__main__":
    raise SystemExit(main())
