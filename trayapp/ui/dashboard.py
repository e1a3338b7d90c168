"""The dashboard: timelines of RAM, swap and pressure, VRAM per GPU and GPU load on one clock
axis, the guard's warnings and the jobs' events on them, and a strip of the running jobs.

It never asks the engine itself: the app feeds it status dicts (``apply_snapshot``), events
(``add_event``) and history (``load_history``, after ``historyRequested``).
"""

from __future__ import annotations

import html
import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QByteArray, QSettings, Qt, Signal
from PySide6.QtGui import QCloseEvent, QColor, QHideEvent
from PySide6.QtWidgets import (
    QButtonGroup,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLayout,
    QProgressBar,
    QPushButton,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from trayapp import series
from trayapp.config import ConfigError, Threshold, format_bytes
from trayapp.jobs.record import JobRecord
from trayapp.ui import data as datamod
from trayapp.ui.model import (
    active_jobs,
    banner_text,
    format_duration,
    is_demo,
    job_names,
    status_jobs,
)
from trayapp.ui.timeline import Table, align_series
from trayapp.vocab import EventKind as E
from trayapp.vocab import GuardLevel as L

GIB = float(1 << 30)
RANGES: Tuple[Tuple[str, int], ...] = (("5 min", 300), ("1 h", 3600), ("24 h", 86400),
                                       ("7 d", 7 * 86400))
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
    L.WARN: (242, 169, 0, 45), L.PAUSE: (238, 106, 28, 55), L.PARK: (215, 38, 61, 60)}
# The guard's events that open a shaded span of their level (guard_ok closes it).
SPAN_LEVELS: Dict[str, str] = {E.GUARD_WARN: L.WARN, E.GUARD_PAUSE: L.PAUSE, E.GUARD_PARK: L.PARK}
MARKER_COLOURS: Dict[str, str] = {
    E.JOB_STARTED: "#1f77b4", E.JOB_RESUMED: "#1f77b4", E.JOB_PAUSED: "#ee6a1c",
    E.JOB_PARKED: "#9467bd", E.JOB_FINISHED: "#2e9d46", E.JOB_FAILED: "#d7263d",
    E.JOB_STOPPED: "#555555",
}
# A marker's word is its kind's: job_parked -> "parked".
MARKER_WORDS: Dict[str, str] = {kind: kind[len("job_"):] for kind in MARKER_COLOURS}
# The guard's thresholds drawn on the RAM plot (``guard.<name>_available``).
THRESHOLD_COLOURS: Dict[str, str] = {L.WARN: "#f2a900", L.PAUSE: "#ee6a1c", L.PARK: "#d7263d",
                     "resume": "#2e9d46"}
LAYER_COLOURS = ("#4c78a8", "#f58518", "#54a24b", "#b279a2", "#e45756", "#72b7b2", "#9d755d")
OTHER_COLOUR = "#bab0ac"

HOVER_HINT = "Point at the timelines to read the values at that time."
NO_TRAY_TEXT = ("No system tray is available here ({why}), so Headroom runs in this window; "
                "closing it quits Headroom.")


def snapshot_values(status: Dict[str, Any]) -> Dict[str, Optional[float]]:
    """A status dict as the history's series (``trayapp.series``: ``mem.used``,
    ``gpu0.job.<id>``...), as the engine records them."""
    return series.sample_values(status.get("memory") or {}, status.get("gpus") or [],
                                status_jobs(status))


def _ratio(a: np.ndarray, b: np.ndarray, scale: float = 1.0) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        out = a * scale / b
    out[~np.isfinite(out)] = np.nan
    return out


@dataclass
class _Curve:
    item: Any  # pg.PlotDataItem
    compute: Callable[[Table], np.ndarray]
    label: str
    unit: str  # "GiB" | "%" | "°C"
    drawn: bool = False


def marker_label(event: Dict[str, Any], names: Dict[str, str]) -> str:
    """A short marker text: the job's name (from ``names`` by the event's ``job_id``, else the
    id) and what happened ("mnist paused"); an event of no job shows its message."""
    kind = str(event.get("kind") or "")
    message = str(event.get("message") or kind.replace("_", " "))
    job_id = event.get("job_id")
    name = names.get(str(job_id), str(job_id)) if job_id is not None else None
    text = f"{name} {MARKER_WORDS[kind]}" if name and kind in MARKER_WORDS else message
    return text if len(text) <= 40 else text[:39] + "…"


def _column(name: str) -> Callable[[Table], np.ndarray]:
    return lambda tb: tb.column(name)


