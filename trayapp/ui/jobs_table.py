"""The jobs window's table: the model of the job records, its filter, and the progress cell."""

from __future__ import annotations

import time
from typing import Any, Callable, List, Optional

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QSortFilterProxyModel, Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QApplication, QStyle, QStyledItemDelegate, QStyleOptionViewItem

from trayapp.jobs.record import JobRecord
from trayapp.text import one_line
from trayapp.ui.forms import plain_tip
from trayapp.ui.job_rows import (
    COLUMNS,
    FINISHED_STATES,
    STATE_COLOURS,
    cell_text,
    job_matches,
    progress_fraction,
    state_text,
)


class JobsModel(QAbstractTableModel):
    """Job records, newest first, updated in place so the selection stays on its job."""

    JOB_ROLE = Qt.ItemDataRole.UserRole + 1
    FRACTION_ROLE = Qt.ItemDataRole.UserRole + 2

    def __init__(self, clock: Callable[[], float] = time.time, parent: Any = None):
        super().__init__(parent)
        self.jobs: List[JobRecord] = []
        self.clock = clock

    def rowCount(self, parent: Any = QModelIndex()) -> int:  # noqa: N802 - Qt's name
        return 0 if parent.isValid() else len(self.jobs)

    def columnCount(self, parent: Any = QModelIndex()) -> int:  # noqa: N802 - Qt's name
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(
        self,
        section: int,
        orientation: Qt.Orientation,  # noqa: N802
        role: int = Qt.ItemDataRole.DisplayRole,
    ) -> Any:
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return COLUMNS[section]
        return None

    def data(self, index: Any, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or index.row() >= len(self.jobs):
            return None
        job = self.jobs[index.row()]
        col = index.column()
        if role == Qt.ItemDataRole.DisplayRole:  # a job's name, its reasons: escaped
            return one_line(cell_text(job, col, self.clock()))
        if role == self.JOB_ROLE:
            return job
        if role == self.FRACTION_ROLE:
            return progress_fraction(job)
        if role == Qt.ItemDataRole.ForegroundRole and COLUMNS[col] == "State":
            colour = STATE_COLOURS.get(job.state)
            return QColor(colour) if colour else None
        if role == Qt.ItemDataRole.ToolTipRole:
            if COLUMNS[col] == "State":
                return plain_tip(state_text(job))
            if COLUMNS[col] == "Name":
                return plain_tip(f"{job.id} · {job.script}")
        if role == Qt.ItemDataRole.TextAlignmentRole and COLUMNS[col] in (
            "Loss",
            "ETA",
            "RAM",
            "VRAM",
            "Elapsed",
        ):
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        return None

    def row_of(self, job_id: str) -> int:
        for i, j in enumerate(self.jobs):
            if j.id == job_id:
                return i
        return -1

    def job(self, job_id: str) -> Optional[JobRecord]:
        i = self.row_of(job_id)
        return self.jobs[i] if i >= 0 else None

    def update_jobs(self, jobs: List[JobRecord], complete: bool) -> None:
        """Merge ``jobs`` in: known ones change in place, new ones are added at the top; with
        ``complete`` (a whole list from the engine) jobs it no longer has are removed."""
        incoming = {j.id: j for j in jobs}
        if complete:
            for i in range(len(self.jobs) - 1, -1, -1):
                if self.jobs[i].id not in incoming:
                    self.beginRemoveRows(QModelIndex(), i, i)
                    del self.jobs[i]
                    self.endRemoveRows()
        last = len(COLUMNS) - 1
        for job_id, job in incoming.items():
            i = self.row_of(job_id)
            if i >= 0:
                self.jobs[i] = job
                self.dataChanged.emit(self.index(i, 0), self.index(i, last))
        new = [j for jid, j in incoming.items() if self.row_of(jid) < 0]
        if new:
            new.sort(key=lambda j: -(j.started or float("inf")))
            self.beginInsertRows(QModelIndex(), 0, len(new) - 1)
            self.jobs[0:0] = new
            self.endInsertRows()

    def tick(self) -> None:
        """Elapsed and ETA move with the clock: redraw those cells of live jobs."""
        for i, j in enumerate(self.jobs):
            if j.state not in FINISHED_STATES:
                self.dataChanged.emit(
                    self.index(i, COLUMNS.index("ETA")), self.index(i, len(COLUMNS) - 1)
                )


class JobsFilter(QSortFilterProxyModel):
    def __init__(self, parent: Any = None):
        super().__init__(parent)
        self.text = ""
        self.show = "all"

    def set_filter(self, text: Optional[str] = None, show: Optional[str] = None) -> None:
        self.beginFilterChange()
        if text is not None:
            self.text = text
        if show is not None:
            self.show = show
        self.endFilterChange(QSortFilterProxyModel.Direction.Rows)

    def filterAcceptsRow(self, row: int, parent: Any) -> bool:  # noqa: N802 - Qt's name
        model = self.sourceModel()
        job = model.data(model.index(row, 0, parent), JobsModel.JOB_ROLE)
        return bool(job) and job_matches(job, self.text, self.show)


class ProgressDelegate(QStyledItemDelegate):
    """Draws the progress cell as a light bar with the epoch and step on it, in dark text that
    reads on a selected row as well as on a plain one."""

    TRACK = QColor("#f0f0f0")
    CHUNK = QColor("#9cc9f0")
    BORDER = QColor("#8a8a8a")
    TEXT = QColor("#1c1c1c")

    def paint(self, painter: Any, option: QStyleOptionViewItem, index: Any) -> None:
        fraction = index.data(JobsModel.FRACTION_ROLE)
        if fraction is None:
            super().paint(painter, option, index)
            return
        widget = option.widget  # type: ignore[attr-defined]
        style = widget.style() if widget is not None else QApplication.style()
        style.drawPrimitive(QStyle.PrimitiveElement.PE_PanelItemViewItem, option, painter, widget)
        rect = option.rect.adjusted(3, 4, -4, -5)  # type: ignore[attr-defined]
        painter.save()
        try:
            painter.setPen(self.BORDER)
            painter.setBrush(self.TRACK)
            painter.drawRect(rect)
            inner = rect.adjusted(1, 1, 0, 0)
            inner.setWidth(int(round((rect.width() - 1) * max(0.0, min(1.0, fraction)))))
            painter.fillRect(inner, self.CHUNK)
            painter.setPen(self.TEXT)
            text = index.data(Qt.ItemDataRole.DisplayRole) or f"{fraction:.0%}"
            painter.drawText(rect, int(Qt.AlignmentFlag.AlignCenter), text)
        finally:
            painter.restore()
