"""The dashboard's timelines: the plots on one clock axis (RAM, swap and pressure, VRAM per GPU
stacked by process, GPU load), the guard's thresholds, the jobs' events as markers and the
guard's warnings as shaded spans, the view that follows live data, and the readout under the
pointer.

``DashboardPlots`` is the dashboard window's base: it draws what the window keeps (``table``,
``job_names``, ``status``, ``range_seconds``) and fed to it. A plot's title line with its
legend is fitted to its width by ``dashboard_titles``.
"""

from __future__ import annotations

import html
import math
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtWidgets import QLabel, QPushButton, QWidget

from trayapp import formats, series
from trayapp.engine.event_record import EngineEvent
from trayapp.engine.status_record import Status
from trayapp.readings import GpuReading
from trayapp.ui import data as datamod
from trayapp.ui.dashboard_labels import LabelLayer
from trayapp.ui.dashboard_now import Segment
from trayapp.ui.dashboard_parts import (
    FOLLOW_STEP,
    LAYER_COLOURS,
    MARKER_COLOURS,
    MAX_MARKERS,
    MAX_SPANS,
    SPAN_COLOURS,
    SPAN_LEVELS,
    THRESHOLD_COLOURS,
    Curve,
    column,
    marker_label,
    ratio,
)
from trayapp.ui.dashboard_readout import Readout
from trayapp.ui.dashboard_stack import Stack, gpu_stack, ram_stack
from trayapp.ui.dashboard_titles import TITLE_SIZE, fitted_title
from trayapp.ui.timeline import Table
from trayapp.vocab import GuardLevel as L

# Drawing order: the stacked areas (z 1 up to their number of layers), the guard's spans as a
# tint over them, then the lines, then the labels (dashboard_labels).
SPANS_Z = 20
LINES_Z = 45


