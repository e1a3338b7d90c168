"""The dashboard's words fit: labels never overlap nor leave their plot, the readout wraps and
says the time it is for, the banner shows all its lines."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, List

import pytest
from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QApplication

from tests.ui.statuses import GiB, job, make_status
from trayapp import formats
from trayapp.config.view import ConfigView
from trayapp.engine.event_record import EngineEvent
from trayapp.ui.dashboard import Dashboard
from trayapp.ui.dashboard_labels import event_candidates, line_candidates, overlaps, place
from trayapp.vocab import GuardLevel as L

pytestmark = pytest.mark.qt_log_ignore(
    r"This plugin does not support (propagateSizeHints|raise)\(\)")

T0 = 1796050000.0


def dashboard(qtbot: Any, tmp_path: Path, width: int = 1000, height: int = 600) -> Dashboard:
    d = Dashboard(QSettings(str(tmp_path / "ui.ini"), QSettings.Format.IniFormat))
    qtbot.addWidget(d)
    d.resize(width, height)
    d.show()
    return d


def guard_config(**values: str) -> ConfigView:
    guard = {"warn_available": "15%", "pause_available": "10%", "park_available": "5%",
             "resume_available": "20%"}
    guard.update(values)
    return ConfigView(values={"guard": guard})


def event(eid: int, kind: str, t: float, job_id: str = "j1") -> EngineEvent:
    return EngineEvent(t, kind, "info", kind, job_id, id=eid)


def label_rects(d: Dashboard) -> List[Any]:
    QApplication.processEvents()
    d.ram_labels.relayout()
    return [la.item.sceneBoundingRect() for la in d.ram_labels.labels.values()
            if la.item.isVisible()]


def assert_apart_and_inside(d: Dashboard) -> None:
    rects = label_rects(d)
    view = d.ram_plot.vb.sceneBoundingRect()
    for r in rects:
        assert view.contains(r), (r, view)
    for a, b in itertools.combinations(rects, 2):
        assert not a.intersects(b), (a, b)


def test_place_takes_the_first_free_candidate_inside() -> None:
    bounds = (0.0, 0.0, 100.0, 50.0)
    first = [(10.0, 10.0, 30.0, 10.0), (10.0, 25.0, 30.0, 10.0)]
    out = place([first, list(first), [(90.0, 0.0, 30.0, 10.0)]], bounds)
    assert out == [first[0], first[1], None]  # the second moves, the third is outside
    # A threshold's label stays on its line (above or below it); an event's in the top rows.
    for r in line_candidates(30.0, 20.0, 8.0, bounds):
        assert r[1] + r[3] == pytest.approx(29.0) or r[1] == pytest.approx(31.0)
    rows = {r[1] for r in event_candidates(50.0, 20.0, 8.0, bounds)}
    assert min(rows) > 0 and len(rows) >= 3
    assert not overlaps((0, 0, 10, 10), (10, 0, 10, 10))


def test_labels_never_overlap_even_after_a_settings_change(qtbot, tmp_path: Path) -> None:
    d = dashboard(qtbot, tmp_path)
    for k in range(20):
        d.apply_snapshot(make_status(t=T0 + k, jobs=[job()]))
    d.set_config(guard_config())
    # Events close together, on the thresholds' side of the plot and at its right edge.
    for n, (kind, dt) in enumerate([("job_started", 2), ("job_paused", 3), ("job_resumed", 3.5),
                                    ("job_paused", 4), ("job_resumed", 18), ("job_parked", 19),
                                    ("job_stopped", 19.5)]):
        d.add_event(event(n + 1, kind, T0 + dt))
    assert d.ram_labels.shown(), "no label placed at all"
    assert_apart_and_inside(d)
    words = [la.item.textItem.toPlainText() for la in d.ram_labels.labels.values()]
    assert "resume: available > 20%" in words and "warn: available < 15%" in words
    # The thresholds moved next to the top of the plot (and the limit's line), then the window
    # made smaller: every label still inside, none over another.
    d.set_config(guard_config(warn_available="3%", pause_available="2%", park_available="1%"))
    assert ("threshold", "warn") in d.ram_labels.shown()
    assert_apart_and_inside(d)
    d.resize(760, 560)
    QApplication.processEvents()
    assert_apart_and_inside(d)


def test_the_readout_says_its_time_and_fits(qtbot, tmp_path: Path) -> None:
    d = dashboard(qtbot, tmp_path, 1280, 760)
    many = [job(f"j{k}", f"a-long-job-name-{k}") for k in range(4)]
    for k in range(10):
        d.apply_snapshot(make_status(t=T0 + k, jobs=many))
    QApplication.processEvents()
    # Not pointing: the newest row, said to be now.
    now = d.readout_view.plain()
    assert now.startswith("now " + formats.clock(T0 + 9))
    text = d.show_values_at(T0 + 3.1)
    assert text.startswith("at " + formats.clock(T0 + 3))
    assert "a-long-job-name-3 (job j3)" in text and "GPU 0" in text
    for width in (1280, 760):
        d.resize(width, 760)
        d.show_values_at(T0 + 3.1 + width / 10000)
        QApplication.processEvents()
        r = d.readout
        assert r.wordWrap() and r.width() <= d.width()
        assert r.height() >= r.heightForWidth(r.width()), "the readout is cut off"
    # The pointer leaves: back to now.
    d.show_values_at(None)
    assert d.readout_view.plain().startswith("now ") and d.hover_t is None


def test_the_banner_shows_every_line(qtbot, tmp_path: Path) -> None:
    d = dashboard(qtbot, tmp_path, 760, 560)
    reasons = [f"reason number {k}: available memory below 15% while the job grows by "
               f"{k * 10} MiB/s and the largest process is named at length" for k in range(4)]
    # The banner comes with one line, then its text grows while the window is open.
    d.apply_snapshot(make_status(t=T0))
    QApplication.processEvents()
    d.apply_snapshot(make_status(L.WARN, reasons=["low"], t=T0 + 1, available=3 * GiB))
    QApplication.processEvents()
    d.apply_snapshot(make_status(L.WARN, reasons=reasons, tte=40, available=1 * GiB, t=T0 + 2))
    QApplication.processEvents()
    b = d.banner
    assert b.isVisible() and "reason number 3" in b.text()
    assert b.height() >= b.heightForWidth(b.width()), "the banner's last lines are cut"
    d.resize(720, 560)  # narrower: more lines
    QApplication.processEvents()
    assert b.heightForWidth(b.width()) > 4 * b.fontMetrics().height()
    assert b.height() >= b.heightForWidth(b.width()), "the banner's last lines are cut"


def test_pointing_where_nothing_was_recorded_says_so(qtbot, tmp_path: Path) -> None:
    d = dashboard(qtbot, tmp_path)
    for k in range(5):
        d.apply_snapshot(make_status(t=T0 + k, jobs=[job()]))
    text = d.show_values_at(T0 - 120)
    assert text.startswith("at " + formats.clock(T0 - 120)) and "no samples at this time" in text
    assert "mnist" not in text
