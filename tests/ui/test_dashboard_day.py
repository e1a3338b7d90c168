"""The dashboard after a day of work: seven jobs over 40 minutes, five of them runs of "train"
that have ended, one with a very long name. The live edge stays in view at every width, the
legend and the "now" line list only what holds memory in the range shown, the jobs are told
apart by a short id, and the titles fit their plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any, List

import pytest
from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QApplication

from tests.ui.statuses import GiB, job, make_status
from trayapp.ui.dashboard import Dashboard

pytestmark = pytest.mark.qt_log_ignore(
    r"This plugin does not support (propagateSizeHints|raise)\(\)")

T0 = 1796050000.0
LONG = "sweep_lr_0.001_bs_256_resnet50_cifar100_augmix_seed_17"
NAMES = ["train"] * 5 + [LONG, "bert-finetune"]
SPANS = [(0, 300), (320, 600), (650, 900), (950, 1300), (1350, 1700), (1800, 2400),
         (2000, 2400)]
END = 2400
CONSUMERS = [{"name": "firefox", "rss_bytes": 5 * GiB, "processes": 12},
             {"name": "Headroom engine", "rss_bytes": GiB // 3, "processes": 1}]


def jobs_at(k: int) -> List[Any]:
    out = []
    for i, (a, b) in enumerate(SPANS):
        jid = f"{i}a{i}b{i}c{i}"
        if a <= k <= b:
            out.append(job(jid, NAMES[i], "running", rss_bytes=GiB // 2 + i * GiB // 8,
                           pids=[5000 + i], pid=5000 + i))
        elif k > b:
            out.append(job(jid, NAMES[i], "finished", rss_bytes=None, vram_bytes=None,
                           pids=[], pid=5000 + i))
    return out


@pytest.fixture
def day(qtbot: Any, tmp_path: Path) -> Dashboard:
    d = Dashboard(QSettings(str(tmp_path / "ui.ini"), QSettings.Format.IniFormat))
    qtbot.addWidget(d)
    d.resize(1280, 760)
    d.show()
    for k in range(0, END + 1, 5):
        st = make_status(t=T0 + k, available=10 * GiB, jobs=jobs_at(k), consumers=CONSUMERS)
        d.apply_snapshot(st)
    QApplication.processEvents()
    return d


def legend_of(d: Dashboard) -> List[str]:
    return [label for label, _ in d._titles[id(d.ram_plot)][1]]


@pytest.mark.parametrize("width", [1280, 1000, 760])
def test_the_live_edge_is_in_view_at_every_width(day: Dashboard, qtbot: Any,
                                                  width: int) -> None:
    day.resize(width, 760)
    qtbot.waitUntil(lambda: day.plots.width() <= day.width(), timeout=5000)
    for plot in day._plot_order:
        # Every plot fits the window, and its range ends at the newest sample (not off screen).
        assert plot.sceneBoundingRect().right() <= day.plots.viewport().width() + 1
        assert plot.vb.viewRange()[0][1] >= T0 + END
        title = plot.titleLabel
        assert title.item.boundingRect().width() <= plot.width() + 1, title.text
    assert "…" in day.ram_plot.titleLabel.text  # the long name is cut
    assert LONG in day.ram_plot.titleLabel.toolTip()  # and whole on hover


def test_only_what_holds_memory_in_the_range_is_listed(day: Dashboard) -> None:
    # The last five minutes: the two running jobs, not the five runs of "train" that ended.
    legend = legend_of(day)
    assert "bert-finetune (job 6a6b)" in legend
    assert any(label.endswith("(job 5a5b)") for label in legend)
    assert not [label for label in legend if label.startswith("train")]
    assert {"firefox", "Headroom engine", "available"} <= set(legend)
    now = day.show_values_at(None)
    assert "0 MiB (0%)" not in now and "train" not in now
    # An hour: the ended runs are back, each told apart by its short id.
    day.set_range(3600)
    day.redraw(T0 + END)
    trains = [label for label in legend_of(day) if label.startswith("train")]
    assert trains == [f"train (job {i}a{i}b)" for i in range(5)]
    # Pointing at the time the second run of train ran: it is named with its id.
    assert "train (job 1a1b) 0.62 GiB" in day.show_values_at(T0 + 450)