def _escape(text: str) -> str:
    # InfiniteLine labels are format strings ({value}); braces in a message must not break them.
    return text.replace("{", "{{").replace("}", "}}")


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
                    w.deleteLater()
        self.rows = {}
        self._order = ids
        self.empty.setVisible(not ids)
        for r, jid in enumerate(ids, start=1):
            name = QLabel()
            font = name.font()
            font.setBold(True)
            name.setFont(font)
            epoch, step = QProgressBar(), QProgressBar()
            for bar in (epoch, step):
                bar.setTextVisible(True)
                bar.setMaximumHeight(16)
                bar.setMinimumWidth(120)
            loss, eta, mem = QLabel(), QLabel(), QLabel()
            row = {"name": name, "epoch": epoch, "step": step, "loss": loss, "eta": eta,
                   "mem": mem}
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
        row["name"].setText(f"{job.name or job.id}  ({job.state})")
        self._bar(row["epoch"], "epoch", job.epoch, job.epochs)
        self._bar(row["step"], "step", job.step, job.steps)
        loss = job.metrics.get("loss")
        row["loss"].setText(f"loss {loss:.4g}" if loss is not None else "loss n/a")
        row["eta"].setText(f"ETA {format_duration(job.eta_seconds)}")
        row["mem"].setText(f"RAM {format_bytes(job.rss_bytes)} · "
                           f"VRAM {format_bytes(job.vram_bytes)}")


