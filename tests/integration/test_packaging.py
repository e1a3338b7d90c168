"""The installers for real: ``packaging/build.py`` builds the bundle (and on Linux the .deb) once
per session, and the frozen executable is run as a user runs it: ``--version``, ``status``, an
engine, a Keras job in this environment's Python, the tray's icon on a virtual desktop.

The build takes a minute or two: these tests run when HEADROOM_TEST_PACKAGING=1 (``.ci/run``
sets it). The checks of the build tools' pure parts at the end always run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import psutil
import pytest

from tests.conftest import REPO
from tests.fixtures import load_packaging, pyside_folder
from trayapp import __version__
from trayapp.engine.client import EngineClient, EngineUnavailable

if sys.platform.startswith("linux"):
    # The virtual desktop (Xvfb + trayer) of the tray's own tests.
    from tests.ui.test_desktop import desktop  # noqa: F401

WINDOWS = sys.platform == "win32"
LINUX = sys.platform.startswith("linux")
EXE_NAME = "headroom.exe" if WINDOWS else "headroom"
BUILD_TIMEOUT = 1200
packaging_only = pytest.mark.skipif(
    os.environ.get("HEADROOM_TEST_PACKAGING") != "1",
    reason="builds the installers (slow); set HEADROOM_TEST_PACKAGING=1 to run")
linux_only = pytest.mark.skipif(not LINUX, reason="the .deb is built on Linux")
# Watch only; an engine that a command started goes away soon after its job.
CONFIG = '[guard]\nmode = "off"\n\n[engine]\nidle_exit_seconds = 2.0\n'


build = load_packaging("build")
bundle_filter = load_packaging("bundle_filter")


@dataclass
class Built:
    dist: Path
    bundle: Path
    exe: Path
    deb: Optional[Path]
    seconds: float


@pytest.fixture(scope="session")
def built() -> Iterator[Built]:
    """The bundle (and the .deb on Linux), built once for the session in a scratch folder."""
    if os.environ.get("HEADROOM_TEST_PACKAGING") != "1":
        pytest.skip("builds the installers (slow); set HEADROOM_TEST_PACKAGING=1 to run")
    if importlib.util.find_spec("PyInstaller") is None:
        pytest.fail("PyInstaller is not installed in this environment "
                    "(pip install -e '.[build]')")
    scratch = Path(tempfile.mkdtemp(prefix="headroom-build-"))
    try:
        dist, work = scratch / "dist", scratch / "work"
        cmd = [sys.executable, str(REPO / "packaging" / "build.py"),
               "--dist", str(dist), "--work", str(work)]
        if WINDOWS:
            cmd.append("--skip-installer")
        started = time.monotonic()
        r = subprocess.run(cmd, cwd=str(REPO), capture_output=True, text=True,
                           timeout=BUILD_TIMEOUT)
        took = time.monotonic() - started
        assert r.returncode == 0, f"build failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
        debs = sorted(dist.glob("*.deb"))
        yield Built(dist, dist / "headroom", dist / "headroom" / EXE_NAME,
                    debs[0] if debs else None, took)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def frozen(built: Built, *args: str, home: Path, timeout: float = 60,
           env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    full = dict(os.environ, HEADROOM_HOME=str(home))
    full.update(env or {})
    return subprocess.run([str(built.exe), *args], env=full, capture_output=True, text=True,
                          timeout=timeout, cwd=str(home))


def stop_engine_of(paths: Any) -> None:
    """End an engine that a frozen command started on this state folder (if any)."""
    try:
        pid = int(paths.lock_file.read_text().strip() or 0)
    except (OSError, ValueError):
        return
    try:
        proc = psutil.Process(pid)
        if "engine" in proc.cmdline():
            proc.terminate()
            proc.wait(10)
    except psutil.Error:
        pass


@pytest.fixture
def frozen_home(home: Path, paths: Any) -> Iterator[Path]:
    (home / "config.toml").write_text(CONFIG)
    yield home
    stop_engine_of(paths)


# -- the bundle ---------------------------------------------------------------------------------


@packaging_only
def test_frozen_version(built: Built, frozen_home: Path) -> None:
    r = frozen(built, "--version", home=frozen_home)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"headroom {__version__}"


@packaging_only
def test_frozen_status_json(built: Built, frozen_home: Path) -> None:
    r = frozen(built, "status", "--json", home=frozen_home)
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert {"time", "memory", "gpus", "guard", "jobs"} <= set(st)
    assert 0 < st["memory"]["available_bytes"] <= st["memory"]["total_bytes"]
    assert st["engine"]["running"] is False


@packaging_only
def test_frozen_bad_usage_is_one_line(built: Built, frozen_home: Path) -> None:
    r = frozen(built, "status", "--watch", "soon", home=frozen_home)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


@packaging_only
def test_frozen_engine_starts_and_stops(built: Built, frozen_home: Path, paths: Any) -> None:
    log = open(frozen_home / "engine-stderr.log", "wb")
    proc = subprocess.Popen([str(built.exe), "engine", "--stay"],
                            env=dict(os.environ, HEADROOM_HOME=str(frozen_home)),
                            stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        pid = None
        while time.monotonic() < deadline and pid is None:
            assert proc.poll() is None, (frozen_home / "engine-stderr.log").read_text()
            try:
                with EngineClient(paths, timeout=2.0) as c:
                    pid = c.ping()["pid"]
            except EngineUnavailable:
                time.sleep(0.1)
        assert pid == proc.pid
        r = frozen(built, "status", "--json", home=frozen_home)
        assert r.returncode == 0, r.stderr
        st = json.loads(r.stdout)
        assert st["engine"]["running"] is True and st["engine"]["pid"] == proc.pid
        if WINDOWS:
            with EngineClient(paths, timeout=5.0) as c:
                c.shutdown()
        else:
            proc.send_signal(signal.SIGTERM)  # as at logout
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.close()
    with pytest.raises(EngineUnavailable):
        with EngineClient(paths, timeout=2.0) as c:
            c.ping()


@packaging_only
def test_frozen_engine_serves_metrics(built: Built, frozen_home: Path, paths: Any) -> None:
    import urllib.request

    from tests.prometheus_server import free_port

    port = free_port()
    proc = subprocess.Popen([str(built.exe), "engine", "--stay", "--metrics", str(port)],
                            env=dict(os.environ, HEADROOM_HOME=str(frozen_home)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        deadline, text = time.monotonic() + 30, ""
        while time.monotonic() < deadline and "headroom_memory_available_bytes" not in text:
            assert proc.poll() is None, proc.communicate()[1]
            try:
                with opener.open(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    text = r.read().decode()
            except OSError:
                time.sleep(0.2)
        assert "headroom_memory_available_bytes" in text and "headroom_guard_state" in text
    finally:
        proc.terminate()
        proc.wait(20)


KERAS_JOB = '''\
import os, sys
bundle = sys.argv[1]
# The job runs in its own Python: nothing of the app bundle may be on its library path.
leaked = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep)
          if p and os.path.realpath(p).startswith(os.path.realpath(bundle))]
if leaked or any(os.path.realpath(p).startswith(os.path.realpath(bundle)) for p in sys.path if p):
    print("the bundle leaked into the job:", leaked, sys.path, flush=True)
    sys.exit(3)
import keras
import numpy as np
x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
y = (x.sum(axis=1, keepdims=True) > 0).astype("float32")
model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(8, activation="relu"),
                          keras.layers.Dense(1, activation="sigmoid")])
model.compile(optimizer="adam", loss="binary_crossentropy")
model.fit(x, y, batch_size=16, epochs=2, verbose=0)
print("frozen job trained", flush=True)
'''


@packaging_only
@pytest.mark.tensorflow
def test_frozen_runs_a_keras_job_in_the_users_python(built: Built, frozen_home: Path) -> None:
    script = frozen_home / "train.py"
    script.write_text(KERAS_JOB)
    r = frozen(built, "run", "--python", sys.executable, "--cpu-only", str(script), "--",
               str(built.bundle), home=frozen_home, timeout=300)
    assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    assert "frozen job trained" in r.stdout
    assert "Traceback" not in r.stderr


@packaging_only
def test_runner_ships_as_plain_source(built: Built) -> None:
    shipped = built.bundle / "_internal" / "trayapp" / "runner"
    sources = sorted(p.name for p in (REPO / "trayapp" / "runner").glob("*.py"))
    assert "bootstrap.py" in sources
    for name in sources:
        assert (shipped / name).read_bytes() == (REPO / "trayapp" / "runner" / name).read_bytes()


@packaging_only
def test_bundle_leaves_out_what_the_app_does_not_use(built: Built) -> None:
    internal = built.bundle / "_internal"
    for name in ("tensorflow", "keras", "tensorboard", "scipy", "matplotlib", "PyQt5", "PyQt6"):
        assert not (internal / name).exists(), name
    left_in = [str(p.relative_to(internal)) for p in internal.rglob("*")
               if bundle_filter.dropped(p.relative_to(internal).as_posix())]
    assert left_in == []
    # What the tray needs is there.
    qt = internal / "PySide6" / ("" if WINDOWS else "Qt")
    platform_plugin = "qwindows.dll" if WINDOWS else "libqxcb.so"
    assert (qt / "plugins" / "platforms" / platform_plugin).exists()
    assert (internal / "numpy").is_dir() and (internal / "pyqtgraph").is_dir()
    # numpy's lazily loaded parts that nothing uses stay out.
    assert not (internal / "numpy" / "random").exists()


@packaging_only
@linux_only
def test_bundle_holds_trimmed_icu_data(built: Built) -> None:
    wheel = sorted((pyside_folder() / "Qt" / "lib").glob("libicudata.so.*"))
    if not wheel:
        pytest.skip("this PySide6 wheel ships no ICU data library")
    bundled = built.bundle / "_internal" / "PySide6" / "Qt" / "lib" / wheel[0].name
    assert bundled.is_file()
    # The test set-up installs gcc, so the build trims it to under a third; the frozen tray's
    # test below shows Qt running on it.
    assert bundled.stat().st_size < wheel[0].stat().st_size / 3


@packaging_only
@pytest.mark.desktop
@pytest.mark.skipif(not LINUX, reason="Xvfb and trayer")
def test_frozen_tray_shows_its_icon(built: Built, frozen_home: Path, paths: Any,
                                    desktop: str) -> None:
    from tests.ui.test_desktop import embedded_icon, tray_env, viewable, wait_for, windows

    log_path = frozen_home / "tray-stderr.log"
    with open(log_path, "wb") as log:
        tray = subprocess.Popen([str(built.exe), "--demo"], env=tray_env(desktop, frozen_home),
                                stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    try:
        icon = wait_for("tray icon", lambda: tray.poll() is None and embedded_icon(desktop),
                        timeout=45)
        assert icon.width > 0 and icon.height > 0
        # The dashboard's plots (pyqtgraph, numpy) load in the frozen app too.
        second = frozen(built, "--open", "dashboard", home=frozen_home,
                        env=tray_env(desktop, frozen_home), timeout=60)
        assert second.returncode == 0, second.stderr
        wait_for("dashboard window", lambda: [
            w for w in windows(desktop)
            if "simulated GPUs" in w.name and w.width >= 600 and viewable(desktop, w.wid)],
            timeout=30)
        assert tray.poll() is None, log_path.read_text(errors="replace")
    finally:
        if tray.poll() is None:
            tray.send_signal(signal.SIGTERM)
            try:
                tray.wait(15)
            except subprocess.TimeoutExpired:
                tray.kill()
                tray.wait(5)
    text = log_path.read_text(errors="replace")
    assert tray.returncode == 0, text
    assert "Traceback" not in text, text
    assert not (frozen_home / "crash.log").exists()


# -- the .deb -----------------------------------------------------------------------------------


def _deb(built: Built) -> Path:
    assert built.deb is not None, f"no .deb in {built.dist}"
    return built.deb


@packaging_only
@linux_only
def test_deb_fields(built: Built) -> None:
    deb = _deb(built)
    fields = ["Package", "Version", "Architecture", "Maintainer", "Depends", "Installed-Size"]
    out = subprocess.run(["dpkg-deb", "-f", str(deb), *fields], capture_output=True, text=True,
                         check=True).stdout
    info = dict(line.split(": ", 1) for line in out.strip().splitlines())
    assert info["Package"] == "headroom"
    assert info["Version"] == build.deb_version(__version__)
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert info["Architecture"] == arch
    assert deb.name == f"headroom_{info['Version']}_{arch}.deb"
    depends = {d.strip().split(" ")[0] for d in info["Depends"].split(",")}
    assert {"libxcb-cursor0", "libxcb-icccm4", "libxcb-keysyms1", "libxkbcommon-x11-0",
            "libegl1", "libgl1", "libfontconfig1", "libdbus-1-3", "libc6"} <= depends
    unpacked_kib = build.tree_size(built.bundle) / 1024
    assert unpacked_kib <= int(info["Installed-Size"]) <= unpacked_kib * 1.05
    listing = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True,
                             check=True).stdout.splitlines()
    assert listing and all(" root/root " in line for line in listing)
    # Programs and folders 0755, shared objects and data 0644 (Debian's rule).
    modes = {line.split()[-1]: line.split()[0] for line in listing if "->" not in line}
    assert modes["./opt/headroom/headroom"] == "-rwxr-xr-x"
    shared = [m for path, m in modes.items() if path.endswith(".so") or ".so." in path]
    assert shared and set(shared) == {"-rw-r--r--"}


@packaging_only
@linux_only
def test_deb_unpacked_runs_and_holds_its_desktop_files(built: Built, tmp_path: Path) -> None:
    root = tmp_path / "root"
    subprocess.run(["dpkg-deb", "-x", str(_deb(built)), str(root)], check=True)
    r = subprocess.run([str(root / "opt" / "headroom" / "headroom"), "--version"],
                       capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, HEADROOM_HOME=str(tmp_path / "home")))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"headroom {__version__}"
    link = root / "usr" / "bin" / "headroom"
    assert link.is_symlink() and os.readlink(link) == "/opt/headroom/headroom"

    desktop_file = root / "usr" / "share" / "applications" / "headroom.desktop"
    v = subprocess.run(["desktop-file-validate", str(desktop_file)], capture_output=True,
                       text=True)
    assert v.returncode == 0 and v.stdout.strip() == "", v.stdout + v.stderr
    entry = desktop_file.read_text()
    assert "\nExec=headroom\n" in entry and "\nIcon=headroom\n" in entry

    notice = (root / "usr" / "share" / "doc" / "headroom" / "copyright").read_text()
    assert "License: MIT" in notice
    assert "PySide6" in notice and "numpy" in notice and "LGPL-3.0" in notice

    hicolor = root / "usr" / "share" / "icons" / "hicolor"
    for size in build.ICON_SIZES:
        png = hicolor / f"{size}x{size}" / "apps" / "headroom.png"
        assert png_size(png) == (size, size), png
    assert (hicolor / "scalable" / "apps" / "headroom.svg").read_text().lstrip().startswith(
        "<?xml")


# -- the build tools' pure parts (always run) ---------------------------------------------------


def png_size(path: Path) -> tuple:
    data = path.read_bytes()[:24]
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", path
    return struct.unpack(">II", data[16:24])


def test_resource_icons_have_their_sizes() -> None:
    for size in build.ICON_SIZES:
        assert png_size(build.icon_png(size)) == (size, size)


@pytest.mark.skipif(shutil.which("desktop-file-validate") is None,
                    reason="needs desktop-file-validate (Debian's desktop-file-utils)")
def test_desktop_entry_is_valid() -> None:
    r = subprocess.run(["desktop-file-validate", str(REPO / "resources" / "headroom.desktop")],
                       capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "", r.stdout + r.stderr


def test_ico_holds_every_png(tmp_path: Path) -> None:
    sizes = (16, 32, 256)
    ico = build.write_ico([build.icon_png(s) for s in sizes], tmp_path / "h.ico")
    data = ico.read_bytes()
    reserved, kind, count = struct.unpack_from("<HHH", data, 0)
    assert (reserved, kind, count) == (0, 1, len(sizes))
    for i, size in enumerate(sizes):
        w, h, _c, _r, _planes, _bpp, length, offset = struct.unpack_from(
            "<BBBBHHII", data, 6 + 16 * i)
        assert (w or 256, h or 256) == (size, size)
        assert data[offset:offset + length] == build.icon_png(size).read_bytes()
    with pytest.raises(build.BuildError):
        build.write_ico([REPO / "resources" / "headroom.svg"], tmp_path / "bad.ico")


@pytest.mark.parametrize("version,expected", [
    ("0.1.0", "0.1.0"), ("1.2rc1", "1.2~rc1"), ("1.2.0b3", "1.2.0~b3"),
    ("2.0.dev4", "2.0~dev4"), ("1.0.post1", "1.0.post1"),
])
def test_deb_version(version: str, expected: str) -> None:
    assert build.deb_version(version) == expected


def test_version_comes_from_the_package() -> None:
    assert build.read_version() == __version__
    assert build.numeric_version("1.2.3rc1") == "1.2.3.0"


def test_left_out_files() -> None:
    assert bundle_filter.dropped("PySide6/Qt/translations/qtbase_de.qm")
    assert bundle_filter.dropped("PySide6/Qt/lib/libQt6Quick.so.6")
    assert bundle_filter.dropped("PySide6/opengl32sw.dll")
    assert bundle_filter.dropped("PySide6\\plugins\\platforms\\qvnc.dll")
    assert not bundle_filter.dropped("PySide6/Qt/plugins/platforms/libqxcb.so")
    assert not bundle_filter.dropped("PySide6/Qt/lib/libQt6Gui.so.6")
    assert not bundle_filter.dropped("PySide6/plugins/platforms/qwindows.dll")
    # A symbolic link whose target is left out goes too.
    toc = [("PySide6/Qt/lib/libQt6Quick.so.6", "/x/libQt6Quick.so.6", "BINARY"),
           ("libQt6Quick.so.6", "PySide6/Qt/lib/libQt6Quick.so.6", "SYMLINK"),
           ("libQt6Gui.so.6", "PySide6/Qt/lib/libQt6Gui.so.6", "SYMLINK"),
           ("PySide6/Qt/lib/libQt6Gui.so.6", "/x/libQt6Gui.so.6", "BINARY")]
    assert [e[0] for e in bundle_filter.keep(toc)] == ["libQt6Gui.so.6",
                                                       "PySide6/Qt/lib/libQt6Gui.so.6"]


def test_system_libraries_nothing_links_to_are_pruned() -> None:
    links: Dict[str, List[str]] = {
        "/v/site-packages/PySide6/QtGui.abi3.so": ["libQt6Gui.so.6"],
        "/v/site-packages/PySide6/Qt/lib/libQt6Gui.so.6": ["libglib-2.0.so.0"],
        "/usr/lib/libglib-2.0.so.0": ["libpcre2-8.so.0"],
        "/usr/lib/libpcre2-8.so.0": [],
        "/usr/lib/libgtk-3.so.0": ["libcairo.so.2"],  # its only user (the GTK theme) is gone
        "/usr/lib/libcairo.so.2": [],
        "/py/lib/libpython3.11.so.1.0": [],
    }
    toc = [("PySide6/QtGui.abi3.so", "/v/site-packages/PySide6/QtGui.abi3.so", "EXTENSION"),
           ("PySide6/Qt/lib/libQt6Gui.so.6", "/v/site-packages/PySide6/Qt/lib/libQt6Gui.so.6",
            "BINARY"),
           ("libQt6Gui.so.6", "PySide6/Qt/lib/libQt6Gui.so.6", "SYMLINK"),
           ("libglib-2.0.so.0", "/usr/lib/libglib-2.0.so.0", "BINARY"),
           ("libpcre2-8.so.0", "/usr/lib/libpcre2-8.so.0", "BINARY"),
           ("libgtk-3.so.0", "/usr/lib/libgtk-3.so.0", "BINARY"),
           ("libcairo.so.2", "/usr/lib/libcairo.so.2", "BINARY"),
           ("libpython3.11.so.1.0", "/py/lib/libpython3.11.so.1.0", "BINARY")]
    kept = bundle_filter.prune_system_libraries(toc, needed=lambda p: links.get(p, []),
                                                is_elf=lambda p: True)
    assert [e[0] for e in kept] == [
        "PySide6/QtGui.abi3.so", "PySide6/Qt/lib/libQt6Gui.so.6", "libQt6Gui.so.6",
        "libglib-2.0.so.0", "libpcre2-8.so.0", "libpython3.11.so.1.0"]
    # Libraries whose links cannot be read (not ELF: Windows DLLs) all stay.
    assert bundle_filter.prune_system_libraries(toc, needed=lambda p: [],
                                                is_elf=lambda p: False) == toc


@pytest.mark.skipif(not LINUX, reason="ELF")
def test_elf_needed_reads_a_real_library() -> None:
    import _ctypes

    needed = bundle_filter.elf_needed(_ctypes.__file__)
    assert "libc.so.6" in needed or any(n.startswith("libpython") for n in needed)
    assert bundle_filter.elf_needed(__file__) == []


def test_hidden_imports_cover_the_package_but_not_the_runner() -> None:
    names = bundle_filter.hidden_imports(REPO)
    assert {"trayapp", "trayapp.cli", "trayapp.engine.service", "trayapp.ui.app"} <= set(names)
    assert not [n for n in names if n.startswith("trayapp.runner")]
    # The exporter is in the bundle, with what it needs (prometheus_client imports ssl).
    assert "trayapp.engine.metrics_export" in names
    assert not {"ssl", "_ssl", "prometheus_client"} & set(bundle_filter.EXCLUDED_MODULES)
