"""The tray killed outright: the engine it started keeps guarding, and a new tray shows the
same state (jobs, their states, the guard)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, headroom_cmd, wait_for
from trayapp.config import Paths
from trayapp.engine.client import EngineClient, EngineUnavailable
from trayapp.ui.app import HeadroomApp
from trayapp.vocab import JobState as S

pytestmark = [
    pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals"),
    pytest.mark.qt_log_ignore(r"This plugin does not support (propagateSizeHints|raise)\(\)"),
]

SCRIPTS = REPO / "tests" / "scripts"


def _ping(paths: Paths) -> object:
    try:
        with EngineClient(paths, timeout=2) as c:
            return c.ping()
    except EngineUnavailable:
        return None


def test_engine_guards_on_and_a_new_tray_sees_the_same(qtbot, paths: Paths, home: Path,
                                                       tmp_path: Path) -> None:
    (home / "config.toml").write_text('[guard]\nmode = "act"\n')
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", HEADROOM_HOME=str(home))
    tray = subprocess.Popen(headroom_cmd("--demo"), env=env, cwd=str(REPO),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        engine_pid = wait_for(lambda: _ping(paths), 30, "the engine the tray starts")["pid"]
        trigger = tmp_path / "go"
        with EngineClient(paths, timeout=30) as c:
            ticker = c.job_start({"script": str(SCRIPTS / "jobs" / "ticker.py"),
                                  "args": ["0", "0.2"], "name": "ticker"}).id
            hog = c.job_start({"script": str(SCRIPTS / "faults" / "quiet_hog.py"),
                               "args": [str(trigger), "600"], "name": "hog",
                               "ram_budget_mb": 200}).id
            wait_for(lambda: c.job_get(hog).state == S.RUNNING, 30, "the hog to run")
        tray.send_signal(signal.SIGKILL)
        tray.wait(10)

        # No tray: the engine is still there, and still acts.
        trigger.write_text("go")
        with EngineClient(paths, timeout=30) as c:
            paused = wait_for(lambda: (j := c.job_get(hog)).state == S.PAUSED and j, 30,
                              "the guard to pause the hog with no tray running")
            assert paused.paused_by == "guard"
            assert c.ping()["pid"] == engine_pid
            truth = {j.id: j.state for j in c.jobs()}
        assert truth[ticker] == "running" and truth[hog] == "paused"

        # A new tray shows what the engine knows.
        app = HeadroomApp(paths, demo=True, tray_available=False, start_engine=False)
        try:
            app.start()
            qtbot.waitUntil(lambda: app.status is not None and
                            {j.id: j.state for j in app.status.jobs} == truth,
                            timeout=20000)
            assert app.status.engine.pid == engine_pid  # type: ignore[union-attr]
            assert app.reachable
        finally:
            app.close()
    finally:
        if tray.poll() is None:
            tray.kill()
            tray.wait(10)
        # The jobs and the engine are ended by the `home` fixture.
