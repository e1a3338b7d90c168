"""The dashboard's "now" bars: each memory by consumer at this moment, a 2% job a band of its
own whatever the scale, named inside where it fits and on hover always."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QPoint, QSettings
from PySide6.QtWidgets import QApplication

from tests.ui.statuses import GiB, job, make_status
from trayapp.ui.dashboard import Dashboard
from trayapp.ui.dashboard_now import MIN_SEGMENT_PX, widths

pytestmark = pytest.mark.qt_log_ignore(
    r"This plugin does not support (propagateSizeHints|raise)\(\)")
T0 = 1796050000.0


@pytest.mark.parametrize("values, total, width, expected", [
    ([50, 50], 100, 200, [100, 100]),
    ([1, 99], 100, 200, [MIN_SEGMENT_PX, 196]),  # 1% is 2 px: raised to the minimum
    ([0, 30], 100, 100, [0, 30]),  # nothing held: no band; the rest of the bar stays empty
    ([1, 1, 1], 1000, 100, [MIN_SEGMENT_PX] * 3),  # three tiny ones: each seen
    ([10, 20], 0, 100, [0, 0]),  # no total known: nothing drawn
    ([200], 100, 50, [50]),  # more than the total (pages counted twice): the bar's width
])
def test_widths(values: Any, total: float, width: int, expected: Any) -> None:
    assert widths(values, total, width) == expected


def test_a_small_job_is_a_band_of_its_own_and_named(qtbot: Any, tmp_path: Path) -> None:
    d = Dashboard(QSettings(str(tmp_path / "ui.ini"), QSettings.Format.IniFormat))
    qtbot.addWidget(d)
    d.resize(1000, 700)
    d.show()
    consumers = [{"name": "firefox", "rss_bytes": 6 * GiB, "processes": 12}]
    for k in range(5):  # 16 GiB: the job holds 0.3 GiB (2%)
        st = make_status(t=T0 + k, available=8 * GiB,
                         jobs=[job("ab12cd", "tiny", rss_bytes=int(0.3 * GiB))],
                         consumers=consumers)
        d.apply_snapshot(st)
    QApplication.processEvents()
    ram = d.now_bars.bars["RAM"]
    assert [s.label for s in ram.segments][:2] == ["tiny (job ab12)", "firefox"]
    assert ram.segments[-1].label == "available"  # what is free, last
    rects = ram.layout_rects()
    job_rect = rects[0][0]
    assert job_rect.width() >= MIN_SEGMENT_PX
    assert job_rect.right() < rects[1][0].left()  # its own band, before firefox's
    seg = ram.segment_at(job_rect.center().x())
    assert seg is not None and seg.label == "tiny (job ab12)" and seg.job
    assert "GPU 0" in d.now_bars.bars  # each GPU's memory too
    # On hover the job's name, its size and its share.
    ram.event(_help_at(ram, job_rect.center()))


def _help_at(widget: Any, pos: QPoint) -> Any:
    from PySide6.QtCore import QEvent
    from PySide6.QtGui import QHelpEvent

    return QHelpEvent(QEvent.Type.ToolTip, pos, widget.mapToGlobal(pos))


@pytest.mark.parametrize("values, total, width", [
    ([float("inf"), 10], 100, 200), ([float("nan"), 10], 100, 200), ([10, 20], float("nan"), 200),
    ([10, 20], float("inf"), 200), ([-5, 10], 100, 200), ([1.0] * 5000, 5000, 300),
])
def test_widths_of_values_no_reading_should_give_never_raise_nor_overflow(
        values: Any, total: float, width: int) -> None:
    out = widths(values, total, width)
    assert len(out) == len(values) and all(w >= 0 for w in out)
    if len(values) * MIN_SEGMENT_PX <= width:
        assert sum(out) <= width


MARKUP = "<img src='file:///etc/passwd'> & <b>bold</b>"


def test_names_with_markup_are_shown_as_written_never_as_markup(qtbot: Any,
                                                                 tmp_path: Path) -> None:
    from PySide6.QtWidgets import QToolTip

    d = Dashboard(QSettings(str(tmp_path / "ui.ini"), QSettings.Format.IniFormat))
    qtbot.addWidget(d)
    d.resize(1000, 700)
    d.show()
    consumers = [{"name": MARKUP, "rss_bytes": 6 * GiB, "processes": 1}]
    for k in range(3):
        st = make_status(t=T0 + k, available=8 * GiB,
                         jobs=[job("ab12cd", "<i>job</i> &", rss_bytes=2 * GiB)],
                         consumers=consumers)
        d.apply_snapshot(st)
    QApplication.processEvents()
    plain = d.show_values_at(None)
    assert MARKUP in plain and "<i>job</i> & (job ab12)" in plain
    assert "<img" not in d.readout.text()
    ram = d.now_bars.bars["RAM"]
    for rect, _ in ram.layout_rects()[:2]:
        ram.event(_help_at(ram, rect.center()))
        tip = QToolTip.text()
        assert "<img" not in tip and "<i>job" not in tip, tip
        assert "&lt;" in tip
    tip = d.ram_plot.titleLabel.toolTip()
    assert "<img" not in tip and "&lt;img" in tip, tip
