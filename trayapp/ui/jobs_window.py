"""The jobs window: every job in a table (progress, loss, ETA, memory, elapsed) and, for the one
selected, its live log, the options its runner applied, its events and a RAM/VRAM chart.

Everything comes from the engine, off the GUI thread (``CallRunner``): the job list once a
second while the window shows (and at once from the app's status pushes, ``apply_snapshot``),
the selected job's log from where the last read ended, its events after the last one seen.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import pyqtgraph as pg
from PySide6.QtCore import (
    QAbstractTableModel,
    QModelIndex,
    QSortFilterProxyModel,
    Qt,
    QTimer,
    QUrl,
    Signal,
)
from PySide6.QtGui import (
    QColor,
    QDesktopServices,
    QFontDatabase,
    QGuiApplication,
    QHideEvent,
    QShowEvent,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
)
from PySide6.QtWidgets import (
    QAbstractItemView,
    QApplication,
    QCheckBox,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QSplitter,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QTableView,
    QTabWidget,
    QTextEdit,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from trayapp import vocab
from trayapp.config import format_bytes
from trayapp.engine.client import EngineClient
from trayapp.jobs.options import holds_checkpoint
from trayapp.ui.forms import (
    ERROR_STYLE,
    NOTE_STYLE,
    chain_tab_order,
    escape_closes,
    message_label,
    one_line,
    set_message,
    window_title,
)
from trayapp.ui.model import JOB_ACTIONS, format_duration
from trayapp.ui.worker import CallRunner

log = logging.getLogger("headroom.ui")

COLUMNS = ("Name", "State", "Progress", "Loss", "ETA", "RAM", "VRAM", "Elapsed")
COL_PROGRESS = COLUMNS.index("Progress")
FINISHED_STATES = vocab.ENDED
SHOW_CHOICES = (("all", "All jobs"), ("active", "Running and parked"),
                ("finished", "Finished"))
ACTIONS = ("pause", "resume", "park", "stop")
STATE_COLOURS = {"running": "#2e7d32", "paused": "#b26a00", "pausing": "#b26a00",
                 "parked": "#6a3d9a", "parking": "#6a3d9a", "failed": "#c0392b",
                 "lost": "#c0392b", "stopped": "#555555", "finished": "#1f5fa8"}
LEVEL_COLOURS = {"warn": "#a15c00", "error": "#c0392b"}
LOG_MAX_LINES = 20000
CHART_SECONDS = 3600.0  # the chart shows at most the last hour of a job
MIB = float(1 << 20)

JobDict = Dict[str, Any]


# -- what the table shows (pure) ------------------------------------------------------------------


def _num(v: Any) -> Optional[float]:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def progress_fraction(job: JobDict) -> Optional[float]:
    """Training done as a share (epochs are 1-based, steps count within the epoch), or None
    when the job reports no progress."""
    epoch, epochs = _num(job.get("epoch")), _num(job.get("epochs"))
    step, steps = _num(job.get("step")), _num(job.get("steps"))
    if job.get("state") == "finished" and epochs:
        return 1.0
    if not epochs or epoch is None:
        return None
    if steps:
        done = max(0.0, (epoch - 1) * steps + (step or 0.0))
        return max(0.0, min(1.0, done / (epochs * steps)))
    return max(0.0, min(1.0, (epoch - 1) / epochs))


def progress_text(job: JobDict) -> str:
    """``"epoch 2/5 · step 30/100"``, or "" without progress reports."""
    parts = []
    if job.get("epochs"):
        parts.append(f"epoch {job.get('epoch') or 0}/{job['epochs']}")
    if job.get("steps"):
        parts.append(f"step {job.get('step') or 0}/{job['steps']}")
    return " · ".join(parts)


def loss_text(job: JobDict) -> str:
    loss = _num((job.get("metrics") or {}).get("loss"))
    return "" if loss is None else f"{loss:.4g}"


def elapsed_seconds(job: JobDict, now: float) -> Optional[float]:
    started = _num(job.get("started"))
    if started is None:
        return None
    end = _num(job.get("ended")) or now
    return max(0.0, end - started)


def state_text(job: JobDict) -> str:
    """The state with why: ``"paused by guard: RAM low"``, ``"failed (exit status 1)"``."""
    state = str(job.get("state") or "unknown")
    if state in ("paused", "pausing") and job.get("paused_by"):
        text = f"{state} by {job['paused_by']}"
        return text + (f": {job['pause_reason']}" if job.get("pause_reason") else "")
    if state in FINISHED_STATES | vocab.PARKED and job.get("end_reason") \
            and job.get("end_reason") != state:
        return f"{state} ({job['end_reason']})"
    return state


def cell_text(job: JobDict, column: int, now: float) -> str:
    name = COLUMNS[column]
    if name == "Name":
        return str(job.get("name") or job.get("id") or "job")
    if name == "State":
        return state_text(job)
    if name == "Progress":
        return progress_text(job)
    if name == "Loss":
        return loss_text(job)
    if name == "ETA":
        eta = _num(job.get("eta_seconds"))
        return "" if eta is None or job.get("state") in FINISHED_STATES else format_duration(eta)
    if name in ("RAM", "VRAM"):
        value = job.get("rss_bytes" if name == "RAM" else "vram_bytes")
        if value is None:
            # An ended job has no memory; a live one whose reading is missing shows "n/a".
            return "" if job.get("state") in FINISHED_STATES | vocab.PARKED else "n/a"
        return format_bytes(value)
    return format_duration(elapsed_seconds(job, now))


def job_matches(job: JobDict, text: str, show: str) -> bool:
    """Whether the job passes the filter: ``show`` is "active", "finished" or "all"; ``text``
    must appear in its name, id, state or script (any case)."""
    finished = str(job.get("state")) in FINISHED_STATES
    if (show == "active" and finished) or (show == "finished" and not finished):
        return False
    needle = text.strip().lower()
    if not needle:
        return True
    hay = " ".join(str(job.get(k) or "") for k in ("name", "id", "state", "script")).lower()
    return needle in hay


def actions_for(job: Optional[JobDict]) -> Tuple[str, ...]:
    """The actions a job's state allows (the engine has the last word)."""
    if not job:
        return ()
    if job.get("state") == "stopped" and job.get("resumable"):
        return ("resume",)  # stopped with a checkpoint folder: continues from it
    return JOB_ACTIONS.get(str(job.get("state")), ())


