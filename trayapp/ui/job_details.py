"""The panes of the jobs window's details: the live log with its search, the Options tree, the
events list and the RAM/VRAM chart of the selected job.

Each pane only shows what it is given; the window asks the engine and hands the answers over.
"""

from __future__ import annotations

import html
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import (
    QColor,
    QFontDatabase,
    QGuiApplication,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
)
from PySide6.QtWidgets import (
    QCheckBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QTextEdit,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from trayapp import formats
from trayapp import series as seriesmod
from trayapp.config import format_bytes
from trayapp.engine.event_record import EngineEvent
from trayapp.engine.history_record import History, Series
from trayapp.jobs.curves import FitStart, JobCurves
from trayapp.jobs.record import JobRecord
from trayapp.text import one_line
from trayapp.ui.forms import ERROR_STYLE, NOTE_STYLE, plain_label, plain_tip, set_message
from trayapp.ui.job_rows import LEVEL_COLOURS, curve_data, option_sections, options_key

LOG_MAX_LINES = 20000
CHART_SECONDS = 3600.0  # the chart shows at most the last hour of a job
MIB = float(1 << 20)
MAX_HIGHLIGHTS = 1000


class LogPane(QWidget):
    """The job's log as it grows, a search over it (next, previous, every match marked),
    "Follow" to keep the newest output in view, and "Copy"."""

    def __init__(self, parent: Optional[QWidget] = None):
        super().__init__(parent)
        layout = QVBoxLayout(self)
        bar = QHBoxLayout()
        self.search_edit = QLineEdit()
        self.search_edit.setPlaceholderText("Search the log")
        self.search_edit.setAccessibleName("Search the log")
        self.search_edit.setClearButtonEnabled(True)
        self.search_edit.returnPressed.connect(lambda: self.find_text(forward=True))
        self.search_edit.textChanged.connect(lambda _t: self.highlight())
        self.find_button = QPushButton("Next")
        self.find_button.setAccessibleName("Find next in the log")
        self.find_button.clicked.connect(lambda: self.find_text(forward=True))
        self.find_prev_button = QPushButton("Previous")
        self.find_prev_button.setAccessibleName("Find previous in the log")
        self.find_prev_button.clicked.connect(lambda: self.find_text(forward=False))
        self.search_result = QLabel()
        self.search_result.setAccessibleName("Search result")
        self.follow_box = QCheckBox("Follow")
        self.follow_box.setToolTip("Keep the newest output in view")
        self.follow_box.setAccessibleName("Follow the log")
        self.follow_box.setChecked(True)
        self.copy_button = QPushButton("Copy")
        self.copy_button.setToolTip("Copy the selected text, or the whole log")
        self.copy_button.setAccessibleName("Copy the log")
        self.copy_button.clicked.connect(self.copy)
        for w in (
            self.search_edit,
            self.find_button,
            self.find_prev_button,
            self.search_result,
            self.follow_box,
            self.copy_button,
        ):
            bar.addWidget(w, 1 if w is self.search_edit else 0)
        layout.addLayout(bar)
        self.view = QPlainTextEdit()
        self.view.setReadOnly(True)
        self.view.setAccessibleName("Job log")
        self.view.setMaximumBlockCount(LOG_MAX_LINES)
        self.view.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.view.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        layout.addWidget(self.view, 1)

    def focus_chain(self) -> List[QWidget]:
        """The pane's widgets in tab order."""
        return [
            self.search_edit,
            self.find_button,
            self.find_prev_button,
            self.follow_box,
            self.copy_button,
            self.view,
        ]

    def append(self, text: str) -> None:
        view = self.view
        bar = view.verticalScrollBar()
        at_end = bar.value() >= bar.maximum() - 2
        cursor = QTextCursor(view.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.insertText(text)
        if self.follow_box.isChecked() and at_end:
            bar.setValue(bar.maximum())
        if self.search_edit.text():
            self.highlight()

    def text(self) -> str:
        return self.view.toPlainText()

    def find_text(self, forward: bool = True) -> bool:
        """Select the next (or previous) place the search text occurs, wrapping around."""
        text = self.search_edit.text()
        if not text:
            set_message(self.search_result, None)
            return False
        flags = QTextDocument.FindFlag(0) if forward else QTextDocument.FindFlag.FindBackward
        found = self.view.find(text, flags)
        if not found:
            cursor = self.view.textCursor()
            cursor.movePosition(
                QTextCursor.MoveOperation.Start if forward else QTextCursor.MoveOperation.End
            )
            self.view.setTextCursor(cursor)
            found = self.view.find(text, flags)
        if found:
            self.follow_box.setChecked(False)  # stay where the match is
        self.highlight()
        return found

    def highlight(self) -> None:
        """Mark every match of the search text (at most ``MAX_HIGHLIGHTS``) and count them."""
        text = self.search_edit.text()
        selections: List[QTextEdit.ExtraSelection] = []
        if text:
            fmt = QTextCharFormat()
            fmt.setBackground(QColor("#ffe88a"))
            doc = self.view.document()
            cursor = doc.find(text)
            while not cursor.isNull() and len(selections) < MAX_HIGHLIGHTS:
                sel = QTextEdit.ExtraSelection()
                sel.cursor = cursor  # type: ignore[misc]
                sel.format = fmt  # type: ignore[misc]
                selections.append(sel)
                cursor = doc.find(text, cursor)
            count = f"{len(selections)}{'+' if len(selections) >= MAX_HIGHLIGHTS else ''}"
            self.search_result.setText("not found" if not selections else f"{count} found")
            self.search_result.setStyleSheet(ERROR_STYLE if not selections else NOTE_STYLE)
            self.search_result.show()
        else:
            self.search_result.hide()
        self.view.setExtraSelections(selections)

    def copy(self) -> str:
        """Copy the selected log text, or the whole log; returns what was copied."""
        cursor = self.view.textCursor()
        text = (
            cursor.selectedText().replace("\u2029", "\n") if cursor.hasSelection() else self.text()
        )
        QGuiApplication.clipboard().setText(text)
        return text


def options_tree() -> QTreeWidget:
    tree = QTreeWidget()
    tree.setAccessibleName("Options applied")
    tree.setHeaderLabels(["Option", "Value"])
    tree.setColumnWidth(0, 240)
    return tree


def fill_options(tree: QTreeWidget, job: JobRecord) -> None:
    """The Options tab of ``job`` (``job_rows.option_sections``); left as it is when nothing
    in it changed, so an expanded or scrolled tree stays so."""
    key = options_key(job)
    if tree.property("filled_for") == key:
        return
    tree.setProperty("filled_for", key)
    tree.clear()
    for title, rows in option_sections(job):
        top = QTreeWidgetItem([title, ""])
        for k, v in rows:
            top.addChild(QTreeWidgetItem([one_line(k), one_line(v)]))
        tree.addTopLevelItem(top)
        top.setExpanded(True)


class EventList(QTreeWidget):
    """The selected job's events, oldest first: time, level and what happened."""

    def __init__(self, parent: Optional[QWidget] = None):
        super().__init__(parent)
        self.setAccessibleName("Job events")
        self.setHeaderLabels(["Time", "Level", "What happened"])
        self.setRootIsDecorated(False)
        self.setColumnWidth(0, 90)
        self.setColumnWidth(1, 60)

    def add(self, event: EngineEvent) -> None:
        when = formats.clock(event.time)
        level = event.level or "info"
        item = QTreeWidgetItem([when, level, one_line(event.message or event.kind)])
        item.setToolTip(2, plain_tip(event.message))
        if level in LEVEL_COLOURS:
            for col in range(3):
                item.setForeground(col, QColor(LEVEL_COLOURS[level]))
        self.addTopLevelItem(item)

    def lines(self) -> List[str]:
        items = (self.topLevelItem(i) for i in range(self.topLevelItemCount()))
        return [item.text(2) for item in items if item is not None]


def chart_request(
    job: Optional[JobRecord], job_id: str, now: float
) -> Tuple[float, float, List[str]]:
    """(start, end, series) of the history the chart of ``job_id`` shows: the job's time, at
    most its last hour."""
    end = (job.ended if job is not None else None) or now
    started = job.started if job is not None else None
    start = max(started or end - CHART_SECONDS, end - CHART_SECONDS)
    return start, end, [seriesmod.job_series(job_id, "rss"), seriesmod.job_series(job_id, "vram")]


class MemoryChart(QWidget):
    """The RAM (process tree) and VRAM of one job on a clock-time axis, with its budgets."""

    def __init__(self, parent: Optional[QWidget] = None):
        super().__init__(parent)
        axis = pg.DateAxisItem(orientation="bottom")
        self.chart = pg.PlotWidget(axisItems={"bottom": axis})
        self.chart.setAccessibleName("RAM and VRAM of the job")
        self.chart.setBackground("w")
        plot = self.chart.getPlotItem()
        plot.setLabel("left", "MiB")
        plot.showGrid(x=True, y=True, alpha=0.2)
        plot.setMenuEnabled(False)
        plot.setDownsampling(auto=True, mode="peak")
        plot.setClipToView(True)
        for ax in ("left", "bottom"):
            plot.getAxis(ax).setPen(pg.mkPen("#888888"))
            plot.getAxis(ax).setTextPen(pg.mkPen("#333333"))
        self.rss_curve = plot.plot(
            [], [], name="RAM (process tree)", pen=pg.mkPen("#2e7d32", width=1), antialias=False
        )
        self.vram_curve = plot.plot(
            [], [], name="VRAM", pen=pg.mkPen("#6a3d9a", width=1), antialias=False
        )
        self.budget_lines: List[Any] = []
        self.keys: List[Tuple[str, str, bool]] = []  # the legend: (label, colour, dashed)
        self._legend([])
        self.note = plain_label()  # metric names are the job's
        self.note.setStyleSheet(NOTE_STYLE)
        layout = QVBoxLayout(self)
        layout.addWidget(self.chart, 1)
        layout.addWidget(self.note)

    def _legend(self, budgets: List[Tuple[str, str, bool]]) -> None:
        # In the title line, never over the curves.
        self.keys = [("RAM (process tree)", "#2e7d32", False), ("VRAM", "#6a3d9a", False)] + budgets
        self.chart.getPlotItem().setTitle(title_legend(self.keys), size="8pt")

    def clear(self) -> None:
        self.rss_curve.setData([], [])
        self.vram_curve.setData([], [])

    def show_history(self, job_id: str, result: History, job: Optional[JobRecord]) -> None:
        """Draw the engine's history answer for ``job_id`` (``chart_request``'s series)."""
        data = []
        for name, curve in (
            (seriesmod.job_series(job_id, "rss"), self.rss_curve),
            (seriesmod.job_series(job_id, "vram"), self.vram_curve),
        ):
            rows = result.series.get(name) or Series()
            # Raw samples, or of one-minute rows the peak: the peak is what counts. A row
            # without a value is not drawn.
            kept = [(t, v) for t, v in zip(rows.t, rows.values()) if v is not None]
            data.append((curve, [t for t, _v in kept], [v for _t, v in kept]))
        peak = max((max(v) for _c, _t, v in data if v), default=0.0)
        unit, scale = ("GiB", float(1 << 30)) if peak >= 2 * float(1 << 30) else ("MiB", MIB)
        plot = self.chart.getPlotItem()
        plot.setLabel("left", unit)
        shown = self._draw(data, scale)
        notes = self._budgets(job, scale)
        if not shown:
            notes.insert(0, "No memory samples for this job in the engine's history.")
        self.note.setText(" · ".join(notes))

    def _draw(self, data: Sequence[Tuple[Any, List[float], List[float]]], scale: float) -> int:
        shown = 0
        span: List[float] = []
        for curve, t, values in data:
            if t and values:
                curve.setData(t, [float(v) / scale for v in values])
                span += [float(t[0]), float(t[-1])]
                shown += 1
            else:
                curve.setData([], [])
        if span:
            # At least a minute wide, so the time axis reads as clock time, not as seconds.
            t0, t1 = min(span), max(span)
            self.chart.getPlotItem().setXRange(t0, max(t1, t0 + 60.0), padding=0.02)
        return shown

    def _budgets(self, job: Optional[JobRecord], scale: float) -> List[str]:
        plot = self.chart.getPlotItem()
        for line in self.budget_lines:
            plot.removeItem(line)
        self.budget_lines = []
        notes = []
        keys: List[Tuple[str, str, bool]] = []
        peak = self._peak()
        top = peak
        for value, colour, label in (
            (job.ram_budget_bytes if job else None, "#2e7d32", "RAM budget"),
            (job.vram_budget_bytes if job else None, "#6a3d9a", "VRAM budget"),
        ):
            if value:
                y = float(value) / scale
                notes.append(f"{label} {format_bytes(value)}")
                line = pg.InfiniteLine(
                    pos=y,
                    angle=0,
                    movable=False,
                    pen=pg.mkPen(colour, width=1, style=Qt.PenStyle.DashLine),
                    label=label,
                    labelOpts={"position": 0.05, "color": colour},
                )
                plot.addItem(line, ignoreBounds=True)
                self.budget_lines.append(line)
                keys.append((label, colour, True))
                # A budget near the use is in view; one far above it would flatten the curves,
                # so it is said instead.
                if not peak or y <= BUDGET_IN_VIEW * peak:
                    top = max(top, y)
                else:
                    notes[-1] += f" (above the chart: {y / peak:.0f}x the most used)"
        if top > 0:
            plot.setYRange(0, top * 1.08, padding=0)
        self._legend(keys)
        return notes

    def _peak(self) -> float:
        peak = 0.0
        for curve in (self.rss_curve, self.vram_curve):
            _, y = curve.getData()
            if y is not None and len(y):
                peak = max(peak, float(max(y)))
        return peak


BUDGET_IN_VIEW = 3.0  # a budget up to this many times the most used is drawn in view


def title_legend(keys: Sequence[Tuple[str, str, bool]]) -> str:
    """A legend as a title line: a coloured square (a dash for a dashed line) and the name."""
    return "&nbsp;&nbsp;".join(
        f"<span style='color:{colour}'>{'&#9476;' if dashed else '&#9632;'}</span>&nbsp;"
        f"{html.escape(label)}"
        for label, colour, dashed in keys
    )


CURVE_COLOURS = ("#1f5fa8", "#c0392b", "#2e7d32", "#6a3d9a", "#b26a00", "#117a8b", "#555555")


def _base_metric(name: str) -> str:
    return name[4:] if name.startswith("val_") else name


class CurvesChart(QWidget):
    """A job's loss and metrics against the epoch (Keras's numbering: 2.5 is halfway through
    epoch 3): each metric's batch values as a thin line, its epoch ends as points, a ``val_``
    metric dashed in its metric's colour."""

    def __init__(self, parent: Optional[QWidget] = None):
        super().__init__(parent)
        self.chart = pg.PlotWidget()
        self.chart.setAccessibleName("Loss and metrics of the job")
        self.chart.setBackground("w")
        plot = self.chart.getPlotItem()
        plot.setLabel("bottom", "epoch")
        plot.showGrid(x=True, y=True, alpha=0.2)
        plot.setMenuEnabled(False)
        for ax in ("left", "bottom"):
            plot.getAxis(ax).setPen(pg.mkPen("#888888"))
            plot.getAxis(ax).setTextPen(pg.mkPen("#333333"))
        self.curves: Dict[str, Any] = {}  # "loss" (batches) and "loss@epoch" -> its item
        self.keys: List[Tuple[str, str, bool]] = []  # the legend, in the title line
        self.fit_lines: List[Any] = []  # where each later fit() call began
        self.note = plain_label()  # metric names are the job's
        self.note.setStyleSheet(NOTE_STYLE)
        self.note.setWordWrap(True)
        layout = QVBoxLayout(self)
        layout.addWidget(self.chart, 1)
        layout.addWidget(self.note)

    def clear(self) -> None:
        plot = self.chart.getPlotItem()
        for item in self.curves.values():
            plot.removeItem(item)
        self.curves = {}
        self._mark_fits([])
        self.keys = []
        self.chart.getPlotItem().setTitle(None)
        self.note.setText("")

    def _mark_fits(self, fits: Sequence[FitStart]) -> None:
        plot = self.chart.getPlotItem()
        for line in self.fit_lines:
            plot.removeItem(line)
        self.fit_lines = []
        for fit in fits[1:]:
            line = pg.InfiniteLine(
                pos=fit.x,
                angle=90,
                movable=False,
                pen=pg.mkPen("#888888", width=1, style=Qt.PenStyle.DotLine),
                label=f"fit {fit.fit}",
                labelOpts={"position": 0.05, "color": "#555555"},
            )
            plot.addItem(line, ignoreBounds=True)
            self.fit_lines.append(line)

    def _colour(self, name: str, names: List[str]) -> str:
        bases: List[str] = []
        for n in names:
            if _base_metric(n) not in bases:
                bases.append(_base_metric(n))
        return CURVE_COLOURS[bases.index(_base_metric(name)) % len(CURVE_COLOURS)]

    def _item(self, key: str, name: str, names: List[str], epochs: bool, named: bool = True) -> Any:
        item = self.curves.get(key)
        if item is None:
            colour = self._colour(name, names)
            style = Qt.PenStyle.DashLine if name.startswith("val_") else Qt.PenStyle.SolidLine
            plot = self.chart.getPlotItem()
            if epochs:
                item = plot.plot(
                    [],
                    [],
                    pen=pg.mkPen(colour, width=2, style=style),
                    symbol="o",
                    symbolSize=6,
                    symbolBrush=colour,
                    symbolPen=colour,
                    antialias=True,
                )
            else:
                item = plot.plot(
                    [], [], pen=pg.mkPen(colour, width=1, style=style), antialias=False
                )
            self.curves[key] = item
            if named:  # in the legend once, in the title line (never over the curves)
                self.keys.append((name, colour, name.startswith("val_")))
                plot.setTitle(title_legend(self.keys), size="8pt")
        return item

    def show_curves(self, curves: Optional[JobCurves], job: Optional[JobRecord]) -> None:
        """Draw the engine's curves of a job (``EngineClient.job_curves``)."""
        batches, epochs = curve_data(curves)
        names = list(curves.names) if curves is not None else []
        self._mark_fits(curves.fits if curves is not None else ())
        for name in names:
            if name in batches:
                self._item(name, name, names, False).setData(*batches[name])
            if name in epochs:
                self._item(name + "@epoch", name, names, True, named=name not in batches).setData(
                    *epochs[name]
                )
        if not batches and not epochs:
            self.note.setText(
                "No loss or metrics from this job: they come from Keras's fit() "
                "while the engine runs"
                + (
                    " (the job reports no fit() progress)"
                    if job and job.hello and not job.hooked
                    else ""
                )
                + "."
            )
            return
        last = {n: v[1][-1] for n, v in {**batches, **epochs}.items() if v[1]}
        said = " · ".join(f"{n} {formats.loss(last[n])}" for n in names if n in last)
        self.note.setText(f"Last: {said}" + (" · the points are the epoch ends" if epochs else ""))
