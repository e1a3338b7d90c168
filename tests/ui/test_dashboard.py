"""The dashboard: fed by a real engine in --demo mode, events as markers and spans, the banner,
remembered window state, and the window that stands in for a missing system tray."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import pytest
from PySide6.QtCore import QSettings

from tests.conftest import REPO
from tests.ui.statuses import job, make_status
from trayapp.config.view import ConfigView
from trayapp.engine.client import EngineClient
from trayapp.engine.event_record import EngineEvent
from trayapp.ui.dashboard import GIB, Dashboard
from trayapp.ui.data import RangeData
from trayapp.ui.icon import COLOURS
from trayapp.vocab import GuardLevel as L
from trayapp.vocab import JobState as S

# The offscreen platform has no window manager and no system tray: it says so when a window is
# raised or resized, and when a tray icon is shown anyway (one test forces one).
pytestmark = pytest.mark.qt_log_ignore(
    r"This plugin does not support (propagateSizeHints|raise)\(\)",
    r"No such signal QPlatformNativeInterface::systemTrayWindowChanged")


TICKER = str(REPO / "tests" / "scripts" / "jobs" / "ticker.py")


def settings_at(tmp_path: Path) -> QSettings:
    return QSettings(str(tmp_path / "ui.ini"), QSettings.Format.IniFormat)


def event(eid: int, kind: str, t: float, message: str = "", level: str = "info",
          job_id: Optional[str] = "j1") -> EngineEvent:
    return EngineEvent(t, kind, level, message or kind.replace("_", " "), job_id, None, eid)


def test_dashboard_fed_by_a_real_demo_engine(qtbot, demo_engine, app_on) -> None:
    app = app_on(demo=True, tray_available=False)
    app.start()
    d = app.dashboard()
    assert d.isVisible()
    qtbot.waitUntil(lambda: d.updates >= 3 and d.history_loads >= 1, timeout=20000)
    status = app.status
    assert status is not None and status.engine.demo is True
    assert "simulated GPUs" in d.windowTitle() and d.sim_label.isVisible()
    # Two simulated GPUs: one VRAM plot each, stacked by process (the desktop's on GPU 0).
    gpus = sorted(g.index for g in status.gpus)
    assert sorted(d.vram_plots) == gpus
    for i in gpus:
        top = d._stacks[i].layers[-1].item
        x, y = top.getData()
        assert len(x) >= 1 and np.nanmax(y) > 0
    qtbot.waitUntil(lambda: "Xorg" in [la.label for la in d._stacks[0].layers], timeout=10000)
    # RAM stacked by process, on the clock-time axis: the top of the stack is the RAM used.
    used = d._stacks["ram"].layers[-2].item
    x, y = used.getData()
    assert len(x) >= 3 and abs(x[-1] - time.time()) < 60
    assert status.memory is not None
    total = status.memory.total_bytes
    assert 0 < y[-1] <= total / GIB
    # The limit and the guard's thresholds (from the engine's settings) as lines, where the
    # stack of what is used reaches them when available memory falls that low.
    qtbot.waitUntil(lambda: d.threshold_lines["warn"].isVisible(), timeout=10000)
    assert d.limit_line.value() == pytest.approx(total / GIB)
    assert d.threshold_lines["warn"].value() == pytest.approx(0.85 * total / GIB, rel=1e-6)
    assert d.threshold_lines["park"].value() == pytest.approx(0.95 * total / GIB, rel=1e-6)
    # Downsampling and clipping are on for every plot.
    for plot in d._plot_order:
        assert plot.ctrl.downsampleCheck.isChecked() and plot.ctrl.clipToViewCheck.isChecked()
        assert plot.ctrl.peakRadio.isChecked()
    # Hovering reads the values at that time.
    text = d.show_values_at(float(x[-1]))
    assert "RAM " in text and "available" in text and "GPU 0 " in text and "Xorg" in text
    # A longer range is filled from the history again, then follows live data.
    loads = d.history_loads
    d.set_range(3600)
    qtbot.waitUntil(lambda: d.history_loads > loads, timeout=20000)
    start, end = d.ram_plot.vb.viewRange()[0]
    assert end - start == pytest.approx(3600, rel=0.01)
    n = d.updates
    qtbot.waitUntil(lambda: d.updates > n, timeout=10000)
    assert len(d.table) >= 3


def test_history_arrives_once_the_engine_does(qtbot, start_engine, app_on) -> None:
    app = app_on(tray_available=True)
    app.start()
    d = app.open_window("dashboard")
    qtbot.waitUntil(lambda: d.banner_level == "unreachable", timeout=10000)
    qtbot.waitUntil(lambda: d._requested is None, timeout=10000)  # the first fetch failed
    start_engine(demo=True)
    qtbot.waitUntil(lambda: d.history_loads >= 1, timeout=30000)
    assert d.banner_level == "" and len(d.table) >= 1


def test_live_events_from_a_real_engine(qtbot, demo_engine, app_on, paths) -> None:
    app = app_on(tray_available=True)
    app.start()
    d = app.open_window("dashboard")
    qtbot.waitUntil(lambda: d.updates >= 2 and d.history_loads >= 1, timeout=20000)
    with EngineClient(paths) as c:
        job_id = c.job_start({"script": TICKER, "args": ["0", "0.2"], "name": "ticker"}).id
        # The job's first event may come before a status names the job: its marker is named
        # as soon as one does (by the event's job id).
        qtbot.waitUntil(lambda: "ticker started" in [
            d.marker_text(key) for key in d._markers], timeout=15000)
        qtbot.waitUntil(lambda: job_id in d.jobs_strip.rows,
                        timeout=15000)
        # A warning threshold above what is free now: the guard warns at once.
        c.config_set("guard.warn_available", "99%")
        qtbot.waitUntil(lambda: d.banner_level == "warn", timeout=15000)
        qtbot.waitUntil(lambda: bool(d.spans) and d.spans[-1][2] == "warn", timeout=15000)
        assert app.tray is not None and app.tray.icon_state.state == "warn"
        assert d.threshold_lines["warn"].value() == pytest.approx(
            0.01 * app.status.memory.total_bytes / GIB, rel=1e-6)  # type: ignore[union-attr]
        c.config_set("guard.warn_available", "15%")
        qtbot.waitUntil(lambda: d.banner_level == "", timeout=30000)
        start, end, level = d.spans[-1]
        assert end > start
        c.job_action(job_id, "stop")
        qtbot.waitUntil(lambda: "ticker stopped" in [
            d.marker_text(key) for key in d._markers], timeout=20000)
        qtbot.waitUntil(lambda: job_id not in d.jobs_strip.rows, timeout=15000)


def test_events_become_markers_and_spans(qtbot, tmp_path: Path) -> None:
    d = Dashboard(settings_at(tmp_path))
    qtbot.addWidget(d)
    t0 = 1796050000.0
    for k in range(10):
        d.apply_snapshot(make_status(t=t0 + k, jobs=[job()]))
    d.show()
    events = [event(1, "job_started", t0 + 1, "job mnist started"),
              event(2, "guard_warn", t0 + 2, "RAM 86% used", "warn"),
              event(3, "guard_pause", t0 + 4, "RAM 93% used", "warn"),
              event(4, "job_paused", t0 + 4, "job mnist paused"),
              event(5, "guard_ok", t0 + 7, "memory is back"),
              event(6, "config_changed", t0 + 8)]
    for e in events:
        d.add_event(e)
    d.add_event(events[0])  # the same event twice draws one marker
    assert d.marker_count == 2
    assert d.spans == [(t0 + 2, t0 + 4, "warn"), (t0 + 4, t0 + 7, "pause")]
    # One marker line per plot, labelled on the top plot only.
    lines = d._markers[1]
    assert len(lines) == len(d._plot_order)
    assert d.marker_text(1) == "mnist started"  # the job's name from the status
    assert [k for k in d.ram_labels.labels if k[0] == "event"] == [("event", 1), ("event", 4)]
    # An open warning span follows the live data until the guard says ok.
    d.add_event(event(7, "guard_warn", t0 + 8, "again", "warn"))
    d.apply_snapshot(make_status(L.WARN, t=t0 + 12, jobs=[job()]))
    assert d.spans[-1] == (t0 + 8, t0 + 12, "warn")
    d.apply_snapshot(make_status(L.OK, t=t0 + 13, jobs=[job()]))
    assert d.spans[-1] == (t0 + 8, t0 + 13, "warn")
    text = d.show_values_at(t0 + 5.2)
    assert text.startswith("at " + time.strftime("%H:%M:%S", time.localtime(t0 + 5)))
    assert "mnist (job j1) 3.00 GiB (19%)" in text and "available 12.00 GiB" in text
    assert "GPU 0 mnist (job j1) 4.00 GiB (33%) · Xorg 1.00 GiB (8%) · other 1.00 GiB" in text
    # A message with braces cannot break a marker label (they are format strings).
    d.add_event(event(8, "job_failed", t0 + 9, "KeyError: {'x'}", job_id=None))
    assert d.marker_text(8) == "KeyError: {'x'}"
    # A job the status no longer lists is named by the event's job id, from the jobs the
    # history load names (not from the words of the message); one never named shows its id.
    assert d.load_history(RangeData(d.range_seconds, t0 + 10, jobs={"3fa2": "resnet"}))
    d.add_event(event(9, "job_finished", t0 + 9, "job 3fa2 (other words) finished",
                      job_id="3fa2"))
    assert d.marker_text(9) == "resnet finished"
    d.add_event(event(10, "job_finished", t0 + 9, "job 4b5c (gan) finished", job_id="4b5c"))
    assert d.marker_text(10) == "4b5c finished"
    # A job seen in a status once keeps its name after it has gone from the status.
    d.apply_snapshot(make_status(L.OK, t=t0 + 14, jobs=[]))
    d.add_event(event(11, "job_stopped", t0 + 14, "stopped", job_id="j1"))
    assert d.marker_text(11) == "mnist stopped"


def test_the_jobs_strip_shows_progress_loss_and_eta(qtbot, tmp_path: Path) -> None:
    d = Dashboard(settings_at(tmp_path))
    qtbot.addWidget(d)
    d.show()
    d.apply_snapshot(make_status(jobs=[job("a1", "mnist"), job("b2", "gan", S.PAUSED,
                                                                 steps=None, metrics={})]))
    rows = d.jobs_strip.rows
    assert list(rows) == ["a1", "b2"] and not d.jobs_strip.empty.isVisible()
    a = rows["a1"]
    assert (a["epoch"].value(), a["epoch"].maximum()) == (2, 10)
    assert a["epoch"].text() == "epoch 2/10" and a["step"].text() == "step 120/500"
    assert a["loss"].text() == "loss 0.4321" and a["eta"].text() == "ETA 12 min"
    assert rows["b2"]["step"].text() == "step n/a" and rows["b2"]["loss"].text() == "loss n/a"
    d.apply_snapshot(make_status(jobs=[job("a1", "mnist", epoch=3)]))
    assert d.jobs_strip.rows["a1"]["epoch"].value() == 3 and list(d.jobs_strip.rows) == ["a1"]
    # A notebook's kernel between fits: its bars are the last fit's, with no time left.
    d.apply_snapshot(make_status(jobs=[job("k1", "train.ipynb", kind="kernel", hooked=True,
                                           runner_state="idle")]))
    k = d.jobs_strip.rows["k1"]
    assert k["name"].text() == "train.ipynb  (running, idle)" and k["eta"].text() == ""
    d.apply_snapshot(make_status(jobs=[]))
    assert d.jobs_strip.rows == {} and d.jobs_strip.empty.isVisible()


def test_the_banner_shows_an_active_warning(qtbot, tmp_path: Path) -> None:
    d = Dashboard(settings_at(tmp_path))
    qtbot.addWidget(d)
    d.show()
    d.apply_snapshot(make_status())
    assert not d.banner.isVisible()
    d.apply_snapshot(make_status(L.WARN, reasons=["available memory below 15%"], tte=40))
    assert d.banner.isVisible() and d.banner_level == "warn"
    assert d.banner.text() == \
        "Warning: available memory below 15%. Memory runs out in ~40 s"
    assert COLOURS["warn"].name() in d.banner.styleSheet()
    d.apply_snapshot(make_status(L.PARK, reasons=["RAM 96% used"]))
    assert d.banner_level == "park" and COLOURS["park"].name() in d.banner.styleSheet()
    d.set_reachable(False, "the engine went away")
    assert d.banner_level == "unreachable" and "the engine went away" in d.banner.text()
    d.apply_snapshot(make_status())
    assert not d.banner.isVisible()


def test_window_state_and_range_are_remembered(qtbot, tmp_path: Path) -> None:
    s = settings_at(tmp_path)
    d = Dashboard(s)
    qtbot.addWidget(d)
    d.show()
    d.set_range(86400)
    d.resize(740, 570)  # within the offscreen screen (800 x 600)
    d.move(20, 10)
    d.close()
    assert (tmp_path / "ui.ini").exists()
    again = Dashboard(settings_at(tmp_path))
    qtbot.addWidget(again)
    assert again.range_seconds == 86400 and again.range_buttons[86400].isChecked()
    again.show()
    assert (again.width(), again.height()) == (740, 570)
    # Without a window manager the frame is a guess: the place is kept within its height.
    assert abs(again.x() - 20) <= 16 and abs(again.y() - 10) <= 16


def test_no_tray_opens_the_dashboard_as_a_window(qtbot, app_on, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CURRENT_DESKTOP", "ubuntu:GNOME")
    app = app_on(tray_available=None)  # the offscreen platform has no system tray
    assert app.tray is None
    app.start()
    d = app.dashboard()
    assert d.isVisible() and d.no_tray_label.isVisible()
    assert "No system tray is available here (GNOME shows tray icons only with the " \
           "AppIndicator extension)" in d.no_tray_label.text()
    # Without an engine the banner says so (and the title is not "simulated").
    qtbot.waitUntil(lambda: d.banner_level == "unreachable", timeout=5000)
    # Closing the window quits Headroom (nothing to ask: no jobs, no engine of ours).
    d.close()
    assert app._finished


def test_notifications_follow_the_setting(qtbot, app_on) -> None:
    app = app_on(tray_available=True)
    shown: List[Dict[str, Any]] = []
    assert app.tray is not None
    app.tray.notify = lambda e: shown.append(e) or True  # type: ignore[method-assign]
    app._on_event(event(1, "guard_pause", 1.0, "paused", "warn"))
    app._on_config(ConfigView(values={"ui": {"notifications": False}, "guard": {}}))
    app._on_event(event(2, "guard_park", 2.0, "parked", "error"))
    app._on_config(ConfigView(values={"ui": {"notifications": True}, "guard": {}}))
    app._on_event(event(3, "job_failed", 3.0, "failed", "error"))
    assert [e.id for e in shown] == [1, 3]


def test_a_clicked_notification_opens_the_dashboard_at_its_event(qtbot, app_on) -> None:
    app = app_on(tray_available=True)
    t0 = time.time()
    app._on_snapshot(make_status(t=t0))
    app._on_event(event(11, "guard_warn", t0 - 1200, "RAM 86% used", "warn"))
    assert app.tray is not None and app._dashboard is None
    app.tray.icon.messageClicked.emit()  # the user clicks the notification
    d = app.dashboard()
    assert d.isVisible() and not d.following
    assert d.range_seconds == 3600  # the shortest range that holds the event
    start, end = d.ram_plot.vb.viewRange()[0]
    assert start < t0 - 1200 < end
    assert "RAM 86% used" in d.readout.text()