def stop_question(job: JobDict) -> str:
    """What the stop confirmation asks: what stop does to the checkpoint and to the script."""
    name = f"{job.get('name')} ({job.get('id')})"
    if not job.get("hooked"):
        return (f"Stop {name}? It is interrupted (as with Ctrl-C), then ended by force if it "
                "does not end; the rest of its script does not run.")
    if job.get("checkpoint_dir"):
        return (f"Stop {name}? It saves a checkpoint and ends at the next batch; the rest of "
                "its script (after fit()) does not run. Resume continues it from the "
                "checkpoint.")
    return (f"Stop {name}? It ends at the next batch; the rest of its script (after fit()) "
            "does not run. It has no checkpoint folder, so its training progress is lost; "
            "Park needs one.")


RELAUNCH_CHOICES = ("Continue from the checkpoint", "Start over (the checkpoint is deleted)")


def relaunch_spec(spec: Dict[str, Any], choice: Optional[int]) -> Optional[Dict[str, Any]]:
    """The spec to launch again after the relaunch question: ``choice`` 0 continues from the
    checkpoint (``resume``), 1 starts over (``fresh``), None asks nothing (no checkpoint
    there); None when the question was cancelled."""
    if choice is None:
        return dict(spec, resume=False, fresh=False)
    if choice not in (0, 1):
        return None
    return dict(spec, resume=choice == 0, fresh=choice == 1)


def job_folder(job: JobDict) -> Optional[Path]:
    """The job's folder (``jobs/<id>/``), from where its log lives."""
    log_path = job.get("log_path")
    return Path(str(log_path)).parent if log_path else None


def _plain(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=str)
    return str(value)


def process_rows(process: Any) -> List[Tuple[str, str]]:
    """(what, value) of how the job's process runs beside the desktop: its CPU priority, its
    OOM score, its log's cap; empty for a job launched before they were recorded."""
    if not isinstance(process, dict):
        return []
    rows = []
    nice, oom, cap = process.get("nice"), process.get("oom_score_adj"), \
        process.get("log_max_bytes")
    if isinstance(nice, int):
        rows.append(("CPU priority", f"nice {nice}" + (" (the desktop's normal priority)"
                                                       if nice == 0 else " (below the desktop)")))
    if isinstance(oom, int) and sys.platform != "win32":
        rows.append(("OOM score", f"oom_score_adj {oom:+d} (the kernel's OOM killer takes it "
                                  "before the desktop)" if oom > 0 else f"oom_score_adj {oom}"))
    if isinstance(cap, int):
        rows.append(("Log", f"capped at {format_bytes(cap)} (its head and its tail kept)"))
    return rows


def checkpoint_text(ck: Dict[str, Any]) -> str:
    """The last checkpoint in the words of the progress column: ``/ckpt/fit-1 (in epoch 22,
    after step 2)`` or ``(after epoch 26)``; the runner counts the epochs done, from 0."""
    path, epoch, step = ck.get("path"), ck.get("epoch"), ck.get("step")
    if not isinstance(epoch, int) or isinstance(epoch, bool):
        return str(path)
    if isinstance(step, int) and not isinstance(step, bool) and step > 0:
        return f"{path} (in epoch {epoch + 1}, after step {step})"
    return f"{path} (after epoch {epoch})" if epoch else f"{path} (before the first epoch)"


def applied_lines(hello: Optional[Dict[str, Any]]) -> List[str]:
    """The runner's applied options, one line each: ``"memory_growth = True
    (tf.config.experimental.set_memory_growth)"``."""
    lines = []
    for item in (hello or {}).get("applied") or []:
        if isinstance(item, dict):
            text = f"{item.get('option', '?')} = {_plain(item.get('value'))}"
            if item.get("call"):
                text += f"  ({item['call']})"
            lines.append(text)
        else:
            lines.append(_plain(item))
    return lines


# -- the table -------------------------------------------------------------------------------------


