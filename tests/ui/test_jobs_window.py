"""The jobs window: what the table shows, and real jobs on a real engine: the live log, search
and copy, pause and resume, stop, relaunch, the folder, events and the memory chart."""

from __future__ import annotations

from pathlib import Path
from typing import List

import pytest
from PySide6.QtCore import QObject, Qt, QUrl, Slot
from PySide6.QtGui import QDesktopServices, QGuiApplication

from trayapp.engine.client import EngineClient
from trayapp.jobs.record import JobRecord
from trayapp.ui.job_rows import (
    applied_lines,
    cell_text,
    job_matches,
    progress_fraction,
    progress_text,
    state_text,
)
from trayapp.ui.jobs_table import JobsModel
from trayapp.ui.jobs_window import JobsWindow
from trayapp.vocab import JobState as S

REPO = Path(__file__).resolve().parents[2]
TICKER = str(REPO / "tests" / "scripts" / "jobs" / "ticker.py")
EXIT_WITH = str(REPO / "tests" / "scripts" / "jobs" / "exit_with.py")
pytestmark = pytest.mark.qt_log_ignore(r"This plugin does not support propagateSizeHints")


# -- what the table shows -------------------------------------------------------------------


def rec(**fields):  # type: ignore[no-untyped-def]
    """A job record with these fields (the others their defaults)."""
    return JobRecord.from_json({"id": "j1", **fields})


def test_progress_of_epochs_and_steps() -> None:
    job = rec(state=S.RUNNING, epoch=2, epochs=4, step=50, steps=100)
    assert progress_fraction(job) == pytest.approx(0.375)
    assert progress_text(job) == "epoch 2/4 · step 50/100"
    assert progress_fraction(rec(epoch=3, epochs=4)) == pytest.approx(0.5)
    assert progress_fraction(rec(state=S.RUNNING)) is None
    assert progress_text(rec(state=S.RUNNING)) == ""
    assert progress_fraction(rec(state=S.FINISHED, epoch=4, epochs=4, step=7, steps=100)) == 1.0


def test_cells_and_states() -> None:
    job = rec(id="ab12", name="mnist", state=S.PAUSED, paused_by="guard",
              pause_reason="RAM below 8%", metrics={"loss": 0.123456}, eta_seconds=125,
              rss_bytes=3 * 1024**3, vram_bytes=None, started=1000.0)
    assert state_text(job) == "paused by the guard: RAM below 8%"
    assert [cell_text(job, c, 1065.0) for c in range(8)] == [
        "mnist (ab12)", "paused by the guard: RAM below 8%", "", "0.1235", "2 min 05 s",
        "3.0 GiB", "n/a", "1 min 05 s"]
    ended = rec(id="cd34", name="x", state=S.FAILED, end_reason="exit status 3", exit_code=3,
                started=1000.0, ended=1010.0, rss_bytes=None, eta_seconds=4.0)
    assert state_text(ended) == "failed (exit status 3)"
    assert cell_text(ended, 4, 5000.0) == ""  # no ETA once ended
    assert cell_text(ended, 5, 5000.0) == ""  # no memory once ended
    assert cell_text(ended, 7, 5000.0) == "10 s"  # elapsed stops at the end


def test_filter() -> None:
    live = rec(id="a1", name="mnist", state=S.RUNNING, script="/w/mnist.py")
    done = rec(id="b2", name="cifar", state=S.FINISHED, script="/w/cifar.py")
    parked = rec(id="c3", name="bert", state=S.PARKED)
    assert [job_matches(j, "", "active") for j in (live, done, parked)] == [True, False, True]
    assert [job_matches(j, "", "finished") for j in (live, done, parked)] == [False, True, False]
    assert [job_matches(j, "CIFAR", "all") for j in (live, done, parked)] == [False, True, False]
    assert job_matches(live, "w/mnist", "all") and job_matches(parked, "c3", "all")


def test_applied_options_lines() -> None:
    hello = {"applied": [{"option": "memory_growth", "value": True,
                          "call": "tf.config.experimental.set_memory_growth"},
                         {"option": "vram_limit_mb", "value": 4096.0}]}
    assert applied_lines(hello) == ["memory_growth = True  "
                                    "(tf.config.experimental.set_memory_growth)",
                                    "vram_limit_mb = 4096"]
    assert applied_lines(None) == []


