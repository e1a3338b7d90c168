"""The dashboard's timelines: the plots on one clock axis (RAM, swap and pressure, VRAM per GPU
stacked by process, GPU load), the guard's thresholds, the jobs' events as markers and the
guard's warnings as shaded spans, the view that follows live data, and the readout under the
pointer.

``DashboardPlots`` is the dashboard window's base: it draws what the window keeps (``table``,
``job_names``, ``status``, ``range_seconds``) and fed to it.
"""

from __future__ import annotations

import html
import math
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QLabel, QPushButton, QWidget

from trayapp import formats, series
from trayapp.ui import data as datamod
from trayapp.ui.dashboard_parts import (
    FOLLOW_STEP,
    GIB,
    LAYER_COLOURS,
    MARKER_COLOURS,
    MAX_MARKERS,
    MAX_SPANS,
    OTHER_COLOUR,
    SPAN_COLOURS,
    SPAN_LEVELS,
    THRESHOLD_COLOURS,
    Curve,
    column,
    escape,
    marker_label,
    ratio,
)
from trayapp.ui.timeline import Table
from trayapp.vocab import GuardLevel as L


class DashboardPlots(QWidget):
    """The plots and what is drawn on them (see the module docstring)."""

    # Kept by the dashboard window, drawn here.
    table: Table
    job_names: Dict[str, str]
    status: Optional[Dict[str, Any]]
    range_seconds: int
    following: bool
    plots: Any  # pg.GraphicsLayoutWidget
    readout: QLabel
    follow_button: QPushButton

    def _build_plots(self) -> None:
        """The plots, their curves and lines, in ``self.plots``."""
        self._view_right: Optional[float] = None  # the right edge the view follows to
        self._events: Dict[Any, Dict[str, Any]] = {}
        self._markers: Dict[Any, List[Any]] = {}
        self._spans: List[Dict[str, Any]] = []
        self._open_span: Optional[Dict[str, Any]] = None
        self._layers: Dict[int, List[str]] = {}
        self._stack_items: Dict[int, Dict[str, Any]] = {}
        self._curves: List[Curve] = []
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
                    lambda tb: ratio(tb.column("swap.used"), tb.column("swap.total"), 100.0))
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
               compute: Callable[[Table], np.ndarray], fill: Optional[str] = None) -> Curve:
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
            self._layers[i] = []
            self._stack_items[i] = {}
            self._curve(self.gpu_plot, f"GPU{i} util", LAYER_COLOURS[(2 * i) % 7], "%",
                        column(f"gpu{i}.util"))
            self._curve(self.gpu_plot, f"GPU{i} temp", LAYER_COLOURS[(2 * i + 1) % 7], "°C",
                        column(f"gpu{i}.temp"))
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
                items[0][1].label.setFormat(escape(marker_label(event, self.job_names)))

    def _add_marker(self, key: Any, event: Dict[str, Any]) -> None:
        kind = str(event.get("kind"))
        colour = MARKER_COLOURS.get(kind, "#555555")
        label = marker_label(event, self.job_names)
        items = []
        for n, plot in enumerate(self._plot_order):
            line = pg.InfiniteLine(
                pos=float(event["time"]), angle=90, movable=False,
                pen=pg.mkPen(colour, width=1, style=Qt.PenStyle.DashLine),
                label=escape(label) if n == 0 else None,
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
        parts = [formats.clock(t)]
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
