"""The tray application: quitting with and without jobs (real engine, real jobs), one instance
per state folder (a real second `headroom` process), and the windows it opens."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, List

import pytest

from tests.conftest import REPO, headroom_cmd
from trayapp.config import Paths, get_paths
from trayapp.engine.client import EngineClient, EngineUnavailable
from trayapp.jobs.record import JobRecord
from trayapp.ui import app as appmod
from trayapp.ui.app import QUIT_CANCEL, QUIT_KEEP, QUIT_STOP
from trayapp.ui.single_instance import SingleInstance
from trayapp.vocab import JobState as S

# The offscreen platform has no window manager and no system tray: it says so when a window is
# raised or resized, and when a tray icon is shown anyway (the tests force one).
pytestmark = pytest.mark.qt_log_ignore(
    r"This plugin does not support (propagateSizeHints|raise)\(\)",
    r"No such signal QPlatformNativeInterface::systemTrayWindowChanged")

TICKER = str(REPO / "tests" / "scripts" / "jobs" / "ticker.py")
LIVE = ("starting", "running", "pausing", "paused")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def start_ticker(paths: Paths) -> str:
    with EngineClient(paths) as c:
        job = c.job_start({"script": TICKER, "args": ["0", "0.2"], "name": "ticker"})
    return str(job.id)


def job_state(paths: Paths, job_id: str) -> str:
    with EngineClient(paths) as c:
        return str(c.job_get(job_id).state)


def test_quit_without_jobs_stops_the_engine_the_tray_started(qtbot, app_on, paths) -> None:
    app = app_on(start_engine=True, demo=True)
    app.start()
    qtbot.waitUntil(lambda: app.status is not None, timeout=30000)
    assert app.worker.started_engine and app.tray is not None
    pid = app.status.engine.pid  # type: ignore[union-attr]
    asked: List[Any] = []
    app.quit_prompt = lambda jobs: asked.append(jobs) or QUIT_KEEP  # type: ignore[func-returns-value]
    assert app.request_quit() is True
    qtbot.waitUntil(lambda: app._finished, timeout=15000)
    assert asked == []  # nothing to ask without jobs
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and alive(pid):
        time.sleep(0.05)
    assert not alive(pid)
    with pytest.raises(EngineUnavailable):
        EngineClient(paths, timeout=2).ping()


def test_quit_leaves_an_engine_it_did_not_start(qtbot, demo_engine, app_on) -> None:
    app = app_on()
    app.start()
    qtbot.waitUntil(lambda: app.status is not None, timeout=15000)
    assert app.request_quit() is True and app._finished
    time.sleep(0.3)
    assert demo_engine.proc.poll() is None


def test_quit_with_jobs_asks_and_keeps_guarding(qtbot, demo_engine, app_on, paths) -> None:
    job_id = start_ticker(paths)
    app = app_on()
    app.start()
    qtbot.waitUntil(lambda: any(j.id == job_id for j in (app.status.jobs if app.status else ())),
                    timeout=15000)
    asked: List[List[JobRecord]] = []
    answers = [QUIT_CANCEL, QUIT_KEEP]
    app.quit_prompt = lambda jobs: asked.append(jobs) or answers.pop(0)  # type: ignore
    assert app.request_quit() is False  # cancelled: still running
    assert not app._finished and app.worker.isRunning()
    assert app.request_quit() is True
    assert app._finished
    assert [j.id for j in asked[0]] == [job_id]
    # The engine stays and keeps guarding the job.
    time.sleep(0.5)
    assert demo_engine.proc.poll() is None
    assert job_state(paths, job_id) == S.RUNNING


def test_quit_with_jobs_can_stop_them(qtbot, demo_engine, app_on, paths) -> None:
    job_id = start_ticker(paths)
    app = app_on()
    app.start()
    qtbot.waitUntil(lambda: any(j.id == job_id and j.state == S.RUNNING
                                for j in (app.status.jobs if app.status else ())), timeout=15000)
    app.quit_prompt = lambda jobs: QUIT_STOP
    assert app.request_quit() is True
    qtbot.waitUntil(lambda: app._finished, timeout=30000)
    assert job_state(paths, job_id) not in LIVE
    # Not started by this tray: the engine stays.
    assert demo_engine.proc.poll() is None


def test_menu_actions_reach_the_engine(qtbot, demo_engine, app_on, paths) -> None:
    job_id = start_ticker(paths)
    app = app_on()
    app.start()
    qtbot.waitUntil(lambda: any(j.id == job_id and j.state == S.RUNNING
                                for j in (app.status.jobs if app.status else ())), timeout=15000)
    app.choose(f"job:{job_id}:pause")
    qtbot.waitUntil(lambda: job_state(paths, job_id) == S.PAUSED, timeout=20000)
    app.choose(f"job:{job_id}:resume")
    qtbot.waitUntil(lambda: job_state(paths, job_id) == S.RUNNING, timeout=20000)
    app.choose("guard:dry-run")
    qtbot.waitUntil(lambda: app.status is not None and app.status.guard.mode == "dry-run",
                    timeout=15000)
    app.choose(f"job:{job_id}:stop")
    qtbot.waitUntil(lambda: job_state(paths, job_id) not in LIVE, timeout=30000)


def test_windows_open_by_name_and_missing_ones_say_so(qtbot, app_on, monkeypatch) -> None:
    app = app_on()
    for name in ("dashboard", "jobs", "settings", "launch"):
        window = app.open_window(name)
        assert window is not None and window.isVisible(), name
        assert app.open_window(name) is window  # brought forward, not opened twice
    monkeypatch.setitem(appmod.EXTERNAL_WINDOWS, "launch",
                        ("trayapp.ui.no_such_window", "LaunchDialog", "Launching training"))
    app.windows.pop("launch").close()
    assert app.open_window("launch") is None
    assert app.messages[-1] == "Launching training is not available yet in this version of " \
                               "Headroom."


def test_settings_opened_at_a_cold_start_load_once_the_engine_answers(qtbot, app_on) -> None:
    # `headroom --open settings` with no engine running: the dialog opens before the engine
    # the tray starts is up, then reads the settings when it answers.
    app = app_on(start_engine=True, demo=True)
    dialog = app.open_window("settings")
    assert dialog is not None and not dialog.loaded_ok  # type: ignore[attr-defined]
    qtbot.waitUntil(lambda: "cannot be read" in dialog.status_label.text(),  # type: ignore
                    timeout=15000)
    app.start()
    qtbot.waitUntil(lambda: dialog.loaded_ok, timeout=30000)  # type: ignore[attr-defined]
    assert dialog.status_label.text().startswith("Settings file: ")  # type: ignore
    assert dialog.tabs.isEnabled()  # type: ignore[attr-defined]
    assert app.request_quit() is True


def test_a_job_launched_from_the_dialog_shows_in_the_jobs_window(qtbot, demo_engine, app_on,
                                                                  paths) -> None:
    app = app_on()
    app.start()
    dialog = app.open_window("launch")
    job_id = start_ticker(paths)
    qtbot.waitUntil(lambda: any(j.id == job_id for j in (app.status.jobs if app.status else ())),
                    timeout=15000)
    dialog.launched.emit(JobRecord(id=job_id, name="ticker"))  # type: ignore[union-attr]
    jobs = app.windows.get("jobs")
    assert jobs is not None and jobs.isVisible()
    qtbot.waitUntil(lambda: jobs.select_job(job_id), timeout=15000)
    with EngineClient(paths) as c:
        c.job_action(job_id, "kill")


def test_a_second_instance_asks_the_first_to_open_a_window(qtbot, paths, home) -> None:
    first = SingleInstance(paths)
    try:
        assert first.acquire()
        env = dict(os.environ, QT_QPA_PLATFORM="offscreen", HEADROOM_HOME=str(home))
        for args, window in ((["--open", "jobs"], "jobs"), ([], "dashboard")):
            with qtbot.waitSignal(first.activated, timeout=20000) as blocker:
                proc = subprocess.Popen(headroom_cmd(*args), env=env, cwd=str(REPO),
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            assert blocker.args == [window]
            out, err = proc.communicate(timeout=20)
            assert proc.returncode == 0, err.decode()
            assert out.decode() == f"Headroom is already running; opened the {window}\n"
        # Another state folder is another user's tray: it does not ask this one.
        other = SingleInstance(get_paths_for(home.parent / "other"))
        try:
            assert other.acquire()
        finally:
            other.close()
    finally:
        first.close()


def get_paths_for(folder: Path) -> Paths:
    old = os.environ.get("HEADROOM_HOME")
    os.environ["HEADROOM_HOME"] = str(folder)
    try:
        return get_paths()
    finally:
        if old is None:
            del os.environ["HEADROOM_HOME"]
        else:
            os.environ["HEADROOM_HOME"] = old


def test_a_lock_left_by_a_dead_tray_is_taken_over(qtbot, paths) -> None:
    paths.ensure()
    lock = paths.data_dir / "tray.lock"
    code = ("import os, sys; from PySide6.QtCore import QLockFile; "
            f"l = QLockFile({str(lock)!r}); assert l.tryLock(0); "
            "sys.stdout.write('locked'); sys.stdout.flush(); os.kill(os.getpid(), 9)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=30)
    assert proc.stdout == "locked" and proc.returncode == -signal.SIGKILL
    assert lock.exists()
    s = SingleInstance(paths)
    try:
        assert s.acquire()
    finally:
        s.close()
