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
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

import pyqtgraph as pg
from PySide6.QtCore import QByteArray, QSettings, Qt, Signal
from PySide6.QtGui import QCloseEvent, QHideEvent
from PySide6.QtWidgets import (
    QButtonGroup,
    QHBoxLayout,
    QLabel,
    QLayout,
    QPushButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from trayapp import formats
from trayapp.config import ConfigError, Threshold, format_bytes
from trayapp.config.view import ConfigView
from trayapp.engine.event_record import EngineEvent
from trayapp.engine.status_record import Status
from trayapp.ui.dashboard_charts import DashboardPlots
from trayapp.ui.dashboard_now import NowBars
from trayapp.ui.dashboard_parts import (
    BANNER_STYLES,
    GIB,
    HOVER_HINT,
    LIVE_RATE_HZ,
    LIVE_STEP,
    LOW_SERIES,
    NO_TRAY_TEXT,
    RANGES,
    SPAN_COLOURS,
    THRESHOLD_COLOURS,
    JobsStrip,
    escape,
    snapshot_values,
)
from trayapp.ui.data import RangeData
from trayapp.ui.model import active_jobs, banner_text, is_demo, job_names
from trayapp.ui.timeline import Table, align_series


class Dashboard(DashboardPlots):
    """The dashboard window. ``historyRequested(seconds, gpu_indices)`` asks the app to fetch
    the history of the chosen range; the answer comes back through ``load_history``."""

    historyRequested = Signal(float, object)

    def __init__(
        self,
        settings: QSettings,
        *,
        no_tray_reason: Optional[str] = None,
        demo: bool = False,
        parent: Optional[QWidget] = None,
    ):
        super().__init__(parent)
        self.settings = settings
        self.demo = demo
        self.close_handler: Optional[Callable[[], bool]] = None
        self.status: Optional[Status] = None
        # Job id -> name, of every job seen in a status or the history: the markers' names.
        self.job_names: Dict[str, str] = {}
        self.reachable = False
        self.reason: Optional[str] = "connecting to the engine"
        self.following = True
        self.thresholds: Dict[str, Threshold] = {}
        self._gpus: List[int] = []
        self._requested: Optional[Tuple[int, Tuple[int, ...]]] = None
        self._live: Deque[Tuple[float, Dict[str, Optional[float]]]] = deque(
            maxlen=int(LIVE_RATE_HZ * 180)
        )
        self._totals: Dict[str, float] = {}
        self.updates = 0  # statuses applied
        # The plots follow live data at most this often (status time, seconds): the tray sets
        # 2 s, which halves what an open dashboard costs; 0 redraws on every status.
        self.live_redraw_seconds = 0.0
        self._drawn_at: Optional[float] = None
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
        self.banner.setTextFormat(Qt.TextFormat.PlainText)  # the guard's reasons name jobs
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
        self.gpu_note.setTextFormat(Qt.TextFormat.PlainText)
        self.gpu_note.setStyleSheet("color:#666;")
        bar.addWidget(self.gpu_note)
        outer.addLayout(bar)

        self.readout = QLabel(HOVER_HINT)
        self.readout.setStyleSheet("color:#333;")
        self.readout.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        outer.addWidget(self.readout)
        self.now_bars = NowBars()  # what holds each memory now, whatever the scale
        outer.addWidget(self.now_bars)

        self.plots = pg.GraphicsLayoutWidget()
        self.plots.setBackground("w")
        outer.addWidget(self.plots, 1)
        self.jobs_strip = JobsStrip()
        outer.addWidget(self.jobs_strip)

        self._build_plots()
        self._update_banner()

    # -- data in ---------------------------------------------------------------------------

    def _new_table(self, history_rows: int) -> Table:
        step = LIVE_STEP.get(self.range_seconds, 1.0)
        live_rows = (
            int(self.range_seconds / step) if step else int(self.range_seconds * LIVE_RATE_HZ)
        )
        return Table(history_rows + live_rows + 16, low=LOW_SERIES)

    def apply_snapshot(self, status: Status) -> None:
        """One status from the engine: a live row, the banner, the jobs strip."""
        self.status = status
        self._learn_names(job_names(status))
        self.reachable = True
        self.reason = None
        t = status.time or time.time()
        values = snapshot_values(status)
        self._live.append((t, values))
        self.table.append(t, values, LIVE_STEP.get(self.range_seconds, 0.0))
        gpus = sorted(g.index for g in status.gpus)
        self._ensure_gpus(gpus)
        self._note_gpus(status)
        self._note_gpus_memory(status.gpus)
        m = status.memory
        if m is None:
            self._set_totals(None, None, status)
        else:
            self._set_totals(m.total_bytes, m.limit_source, status)
        if self._open_span is not None:
            if status.guard.state not in SPAN_COLOURS:
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
            if self._drawn_at is None or not 0 <= t - self._drawn_at < self.live_redraw_seconds:
                self._drawn_at = t
                self.redraw(follow_to=t)
        if self._requested is None:
            if self.isVisible():
                self.request_history()
        elif tuple(gpus) != self._requested[1]:
            self.request_history()

    def _note_gpus(self, status: Status) -> None:
        text = "" if status.gpus else "No GPU: " + (status.gpu_status.message or "none found")
        if text != self.gpu_note.text():
            self.gpu_note.setText(text)

    def _set_totals(self, total: Optional[float], source: Optional[str], status: Status) -> None:
        totals: Dict[str, float] = {}
        if total:
            totals["ram"] = float(total)
        for g in status.gpus:
            if g.memory_total_bytes:
                totals[f"gpu{g.index}"] = float(g.memory_total_bytes)
        if totals == self._totals:
            return
        self._totals = totals
        ram = totals.get("ram")
        if ram:
            self._set_y(self.ram_plot, ram / GIB)
            self.limit_line.setValue(ram / GIB)
            self.ram_labels.set(
                "limit",
                f"limit {format_bytes(ram)}" + (" (cgroup)" if source == "cgroup" else ""),
                "#333333",
                horizontal=True,
                value=ram / GIB,
                priority=0,
            )
            self.limit_line.show()
            self._place_thresholds()
        for i, plot in self.vram_plots.items():
            g_total = totals.get(f"gpu{i}")
            line = self._totals_lines[i]
            if g_total:
                self._set_y(plot, g_total / GIB)
                line.setValue(g_total / GIB)
                line.label.setFormat(escape(f"total {format_bytes(g_total)}"))
                line.show()

    def set_config(self, config: Optional[ConfigView]) -> None:
        """The engine's settings (``config_get()``): the guard's thresholds on the RAM plot."""
        guard = config.section("guard") if config is not None else {}
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
        for n, (name, line) in enumerate(self.threshold_lines.items(), start=1):
            th = self.thresholds.get(name)
            if th is None or not ram:
                line.hide()
                self.ram_labels.remove(("threshold", name))
                continue
            # On the stack of what is used: the line it reaches when available memory falls
            # to the threshold (what is used and what is available make up the limit).
            value = (ram - th.bytes_of(int(ram))) / GIB
            line.setValue(value)
            # The guard resumes once available memory is back above its line.
            sign = ">" if name == "resume" else "<"
            self.ram_labels.set(
                ("threshold", name),
                f"{name}: available {sign} {th}",
                THRESHOLD_COLOURS[name],
                horizontal=True,
                value=value,
                priority=n,
            )
            line.show()
        self.ram_labels.relayout()

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
        self._fit_words()

    def _fit_words(self, resized: bool = False) -> None:
        """The banner keeps room for all its lines at the window's width, whatever the
        platform's layout makes of a wrapped label's height; the readout likewise."""
        if self.banner.isVisible():
            self.banner.setMinimumHeight(self.banner.heightForWidth(max(1, self.banner.width())))
        self.readout_view.fit(resized)

    def resizeEvent(self, event: Any) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(event)
        self._fit_words(resized=True)

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
        gpus = tuple(sorted(g.index for g in self.status.gpus)) if self.status else ()
        self._requested = (self.range_seconds, gpus)
        self.historyRequested.emit(float(self.range_seconds), list(gpus))

    def history_failed(self) -> None:
        """The history could not be fetched (no engine yet): ask again with the next status."""
        self._requested = None

    def load_history(self, loaded: RangeData) -> bool:
        """The app's answer to ``historyRequested`` (``data.load_range``): rebuild the
        buffers from it, then replay the live rows that came since. False (and ignored) when
        the range changed meanwhile."""
        if int(loaded.range_seconds) != self.range_seconds:
            return False
        times, cols = align_series(loaded.history.series, low=LOW_SERIES)
        self.table = self._new_table(len(times))
        if len(times):
            self.table.load(times, cols)
        last = float(times[-1]) if len(times) else -math.inf
        step = LIVE_STEP.get(self.range_seconds, 0.0)
        for t, values in self._live:
            if t > last:
                self.table.append(t, values, step)
        gpus = sorted({int(n[3 : n.index(".")]) for n in cols if n.startswith("gpu")})
        self._ensure_gpus(gpus)
        self._clear_annotations()
        for event in loaded.events:
            self.add_event(event)
        self._learn_names(dict(loaded.jobs))
        self.history_loads += 1
        self.redraw(follow_to=self._now())
        return True

    def show_event(self, event: EngineEvent) -> None:
        """Centre the timelines on an event (a clicked notification) and name it."""
        t = event.time
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
        message = event.message or event.kind
        if not self.show_values_at(float(t), note=message):
            self.readout.setText(f"{formats.clock(float(t))}  {html.escape(message)}")

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