class Dashboard(QWidget):
    """The dashboard window. ``historyRequested(seconds, gpu_indices)`` asks the app to fetch
    the history of the chosen range; the answer comes back through ``load_history``."""

    historyRequested = Signal(float, object)

    def __init__(self, settings: QSettings, *, no_tray_reason: Optional[str] = None,
                 demo: bool = False, parent: Optional[QWidget] = None):
        super().__init__(parent)
        self.settings = settings
        self.demo = demo
        self.close_handler: Optional[Callable[[], bool]] = None
        self.status: Optional[Dict[str, Any]] = None
        # Job id -> name, of every job seen in a status or the history: the markers' names.
        self.job_names: Dict[str, str] = {}
        self.reachable = False
        self.reason: Optional[str] = "connecting to the engine"
        self.following = True
        self._view_right: Optional[float] = None  # the right edge the view follows to
        self.thresholds: Dict[str, Threshold] = {}
        self._gpus: List[int] = []
        self._requested: Optional[Tuple[int, Tuple[int, ...]]] = None
        self._live: Deque[Tuple[float, Dict[str, Optional[float]]]] = deque(
            maxlen=int(LIVE_RATE_HZ * 180))
        self._events: Dict[Any, Dict[str, Any]] = {}
        self._markers: Dict[Any, List[Any]] = {}
        self._spans: List[Dict[str, Any]] = []
        self._open_span: Optional[Dict[str, Any]] = None
        self._totals: Dict[str, float] = {}
        self._layers: Dict[int, List[str]] = {}
        self._stack_items: Dict[int, Dict[str, Any]] = {}
        self.updates = 0  # status dicts applied
        self.history_loads = 0  # history answers applied
        self.range_seconds = self._remembered_range()
        self.table = self._new_table(0)
        self.setWindowTitle(self._title())
        self.setMinimumSize(720, 560)
        self._build(no_tray_reason)
        self._restore_geometry()

    # -- building --------------------------------------------------------------------------

    def _title(self) -> str:
        demo = self.demo or (self.status is not None and is_demo(self.status))
        # Ends with the product name, so the desktop does not append it a second time.
        return "Dashboard (simulated GPUs) — Headroom" if demo else "Dashboard — Headroom"

    def _build(self, no_tray_reason: Optional[str]) -> None:
        outer = QVBoxLayout(self)
        # The window's size is set once; content changes never resize it (and never ask the
        # platform to re-read its size hints).
        outer.setSizeConstraint(QLayout.SizeConstraint.SetNoConstraint)
        outer.setContentsMargins(6, 6, 6, 6)
        outer.setSpacing(4)
        self.no_tray_label = QLabel()
        self.no_tray_label.setWordWrap(True)
        self.no_tray_label.setStyleSheet("color:#444;padding:2px;")
        if no_tray_reason:
            self.no_tray_label.setText(NO_TRAY_TEXT.format(why=no_tray_reason))
        self.no_tray_label.setVisible(bool(no_tray_reason))
        outer.addWidget(self.no_tray_label)
        self.banner = QLabel()
        self.banner.setWordWrap(True)
        self.banner.setContentsMargins(8, 4, 8, 4)
        self.banner.hide()
        self.banner_level = ""
        outer.addWidget(self.banner)

        bar = QHBoxLayout()
        self.range_group = QButtonGroup(self)
        self.range_group.setExclusive(True)
        self.range_buttons: Dict[int, QToolButton] = {}
        for label, seconds in RANGES:
            b = QToolButton()
            b.setText(label)
            b.setCheckable(True)
            b.setChecked(seconds == self.range_seconds)
            self.range_group.addButton(b, seconds)
            self.range_buttons[seconds] = b
            bar.addWidget(b)
        self.range_group.idClicked.connect(self.set_range)
        self.follow_button = QPushButton("Follow live")
        self.follow_button.setCheckable(True)
        self.follow_button.setChecked(True)
        self.follow_button.toggled.connect(self._set_following)
        bar.addWidget(self.follow_button)
        bar.addStretch(1)
        self.sim_label = QLabel("SIMULATED GPUs (demo)")
        self.sim_label.setStyleSheet("color:#b05a00;font-weight:bold;")
        self.sim_label.setVisible(self.demo)
        bar.addWidget(self.sim_label)
        self.gpu_note = QLabel()
        self.gpu_note.setStyleSheet("color:#666;")
        bar.addWidget(self.gpu_note)
        outer.addLayout(bar)

        self.readout = QLabel(HOVER_HINT)
        self.readout.setStyleSheet("color:#333;font-family:monospace;")
        self.readout.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.readout.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        outer.addWidget(self.readout)

        self.plots = pg.GraphicsLayoutWidget()
        self.plots.setBackground("w")
        outer.addWidget(self.plots, 1)
        self.jobs_strip = JobsStrip()
        outer.addWidget(self.jobs_strip)

        self._curves: List[_Curve] = []
        self._titles: Dict[int, Tuple[str, List[Tuple[str, str]]]] = {}
        self._grid: Dict[int, List[Any]] = {}
        self.ram_plot = self._plot("RAM", "GiB")
        self.swap_plot = self._plot("Swap and memory pressure", "%")
        self.gpu_plot = self._plot("GPU utilisation and temperature", "% · °C")
        self.vram_plots: Dict[int, Any] = {}
        self._plot_order: List[Any] = []
        self._layout_plots()
        self._curve(self.ram_plot, "RAM used", "#4c78a8", "GiB",
                    lambda tb: tb.column("mem.used") / GIB)
        self._curve(self.ram_plot, "available", "#2e9d46", "GiB",
                    lambda tb: tb.column("mem.available") / GIB)
        self._curve(self.swap_plot, "swap used", "#9467bd", "%",
                    lambda tb: _ratio(tb.column("swap.used"), tb.column("swap.total"), 100.0))
        self._curve(self.swap_plot, "PSI some", "#f2a900", "%", lambda tb: tb.column("psi.some"))
        self._curve(self.swap_plot, "PSI full", "#d7263d", "%", lambda tb: tb.column("psi.full"))
        self._set_y(self.swap_plot, 100.0, 1.02)
        self._set_y(self.gpu_plot, 100.0, 1.05)
        self.limit_line = pg.InfiniteLine(angle=0, movable=False,
                                          pen=pg.mkPen("#333333", width=1,
                                                       style=Qt.PenStyle.DashLine),
                                          label="limit", labelOpts={"position": 0.45,
                                                                    "color": "#333333",
                                                                    "anchors": [(0, 0), (0, 0)]})
        self.limit_line.hide()
        self.ram_plot.addItem(self.limit_line, ignoreBounds=True)
        self.threshold_lines: Dict[str, Any] = {}
        for n, (name, colour) in enumerate(THRESHOLD_COLOURS.items()):
            # Labels side by side along the line: the thresholds lie close together.
            line = pg.InfiniteLine(angle=0, movable=False,
                                   pen=pg.mkPen(colour, width=1, style=Qt.PenStyle.DotLine),
                                   label=name, labelOpts={"position": 0.02 + 0.1 * n,
                                                          "color": colour,
                                                          "fill": pg.mkBrush(255, 255, 255, 170),
                                                          "anchors": [(0, 1), (0, 1)]})
            line.hide()
            self.ram_plot.addItem(line, ignoreBounds=True)
            self.threshold_lines[name] = line
        self._cursor_lines: Dict[int, Any] = {}
        self._mouse = pg.SignalProxy(self.plots.scene().sigMouseMoved, rateLimit=30,
                                     slot=self._mouse_moved)
        self._update_banner()

    def _plot(self, title: str, unit: str) -> Any:
        axis = pg.DateAxisItem(orientation="bottom")
        plot = pg.PlotItem(axisItems={"bottom": axis})
        self._titles[id(plot)] = (title, [])
        self._show_title(plot)
        plot.setLabel("left", unit, color="#333333")
        plot.setDownsampling(auto=True, mode="peak")
        plot.setClipToView(True)
        plot.setMouseEnabled(x=True, y=False)
        plot.enableAutoRange(x=False, y=False)
        plot.hideButtons()
        plot.setMenuEnabled(False)
        for side in ("left", "bottom"):
            ax = plot.getAxis(side)
            ax.setPen(pg.mkPen("#888888"))
            ax.setTextPen(pg.mkPen("#333333"))
        plot.getAxis("left").setWidth(48)
        plot.vb.sigRangeChangedManually.connect(self._manual_range)
        return plot

    def _set_y(self, plot: Any, top: float, headroom: float = 1.05) -> None:
        """Fix the plot's vertical range at 0..top (no autorange) with light lines at each
        quarter. The axis' own grid would be repainted with every update of the curves and
        costs more than they do."""
        plot.setYRange(0, top * headroom, padding=0)
        lines = self._grid.setdefault(id(plot), [])
        if not lines:
            for _ in range(4):
                line = pg.InfiniteLine(angle=0, movable=False, pen=pg.mkPen("#e4e4e4", width=1))
                line.setZValue(-20)
                plot.addItem(line, ignoreBounds=True)
                lines.append(line)
        for n, line in enumerate(lines, start=1):
            line.setValue(top * n / 4)

    def _show_title(self, plot: Any) -> None:
        # The legend rides in the title line: no box over the data, nothing anchored to the
        # plot that could outlive it.
        title, keys = self._titles[id(plot)]
        parts = [f"<b>{html.escape(title)}</b>"] + [
            f"<span style='color:{colour}'>&#9632;</span>&nbsp;{html.escape(label)}"
            for label, colour in keys]
        plot.setTitle("&nbsp;&nbsp;&nbsp;".join(parts), size="9pt", color="#222222")

    def _set_keys(self, plot: Any, keys: List[Tuple[str, str]]) -> None:
        title, old = self._titles[id(plot)]
        if keys != old:
            self._titles[id(plot)] = (title, list(keys))
            self._show_title(plot)

    def _layout_plots(self) -> None:
        order = [self.ram_plot, self.swap_plot] + \
            [self.vram_plots[i] for i in sorted(self.vram_plots)] + \
            ([self.gpu_plot] if self.vram_plots else [])
        if order == self._plot_order:
            return
        ci = self.plots.ci
        for plot in self._plot_order:
            ci.removeItem(plot)
        for row, plot in enumerate(order):
            ci.addItem(plot, row=row, col=0)
            if plot is not order[0]:
                plot.setXLink(order[0])
            plot.getAxis("bottom").setStyle(showValues=plot is order[-1])
        self.gpu_plot.setVisible(bool(self.vram_plots))
        self._plot_order = order

    def _curve(self, plot: Any, label: str, colour: str, unit: str,
               compute: Callable[[Table], np.ndarray], fill: Optional[str] = None) -> _Curve:
        item = pg.PlotDataItem(pen=pg.mkPen(colour, width=1), antialias=False, connect="finite")
        if fill is not None:
            item.setFillLevel(0)
            item.setBrush(pg.mkBrush(fill))
        plot.addItem(item)
        self._set_keys(plot, self._titles[id(plot)][1] + [(label, colour)])
        curve = _Curve(item, compute, label, unit)
        self._curves.append(curve)
        return curve

    def _ensure_gpus(self, indices: Sequence[int]) -> bool:
        """Create the VRAM plot and utilisation curves of GPUs not seen yet."""
        new = [i for i in indices if i not in self.vram_plots]
        for i in new:
            plot = self._plot(f"GPU {i} memory by process", "GiB")
            self.vram_plots[i] = plot
            self._layers[i] = []
            self._stack_items[i] = {}
            self._curve(self.gpu_plot, f"GPU{i} util", LAYER_COLOURS[(2 * i) % 7], "%",
                        _column(f"gpu{i}.util"))
            self._curve(self.gpu_plot, f"GPU{i} temp", LAYER_COLOURS[(2 * i + 1) % 7], "°C",
                        _column(f"gpu{i}.temp"))
            total = pg.InfiniteLine(angle=0, movable=False,
                                    pen=pg.mkPen("#333333", width=1, style=Qt.PenStyle.DashLine),
                                    label="total", labelOpts={"position": 0.3,
                                                              "color": "#333333",
                                                              "anchors": [(0, 0), (0, 0)]})
            total.hide()
            plot.addItem(total, ignoreBounds=True)
            self._stack_items[i]["__total__"] = total
        if new:
            self._gpus = sorted(self.vram_plots)
            self._layout_plots()
            self._place_annotations()
        return bool(new)

    def _sync_layers(self, index: int) -> None:
        """Stacked VRAM layers of one GPU: the guard's jobs (by name), then "other"."""
        prefix = series.gpu_series(index, "")
        jobs = sorted(n[len(prefix):] for n in self.table.columns
                      if n.startswith(prefix) and series.layer_job(n[len(prefix):]))
        layers = jobs + [series.OTHER]
        if layers == self._layers.get(index):
            return
        plot = self.vram_plots[index]
        items = self._stack_items[index]
        names = self.job_names
        for key in list(items):
            if key != "__total__" and key not in layers:
                plot.removeItem(items.pop(key))
        # Each layer is drawn as the cumulative sum up to it, filled down to 0; lower layers sit
        # above in z, so each band shows its own colour.
        for depth, key in enumerate(layers):
            item = items.get(key)
            if item is None:
                jid = series.layer_job(key)
                if jid is None:
                    label, colour = "other processes", OTHER_COLOUR
                else:
                    label = names.get(jid, jid)
                    colour = LAYER_COLOURS[len(items) % len(LAYER_COLOURS)]
                item = pg.PlotDataItem(pen=pg.mkPen(QColor(colour).darker(130), width=1),
                                       antialias=False, connect="finite", fillLevel=0,
                                       brush=pg.mkBrush(colour))
                item.legend_key = (label, colour)
                plot.addItem(item)
                items[key] = item
            item.setZValue(len(layers) - depth)
        self._layers[index] = layers
        self._set_keys(plot, [items[k].legend_key for k in layers])

    # -- data in ---------------------------------------------------------------------------

    def _new_table(self, history_rows: int) -> Table:
        step = LIVE_STEP.get(self.range_seconds, 1.0)
        live_rows = int(self.range_seconds / step) if step else int(self.range_seconds *
                                                                    LIVE_RATE_HZ)
        return Table(history_rows + live_rows + 16, low=LOW_SERIES)

    def apply_snapshot(self, status: Dict[str, Any]) -> None:
        """One status dict from the engine: a live row, the banner, the jobs strip."""
        self.status = status
        self._learn_names(job_names(status))
        self.reachable = True
        self.reason = None
        t = float(status.get("time") or time.time())
        values = snapshot_values(status)
        self._live.append((t, values))
        self.table.append(t, values, LIVE_STEP.get(self.range_seconds, 0.0))
        gpus = sorted(int(g.get("index") or 0) for g in status.get("gpus") or [])
        self._ensure_gpus(gpus)
        self._note_gpus(status)
        m = status.get("memory") or {}
        self._set_totals(m.get("total_bytes"), m.get("limit_source"), status)
        guard = status.get("guard") or {}
        if self._open_span is not None:
            if guard.get("state") not in SPAN_COLOURS:
                self._close_span(t)
            else:
                self._open_span["end"] = t
                self._open_span["items_end"](t)
        self.updates += 1
        if self.isVisible():
            self.setWindowTitle(self._title())
            self.sim_label.setVisible(self.demo or is_demo(status))
            self._update_banner()
            self.jobs_strip.update_jobs(active_jobs(status))
            self.redraw(follow_to=t)
        if self._requested is None:
            if self.isVisible():
                self.request_history()
        elif tuple(gpus) != self._requested[1]:
            self.request_history()

    def _note_gpus(self, status: Dict[str, Any]) -> None:
        if status.get("gpus"):
            text = ""
        else:
            text = "No GPU: " + ((status.get("gpu_status") or {}).get("message") or "none found")
        if text != self.gpu_note.text():
            self.gpu_note.setText(text)

    def _set_totals(self, total: Optional[float], source: Optional[str],
                    status: Dict[str, Any]) -> None:
        totals: Dict[str, float] = {}
        if total:
            totals["ram"] = float(total)
        for g in status.get("gpus") or []:
            if g.get("memory_total_bytes"):
                totals[f"gpu{g.get('index')}"] = float(g["memory_total_bytes"])
        if totals == self._totals:
            return
        self._totals = totals
        ram = totals.get("ram")
        if ram:
            self._set_y(self.ram_plot, ram / GIB)
            self.limit_line.setValue(ram / GIB)
            self.limit_line.label.setFormat(_escape(
                f"limit {format_bytes(ram)}" + (" (cgroup)" if source == "cgroup" else "")))
            self.limit_line.show()
            self._place_thresholds()
        for i, plot in self.vram_plots.items():
            g_total = totals.get(f"gpu{i}")
            line = self._stack_items[i]["__total__"]
            if g_total:
                self._set_y(plot, g_total / GIB)
                line.setValue(g_total / GIB)
                line.label.setFormat(_escape(f"total {format_bytes(g_total)}"))
                line.show()

    def set_config(self, config: Optional[Dict[str, Any]]) -> None:
        """The engine's settings (``config_get()``): the guard's thresholds on the RAM plot."""
        guard = ((config or {}).get("values") or {}).get("guard") or {}
        thresholds: Dict[str, Threshold] = {}
        for name in THRESHOLD_COLOURS:
            value = guard.get(f"{name}_available")
            if value is None:
                continue
            try:
                thresholds[name] = Threshold.parse(value)
            except ConfigError:
                continue
        self.thresholds = thresholds
        self._place_thresholds()

    def _place_thresholds(self) -> None:
        ram = self._totals.get("ram")
        for name, line in self.threshold_lines.items():
            th = self.thresholds.get(name)
            if th is None or not ram:
                line.hide()
                continue
            line.setValue(th.bytes_of(int(ram)) / GIB)
            line.label.setFormat(_escape(f"{name}: available < {th}"))
            line.show()

    def set_reachable(self, reachable: bool, reason: Optional[str] = None) -> None:
        self.reachable = reachable
        self.reason = reason
        self._update_banner()

    def _update_banner(self) -> None:
        level, text = banner_text(self.status, self.reachable, self.reason)
        if (level, text) == (self.banner_level, self.banner.text()):
            return
        self.banner_level = level
        self.banner.setText(text)
        self.banner.setStyleSheet(BANNER_STYLES.get(level, ""))
        self.banner.setVisible(bool(level))

    # -- history ---------------------------------------------------------------------------

    def set_range(self, seconds: int) -> None:
        """Show the last ``seconds`` (one of RANGES) and follow live data."""
        if seconds not in LIVE_STEP:
            return
        changed = seconds != self.range_seconds
        self.range_seconds = seconds
        self.range_buttons[seconds].setChecked(True)
        self.settings.setValue("dashboard/range", seconds)
        self.following = True
        self._view_right = None
        self.follow_button.setChecked(True)
        if changed or self._requested is None:
            self._reset_table()
            self.request_history()
        self.redraw(follow_to=self._now())

    def _reset_table(self) -> None:
        self.table = self._new_table(0)
        step = LIVE_STEP.get(self.range_seconds, 0.0)
        for t, values in self._live:
            self.table.append(t, values, step)

    def request_history(self) -> None:
        gpus = tuple(sorted(int(g.get("index") or 0) for g in (self.status or {}).get("gpus")
                            or []))
        self._requested = (self.range_seconds, gpus)
        self.historyRequested.emit(float(self.range_seconds), list(gpus))

    def history_failed(self) -> None:
        """The history could not be fetched (no engine yet): ask again with the next status."""
        self._requested = None

    def load_history(self, answer: Dict[str, Any]) -> bool:
        """The app's answer to ``historyRequested`` (``data.load_range``): rebuild the
        buffers from it, then replay the live rows that came since. False (and ignored) when
        the range changed meanwhile."""
        if int(answer.get("range") or 0) != self.range_seconds:
            return False
        history = answer.get("history") or {}
        times, cols = align_series(history.get("series") or {}, low=LOW_SERIES)
        self.table = self._new_table(len(times))
        if len(times):
            self.table.load(times, cols)
        last = float(times[-1]) if len(times) else -math.inf
        step = LIVE_STEP.get(self.range_seconds, 0.0)
        for t, values in self._live:
            if t > last:
                self.table.append(t, values, step)
        gpus = sorted({int(n[3:n.index(".")]) for n in cols if n.startswith("gpu")})
        self._ensure_gpus(gpus)
        self._clear_annotations()
        for event in answer.get("events") or []:
            self.add_event(event)
        self._learn_names({str(k): str(v) for k, v in (answer.get("jobs") or {}).items()})
        self.history_loads += 1
        self.redraw(follow_to=self._now())
        return True

    def _now(self) -> float:
        return float((self.status or {}).get("time") or time.time())

    # -- events: markers and shaded spans --------------------------------------------------

    def add_event(self, event: Dict[str, Any]) -> None:
        """A job event becomes a labelled vertical marker; the guard's warnings shaded spans."""
        kind = str(event.get("kind") or "")
        key = event.get("id") if event.get("id") is not None else (kind, event.get("time"))
        if key in self._events:
            return
        t = event.get("time")
        if not isinstance(t, (int, float)):
            return
        if kind in datamod.MARKER_KINDS:
            self._events[key] = event
            self._add_marker(key, event)
        elif kind in datamod.SPAN_KINDS:
            self._events[key] = event
            level = SPAN_LEVELS.get(kind)
            if level is None:  # guard_ok: headroom is back, the span ends
                self._close_span(float(t))
            elif self._open_span is None or self._open_span["level"] != level:
                self._close_span(float(t))
                self._start_span(float(t), level, str(event.get("message") or ""))

    def _learn_names(self, names: Dict[str, str]) -> None:
        """Job names learned (a status, the history's jobs): markers drawn before their job's
        name was known (a job's first event comes before the status lists it) get it now."""
        new = {jid for jid, name in names.items() if self.job_names.get(jid) != name}
        if not new:
            return
        self.job_names.update(names)
        for key, items in self._markers.items():
            event = self._events.get(key) or {}
            if str(event.get("job_id")) in new and items:
                items[0][1].label.setFormat(_escape(marker_label(event, self.job_names)))

    def _add_marker(self, key: Any, event: Dict[str, Any]) -> None:
        kind = str(event.get("kind"))
        colour = MARKER_COLOURS.get(kind, "#555555")
        label = marker_label(event, self.job_names)
        items = []
        for n, plot in enumerate(self._plot_order):
            line = pg.InfiniteLine(
                pos=float(event["time"]), angle=90, movable=False,
                pen=pg.mkPen(colour, width=1, style=Qt.PenStyle.DashLine),
                label=_escape(label) if n == 0 else None,
                labelOpts={"position": 0.9 - 0.12 * (len(self._markers) % 4), "color": colour,
                           "fill": pg.mkBrush(255, 255, 255, 200), "anchors": [(0, 0.5),
                                                                               (0, 0.5)]}
                if n == 0 else None)
            plot.addItem(line, ignoreBounds=True)
            items.append((plot, line))
        self._markers[key] = items
        while len(self._markers) > MAX_MARKERS:
            old = next(iter(self._markers))
            for plot, line in self._markers.pop(old):
                plot.removeItem(line)

    def _start_span(self, t: float, level: str, message: str) -> None:
        colour = SPAN_COLOURS.get(level, SPAN_COLOURS[L.WARN])
        items = []
        for plot in self._plot_order:
            region = pg.LinearRegionItem(values=(t, max(t, self._now())), movable=False,
                                         brush=pg.mkBrush(*colour), pen=pg.mkPen(None))
            region.setZValue(-10)
            plot.addItem(region, ignoreBounds=True)
            items.append((plot, region))

        def set_end(end: float) -> None:
            for _plot, region in items:
                region.setRegion((t, max(t, end)))

        span = {"start": t, "end": max(t, self._now()), "level": level, "message": message,
                "items": items, "items_end": set_end}
        self._spans.append(span)
        self._open_span = span
        while len(self._spans) > MAX_SPANS:
            old = self._spans.pop(0)
            for plot, region in old["items"]:
                plot.removeItem(region)

    def _close_span(self, t: float) -> None:
        span = self._open_span
        if span is None:
            return
        span["end"] = max(span["start"], t)
        span["items_end"](span["end"])
        self._open_span = None

    def _clear_annotations(self) -> None:
        for items in self._markers.values():
            for plot, line in items:
                plot.removeItem(line)
        for span in self._spans:
            for plot, region in span["items"]:
                plot.removeItem(region)
        self._markers = {}
        self._spans = []
        self._open_span = None
        self._events = {}

    def _place_annotations(self) -> None:
        """Redraw markers and spans after plots were added (a GPU appeared)."""
        events = list(self._events.values())
        self._clear_annotations()
        for event in events:
            self.add_event(event)

    @property
    def marker_count(self) -> int:
        return len(self._markers)

    @property
    def spans(self) -> List[Tuple[float, float, str]]:
        return [(s["start"], s["end"], s["level"]) for s in self._spans]

    def show_event(self, event: Dict[str, Any]) -> None:
        """Centre the timelines on an event (a clicked notification) and name it."""
        t = event.get("time")
        if not isinstance(t, (int, float)):
            return
        self.add_event(event)
        age = self._now() - float(t)
        for _label, seconds in RANGES:
            if seconds >= age * 1.2 or seconds == RANGES[-1][1]:
                if seconds != self.range_seconds:
                    self.set_range(seconds)
                break
        width = min(float(self.range_seconds), 600.0)
        self._set_following(False)
        self.ram_plot.setXRange(float(t) - width * 0.6, float(t) + width * 0.4, padding=0)
        when = time.strftime("%H:%M:%S", time.localtime(float(t)))
        self.readout.setText(f"{when}  {event.get('message') or event.get('kind')}")

    # -- drawing ---------------------------------------------------------------------------

    def _set_following(self, on: bool) -> None:
        self.following = bool(on)
        self._view_right = None
        if self.follow_button.isChecked() != self.following:
            self.follow_button.setChecked(self.following)
        if self.following:
            self.redraw(follow_to=self._now())

    def _manual_range(self, *_: Any) -> None:
        # The user panned or zoomed: stop jumping to "now" until they ask for it again.
        if self.following:
            self._set_following(False)

    def redraw(self, follow_to: Optional[float] = None) -> None:
        """Hand the buffers to the curves (no copies) and move the view along with time."""
        tb = self.table
        t = tb.t()
        for curve in self._curves:
            y = curve.compute(tb)
            if not np.isfinite(y).any():
                # Nothing to draw (no swap, no pressure figures): skip pyqtgraph's work.
                if curve.drawn:
                    curve.item.setData([], [])
                    curve.drawn = False
                continue
            curve.item.setData(t, y)
            curve.drawn = True
        for index in self.vram_plots:
            self._sync_layers(index)
            cum = np.zeros(len(t))
            items = self._stack_items[index]
            for key in self._layers[index]:
                cum = cum + np.nan_to_num(tb.column(f"gpu{index}.{key}"), nan=0.0)
                item = items[key]
                item.setData(t, cum / GIB)
        if self.following and follow_to is not None:
            # The view moves in steps of 2% of the range, not on every update: a moved range
            # redraws every axis, which costs more than the curves themselves.
            step = self.range_seconds * FOLLOW_STEP
            right = math.ceil(follow_to / step) * step
            if right != self._view_right:
                self._view_right = right
                self.ram_plot.setXRange(right - self.range_seconds, right, padding=0)

    def _mouse_moved(self, args: Tuple[Any, ...]) -> None:
        pos = args[0]
        for plot in self._plot_order:
            if plot.sceneBoundingRect().contains(pos):
                self.show_values_at(plot.vb.mapSceneToView(pos).x())
                return

    def show_values_at(self, x: float) -> str:
        """The readout line for the row nearest to time ``x``; a cursor line marks it."""
        i = self.table.nearest(x)
        if i is None:
            return ""
        tb = self.table
        t = float(tb.t()[i])
        parts = [time.strftime("%H:%M:%S", time.localtime(t))]
        for curve in self._curves:
            v = curve.compute(tb)[i]
            if np.isfinite(v):
                parts.append(f"{curve.label} {v:.1f}{'' if curve.unit == '%' else ' '}"
                             f"{curve.unit}")
        for index in self.vram_plots:
            for key in self._layers.get(index, []):
                v = tb.column(series.gpu_series(index, key))[i]
                if np.isfinite(v):
                    jid = series.layer_job(key)
                    who = series.OTHER if jid is None else self.job_names.get(jid, jid)
                    parts.append(f"GPU{index} {who} {v / GIB:.2f} GiB")
        text = " · ".join(parts)
        self.readout.setText(text)
        for plot in self._plot_order:
            line = self._cursor_lines.get(id(plot))
            if line is None:
                line = pg.InfiniteLine(angle=90, movable=False,
                                       pen=pg.mkPen("#666666", width=1,
                                                    style=Qt.PenStyle.DotLine))
                plot.addItem(line, ignoreBounds=True)
                self._cursor_lines[id(plot)] = line
            line.setValue(t)
        return text

    # -- window state ----------------------------------------------------------------------

    def _remembered_range(self) -> int:
        try:
            value = int(str(self.settings.value("dashboard/range", 300)))
        except (TypeError, ValueError):
            value = 300
        return value if value in LIVE_STEP else 300

    def _restore_geometry(self) -> None:
        geometry = self.settings.value("dashboard/geometry")
        if isinstance(geometry, QByteArray) and not geometry.isEmpty():
            self.restoreGeometry(geometry)
        else:
            self.resize(1000, 760)

    def save_state(self) -> None:
        """Remember the window's size and position and the chosen range."""
        self.settings.setValue("dashboard/geometry", self.saveGeometry())
        self.settings.setValue("dashboard/range", self.range_seconds)
        self.settings.sync()

    def showEvent(self, event: Any) -> None:  # noqa: N802 - Qt override
        super().showEvent(event)
        if self._requested is None:
            self.set_range(self.range_seconds)
        if self.status is not None:
            self.setWindowTitle(self._title())
            self._update_banner()
            self.jobs_strip.update_jobs(active_jobs(self.status))
        self.redraw(follow_to=self._now())

    def hideEvent(self, event: QHideEvent) -> None:  # noqa: N802 - Qt override
        self.save_state()
        super().hideEvent(event)

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 - Qt override
        self.save_state()
        if self.close_handler is not None and not self.close_handler():
            event.ignore()
            return
        super().closeEvent(event)
