"""A job's words in the tray and the jobs window: a real engine runs a job named with terminal
escapes, a bidi override, a C1 control and markup, from a script whose file name holds them too,
and a job that sends such notes; every text the tray and the jobs window show of them holds no
raw control character, and none is read as markup (a label's text is plain, a tooltip that
looks like markup shows it literally, a notification's body has its markup escaped)."""

from __future__ import annotations

import shutil
import sys
import unicodedata
from pathlib import Path
from typing import Any, Dict, List

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import Qt as QtGuiNamespace
from PySide6.QtGui import QTextDocument
from PySide6.QtWidgets import QLabel

from tests.conftest import wait_for
from trayapp.engine.client import EngineClient
from trayapp.text import lines, one_line
from trayapp.ui.dashboard_parts import JobsStrip
from trayapp.ui.jobs_window import JobsWindow
from trayapp.ui.model import active_jobs
from trayapp.ui.tray import TrayController
from trayapp.vocab import EventKind as E

REPO = Path(__file__).resolve().parents[2]
JOBS = REPO / "tests" / "scripts" / "jobs"
WORDS = "\x1b]0;pwned\x07\x1b[2J\u202e\x9b<a href=x><img src=y>"
SCRIPT = "evil\x1b]0;pwned\x07\x1b[2J\u202e\x9b<img src=y>.py"
pytestmark = [pytest.mark.skipif(sys.platform == "win32", reason="a file name with ESC in it"),
              pytest.mark.qt_log_ignore(r"This plugin does not support propagateSizeHints")]


def raw(text: str) -> List[str]:
    """Control, format (bidi) and separator characters other than a newline."""
    return [ch for ch in text if ch != "\n" and unicodedata.category(ch) in
            ("Cc", "Cf", "Zl", "Zp")]


def shown(text: str) -> str:
    """What Qt shows of a tooltip (or an auto-format label): markup rendered when it looks
    like markup, as Qt decides it."""
    doc = QTextDocument()
    if QtGuiNamespace.mightBeRichText(text):
        doc.setHtml(text)
    else:
        doc.setPlainText(text)
    return doc.toPlainText().replace("\u2029", "\n")


def test_the_tray_and_the_jobs_window_show_a_jobs_words_escaped(qtbot, paths, start_engine,
                                                               tmp_path) -> None:  # type: ignore
    engine = start_engine()
    script = tmp_path / SCRIPT
    shutil.copy(JOBS / "hostile_words.py", script)
    marker = tmp_path / "sent"
    with engine.client() as c:
        named = c.job_start({"script": str(JOBS / "ticker.py"), "args": ["0", "0.2"],
                             "name": WORDS})
        talker = c.job_start({"script": str(script), "args": [str(marker)]})
        wait_for(marker.exists, 60, "the hostile notes sent")
        shrunk: List[Dict[str, Any]] = wait_for(
            lambda: [e for e in c.events(job=talker.id) if e.kind == E.JOB_SHRUNK], 30,
            "the job_shrunk event")
        status = wait_for(lambda: (lambda s: s if len(active_jobs(s)) == 2 else None)(
            c.status()), 30, "both jobs in the status")

    # The tray: its tooltip, its menu, its notifications.
    tray = TrayController()
    tray.update(status, True)
    tip = tray.icon.toolTip()
    assert raw(tip) == [] and one_line(WORDS) in tip
    assert shown(tip) == tip  # Qt reads it as the plain text it is
    tray.rebuild_menu()
    jobs_menu = next(a.menu() for a in tray.menu.actions() if a.text() == "Jobs")
    texts = [a.text() for a in jobs_menu.actions() if not a.isSeparator()]
    assert any(one_line(WORDS) in t for t in texts), texts
    assert all(raw(t) == [] for t in texts), texts
    bodies: List[str] = []
    tray.icon.showMessage = lambda title, body, *rest: bodies.append(body)  # type: ignore
    assert tray.notify(shrunk[0])
    tray.message("Headroom", f"cannot do it for {WORDS}")
    for body in bodies:
        assert raw(body) == [] and "<" not in body, body
    assert "&lt;img src=y&gt;" in bodies[0]

    # The dashboard's strip of running jobs.
    strip = JobsStrip()
    qtbot.addWidget(strip)
    strip.update_jobs(active_jobs(status))
    for row in strip.rows.values():
        label: QLabel = row["name"]
        assert label.textFormat() == Qt.TextFormat.PlainText and raw(label.text()) == []

    # The jobs window: the table, its tooltips, the header, the events.
    window = JobsWindow(lambda: EngineClient(paths, timeout=10.0), poll_ms=200)
    qtbot.addWidget(window)
    window.show()
    qtbot.waitUntil(lambda: window.loaded and window.proxy.rowCount() == 2, timeout=15000)
    for r in range(window.proxy.rowCount()):
        for col in range(window.proxy.columnCount()):
            index = window.proxy.index(r, col)
            cell = index.data() or ""
            assert raw(cell) == [], (r, col, cell)
            assert raw(shown(index.data(Qt.ItemDataRole.ToolTipRole) or "")) == [], (r, col)
    # The script's file name in the Name tooltip shows as text, not as an image.
    name_tip = window.proxy.index(
        next(r for r in range(2) if window.proxy.index(r, 0).data() != one_line(WORDS)),
        0).data(Qt.ItemDataRole.ToolTipRole)
    assert shown(name_tip) == lines(f"{talker.id} · {script}")
    for job in (named, talker):
        assert window.select_job(job.id)
        header = window.header_label
        assert header.textFormat() == Qt.TextFormat.PlainText
        assert raw(header.text()) == [] and "\\x1b]0;pwned" in header.text()
    qtbot.waitUntil(lambda: any("shrunk" in e for e in window.event_lines()), timeout=20000)
    for line in window.event_lines():
        assert raw(line) == [], line
    with engine.client() as c:
        for job in (named, talker):
            c.job_action(job.id, "kill")