def test_model_updates_in_place(qtbot) -> None:  # type: ignore[no-untyped-def]
    model = JobsModel(clock=lambda: 2000.0)
    model.update_jobs([rec(id="a", name="old", state=S.FINISHED, started=100.0),
                       rec(id="b", name="new", state=S.RUNNING, started=200.0)], complete=True)
    assert [j.id for j in model.jobs] == ["b", "a"]  # newest first
    changed: List[int] = []
    model.dataChanged.connect(lambda top, _bottom, _roles=(): changed.append(top.row()))
    model.update_jobs([rec(id="b", name="new", state=S.PAUSED, started=200.0)], complete=False)
    assert changed == [0] and model.rowCount() == 2
    assert model.data(model.index(0, 1)) == "paused"
    model.update_jobs([rec(id="c", name="newest", state=S.RUNNING, started=300.0),
                       rec(id="b", name="new", state=S.RUNNING, started=200.0)], complete=True)
    assert [j.id for j in model.jobs] == ["c", "b"]


# -- real jobs ------------------------------------------------------------------------------


class UrlCatcher(QObject):
    """Takes file:// URLs instead of the desktop's file manager (Qt's own URL handler hook)."""

    def __init__(self) -> None:
        super().__init__()
        self.paths: List[str] = []

    @Slot(QUrl)
    def handle(self, url: QUrl) -> None:
        self.paths.append(url.toLocalFile())


def start_job(engine, script: str, *args: str, name: str = None):  # type: ignore[no-untyped-def]
    spec = {"script": script, "args": list(args), "options": {"cpu_only": True}}
    if name:
        spec["name"] = name
    with engine.client() as c:
        return c.job_start(spec)


def job_state(engine, job_id: str) -> str:  # type: ignore[no-untyped-def]
    with engine.client() as c:
        return str(c.job_get(job_id).state)


def open_window(qtbot, paths) -> JobsWindow:  # type: ignore[no-untyped-def]
    window = JobsWindow(lambda: EngineClient(paths, timeout=10.0), poll_ms=200)
    qtbot.addWidget(window)
    window.show()
    qtbot.waitUntil(lambda: window.loaded, timeout=15000)
    return window


def test_jobs_window_with_real_jobs(qtbot, paths, start_engine, tmp_path) -> None:  # type: ignore
    engine = start_engine()
    failed = start_job(engine, EXIT_WITH, "3", name="will-fail")
    finished = start_job(engine, EXIT_WITH, "0", name="will-finish")
    for job in (failed, finished):
        qtbot.waitUntil(lambda j=job: job_state(engine, j.id) in (S.FAILED, S.FINISHED),
                        timeout=30000)
    ticker = start_job(engine, TICKER, "0", "0.05", name="ticker")

    window = open_window(qtbot, paths)
    assert window.windowTitle() == "Jobs — Headroom"
    qtbot.waitUntil(lambda: window.proxy.rowCount() == 3, timeout=10000)
    names = [window.proxy.index(r, 0).data() for r in range(3)]
    assert names == [f"{j.name} ({j.id[:4]})" for j in (ticker, finished, failed)]
    fail_row = window.model.job(failed.id)
    assert fail_row is not None and state_text(fail_row) == "failed (exit status 3)"

    # The filter.
    window.show_combo.setCurrentIndex(window.show_combo.findData("finished"))
    assert window.proxy.rowCount() == 2
    window.filter_edit.setText("fail")
    assert window.proxy.rowCount() == 1
    window.filter_edit.clear()
    window.show_combo.setCurrentIndex(window.show_combo.findData("active"))
    assert window.proxy.rowCount() == 1
    window.show_combo.setCurrentIndex(window.show_combo.findData("all"))

    # The live log of the selected job: it grows, search finds, copy copies.
    assert window.select_job(ticker.id)
    assert window.selected_id == ticker.id
    qtbot.waitUntil(lambda: "tick 20" in window.log_text(), timeout=20000)
    window.search_edit.setText("tick 7")
    assert window.find_in_log()
    assert window.log_view.textCursor().selectedText() == "tick 7"
    assert window.search_result.text().endswith("found")
    window.search_edit.setText("no such line")
    assert not window.find_in_log()
    assert window.search_result.text() == "not found"
    window.search_edit.clear()
    copied = window.copy_log()
    assert "tick 1\n" in copied
    assert QGuiApplication.clipboard().text() == copied

    # Pause and resume from the window.
    assert window.buttons["pause"].isEnabled() and not window.buttons["resume"].isEnabled()
    qtbot.mouseClick(window.buttons["pause"], Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: getattr(window.selected_job(), "state", None) == S.PAUSED,
                    timeout=20000)
    qtbot.waitUntil(lambda: window.buttons["resume"].isEnabled(), timeout=5000)
    assert not window.buttons["pause"].isEnabled()
    before = window.log_text().count("tick")
    qtbot.mouseClick(window.buttons["resume"], Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: getattr(window.selected_job(), "state", None) == S.RUNNING,
                    timeout=20000)
    qtbot.waitUntil(lambda: window.log_text().count("tick") > before + 5, timeout=20000)
    # A script without Keras's fit() cannot pause at a batch end: its processes are suspended.
    qtbot.waitUntil(lambda: any(e.endswith("suspended by you") for e in window.event_lines())
                    and any(e.endswith("resumed by you") for e in window.event_lines()),
                    timeout=20000)
    assert any(e.endswith("started in " + str(Path(TICKER).parent) + f" (pid {ticker.pid})")
               for e in window.event_lines())

    # The memory chart from the engine's history of this job.
    window.detail_tabs.setCurrentIndex(3)
    def curve_points() -> int:
        xs = window.rss_curve.getData()[0]
        return 0 if xs is None else len(xs)

    qtbot.waitUntil(lambda: curve_points() >= 2, timeout=20000)
    assert window.chart.getPlotItem().getAxis("left").labelText in ("MiB", "GiB")

    # The folder, through Qt's URL handler hook.
    catcher = UrlCatcher()
    QDesktopServices.setUrlHandler("file", catcher, "handle")
    try:
        qtbot.mouseClick(window.buttons["folder"], Qt.MouseButton.LeftButton)
    finally:
        QDesktopServices.unsetUrlHandler("file")
    assert catcher.paths == [str(paths.jobs_dir / ticker.id)]

    # Stop (after saying yes), then relaunch the same spec.
    asked: List[str] = []
    window.confirm = lambda text: asked.append(text) or True
    qtbot.mouseClick(window.buttons["stop"], Qt.MouseButton.LeftButton)
    assert asked and asked[0].startswith("Stop ticker")
    qtbot.waitUntil(lambda: getattr(window.selected_job(), "state", None) == S.STOPPED,
                    timeout=30000)
    assert window.buttons["relaunch"].isEnabled()
    with qtbot.waitSignal(window.relaunched, timeout=20000) as relaunched:
        qtbot.mouseClick(window.buttons["relaunch"], Qt.MouseButton.LeftButton)
    new = relaunched.args[0]
    assert new.id != ticker.id and new.spec == ticker.spec
    qtbot.waitUntil(lambda: window.selected_id == new.id, timeout=10000)
    qtbot.waitUntil(lambda: "tick 3" in window.log_text(), timeout=20000)
    with engine.client() as c:
        c.job_action(new.id, "stop")


