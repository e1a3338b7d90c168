"""The jobs window's charts: legends in the title line (never over the loss or the RAM line),
and a budget near the memory used drawn in view; one far above it said instead of flattening
the curves."""

from __future__ import annotations

from typing import Any

import pytest

from tests.ui.statuses import job
from trayapp import series
from trayapp.engine.history_record import History
from trayapp.jobs.curves import JobCurves
from trayapp.jobs.record import JobRecord
from trayapp.ui.job_details import CurvesChart, MemoryChart

pytestmark = pytest.mark.qt_log_ignore(r"This plugin does not support propagateSizeHints")
MiB = 1 << 20
T0 = 1796050000.0


def history(job_id: str, peak_mib: float) -> Any:
    t = [T0 + k for k in range(60)]
    rss = [min(peak_mib, 100 + 10 * k) * MiB for k in range(60)]
    return History.from_json(
        {"series": {series.job_series(job_id, "rss"): {"t": t, "v": rss},
                    series.job_series(job_id, "vram"): {"t": t, "v": [0.0] * 60}}})


@pytest.mark.parametrize("budget_mib, in_view", [(600, True), (10240, False)])
def test_a_budget_near_the_use_is_drawn_in_view(qtbot: Any, budget_mib: int,
                                                 in_view: bool) -> None:
    chart = MemoryChart()
    qtbot.addWidget(chart)
    chart.show()
    rec = JobRecord.from_json(job("j1", "fit", ram_budget_bytes=budget_mib * MiB))
    chart.show_history("j1", history("j1", 470), rec)
    plot = chart.chart.getPlotItem()
    top = plot.vb.viewRange()[1][1]
    (line,) = chart.budget_lines
    assert line.value() == pytest.approx(budget_mib)  # MiB: the use stays under 2 GiB
    if in_view:
        assert top >= budget_mib  # the 600 MiB budget line is on the chart
        assert "above the chart" not in chart.note.text()
    else:
        assert top < 1000  # the curves keep their height
        assert "RAM budget 10.0 GiB (above the chart: 22x the most used)" in chart.note.text()
    # The legend rides in the title line: no legend box over the curves.
    assert plot.legend is None
    assert "RAM (process tree)" in plot.titleLabel.text and "RAM budget" in plot.titleLabel.text


def test_the_curves_legend_is_in_the_title_and_escaped(qtbot: Any) -> None:
    chart = CurvesChart()
    qtbot.addWidget(chart)
    chart.show()
    curves = {"names": ["loss", "val_loss", "<b>acc</b>"],
              "batches": [{"x": 0.5, "t": T0, "m": {"loss": 1.0, "<b>acc</b>": 0.5}},
                          {"x": 1.0, "t": T0 + 1, "m": {"loss": 0.8, "<b>acc</b>": 0.6}}],
              "epochs": [{"x": 1.0, "t": T0 + 1, "m": {"loss": 0.8, "val_loss": 0.9}}],
              "fits": [{"fit": 1, "x": 0.0}]}
    chart.show_curves(JobCurves.from_json(curves), None)
    plot = chart.chart.getPlotItem()
    assert plot.legend is None
    assert [k[0] for k in chart.keys] == ["loss", "val_loss", "<b>acc</b>"]
    title = plot.titleLabel.text
    assert "&lt;b&gt;acc&lt;/b&gt;" in title and "<b>acc</b>" not in title  # the job's words
