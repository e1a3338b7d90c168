"""The dashboard's pieces without a window of their own: its colours and words, a status as
the history's series, a marker's label, and the strip of running jobs under the timelines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QGridLayout, QLabel, QProgressBar, QWidget

from trayapp import formats, series
from trayapp.config import format_bytes
from trayapp.engine.event_record import EngineEvent
from trayapp.engine.status_record import Status
from trayapp.jobs.record import JobRecord
from trayapp.text import one_line
from trayapp.ui.model import format_duration
from trayapp.ui.timeline import Table
from trayapp.vocab import EventKind as E
from trayapp.vocab import GuardLevel as L

GIB = float(1 << 30)
RANGES: Tuple[Tuple[str, int], ...] = (
    ("5 min", 300),
    ("1 h", 3600),
    ("24 h", 86400),
    ("7 d", 7 * 86400),
)
# Seconds between live rows per range: finer than a pixel of the plot, coarse enough to bound
# the buffers (a 7-day view does not need four rows a second).
LIVE_STEP = {300: 0.0, 3600: 1.0, 86400: 10.0, 7 * 86400: 60.0}
LIVE_RATE_HZ = 4.0  # the engine pushes at most this often
# Series whose peak is the lowest value (minute rows keep ``min``; live rows fold to the min).
LOW_SERIES = ("mem.available",)
FOLLOW_STEP = 0.02
MAX_MARKERS = 300
MAX_SPANS = 100

BANNER_STYLES: Dict[str, str] = {
    L.WARN: "background:#fff3cd;color:#5c4500;border:1px solid #f2a900;",
    L.PAUSE: "background:#ffe3d1;color:#6b2a00;border:1px solid #ee6a1c;",
    L.PARK: "background:#f8d7da;color:#6b0f1a;border:1px solid #d7263d;",
    "unreachable": "background:#e2e3e5;color:#2b2f33;border:1px solid #8c8c8c;",
    "info": "background:#e7f1ff;color:#0b3d91;border:1px solid #8fb3e8;",
}
SPAN_COLOURS: Dict[str, Tuple[int, int, int, int]] = {
    L.WARN: (242, 169, 0, 45),
    L.PAUSE: (238, 106, 28, 55),
    L.PARK: (215, 38, 61, 60),
}
# The guard's events that open a shaded span of their level (guard_ok closes it).
SPAN_LEVELS: Dict[str, str] = {E.GUARD_WARN: L.WARN, E.GUARD_PAUSE: L.PAUSE, E.GUARD_PARK: L.PARK}
MARKER_COLOURS: Dict[str, str] = {
    E.JOB_STARTED: "#1f77b4",
    E.JOB_RESUMED: "#1f77b4",
    E.JOB_PAUSED: "#ee6a1c",
    E.JOB_PARKED: "#9467bd",
    E.JOB_FINISHED: "#2e9d46",
    E.JOB_FAILED: "#d7263d",
    E.JOB_STOPPED: "#555555",
}
# A marker's word is its kind's: job_parked -> "parked".
MARKER_WORDS: Dict[str, str] = {kind: kind[len("job_") :] for kind in MARKER_COLOURS}
# The guard's thresholds drawn on the RAM plot (``guard.<name>_available``).
THRESHOLD_COLOURS: Dict[str, str] = {
    L.WARN: "#f2a900",
    L.PAUSE: "#ee6a1c",
    L.PARK: "#d7263d",
    "resume": "#2e9d46",
}
LAYER_COLOURS = ("#4c78a8", "#f58518", "#54a24b", "#b279a2", "#e45756", "#72b7b2", "#9d755d")

HOVER_HINT = "The values now, or at the time you point at on the timelines."
NO_TRAY_TEXT = (
    "No system tray is available here ({why}), so Headroom runs in this window; "
    "closing it quits Headroom."
)


def snapshot_values(status: Status) -> Dict[str, Optional[float]]:
    """A status as the history's series (``trayapp.series``: ``mem.used``,
    ``gpu0.job.<id>``, ``ram.proc.<name>``...), as the engine records them."""
    jobs, gpus = status.jobs, status.gpus
    values = series.sample_values(status.memory or {}, gpus, jobs)
    values.update(series.process_values(gpus, jobs, status.consumers))
    return values


def ratio(a: np.ndarray, b: np.ndarray, scale: float = 1.0) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        out = a * scale / b
    out[~np.isfinite(out)] = np.nan
    return out


@dataclass
class Curve:
    item: Any  # pg.PlotDataItem
    compute: Callable[[Table], np.ndarray]
    label: str
    unit: str  # "GiB" | "%" | "°C"
    drawn: bool = False


def marker_label(event: EngineEvent, names: Dict[str, str]) -> str:
    """A short marker text: the job's name (from ``names`` by the event's ``job_id``, else the
    id) and what happened ("mnist paused"); an event of no job shows its message."""
    kind, message, job_id = event.kind, event.text, event.job_id
    name = names.get(str(job_id), str(job_id)) if job_id is not None else None
    text = one_line(f"{name} {MARKER_WORDS[kind]}" if name and kind in MARKER_WORDS else message)
    return text if len(text) <= 40 else text[:39] + "…"


def column(name: str) -> Callable[[Table], np.ndarray]:
    return lambda tb: tb.column(name)


def escape(text: str) -> str:
    # InfiniteLine labels are format strings ({value}); braces in a message must not break them.
    return text.replace("{", "{{").replace("}", "}}")


NAME_PIXELS = 160  # a job's name in the strip at most this wide


class JobsStrip(QWidget):
    """One row per running job: name and state, epoch and step bars, loss, ETA, memory."""

    def __init__(self, parent: Optional[QWidget] = None):
        super().__init__(parent)
        self._grid = QGridLayout(self)
        self._grid.setContentsMargins(6, 2, 6, 2)
        self._grid.setHorizontalSpacing(10)
        self._grid.setVerticalSpacing(2)
        self.empty = QLabel("No jobs running.")
        self.empty.setStyleSheet("color:#666;")
        self._grid.addWidget(self.empty, 0, 0, 1, 6)
        self.rows: Dict[str, Dict[str, Any]] = {}
        self._order: List[str] = []

    def update_jobs(self, jobs: Sequence[JobRecord]) -> None:
        ids = [j.id for j in jobs]
        if ids != self._order:
            self._rebuild(ids)
        for job in jobs:
            self._fill(self.rows[job.id], job)

    def _rebuild(self, ids: List[str]) -> None:
        for row in self.rows.values():
            for w in row.values():
                if isinstance(w, QWidget):
                    self._grid.removeWidget(w)
                    w.hide()  # not drawn again until the event loop deletes it
                    w.deleteLater()
        self.rows = {}
        self._order = ids
        self.empty.setVisible(not ids)
        for r, jid in enumerate(ids, start=1):
            name = QLabel()
            name.setTextFormat(Qt.TextFormat.PlainText)  # the job named itself
            font = name.font()
            font.setBold(True)
            name.setFont(font)
            epoch, step = QProgressBar(), QProgressBar()
            for bar in (epoch, step):
                bar.setTextVisible(True)
                bar.setMaximumHeight(16)
                bar.setMinimumWidth(120)
            loss, eta, mem = QLabel(), QLabel(), QLabel()
            row = {"name": name, "epoch": epoch, "step": step, "loss": loss, "eta": eta, "mem": mem}
            for c, w in enumerate(row.values()):
                self._grid.addWidget(w, r, c)
            self.rows[jid] = row

    @staticmethod
    def _bar(bar: QProgressBar, what: str, value: Any, total: Any) -> None:
        if total:
            bar.setRange(0, int(total))
            bar.setValue(max(0, min(int(total), int(value or 0))))
            bar.setFormat(f"{what} {int(value or 0)}/{int(total)}")
        else:
            bar.setRange(0, 1)
            bar.setValue(0)
            bar.setFormat(f"{what} n/a")

    def _fill(self, row: Dict[str, Any], job: JobRecord) -> None:
        idle = job.kernel_idle  # the bars and numbers below are its last fit's
        label = row["name"]
        state = f"  ({job.state}{', idle' if idle else ''})"
        name = one_line(job.name or job.id)
        # A long name is cut (its tooltip has it whole); the state always shows.
        cut = label.fontMetrics().elidedText(name, Qt.TextElideMode.ElideMiddle, NAME_PIXELS)
        label.setText(cut + state)
        label.setToolTip(name if cut != name else "")
        self._bar(row["epoch"], "epoch", job.epoch, job.epochs)
        self._bar(row["step"], "step", job.step, job.steps)
        loss = job.metrics.get("loss")
        row["loss"].setText(f"loss {formats.loss(loss)}" if loss is not None else "loss n/a")
        row["eta"].setText("" if idle else f"ETA {format_duration(job.eta_seconds)}")
        row["mem"].setText(
            f"RAM {format_bytes(job.rss_bytes)} · VRAM {format_bytes(job.vram_bytes)}"
        )