class JobsModel(QAbstractTableModel):
    """Job dicts, newest first, updated in place so the selection stays on its job."""

    JOB_ROLE = Qt.ItemDataRole.UserRole + 1
    FRACTION_ROLE = Qt.ItemDataRole.UserRole + 2

    def __init__(self, clock: Callable[[], float] = time.time, parent: Any = None):
        super().__init__(parent)
        self.jobs: List[JobDict] = []
        self.clock = clock

    def rowCount(self, parent: Any = QModelIndex()) -> int:  # noqa: N802 - Qt's name
        return 0 if parent.isValid() else len(self.jobs)

    def columnCount(self, parent: Any = QModelIndex()) -> int:  # noqa: N802 - Qt's name
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section: int, orientation: Qt.Orientation,  # noqa: N802
                   role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return COLUMNS[section]
        return None

    def data(self, index: Any, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or index.row() >= len(self.jobs):
            return None
        job = self.jobs[index.row()]
        col = index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            return cell_text(job, col, self.clock())
        if role == self.JOB_ROLE:
            return job
        if role == self.FRACTION_ROLE:
            return progress_fraction(job)
        if role == Qt.ItemDataRole.ForegroundRole and COLUMNS[col] == "State":
            colour = STATE_COLOURS.get(str(job.get("state")))
            return QColor(colour) if colour else None
        if role == Qt.ItemDataRole.ToolTipRole:
            if COLUMNS[col] == "State":
                return state_text(job)
            if COLUMNS[col] == "Name":
                return f"{job.get('id')} · {job.get('script') or ''}"
        if role == Qt.ItemDataRole.TextAlignmentRole and COLUMNS[col] in (
                "Loss", "ETA", "RAM", "VRAM", "Elapsed"):
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        return None

    def row_of(self, job_id: str) -> int:
        for i, j in enumerate(self.jobs):
            if str(j.get("id")) == job_id:
                return i
        return -1

    def job(self, job_id: str) -> Optional[JobDict]:
        i = self.row_of(job_id)
        return self.jobs[i] if i >= 0 else None

    def update_jobs(self, jobs: List[JobDict], complete: bool) -> None:
        """Merge ``jobs`` in: known ones change in place, new ones are added at the top; with
        ``complete`` (a whole list from the engine) jobs it no longer has are removed."""
        incoming = {str(j.get("id")): j for j in jobs if j.get("id") is not None}
        if complete:
            for i in range(len(self.jobs) - 1, -1, -1):
                if str(self.jobs[i].get("id")) not in incoming:
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
            new.sort(key=lambda j: -(_num(j.get("started")) or float("inf")))
            self.beginInsertRows(QModelIndex(), 0, len(new) - 1)
            self.jobs[0:0] = new
            self.endInsertRows()

    def tick(self) -> None:
        """Elapsed and ETA move with the clock: redraw those cells of live jobs."""
        for i, j in enumerate(self.jobs):
            if str(j.get("state")) not in FINISHED_STATES:
                self.dataChanged.emit(self.index(i, COLUMNS.index("ETA")),
                                      self.index(i, len(COLUMNS) - 1))


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


def _select_data(box: QComboBox, data: Any) -> None:
    i = box.findData(data)
    box.setCurrentIndex(max(0, i))


def _choose(parent: QWidget, text: str, choices: Tuple[str, ...]) -> Optional[int]:
    """Ask ``text`` with a button for each choice and Cancel; the choice's index, or None."""
    box = QMessageBox(QMessageBox.Icon.Question, window_title("Jobs"), text,
                      QMessageBox.StandardButton.Cancel, parent)
    buttons = [box.addButton(c, QMessageBox.ButtonRole.AcceptRole) for c in choices]
    box.setDefaultButton(buttons[0])
    box.exec()
    clicked = box.clickedButton()
    return buttons.index(clicked) if clicked in buttons else None


def _confirm(parent: QWidget, text: str) -> bool:
    answer = QMessageBox.question(parent, window_title("Jobs"), text,
                                  QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
                                  QMessageBox.StandardButton.No)
    return answer == QMessageBox.StandardButton.Yes


class JobsWindow(QWidget):
    """``JobsWindow(client_factory, parent=None)``; ``client_factory()`` returns a new
    EngineClient. The app may feed it ``apply_snapshot(status)``, ``add_event(event)`` and
    ``set_reachable(reachable, reason)``.

    ``relaunched(dict)``: a job started again with the same spec (the new job's dict).
    """

    relaunched = Signal(object)

    def __init__(self, client_factory: Callable[[], EngineClient],
                 parent: Optional[QWidget] = None, *, poll_ms: int = 1000):
        super().__init__(parent)
        self.setWindowFlag(Qt.WindowType.Window, True)
        self.setWindowTitle(window_title("Jobs"))
        self.setObjectName("jobs")
        self._runner = CallRunner(client_factory, workers=2, parent=self)
        self.destroyed.connect(self._runner.close)
        self.selected_id: Optional[str] = None
        self.loaded = False  # the first job list arrived
        self.confirm: Callable[[str], bool] = lambda text: _confirm(self, text)
        self.choose: Callable[[str, Tuple[str, ...]], Optional[int]] = \
            lambda text, choices: _choose(self, text, choices)
        self._busy: set = set()  # kinds of request in flight
        self._log_offset: Optional[int] = None
        self._log_job: Optional[str] = None
        self._events_after: Optional[int] = None
        self._events_job: Optional[str] = None
        self._chart_due = 0.0
        self._ticks = 0

        self.model = JobsModel(parent=self)
        self.proxy = JobsFilter(self)
        self.proxy.setSourceModel(self.model)
        self._build()
        escape_closes(self)
        self._timer = QTimer(self)
        self._timer.setInterval(poll_ms)
        self._timer.timeout.connect(self.refresh)
        self.resize(980, 680)

    # -- building ---------------------------------------------------------------------------------

    def _build(self) -> None:
        outer = QVBoxLayout(self)
        top = QHBoxLayout()
        self.filter_edit = QLineEdit()
        self.filter_edit.setPlaceholderText("Filter by name, id, state or script")
        self.filter_edit.setAccessibleName("Filter jobs")
        self.filter_edit.setClearButtonEnabled(True)
        self.filter_edit.textChanged.connect(lambda t: self.proxy.set_filter(text=t))
        self.show_combo = QComboBox()
        self.show_combo.setAccessibleName("Which jobs to show")
        for key, label in SHOW_CHOICES:
            self.show_combo.addItem(label, key)
        self.show_combo.currentIndexChanged.connect(
            lambda _i: self.proxy.set_filter(show=self.show_combo.currentData()))
        top.addWidget(QLabel("Show"))
        top.addWidget(self.show_combo)
        top.addWidget(self.filter_edit, 1)
        outer.addLayout(top)

        self.banner = message_label(ERROR_STYLE, "Engine connection")
        outer.addWidget(self.banner)

        self.table = QTableView()
        self.table.setAccessibleName("Jobs")
        self.table.setModel(self.proxy)
        self.table.setItemDelegateForColumn(COL_PROGRESS, ProgressDelegate(self.table))
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().hide()
        self.table.setAlternatingRowColors(True)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        header.setStretchLastSection(False)
        for col, width in enumerate((170, 190, 200, 70, 95, 85, 85, 85)):
            self.table.setColumnWidth(col, width)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.table.selectionModel().currentRowChanged.connect(self._current_changed)
        self.empty_label = QLabel("No jobs yet. Launch one from the tray menu "
                                  "(Launch training…) or with 'headroom run'.")
        self.empty_label.setStyleSheet(NOTE_STYLE)

        actions = QHBoxLayout()
        self.buttons: Dict[str, QPushButton] = {}
        for name, text, tip in (
                ("pause", "Pause", "Pause at the next batch end; memory stays in use"),
                ("resume", "Resume", "Resume a paused job, or relaunch a parked or stopped "
                                     "one from its checkpoint"),
                ("park", "Park", "Checkpoint and end the job, freeing its RAM and VRAM"),
                ("stop", "Stop", "End the job: a checkpoint first when it has a folder; the rest "
                                 "of its script does not run"),
                ("relaunch", "Relaunch", "Start a new job with the same script and options"),
                ("folder", "Open folder", "Open the job's folder (log, spec, checkpoints)")):
            b = QPushButton(text)
            b.setToolTip(tip)
            b.setAccessibleName(f"{text} job")
            b.setAccessibleDescription(tip)
            b.setEnabled(False)
            b.clicked.connect(lambda _c=False, n=name: self.act(n))
            actions.addWidget(b)
            self.buttons[name] = b
        actions.addStretch(1)
        self.action_error = message_label(ERROR_STYLE, "Job action problem")

        self.details = self._build_details()
        upper = QWidget()
        ul = QVBoxLayout(upper)
        ul.setContentsMargins(0, 0, 0, 0)
        ul.addWidget(self.table, 1)
        ul.addWidget(self.empty_label)
        ul.addLayout(actions)
        ul.addWidget(self.action_error)
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(upper)
        split.addWidget(self.details)
        split.setStretchFactor(0, 2)
        split.setStretchFactor(1, 3)
        outer.addWidget(split, 1)

        chain_tab_order([self.show_combo, self.filter_edit, self.table]
                        + list(self.buttons.values())
                        + [self.detail_tabs, self.search_edit, self.find_button,
                           self.find_prev_button, self.follow_box, self.copy_button,
                           self.log_view])

    def _build_details(self) -> QWidget:
        box = QWidget()
        layout = QVBoxLayout(box)
        layout.setContentsMargins(0, 0, 0, 0)
        self.header_label = QLabel("Select a job to see its log, options, events and memory.")
        self.header_label.setWordWrap(True)
        self.header_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.header_label.setAccessibleName("Selected job")
        layout.addWidget(self.header_label)
        self.detail_tabs = QTabWidget()
        self.detail_tabs.setAccessibleName("Job details")
        layout.addWidget(self.detail_tabs, 1)

        # Log
        page = QWidget()
        pl = QVBoxLayout(page)
        bar = QHBoxLayout()
        self.search_edit = QLineEdit()
        self.search_edit.setPlaceholderText("Search the log")
        self.search_edit.setAccessibleName("Search the log")
        self.search_edit.setClearButtonEnabled(True)
        self.search_edit.returnPressed.connect(lambda: self.find_in_log(forward=True))
        self.search_edit.textChanged.connect(lambda _t: self._highlight())
        self.find_button = QPushButton("Next")
        self.find_button.setAccessibleName("Find next in the log")
        self.find_button.clicked.connect(lambda: self.find_in_log(forward=True))
        self.find_prev_button = QPushButton("Previous")
        self.find_prev_button.setAccessibleName("Find previous in the log")
        self.find_prev_button.clicked.connect(lambda: self.find_in_log(forward=False))
        self.search_result = QLabel()
        self.search_result.setAccessibleName("Search result")
        self.follow_box = QCheckBox("Follow")
        self.follow_box.setToolTip("Keep the newest output in view")
        self.follow_box.setAccessibleName("Follow the log")
        self.follow_box.setChecked(True)
        self.copy_button = QPushButton("Copy")
        self.copy_button.setToolTip("Copy the selected text, or the whole log")
        self.copy_button.setAccessibleName("Copy the log")
        self.copy_button.clicked.connect(self.copy_log)
        for w in (self.search_edit, self.find_button, self.find_prev_button,
                  self.search_result, self.follow_box, self.copy_button):
            bar.addWidget(w, 1 if w is self.search_edit else 0)
        pl.addLayout(bar)
        self.log_view = QPlainTextEdit()
        self.log_view.setReadOnly(True)
        self.log_view.setAccessibleName("Job log")
        self.log_view.setMaximumBlockCount(LOG_MAX_LINES)
        self.log_view.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.log_view.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        pl.addWidget(self.log_view, 1)
        self.detail_tabs.addTab(page, "Log")

        # Options
        self.options_tree = QTreeWidget()
        self.options_tree.setAccessibleName("Options applied")
        self.options_tree.setHeaderLabels(["Option", "Value"])
        self.options_tree.setColumnWidth(0, 240)
        self.detail_tabs.addTab(self.options_tree, "Options")

        # Events
        self.events_tree = QTreeWidget()
        self.events_tree.setAccessibleName("Job events")
        self.events_tree.setHeaderLabels(["Time", "Level", "What happened"])
        self.events_tree.setRootIsDecorated(False)
        self.events_tree.setColumnWidth(0, 90)
        self.events_tree.setColumnWidth(1, 60)
        self.detail_tabs.addTab(self.events_tree, "Events")

        # Memory chart
        axis = pg.DateAxisItem(orientation="bottom")
        self.chart = pg.PlotWidget(axisItems={"bottom": axis})
        self.chart.setAccessibleName("RAM and VRAM of the job")
        self.chart.setBackground("w")
        plot = self.chart.getPlotItem()
        plot.setLabel("left", "MiB")
        plot.showGrid(x=True, y=True, alpha=0.2)
        plot.setMenuEnabled(False)
        plot.addLegend(offset=(-8, 4), labelTextSize="8pt")  # top right
        plot.setDownsampling(auto=True, mode="peak")
        plot.setClipToView(True)
        for ax in ("left", "bottom"):
            plot.getAxis(ax).setPen(pg.mkPen("#888888"))
            plot.getAxis(ax).setTextPen(pg.mkPen("#333333"))
        self.rss_curve = plot.plot([], [], name="RAM (process tree)",
                                   pen=pg.mkPen("#2e7d32", width=1), antialias=False)
        self.vram_curve = plot.plot([], [], name="VRAM",
                                    pen=pg.mkPen("#6a3d9a", width=1), antialias=False)
        self.budget_lines: List[Any] = []
        self.chart_note = QLabel()
        self.chart_note.setStyleSheet(NOTE_STYLE)
        chart_page = QWidget()
        cl = QVBoxLayout(chart_page)
        cl.addWidget(self.chart, 1)
        cl.addWidget(self.chart_note)
        self.detail_tabs.addTab(chart_page, "Memory")
        self.detail_tabs.currentChanged.connect(lambda _i: self._due_chart())
        return box

    # -- life -------------------------------------------------------------------------------------

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802 - Qt's name
        super().showEvent(event)
        if not self._timer.isActive():
            self._timer.start()
            self.refresh()

    def hideEvent(self, event: QHideEvent) -> None:  # noqa: N802 - Qt's name
        super().hideEvent(event)
        self._timer.stop()

    # -- the app's hooks ---------------------------------------------------------------------------

    def apply_snapshot(self, status: Dict[str, Any]) -> None:
        """Live jobs from a status push (4 a second at most): progress moves between polls."""
        jobs = status.get("jobs")
        if isinstance(jobs, list) and self.loaded:
            self.model.update_jobs([j for j in jobs if isinstance(j, dict)], complete=False)
            self._selection_changed_data()

    def add_event(self, event: Dict[str, Any]) -> None:
        """An engine event: shown at once when it is about the selected job."""
        if self.selected_id and str(event.get("job_id")) == self.selected_id \
                and self._events_job == self.selected_id:
            self._add_events([event])

    def set_reachable(self, reachable: bool, reason: Optional[str] = None) -> None:
        set_message(self.banner, None if reachable else
                    "The engine is not reachable" + (f": {reason}" if reason else "")
                    + ". What is shown may be out of date.")

    # -- polling -----------------------------------------------------------------------------------

    def _submit(self, kind: str, fn: Callable[[EngineClient], Any],
                done: Callable[[Any], None],
                error: Optional[Callable[[str], None]] = None) -> None:
        if kind in self._busy:
            return
        self._busy.add(kind)

        def on_done(result: Any) -> None:
            self._busy.discard(kind)
            done(result)

        def on_error(message: str) -> None:
            self._busy.discard(kind)
            if error is not None:
                error(message)
            else:
                log.info("jobs window: %s failed: %s", kind, message)

        self._runner.submit(fn, on_done, on_error)

    def refresh(self) -> None:
        """Ask for the job list, and the selected job's new log, events and chart."""
        self._ticks += 1
        self._submit("jobs", lambda c: c.jobs(all=True), self._got_jobs, self._jobs_failed)
        self.model.tick()
        job_id = self.selected_id
        if job_id is None:
            return
        self._poll_log(job_id)
        self._poll_events(job_id)
        if time.monotonic() >= self._chart_due and self.detail_tabs.currentIndex() == 3:
            self._poll_chart(job_id)

    def _got_jobs(self, jobs: List[JobDict]) -> None:
        first = not self.loaded
        self.loaded = True
        set_message(self.banner, None)
        self.model.update_jobs([j for j in jobs or [] if isinstance(j, dict)], complete=True)
        self.empty_label.setVisible(self.model.rowCount() == 0)
        if first and self.selected_id is None and self.proxy.rowCount() > 0:
            self.table.selectRow(0)
        self._selection_changed_data()

    def _jobs_failed(self, message: str) -> None:
        set_message(self.banner, f"The jobs cannot be read: {one_line(message)}")

    # -- selection ---------------------------------------------------------------------------------

    def select_job(self, job_id: str) -> bool:
        """Select the job with this id (showing all jobs when the filter hides it)."""
        row = self.model.row_of(job_id)
        if row < 0:
            return False
        index = self.proxy.mapFromSource(self.model.index(row, 0))
        if not index.isValid():
            self.filter_edit.clear()
            _select_data(self.show_combo, "all")
            index = self.proxy.mapFromSource(self.model.index(row, 0))
        self.table.selectRow(index.row())
        self.table.scrollTo(index)
        return True

    def selected_job(self) -> Optional[JobDict]:
        return self.model.job(self.selected_id) if self.selected_id else None

    def _current_changed(self, current: Any, _previous: Any) -> None:
        job = self.proxy.data(current, JobsModel.JOB_ROLE) if current.isValid() else None
        new_id = str(job["id"]) if job else None
        if new_id == self.selected_id:
            return
        self.selected_id = new_id
        set_message(self.action_error, None)
        self.log_view.clear()
        self.events_tree.clear()
        self._log_offset, self._log_job = None, new_id
        self._events_after, self._events_job = None, new_id
        self.rss_curve.setData([], [])
        self.vram_curve.setData([], [])
        self._chart_due = 0.0
        self._selection_changed_data()
        if new_id is not None:
            self._poll_log(new_id)
            self._poll_events(new_id)
            self._poll_chart(new_id)

    def _selection_changed_data(self) -> None:
        job = self.selected_job()
        allowed = actions_for(job)
        for name in ACTIONS:
            self.buttons[name].setEnabled(name in allowed)
        self.buttons["relaunch"].setEnabled(bool(job and job.get("spec")))
        self.buttons["folder"].setEnabled(bool(job and job_folder(job)))
        if job is None:
            self.header_label.setText("Select a job to see its log, options, events and "
                                      "memory.")
            self.options_tree.clear()
            return
        self.header_label.setText(self._header(job))
        self._fill_options(job)

    def _header(self, job: JobDict) -> str:
        parts = [f"{job.get('name')} ({job.get('id')}) — {state_text(job)}"]
        if job.get("script"):
            parts.append(str(job["script"]))
        if job.get("exit_code") is not None and job.get("state") in FINISHED_STATES:
            parts.append(f"exit status {job['exit_code']}")
        if job.get("started"):
            parts.append("started " + time.strftime("%Y-%m-%d %H:%M:%S",
                                                    time.localtime(float(job["started"]))))
        budgets = []
        if job.get("ram_budget_bytes"):
            budgets.append(f"RAM budget {format_bytes(job['ram_budget_bytes'])}")
        if job.get("vram_budget_bytes"):
            budgets.append(f"VRAM budget {format_bytes(job['vram_budget_bytes'])}")
        if budgets:
            parts.append(", ".join(budgets))
        return " · ".join(parts)

    def _fill_options(self, job: JobDict) -> None:
        tree = self.options_tree
        key = json.dumps([job.get("hello"), job.get("warnings"), job.get("notes"),
                          job.get("checkpoint"), job.get("process")], default=str,
                         sort_keys=True)
        if tree.property("filled_for") == f"{job.get('id')}:{key}":
            return
        tree.setProperty("filled_for", f"{job.get('id')}:{key}")
        tree.clear()
        hello = job.get("hello") or {}

        def section(title: str, rows: List[Tuple[str, str]]) -> None:
            top = QTreeWidgetItem([title, ""])
            for k, v in rows:
                top.addChild(QTreeWidgetItem([k, v]))
            tree.addTopLevelItem(top)
            top.setExpanded(True)

        if not hello:
            section("Options applied", [("", "not reported yet (the runner has not said "
                                              "hello)")])
        else:
            rows = []
            for line in applied_lines(hello):
                name, _, value = line.partition(" = ")
                rows.append((name, value))
            section("Options applied", rows or [("", "none (TensorFlow's defaults)")])
            versions = [("Python", f"{hello.get('python_version') or '?'} "
                                   f"({hello.get('python') or '?'})"),
                        ("TensorFlow", str(hello.get("tf_version") or "not imported")),
                        ("Keras", str(hello.get("keras_version") or "n/a")),
                        ("fit() progress", "hooked" if hello.get("hooked") or job.get("hooked")
                         else "not hooked")]
            section("Interpreter", versions)
            asked = hello.get("options")
            if isinstance(asked, dict):
                section("Options asked for", [(k, _plain(v)) for k, v in asked.items()
                                              if v is not None])
            rest = {k: v for k, v in hello.items()
                    if k not in ("applied", "options", "python", "python_version",
                                 "tf_version", "keras_version", "hooked", "job_id", "pid")}
            if rest:
                section("Reported by the runner", [(k, _plain(v)) for k, v in rest.items()])
        rows = process_rows(job.get("process"))
        if rows:
            section("Process", rows)
        if job.get("checkpoint"):
            ck = job["checkpoint"]
            section("Checkpoint", [("last", checkpoint_text(ck))])
        warnings = [str(w) for w in job.get("warnings") or []]
        notes = [f"{n.get('level')}: {n.get('message')}" for n in job.get("notes") or []
                 if isinstance(n, dict)]
        if warnings or notes:
            section("Warnings and notes", [("", w) for w in warnings + notes])

    # -- the log -----------------------------------------------------------------------------------

    def _poll_log(self, job_id: str) -> None:
        offset = self._log_offset
        self._submit("log", lambda c: c.job_log(job_id, offset=offset),
                     lambda r: self._got_log(job_id, offset, r))

    def _got_log(self, job_id: str, asked: Optional[int], result: Dict[str, Any]) -> None:
        if job_id != self._log_job or asked != self._log_offset:
            return  # the selection changed, or another answer came first
        data = str(result.get("data") or "")
        self._log_offset = int(result.get("offset") or 0)
        if data:
            self.append_log(data)
        # A long log arrives in pieces: read on at once rather than a second later.
        if int(result.get("size") or 0) > self._log_offset and self.selected_id == job_id:
            QTimer.singleShot(0, lambda: self._poll_log(job_id))

    def append_log(self, text: str) -> None:
        view = self.log_view
        bar = view.verticalScrollBar()
        at_end = bar.value() >= bar.maximum() - 2
        cursor = QTextCursor(view.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.insertText(text)
        if self.follow_box.isChecked() and at_end:
            bar.setValue(bar.maximum())
        if self.search_edit.text():
            self._highlight()

    def log_text(self) -> str:
        return self.log_view.toPlainText()

    def find_in_log(self, forward: bool = True) -> bool:
        """Select the next (or previous) place the search text occurs, wrapping around."""
        text = self.search_edit.text()
        if not text:
            set_message(self.search_result, None)
            return False
        flags = QTextDocument.FindFlag(0) if forward else QTextDocument.FindFlag.FindBackward
        found = self.log_view.find(text, flags)
        if not found:
            cursor = self.log_view.textCursor()
            cursor.movePosition(QTextCursor.MoveOperation.Start if forward
                                else QTextCursor.MoveOperation.End)
            self.log_view.setTextCursor(cursor)
            found = self.log_view.find(text, flags)
        if found:
            self.follow_box.setChecked(False)  # stay where the match is
        self._highlight()
        return found

    def _highlight(self) -> None:
        text = self.search_edit.text()
        selections: List[QTextEdit.ExtraSelection] = []
        if text:
            fmt = QTextCharFormat()
            fmt.setBackground(QColor("#ffe88a"))
            doc = self.log_view.document()
            cursor = doc.find(text)
            while not cursor.isNull() and len(selections) < 1000:
                sel = QTextEdit.ExtraSelection()
                sel.cursor = cursor  # type: ignore[misc]
                sel.format = fmt  # type: ignore[misc]
                selections.append(sel)
                cursor = doc.find(text, cursor)
            count = f"{len(selections)}{'+' if len(selections) >= 1000 else ''}"
            self.search_result.setText("not found" if not selections else f"{count} found")
            self.search_result.setStyleSheet(ERROR_STYLE if not selections else NOTE_STYLE)
            self.search_result.show()
        else:
            self.search_result.hide()
        self.log_view.setExtraSelections(selections)

    def copy_log(self) -> str:
        """Copy the selected log text, or the whole log; returns what was copied."""
        cursor = self.log_view.textCursor()
        text = cursor.selectedText().replace("\u2029", "\n") if cursor.hasSelection() \
            else self.log_text()
        QGuiApplication.clipboard().setText(text)
        return text

    # -- events ---------------------------------------------------------------------------------

    def _poll_events(self, job_id: str) -> None:
        after = self._events_after
        self._submit("events", lambda c: c.events(job=job_id, after_id=after,
                                                  limit=500 if after is not None else None),
                     lambda r: self._got_events(job_id, after, r))

    def _got_events(self, job_id: str, after: Optional[int],
                    events: List[Dict[str, Any]]) -> None:
        if job_id != self._events_job or after != self._events_after:
            return
        self._add_events(events or [])
        if self._events_after is None:
            self._events_after = 0

    def _add_events(self, events: List[Dict[str, Any]]) -> None:
        for ev in events:
            eid = ev.get("id")
            if isinstance(eid, int):
                if self._events_after is not None and eid <= self._events_after:
                    continue
                self._events_after = eid
            when = time.strftime("%H:%M:%S", time.localtime(float(ev.get("time") or 0)))
            level = str(ev.get("level") or "info")
            item = QTreeWidgetItem([when, level, str(ev.get("message") or ev.get("kind"))])
            item.setToolTip(2, str(ev.get("message") or ""))
            if level in LEVEL_COLOURS:
                for col in range(3):
                    item.setForeground(col, QColor(LEVEL_COLOURS[level]))
            self.events_tree.addTopLevelItem(item)
        if events:
            self.events_tree.scrollToBottom()

    def event_lines(self) -> List[str]:
        tree = self.events_tree
        items = (tree.topLevelItem(i) for i in range(tree.topLevelItemCount()))
        return [item.text(2) for item in items if item is not None]

    # -- the chart ---------------------------------------------------------------------------------

    def _due_chart(self) -> None:
        if self.detail_tabs.currentIndex() == 3 and self.selected_id:
            self._poll_chart(self.selected_id)

    def _poll_chart(self, job_id: str) -> None:
        job = self.model.job(job_id) or {}
        end = _num(job.get("ended")) or time.time()
        start = max(_num(job.get("started")) or end - CHART_SECONDS, end - CHART_SECONDS)
        names = [f"job.{job_id}.rss", f"job.{job_id}.vram"]
        self._chart_due = time.monotonic() + 5.0
        self._submit("chart", lambda c: c.history(start, end, series=names),
                     lambda r: self._got_chart(job_id, r))

    def _got_chart(self, job_id: str, result: Dict[str, Any]) -> None:
        if job_id != self.selected_id:
            return
        series = (result or {}).get("series") or {}
        data = []
        for name, curve in ((f"job.{job_id}.rss", self.rss_curve),
                            (f"job.{job_id}.vram", self.vram_curve)):
            cols = series.get(name) or {}
            # Raw rows have "v"; one-minute rows have min/mean/max: the peak is what counts.
            values = cols.get("v") if "v" in cols else cols.get("max")
            data.append((curve, cols.get("t") or [], values or []))
        peak = max((max(v) for _c, _t, v in data if v), default=0.0)
        unit, scale = ("GiB", float(1 << 30)) if peak >= 2 * float(1 << 30) else ("MiB", MIB)
        plot = self.chart.getPlotItem()
        plot.setLabel("left", unit)
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
            plot.setXRange(t0, max(t1, t0 + 60.0), padding=0.02)
        for line in self.budget_lines:
            plot.removeItem(line)
        self.budget_lines = []
        job = self.model.job(job_id) or {}
        notes = []
        for key, colour, label in (("ram_budget_bytes", "#2e7d32", "RAM budget"),
                                   ("vram_budget_bytes", "#6a3d9a", "VRAM budget")):
            if job.get(key):
                notes.append(f"{label} {format_bytes(job[key])}")
                line = pg.InfiniteLine(pos=float(job[key]) / scale, angle=0, movable=False,
                                       pen=pg.mkPen(colour, width=1, style=Qt.PenStyle.DashLine),
                                       label=label, labelOpts={"position": 0.95,
                                                               "color": colour})
                # A budget far above the use must not flatten the curves: it shows once near.
                plot.addItem(line, ignoreBounds=True)
                self.budget_lines.append(line)
        if not shown:
            notes.insert(0, "No memory samples for this job in the engine's history.")
        self.chart_note.setText(" · ".join(notes))

    # -- actions --------------------------------------------------------------------------------

    def act(self, action: str) -> None:
        """Do ``action`` ("pause", "resume", "park", "stop", "relaunch", "folder") on the
        selected job; an engine refusal shows under the buttons."""
        job = self.selected_job()
        if job is None:
            return
        job_id = str(job["id"])
        set_message(self.action_error, None)
        if action == "folder":
            self.open_folder(job)
            return
        if action == "relaunch":
            spec = job.get("spec")
            if not isinstance(spec, dict):
                set_message(self.action_error, "This job has no saved spec to launch again.")
                return
            choice = None
            folder = spec.get("checkpoint_dir")
            if isinstance(folder, str) and holds_checkpoint(folder):
                choice = self.choose(f"{folder} holds the checkpoint of an earlier run. "
                                     "Continue from it, or start over?", RELAUNCH_CHOICES)
                if choice is None:
                    return
            spec = relaunch_spec(spec, choice)
            if spec is None:
                return
            self.buttons["relaunch"].setEnabled(False)
            # The spec shows its --env values hidden; the engine takes them from this job.
            self._runner.submit(lambda c: c.job_start(spec, env_from=job_id), self._relaunched,
                                self._action_failed)
            return
        if action == "stop" and not self.confirm(stop_question(job)):
            return
        self.buttons[action].setEnabled(False)
        self._runner.submit(lambda c: c.job_action(job_id, action), self._acted,
                            self._action_failed)

    def _acted(self, job: JobDict) -> None:
        if isinstance(job, dict):
            self.model.update_jobs([job], complete=False)
        self._selection_changed_data()
        self.refresh()

    def _relaunched(self, job: JobDict) -> None:
        self._selection_changed_data()
        if isinstance(job, dict) and job.get("id"):
            self.model.update_jobs([job], complete=False)
            self.select_job(str(job["id"]))
            self.relaunched.emit(job)

    def _action_failed(self, message: str) -> None:
        set_message(self.action_error, one_line(message))
        self._selection_changed_data()

    def open_folder(self, job: JobDict) -> bool:
        """Open the job's folder in the file manager; says so when it is gone."""
        folder = job_folder(job)
        if folder is None or not folder.is_dir():
            set_message(self.action_error, f"The job's folder {folder} does not exist any more.")
            return False
        if not QDesktopServices.openUrl(QUrl.fromLocalFile(str(folder))):
            set_message(self.action_error, f"No file manager opened {folder}.")
            return False
        return True

