"""Soak: 3000 dashboard updates, each repainted, without a crash and without growing memory.

PySide6 6.12.0 on Python 3.11 crashes after a few hundred repaints of Python-overridden paint
methods (pyqtgraph's items are); this is the test that notices.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings

from tests.ui.statuses import GiB, job, make_status
from trayapp.engine.event_record import EngineEvent
from trayapp.ui.dashboard import Dashboard
from trayapp.ui.data import RangeData

pytestmark = [pytest.mark.slow,
              pytest.mark.qt_log_ignore(r"This plugin does not support propagateSizeHints")]

UPDATES = 3000
WARM_UP = 1000
# Growth allowed after the warm-up: buffers are full by then, so what is left is noise.
MAX_GROWTH_BYTES = 24 * 1024**2


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc (Linux)")
def test_3000_updates_and_repaints(qtbot, tmp_path: Path) -> None:
    d = Dashboard(QSettings(str(tmp_path / "ui.ini"), QSettings.Format.IniFormat))
    qtbot.addWidget(d)
    d.resize(800, 600)
    d.show()
    d.set_range(300)
    d.load_history(RangeData(300, 0.0))
    t0 = 1796050000.0
    view = d.plots.viewport()
    start_rss = 0
    for k in range(UPDATES):
        t = t0 + k * 0.25
        wave = 0.5 + 0.4 * math.sin(k / 50.0)
        jobs = [job("a1", epoch=k // 500, step=k % 500)] if (k // 700) % 2 == 0 else []
        state = "warn" if (k // 300) % 4 == 3 else "ok"
        d.apply_snapshot(make_status(state, available=16 * GiB * (1 - wave),
                                     vram_used=12 * GiB * wave, jobs=jobs, t=t))
        if k % 50 == 0:
            kind = ("job_started", "job_paused", "job_resumed", "guard_warn", "guard_ok")[
                (k // 50) % 5]
            d.add_event(EngineEvent(t, kind, "info", f"{kind} {k}", "a1", id=k + 1))
        if k % 10 == 0:
            d.show_values_at(t - 3.0)
        view.repaint()  # a real, synchronous paint of every plot
        if k == WARM_UP:
            start_rss = rss_bytes()
    growth = rss_bytes() - start_rss
    assert d.updates == UPDATES
    # The buffers stayed bounded: five minutes of rows at most.
    assert len(d.table) <= d.table.capacity
    assert d.table.t()[-1] == t0 + (UPDATES - 1) * 0.25
    assert d.marker_count <= 300
    assert growth < MAX_GROWTH_BYTES, f"RSS grew by {growth / 2**20:.1f} MiB"
