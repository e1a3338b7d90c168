"""Memory stacked by consumer on one plot: the guard's jobs at the bottom, the largest other
processes by name above them, the rest on top, so the stack's top edge is the memory used.

RAM: ``job.<id>.rss``, ``ram.proc.<name>``, the rest of ``mem.used``. A GPU: ``gpu<i>.job.<id>``,
``gpu<i>.proc.<name>``, the rest of ``gpu<i>.other`` (``trayapp.series``).
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import numpy as np
import pyqtgraph as pg
from PySide6.QtGui import QColor

from trayapp import series
from trayapp.ui.timeline import Table

GIB = float(1 << 30)
JOB_COLOURS = ("#1f5fbf", "#d9480f", "#2b8a3e", "#862e9c", "#c2255c", "#0b7285")
PROC_COLOURS = ("#8fb8dc", "#f2b27a", "#9ccf92", "#c7a6d3", "#ee9a97", "#8ccac4", "#cdb49f")
REST_COLOUR = "#d4d0cc"
REST = "__rest__"
FREE = "__free__"
FREE_COLOUR = "#dcefd6"
# A filled area costs one fill per 50 points drawn: at most this many points per layer, more
# than a full-screen plot has pixels across.
MAX_POINTS = 2000


@dataclass
class Layer:
    key: str  # the column (or REST)
    label: str
    colour: str
    job: bool
    item: Any = None  # pg.PlotDataItem


class Stack:
    """The stacked layers of one plot (see the module docstring). ``job_of(column)`` gives the
    job id of a job column, ``proc_of(column)`` the process name of a per-name column;
    the rest is what the layers leave of the column ``total`` (with ``jobs_in_total``, the
    jobs are part of it; else only the process names are)."""

    def __init__(
        self,
        plot: Any,
        total: str,
        job_of: Callable[[str], Optional[str]],
        proc_of: Callable[[str], Optional[str]],
        rest_label: str,
        jobs_in_total: bool = True,
        free: Optional[str] = None,
    ):
        self.plot = plot
        self.free = free  # the column of what is free, drawn above the stack (RAM: available)
        self.total = total
        self.jobs_in_total = jobs_in_total
        self.job_of = job_of
        self.proc_of = proc_of
        self.rest_label = rest_label
        self.layers: List[Layer] = []
        self._colours: Dict[str, str] = {}

    def _colour(self, key: str, job: bool) -> str:
        colour = self._colours.get(key)
        if colour is None:
            palette = JOB_COLOURS if job else PROC_COLOURS
            used = sum(1 for k in self._colours if (self.job_of(k) is not None) == job)
            colour = self._colours[key] = palette[used % len(palette)]
        return colour

    def sync(self, columns: Iterable[str], names: Dict[str, str]) -> bool:
        """Match the layers to the table's columns: True when they changed (the legend must
        follow). Jobs first (by id), then process names in the order they appeared."""
        columns = list(columns)
        jobs = sorted(c for c in columns if self.job_of(c) is not None)
        seen = [la.key for la in self.layers if self.proc_of(la.key) is not None]
        procs = [c for c in seen if c in columns] + sorted(
            c for c in columns if self.proc_of(c) is not None and c not in seen
        )
        keys = jobs + procs + [REST] + ([FREE] if self.free else [])
        old = {la.key: la for la in self.layers}
        labels = {k: self._label(k, names) for k in keys}
        if keys == [la.key for la in self.layers] and all(old[k].label == labels[k] for k in keys):
            return False
        for key, gone in old.items():
            if key not in keys:
                self.plot.removeItem(gone.item)
        self.layers = []
        for depth, key in enumerate(keys):
            layer = old.get(key)
            job = self.job_of(key) is not None
            if layer is None:
                colour = {REST: REST_COLOUR, FREE: FREE_COLOUR}.get(key) or self._colour(key, job)
                # A job's band has a dark edge: its share stands out among the pale others.
                # (Width 1: a wider pen costs several times as much to draw.)
                pen = pg.mkPen(QColor(colour).darker(170 if job else 115), width=1)
                # connect="all" (the layers are drawn with 0 for "not known"): filling a curve
                # split at each gap costs a fill per piece.
                item = pg.PlotDataItem(
                    pen=pen, antialias=False, connect="all", fillLevel=0, brush=pg.mkBrush(colour)
                )
                self.plot.addItem(item)
                layer = Layer(key, labels[key], colour, job, item)
            layer.label = labels[key]
            # Each layer is drawn as the sum up to it, filled down to 0: lower layers above in z.
            layer.item.setZValue(len(keys) - depth)
            self.layers.append(layer)
        return True

    def _label(self, key: str, names: Dict[str, str]) -> str:
        if key == REST:
            return self.rest_label
        if key == FREE:
            return "available"
        jid = self.job_of(key)
        if jid is not None:
            # Told apart by a short id: five runs of "train" are five jobs.
            return f"{names.get(jid, jid)} (job {jid[:4]})"
        return str(self.proc_of(key))

    def values(self, tb: Table) -> Dict[str, np.ndarray]:
        """Each layer's own values (not summed), NaN where the total is not known."""
        total = tb.column(self.total)
        out: Dict[str, np.ndarray] = {}
        named = np.zeros(len(total))
        for layer in self.layers:
            if layer.key in (REST, FREE):
                continue
            v = np.nan_to_num(tb.column(layer.key), nan=0.0)
            out[layer.key] = np.where(np.isnan(total), np.nan, v)
            if self.jobs_in_total or not layer.job:
                named = named + v
        out[REST] = np.maximum(total - named, 0.0)
        if self.free:
            out[FREE] = tb.column(self.free)
        return out

    def draw(self, tb: Table) -> None:
        t = tb.t()
        cum = np.zeros(len(t))
        values = self.values(tb)
        # RSS counts pages shared between processes in each of them, so the layers can add up
        # to more than is used: the stack stops at the memory used (the jobs, at the bottom,
        # keep their size).
        top = tb.column(self.total)
        if not self.jobs_in_total:
            top = top + sum((values[la.key] for la in self.layers if la.job), np.zeros(len(t)))
        k = len(t) // MAX_POINTS + 1  # rows per point drawn
        start = len(t) % k  # blocks end at the newest row
        t_drawn = t[start:].reshape(-1, k)[:, -1] if k > 1 else t
        for layer in self.layers:
            if layer.key == FREE:  # above the memory used, up to the limit
                y = np.nan_to_num(np.fmin(cum, top) + values[FREE], nan=0.0) / GIB
            else:
                cum = cum + values[layer.key]
                y = np.nan_to_num(np.fmin(cum, top), nan=0.0) / GIB
            if k > 1:  # the peak of each block: sums up to a layer keep their order
                y = y[start:].reshape(-1, k).max(axis=1)
            layer.item.setData(t_drawn, y)

    def legend(
        self, tb: Optional[Table] = None, start: float = -math.inf, end: float = math.inf
    ) -> List[Tuple[str, str]]:
        """The layers' labels and colours; with ``tb``, only those with memory between
        ``start`` and ``end`` (the range shown: a job that ended an hour ago is not listed in
        the last five minutes), what is left and what is free always."""
        if tb is None or not len(tb):
            return [(la.label, la.colour) for la in self.layers]
        t = tb.t()
        inside = (t >= start) & (t <= end)
        out = []
        for la in self.layers:
            if la.key not in (REST, FREE):
                v = tb.column(la.key)[inside]
                if not v.size or not np.nanmax(np.nan_to_num(v, nan=0.0)) > 0:
                    continue
            out.append((la.label, la.colour))
        return out

    def now(self, tb: Table) -> List[Tuple[str, float, str, bool]]:
        """Each layer's (label, bytes, colour, job) at the newest row, jobs first then by size,
        what is free last: the "now" bar's parts."""
        if not len(tb):
            return []
        values = self.values(tb)
        parts: List[Tuple[str, float, str, bool]] = []
        free: List[Tuple[str, float, str, bool]] = []
        for layer in self.layers:
            v = float(values[layer.key][-1]) if layer.key in values else math.nan
            if math.isfinite(v) and v > 0:
                (free if layer.key == FREE else parts).append(
                    (layer.label, v, layer.colour, layer.job)
                )
        parts.sort(key=lambda p: (not p[3], -p[1]))
        return parts + free

    def readout(self, tb: Table, i: int, whole: float) -> List[str]:
        """Each layer's value at row ``i``, largest first after the jobs, with its share of
        ``whole`` (the memory's total) when known; rich text, the labels escaped."""
        values = self.values(tb)
        parts: List[Tuple[bool, float, str]] = []
        for layer in self.layers:
            if layer.key == FREE:
                continue
            v = float(values[layer.key][i])
            if not np.isfinite(v) or v <= 0:
                continue  # a job that has ended, a name gone: not "0 MiB (0%)"
            share = f" ({v / whole:.0%})" if whole and whole > 0 else ""
            text = f"{html.escape(layer.label)} {format_gib(v)}{share}"
            parts.append((layer.job, v, f"<b>{text}</b>" if layer.job else text))
        parts.sort(key=lambda p: (not p[0], -p[1]))
        free = float(values[FREE][i]) if FREE in values else math.nan
        if math.isfinite(free):
            parts.append(
                (False, free, f"<span style='color:#2b7a2b'>available {format_gib(free)}</span>")
            )
        return [p[2] for p in parts]


def format_gib(v: float) -> str:
    return f"{v / GIB:.2f} GiB" if v >= GIB / 10 else f"{v / (1 << 20):.0f} MiB"


def ram_stack(plot: Any) -> Stack:
    def job_of(c: str) -> Optional[str]:
        if c.startswith("job.") and c.endswith(".rss"):
            return c[len("job.") : -len(".rss")]
        return None

    def proc_of(c: str) -> Optional[str]:
        return c[len(series.RAM_PROC) :] if c.startswith(series.RAM_PROC) else None

    return Stack(plot, "mem.used", job_of, proc_of, "other", free="mem.available")


def gpu_stack(plot: Any, index: int) -> Stack:
    prefix = series.gpu_series(index, "")

    def job_of(c: str) -> Optional[str]:
        return series.layer_job(c[len(prefix) :]) if c.startswith(prefix) else None

    def proc_of(c: str) -> Optional[str]:
        return series.proc_name(c[len(prefix) :]) if c.startswith(prefix) else None

    return Stack(
        plot, series.gpu_series(index, series.OTHER), job_of, proc_of, "other", jobs_in_total=False
    )