class DashboardPlots(QWidget):
    """The plots and what is drawn on them (see the module docstring)."""

    # Kept by the dashboard window, drawn here.
    table: Table
    job_names: Dict[str, str]
    status: Optional[Status]
    range_seconds: int
    following: bool
    plots: Any  # pg.GraphicsLayoutWidget
    readout: QLabel
    _totals: Dict[str, float]
    _gpus: List[int]
    follow_button: QPushButton

    def _build_plots(self) -> None:
        """The plots, their curves and lines, in ``self.plots``."""
        self._view_right: Optional[float] = None  # the right edge the view follows to
        self._events: Dict[Any, EngineEvent] = {}
        self._markers: Dict[Any, List[Any]] = {}
        self._spans: List[Dict[str, Any]] = []
        self._open_span: Optional[Dict[str, Any]] = None
        self._stacks: Dict[Any, Stack] = {}  # "ram" or a GPU's index
        self._totals_lines: Dict[int, Any] = {}
        self._curves: List[Curve] = []
        self._titles: Dict[int, Tuple[str, List[Tuple[str, str]]]] = {}
        self._notes: Dict[int, str] = {}  # a plot's note after its legend
        self._title_widths: Dict[int, int] = {}  # the width each title was cut for
        self._grid: Dict[int, List[Any]] = {}
        self.hover_t: Optional[float] = None  # the time pointed at; None: now
        self.ram_plot = self._plot("RAM by process", "GiB")
        self.swap_plot = self._plot("Swap and memory pressure", "%")
        self.gpu_plot = self._plot("GPU utilisation and temperature", "% · °C")
        self.vram_plots: Dict[int, Any] = {}
        self._plot_order: List[Any] = []
        self._layout_plots()
        self.ram_labels = LabelLayer(self.ram_plot)
        self._stacks["ram"] = ram_stack(self.ram_plot)
        self._curve(
            self.swap_plot,
            "swap used",
            "#9467bd",
            "%",
            lambda tb: ratio(tb.column("swap.used"), tb.column("swap.total"), 100.0),
        )
        self._curve(self.swap_plot, "PSI some", "#f2a900", "%", lambda tb: tb.column("psi.some"))
        self._curve(self.swap_plot, "PSI full", "#d7263d", "%", lambda tb: tb.column("psi.full"))
        self._set_y(self.swap_plot, 100.0, 1.02)
        self._set_y(self.gpu_plot, 100.0, 1.05)
        self.limit_line = pg.InfiniteLine(
            angle=0, movable=False, pen=pg.mkPen("#333333", width=1, style=Qt.PenStyle.DashLine)
        )
        self.limit_line.setZValue(LINES_Z)
        self.limit_line.hide()
        self.ram_plot.addItem(self.limit_line, ignoreBounds=True)
        self.threshold_lines: Dict[str, Any] = {}
        for name, colour in THRESHOLD_COLOURS.items():
            line = pg.InfiniteLine(
                angle=0, movable=False, pen=pg.mkPen(colour, width=2, style=Qt.PenStyle.DotLine)
            )
            line.setZValue(LINES_Z)
            line.hide()
            self.ram_plot.addItem(line, ignoreBounds=True)
            self.threshold_lines[name] = line
        self._cursor_lines: Dict[int, Any] = {}
        self.readout_view = Readout(self.readout)
        self._mouse = pg.SignalProxy(
            self.plots.scene().sigMouseMoved, rateLimit=30, slot=self._mouse_moved
        )
        self.plots.viewport().installEventFilter(self)

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
        # The title line is cut to the plot's width: again whenever that width changes.
        plot.geometryChanged.connect(lambda p=plot: self._width_changed(p))
        return plot

    def _width_changed(self, plot: Any) -> None:
        width = round(plot.width())
        if self._title_widths.get(id(plot)) != width:
            self._title_widths[id(plot)] = width
            self._show_title(plot)

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
        note = self._notes.get(id(plot), "")
        plot.setTitle(
            fitted_title(title, keys, note, plot.width() or self.width()),
            size=TITLE_SIZE,
            color="#222222",
        )
        # The title never sets the plot's width (a long legend once pushed "now" off screen):
        # it is cut to fit instead, and its tooltip has every name in full.
        plot.titleLabel.setMinimumWidth(0)
        plot.titleLabel.setToolTip(
            "<span>" + "<br>".join(html.escape(label) for label, _ in keys) + "</span>"
        )

    def set_note(self, plot: Any, note: str) -> None:
        """A line of words after the plot's legend ("" for none)."""
        if self._notes.get(id(plot), "") != note:
            self._notes[id(plot)] = note
            self._show_title(plot)

    def _set_keys(self, plot: Any, keys: List[Tuple[str, str]]) -> None:
        title, old = self._titles[id(plot)]
        if keys != old:
            self._titles[id(plot)] = (title, list(keys))
            self._show_title(plot)

    def _layout_plots(self) -> None:
        order = (
            [self.ram_plot, self.swap_plot]
            + [self.vram_plots[i] for i in sorted(self.vram_plots)]
            + ([self.gpu_plot] if self.vram_plots else [])
        )
        if order == self._plot_order:
            return
        ci = self.plots.ci
        for plot in self._plot_order:
            ci.removeItem(plot)
        for row, plot in enumerate(order):
            ci.addItem(plot, row=row, col=0)
            # RAM, the question most asked, gets twice the height of the others.
            ci.layout.setRowStretchFactor(row, 2 if plot is self.ram_plot else 1)
            if plot is not order[0]:
                plot.setXLink(order[0])
            plot.getAxis("bottom").setStyle(showValues=plot is order[-1])
        self.gpu_plot.setVisible(bool(self.vram_plots))
        self._plot_order = order

    def _curve(
        self,
        plot: Any,
        label: str,
        colour: str,
        unit: str,
        compute: Callable[[Table], np.ndarray],
        fill: Optional[str] = None,
    ) -> Curve:
        item = pg.PlotDataItem(pen=pg.mkPen(colour, width=1), antialias=False, connect="finite")
        if fill is not None:
            item.setFillLevel(0)
            item.setBrush(pg.mkBrush(fill))
        plot.addItem(item)
        self._set_keys(plot, self._titles[id(plot)][1] + [(label, colour)])
        curve = Curve(item, compute, label, unit)
        self._curves.append(curve)
        return curve

    def _ensure_gpus(self, indices: Sequence[int]) -> bool:
        """Create the VRAM plot and utilisation curves of GPUs not seen yet."""
        new = [i for i in indices if i not in self.vram_plots]
        for i in new:
            plot = self._plot(f"GPU {i} memory by process", "GiB")
            self.vram_plots[i] = plot
            self._stacks[i] = gpu_stack(plot, i)
            self._curve(
                self.gpu_plot,
                f"GPU{i} util",
                LAYER_COLOURS[(2 * i) % 7],
                "%",
                column(f"gpu{i}.util"),
            )
            self._curve(
                self.gpu_plot,
                f"GPU{i} temp",
                LAYER_COLOURS[(2 * i + 1) % 7],
                "°C",
                column(f"gpu{i}.temp"),
            )
            total = pg.InfiniteLine(
                angle=0,
                movable=False,
                pen=pg.mkPen("#333333", width=1, style=Qt.PenStyle.DashLine),
                label="total",
                labelOpts={"position": 0.3, "color": "#333333", "anchors": [(0, 0), (0, 0)]},
            )
            total.setZValue(LINES_Z)
            total.hide()
            plot.addItem(total, ignoreBounds=True)
            self._totals_lines[i] = total
        if new:
            self._gpus = sorted(self.vram_plots)
            self._layout_plots()
            self._place_annotations()
        return bool(new)

    def _note_gpus_memory(self, gpus: Sequence[GpuReading]) -> None:
        """Say on a GPU's plot what its breakdown cannot show: a driver that does not tell
        the memory of each process (Windows WDDM), and simulated GPUs (``--demo``)."""
        for g in gpus:
            plot = self.vram_plots.get(g.index)
            if plot is None:
                continue
            notes = []
            if series.per_process_unknown(g):
                notes.append(
                    "this driver does not report memory per process (Windows WDDM): "
                    "only the GPU's total use is shown"
                )
            if g.simulated:
                notes.append("simulated (demo)")
            self.set_note(plot, "; ".join(notes))

    def _sync_stacks(self) -> None:
        """The stacks' layers follow the table's columns; the legends follow the layers."""
        columns = list(self.table.columns)
        start, end = self.ram_plot.vb.viewRange()[0]
        for stack in self._stacks.values():
            stack.sync(columns, self.job_names)
            self._set_keys(stack.plot, stack.legend(self.table, start, end))

    def _now(self) -> float:
        return (self.status.time if self.status is not None else 0.0) or time.time()

    # -- events: markers and shaded spans --------------------------------------------------

    def add_event(self, event: EngineEvent) -> None:
        """A job event becomes a labelled vertical marker; the guard's warnings shaded spans."""
        kind = event.kind
        key = event.id if event.id is not None else (kind, event.time)
        if key in self._events:
            return
        t = event.time
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
                self._start_span(float(t), level, event.message)

    def _learn_names(self, names: Dict[str, str]) -> None:
        """Job names learned (a status, the history's jobs): markers drawn before their job's
        name was known (a job's first event comes before the status lists it) get it now."""
        new = {jid for jid, name in names.items() if self.job_names.get(jid) != name}
        if not new:
            return
        self.job_names.update(names)
        for key in self._markers:
            event = self._events.get(key)
            if event is not None and str(event.job_id) in new:
                self._label_marker(key, event)
        self.ram_labels.relayout()

    def _label_marker(self, key: Any, event: EngineEvent) -> None:
        colour = MARKER_COLOURS.get(event.kind, "#555555")
        self.ram_labels.set(
            ("event", key),
            marker_label(event, self.job_names),
            colour,
            horizontal=False,
            value=float(event.time),
            priority=10,
        )

    def marker_text(self, key: Any) -> str:
        """The label of an event's marker ("" when it has none)."""
        label = self.ram_labels.labels.get(("event", key))
        return label.item.textItem.toPlainText() if label is not None else ""

    def _add_marker(self, key: Any, event: EngineEvent) -> None:
        colour = MARKER_COLOURS.get(event.kind, "#555555")
        items = []
        for plot in self._plot_order:
            line = pg.InfiniteLine(
                pos=float(event.time),
                angle=90,
                movable=False,
                pen=pg.mkPen(colour, width=1, style=Qt.PenStyle.DashLine),
            )
            line.setZValue(LINES_Z)  # over the stacked areas
            plot.addItem(line, ignoreBounds=True)
            items.append((plot, line))
        self._markers[key] = items
        self._label_marker(key, event)
        while len(self._markers) > MAX_MARKERS:
            old = next(iter(self._markers))
            for plot, line in self._markers.pop(old):
                plot.removeItem(line)
            self.ram_labels.remove(("event", old))
        self.ram_labels.relayout()

    def _start_span(self, t: float, level: str, message: str) -> None:
        colour = SPAN_COLOURS.get(level, SPAN_COLOURS[L.WARN])
        items = []
        for plot in self._plot_order:
            region = pg.LinearRegionItem(
                values=(t, max(t, self._now())),
                movable=False,
                brush=pg.mkBrush(*colour),
                pen=pg.mkPen(None),
            )
            region.setZValue(SPANS_Z)  # a tint over the stacked areas, under the lines
            plot.addItem(region, ignoreBounds=True)
            items.append((plot, region))

        def set_end(end: float) -> None:
            for _plot, region in items:
                region.setRegion((t, max(t, end)))

        span = {
            "start": t,
            "end": max(t, self._now()),
            "level": level,
            "message": message,
            "items": items,
            "items_end": set_end,
        }
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
        for key, items in self._markers.items():
            for plot, line in items:
                plot.removeItem(line)
            self.ram_labels.remove(("event", key))
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
        self._sync_stacks()
        for stack in self._stacks.values():
            stack.draw(tb)
        self._show_now()
        if self.following and follow_to is not None:
            # The view moves in steps of 2% of the range, not on every update: a moved range
            # redraws every axis, which costs more than the curves themselves.
            step = self.range_seconds * FOLLOW_STEP
            right = math.ceil(follow_to / step) * step
            if right != self._view_right:
                self._view_right = right
                self.ram_plot.setXRange(right - self.range_seconds, right, padding=0)
        if self.hover_t is None and len(tb):
            self.show_values_at(None)

    def _show_now(self) -> None:
        """The "now" bars: RAM and each GPU's memory by consumer at the newest row."""
        bars = getattr(self, "now_bars", None)
        if bars is None:
            return
        parts = [("RAM", self._stacks["ram"], self._totals.get("ram", 0.0))]
        parts += [
            (f"GPU {i}", self._stacks[i], self._totals.get(f"gpu{i}", 0.0))
            for i in sorted(self.vram_plots)
        ]
        bars.show_parts(
            [
                (name, [Segment(*p) for p in stack.now(self.table)], total)
                for name, stack, total in parts
            ]
        )

    def _mouse_moved(self, args: Tuple[Any, ...]) -> None:
        pos = args[0]
        for plot in self._plot_order:
            if plot.sceneBoundingRect().contains(pos):
                self.show_values_at(plot.vb.mapSceneToView(pos).x())
                return
        self.show_values_at(None)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt override
        if event.type() == QEvent.Type.Leave and self.hover_t is not None:
            self.show_values_at(None)  # the pointer left the timelines: back to now
        return super().eventFilter(watched, event)

    def show_values_at(self, x: Optional[float], note: str = "") -> str:
        """The readout for the row nearest to time ``x`` (None: the newest row, "now"), with a
        cursor line at it; returns its text (plain). ``note`` is said after the time."""
        tb = self.table
        i = (len(tb) - 1 if len(tb) else None) if x is None else tb.nearest(x)
        self.hover_t = x
        if i is None:
            return ""
        t = float(tb.t()[i])
        if x is not None and abs(t - x) > max(5.0, self.range_seconds * FOLLOW_STEP):
            # Pointing where nothing was recorded (before the engine ran): say so, not the
            # values of another time.
            said = f" &nbsp;{html.escape(note)}" if note else ""
            self.readout_view.show(f"<b>at {formats.clock(x)}</b>{said}<br>no samples at this time")
            self._cursor_at(None)
            return self.readout_view.plain()
        when = formats.clock(t)
        head = f"<b>now {when}</b>" if x is None else f"<b>at {when}</b>"
        lines = [head + (f" &nbsp;{html.escape(note)}" if note else "")]
        ram = self._stacks["ram"].readout(tb, i, self._totals.get("ram", 0.0))
        lines.append("<b>RAM</b> " + " · ".join(ram))
        for index in sorted(self.vram_plots):
            parts = self._stacks[index].readout(tb, i, self._totals.get(f"gpu{index}", 0.0))
            lines.append(f"<b>GPU {index}</b> " + (" · ".join(parts) or "n/a"))
        load = []
        for curve in self._curves:
            v = curve.compute(tb)[i]
            if np.isfinite(v):
                load.append(f"{curve.label} {v:.1f}{'' if curve.unit == '%' else ' '}{curve.unit}")
        if load:
            lines.append(" · ".join(load))
        self.readout_view.show("<br>".join(lines))
        self._cursor_at(None if x is None else t)
        return self.readout_view.plain()

    def _cursor_at(self, t: Optional[float]) -> None:
        for plot in self._plot_order:
            line = self._cursor_lines.get(id(plot))
            if line is None:
                if t is None:
                    continue
                line = pg.InfiniteLine(
                    angle=90,
                    movable=False,
                    pen=pg.mkPen("#666666", width=1, style=Qt.PenStyle.DotLine),
                )
                line.setZValue(LINES_Z)
                plot.addItem(line, ignoreBounds=True)
                self._cursor_lines[id(plot)] = line
            line.setVisible(t is not None)
            if t is not None:
                line.setValue(t)
