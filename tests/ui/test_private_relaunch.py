"""The jobs window's relaunch of a job started with ``--env``: the spec it shows has the names
only, and the relaunched job still gets the values (the engine keeps them in the job's private
environ.json)."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from trayapp.engine.client import EngineClient
from trayapp.ui.jobs_window import JobsWindow
from trayapp.vocab import JobState as S

REPO = Path(__file__).resolve().parents[2]
PRINT_ENV = str(REPO / "tests" / "scripts" / "jobs" / "print_env.py")
pytestmark = pytest.mark.qt_log_ignore(r"This plugin does not support propagateSizeHints")


def test_relaunch_gets_the_hidden_env_value_back(qtbot, paths, start_engine) -> None:  # type: ignore
    engine = start_engine()
    spec = {"script": PRINT_ENV, "args": ["API_KEY"], "name": "env-job",
            "env": [["API_KEY", "sekrit-value"]], "options": {"cpu_only": True}}
    with engine.client() as c:
        first = c.job_start(spec)
    assert first.spec["env"] == [["API_KEY", None]]
    window = JobsWindow(lambda: EngineClient(paths, timeout=10.0), poll_ms=200)
    qtbot.addWidget(window)
    window.show()
    qtbot.waitUntil(lambda: window.loaded, timeout=15000)
    qtbot.waitUntil(lambda: getattr(window.selected_job(), "state", None) == S.FINISHED,
                    timeout=30000)
    selected = window.selected_job()
    assert selected is not None and selected.spec["env"] == [["API_KEY", None]]
    with qtbot.waitSignal(window.relaunched, timeout=20000) as relaunched:
        qtbot.mouseClick(window.buttons["relaunch"], Qt.MouseButton.LeftButton)
    new = relaunched.args[0]
    assert new.id != first.id and new.spec["env"] == [["API_KEY", None]]
    qtbot.waitUntil(lambda: window.selected_id == new.id, timeout=10000)
    qtbot.waitUntil(lambda: "API_KEY = sekrit-value" in window.log_text(), timeout=20000)