def test_engine_refusal_shows_one_line(qtbot, paths, start_engine) -> None:  # type: ignore
    engine = start_engine()
    done = start_job(engine, EXIT_WITH, "0", name="quick")
    qtbot.waitUntil(lambda: job_state(engine, done.id) == S.FINISHED, timeout=30000)
    window = open_window(qtbot, paths)
    qtbot.waitUntil(lambda: window.selected_id == done.id, timeout=10000)  # the first row
    assert not window.buttons["pause"].isEnabled()
    window.act("pause")  # as if a stale button were clicked
    qtbot.waitUntil(lambda: window.action_error.text() != "", timeout=15000)
    text = window.action_error.text()
    assert "\n" not in text and "Traceback" not in text
    assert done.id in text or "quick" in text
    qtbot.waitUntil(lambda: "about to exit with 0" in window.log_text(), timeout=10000)
    qtbot.waitUntil(lambda: window.options_tree.topLevelItemCount() > 0, timeout=10000)


def test_engine_gone_is_said(qtbot, paths, start_engine) -> None:  # type: ignore
    engine = start_engine()
    window = open_window(qtbot, paths)
    assert window.empty_label.isVisibleTo(window)
    engine.stop()
    qtbot.waitUntil(lambda: window.banner.isVisibleTo(window), timeout=15000)
    assert window.banner.text().startswith("The jobs cannot be read: ")
    window.set_reachable(False, "the engine went away")
    assert window.banner.text() == ("The engine is not reachable: the engine went away. What "
                                    "is shown may be out of date.")


def test_keyboard_and_names(qtbot, paths, start_engine) -> None:  # type: ignore
    start_engine()
    window = open_window(qtbot, paths)
    for name, button in window.buttons.items():
        assert button.accessibleName().endswith("job"), name
    for widget in (window.table, window.filter_edit, window.show_combo, window.log_view,
                   window.search_edit, window.options_tree, window.events_tree, window.chart):
        assert widget.accessibleName()
    window.filter_edit.setFocus()
    qtbot.keyClick(window.filter_edit, Qt.Key.Key_Escape)
    qtbot.waitUntil(lambda: not window.isVisible(), timeout=5000)
    assert not window._timer.isActive()  # a hidden window stops asking the engine
