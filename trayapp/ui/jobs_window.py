"""The jobs window: every job in a table (progress, loss, ETA, memory, elapsed) and, for the one
selected, its live log, the options its runner applied, its events, its loss and metric curves
beside a RAM/VRAM chart, and its checkpoints (open, delete, continue from one).

Everything comes from the engine, off the GUI thread (``CallRunner``): the job list once a
second while the window shows (and at once from the app's status pushes, ``apply_snapshot``),
the selected job's log from where the last read ended, its events after the last one seen, its
curves, memory and checkpoints while their tab shows. The detail tabs and their polling are a
part the window holds (``jobs_window_tabs.DetailTabs``).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from PySide6.QtCore import Qt, QTimer, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QHideEvent, QShowEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPushButton,
    QSplitter,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from trayapp.config import format_bytes
from trayapp.engine.client import EngineClient
from trayapp.engine.event_record import EngineEvent
from trayapp.engine.status_record import Status
from trayapp.jobs.options import holds_checkpoint
from trayapp.jobs.record import JobRecord
from trayapp.text import one_line as printable
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
from trayapp.ui.job_checkpoints import row_message, say
from trayapp.ui.job_details import fill_options
from trayapp.ui.job_rows import (
    ACTIONS,
    COL_PROGRESS,
    FINISHED_STATES,
    RELAUNCH_CHOICES,
    SHOW_CHOICES,
    action_refusal,
    action_words,
    actions_for,
    job_folder,
    relaunch_spec,
    state_text,
    stop_question,
)
from trayapp.ui.jobs_table import JobsFilter, JobsModel, ProgressDelegate
from trayapp.ui.jobs_window_tabs import (  # noqa: F401 - the tabs' numbers, given here as before
    CHECKPOINTS_SECONDS,
    CHECKPOINTS_TAB,
    CURVES_SECONDS,
    TRAINING_TAB,
    DetailTabs,
)
from trayapp.ui.worker import CallRunner
from trayapp.vocab import GuardAct as A

log = logging.getLogger("headroom.ui")

KERNEL_LOG = (
    "A Jupyter kernel's output is in its notebook: Headroom keeps no log of it. The "
    "progress of its fit() is in the table above and under Curves and memory; what "
    "the guard did to it is under Events."
)


def _select_data(box: QComboBox, data: Any) -> None:
    i = box.findData(data)
    box.setCurrentIndex(max(0, i))


def _choose(parent: QWidget, text: str, choices: Tuple[str, ...]) -> Optional[int]:
    """Ask ``text`` with a button for each choice and Cancel; the choice's index, or None."""
    box = QMessageBox(
        QMessageBox.Icon.Question,
        window_title("Jobs"),
        text,
        QMessageBox.StandardButton.Cancel,
        parent,
    )
    buttons = [box.addButton(c, QMessageBox.ButtonRole.AcceptRole) for c in choices]
    box.setDefaultButton(buttons[0])
    box.exec()
    clicked = box.clickedButton()
    return buttons.index(clicked) if clicked in buttons else None


def _confirm(parent: QWidget, text: str) -> bool:
    answer = QMessageBox.question(
        parent,
        window_title("Jobs"),
        text,
        QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
        QMessageBox.StandardButton.No,
    )
    return answer == QMessageBox.StandardButton.Yes


class JobsWindow(QWidget):
    """``JobsWindow(client_factory, parent=None)``; ``client_factory()`` returns a new
    EngineClient. The app may feed it ``apply_snapshot(status)``, ``add_event(event)`` and
    ``set_reachable(reachable, reason)``.

    ``relaunched(dict)``: a job started again with the same spec (the new job's dict).
    """

    relaunched = Signal(object)

    def __init__(
        self,
        client_factory: Callable[[], EngineClient],
        parent: Optional[QWidget] = None,
        *,
        poll_ms: int = 1000,
    ):
        super().__init__(parent)
        self.setWindowFlag(Qt.WindowType.Window, True)
        self.setWindowTitle(window_title("Jobs"))
        self.setObjectName("jobs")
        self._runner = CallRunner(client_factory, workers=2, parent=self)
        self.destroyed.connect(self._runner.close)
        self.selected_id: Optional[str] = None
        self.loaded = False  # the first job list arrived
        self.confirm: Callable[[str], bool] = lambda text: _confirm(self, text)
        self.choose: Callable[[str, Tuple[str, ...]], Optional[int]] = lambda text, choices: (
            _choose(self, text, choices)
        )
        self._busy: set = set()  # kinds of request in flight
        self._error_state: Optional[str] = None  # the job's state when the error was said
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
        outer.addLayout(self._build_filter())
        self.banner = message_label(ERROR_STYLE, "Engine connection")
        outer.addWidget(self.banner)
        self._build_table()
        actions = self._build_actions()
        self.tabs = tabs = DetailTabs(self)
        self.details = tabs.box
        self.header_label, self.detail_tabs = tabs.header_label, tabs.detail_tabs
        self.log_pane, self.options_tree = tabs.log_pane, tabs.options_tree
        self.events_tree, self.checkpoint_pane = tabs.events_tree, tabs.checkpoint_pane
        self.curves_chart, self.memory_chart = tabs.curves_chart, tabs.memory_chart
        # The panes' parts under the names the window has always had.
        self.log_view, self.search_edit = self.log_pane.view, self.log_pane.search_edit
        self.search_result, self.follow_box = self.log_pane.search_result, self.log_pane.follow_box
        self.chart, self.rss_curve = self.memory_chart.chart, self.memory_chart.rss_curve
        upper = QWidget()
        ul = QVBoxLayout(upper)
        ul.setContentsMargins(0, 0, 0, 0)
        ul.addWidget(self.table, 1)
        ul.addWidget(self.empty_label)
        ul.addLayout(actions)
        self.split = split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(upper)
        split.addWidget(self.details)
        split.setChildrenCollapsible(False)
        split.setStretchFactor(0, 2)
        split.setStretchFactor(1, 3)
        split.setSizes([330, 450])  # the table shows about 8 jobs, the details the rest
        outer.addWidget(split, 1)
        chain_tab_order(
            [self.show_combo, self.filter_edit, self.table]
            + list(self.buttons.values())
            + [self.detail_tabs]
            + self.log_pane.focus_chain()
        )

    def _build_filter(self) -> QHBoxLayout:
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
            lambda _i: self.proxy.set_filter(show=self.show_combo.currentData())
        )
        top.addWidget(QLabel("Show"))
        top.addWidget(self.show_combo)
        top.addWidget(self.filter_edit, 1)
        return top

    def _build_table(self) -> None:
        self.table = QTableView()
        self.table.setAccessibleName("Jobs")
        self.table.setModel(self.proxy)
        self.table.setItemDelegateForColumn(COL_PROGRESS, ProgressDelegate(self.table))
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().hide()
        self.table.verticalHeader().setDefaultSectionSize(self.table.fontMetrics().height() + 10)
        self.table.setMinimumHeight(6 * (self.table.fontMetrics().height() + 10))
        self.table.setAlternatingRowColors(True)
        self.table.setWordWrap(False)
        self.table.setTextElideMode(Qt.TextElideMode.ElideRight)  # the whole text: its tooltip
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        header.setStretchLastSection(False)
        for col, width in enumerate((150, 230, 200, 70, 95, 85, 85, 85)):
            self.table.setColumnWidth(col, width)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)  # a state's reason
        self.table.selectionModel().currentRowChanged.connect(self._current_changed)
        self.empty_label = QLabel(
            "No jobs yet. Launch one from the tray menu (Launch training…) or with 'headroom run'."
        )
        self.empty_label.setStyleSheet(NOTE_STYLE)

    def _build_actions(self) -> QHBoxLayout:
        actions = QHBoxLayout()
        self.buttons: Dict[str, QPushButton] = {}
        for name, text, tip in (
            (A.PAUSE, "Pause", "Pause at the next batch end; memory stays in use"),
            (
                A.RESUME,
                "Resume",
                "Resume a paused job, or relaunch a parked or stopped one from its checkpoint",
            ),
            (A.PARK, "Park", "Checkpoint and end the job, freeing its RAM and VRAM"),
            (
                A.STOP,
                "Stop",
                "End the job: a checkpoint first when it has a folder; the rest "
                "of its script does not run",
            ),
            ("relaunch", "Relaunch", "Start a new job with the same script and options"),
            ("folder", "Open folder", "Open the job's folder (log, spec, checkpoints)"),
        ):
            b = QPushButton(text)
            b.setToolTip(tip)
            b.setProperty("tip", tip)
            b.setProperty("text", text)
            b.setAccessibleName(f"{text} job")
            b.setAccessibleDescription(tip)
            b.setEnabled(False)
            b.clicked.connect(lambda _c=False, n=name: self.act(n))
            actions.addWidget(b)
            self.buttons[name] = b
        # Beside the buttons: an engine's refusal said there moves nothing.
        self.action_error = row_message(ERROR_STYLE, "Job action problem", self.buttons[A.STOP])
        actions.addWidget(self.action_error, 1)
        return actions

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

    def apply_snapshot(self, status: Status) -> None:
        """Live jobs from a status push (4 a second at most): progress moves between polls."""
        if self.loaded:
            self.model.update_jobs(list(status.jobs), complete=False)
            self._selection_changed_data()

    def add_event(self, event: EngineEvent) -> None:
        """An engine event: shown at once when it is about the selected job."""
        self.tabs.add_event(event)

    def set_reachable(self, reachable: bool, reason: Optional[str] = None) -> None:
        set_message(
            self.banner,
            None
            if reachable
            else "The engine is not reachable"
            + (f": {reason}" if reason else "")
            + ". What is shown may be out of date.",
        )

    # -- polling -----------------------------------------------------------------------------------

    def _submit(
        self,
        kind: str,
        fn: Callable[[EngineClient], Any],
        done: Callable[[Any], None],
        error: Optional[Callable[[str], None]] = None,
    ) -> None:
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
        self.tabs.poll(job_id)

    def _got_jobs(self, jobs: List[JobRecord]) -> None:
        first = not self.loaded
        self.loaded = True
        set_message(self.banner, None)
        self.model.update_jobs(jobs, complete=True)
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

    def selected_job(self) -> Optional[JobRecord]:
        return self.model.job(self.selected_id) if self.selected_id else None

    def _current_changed(self, current: Any, _previous: Any) -> None:
        job = self.proxy.data(current, JobsModel.JOB_ROLE) if current.isValid() else None
        new_id = job.id if job else None
        if new_id == self.selected_id:
            return
        self.selected_id = new_id
        self._say_error(None)
        self.tabs.select(new_id)
        self._selection_changed_data()
        if new_id is not None:
            self.tabs.fill(new_id)

    def _selection_changed_data(self) -> None:
        job = self.selected_job()
        allowed = actions_for(job)
        for name in ACTIONS:
            refusal = action_refusal(job, name)
            button = self.buttons[name]
            text, tip = action_words(
                job, name, str(button.property("text")), str(button.property("tip"))
            )
            if button.text() != text:
                button.setText(text)
                button.setAccessibleName(f"{text} job")
            button.setAccessibleDescription(tip)
            button.setEnabled(name in allowed and refusal is None)
            button.setToolTip(refusal or tip)
        if job is not None and self._error_state is not None and job.state != self._error_state:
            self._say_error(None)  # said of the job as it was: it has moved on (or ended)
        # A kernel is started by Jupyter, not relaunched from a spec.
        self.buttons["relaunch"].setEnabled(bool(job and job.spec and not job.is_kernel))
        self.buttons["folder"].setEnabled(bool(job and job_folder(job)))
        if job is None:
            self.header_label.setText(
                "Select a job to see its log, options, events, curves, memory and checkpoints."
            )
            self.options_tree.clear()
            return
        self.header_label.setText(self._header(job))
        self.log_view.setPlaceholderText(KERNEL_LOG if job.is_kernel else "")
        fill_options(self.options_tree, job)
        self.checkpoint_pane.set_job(job)

    def _header(self, job: JobRecord) -> str:
        parts = [f"{job.name} ({job.id}) — {state_text(job)}"]
        if job.is_kernel:  # its "script" is Jupyter's connection file: no help to anyone
            parts.append("Jupyter kernel")
        elif job.script:
            parts.append(job.script)
        if job.exit_code is not None and job.state in FINISHED_STATES:
            parts.append(f"exit status {job.exit_code}")
        if job.started:
            parts.append(
                "started " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(job.started))
            )
        budgets = []
        if job.ram_budget_bytes:
            budgets.append(f"RAM budget {format_bytes(job.ram_budget_bytes)}")
        if job.vram_budget_bytes:
            budgets.append(f"VRAM budget {format_bytes(job.vram_budget_bytes)}")
        if budgets:
            parts.append(", ".join(budgets))
        return printable(" · ".join(parts))

    # -- the log -----------------------------------------------------------------------------------

    def append_log(self, text: str) -> None:
        self.log_pane.append(text)

    def log_text(self) -> str:
        return self.log_pane.text()

    def find_in_log(self, forward: bool = True) -> bool:
        """Select the next (or previous) place the search text occurs, wrapping around."""
        return self.log_pane.find_text(forward)

    def copy_log(self) -> str:
        """Copy the selected log text, or the whole log; returns what was copied."""
        return self.log_pane.copy()

    # -- events ---------------------------------------------------------------------------------

    def event_lines(self) -> List[str]:
        return self.events_tree.lines()

    # -- actions --------------------------------------------------------------------------------

    def act(self, action: str) -> None:
        """Do ``action`` ("pause", "resume", "park", "stop", "relaunch", "folder") on the
        selected job; an engine refusal shows under the buttons."""
        job = self.selected_job()
        if job is None:
            return
        job_id = job.id
        self._say_error(None)
        if action == "folder":
            self.open_folder(job)
            return
        if action == "relaunch":
            if not job.spec:
                self._say_error("This job has no saved spec to launch again.")
                return
            choice = None
            folder = job.spec.get("checkpoint_dir")  # the spec's JSON (JobSpec.to_json)
            if isinstance(folder, str) and holds_checkpoint(folder):
                choice = self.choose(
                    f"{folder} holds the checkpoint of an earlier run. "
                    "Continue from it, or start over?",
                    RELAUNCH_CHOICES,
                )
                if choice is None:
                    return
            spec = relaunch_spec(job.spec, choice)
            if spec is None:
                return
            self.buttons["relaunch"].setEnabled(False)
            # The spec shows its --env values hidden; the engine takes them from this job.
            self._runner.submit(
                lambda c: c.job_start(spec, env_from=job_id), self._relaunched, self._action_failed
            )
            return
        if action == A.STOP and not self.confirm(stop_question(job)):
            return
        self.buttons[action].setEnabled(False)
        self._runner.submit(
            lambda c: c.job_action(job_id, action), self._acted, self._action_failed
        )

    def _acted(self, job: JobRecord) -> None:
        self.model.update_jobs([job], complete=False)
        self._selection_changed_data()
        self.refresh()

    def _relaunched(self, job: JobRecord) -> None:
        """A job launched again (its record): selected, and said with ``relaunched``."""
        self._selection_changed_data()
        self.model.update_jobs([job], complete=False)
        self.select_job(job.id)
        self.relaunched.emit(job)

    def _action_failed(self, message: str) -> None:
        self._say_error(one_line(message))
        self._selection_changed_data()

    def _say_error(self, text: Optional[str]) -> None:
        """Say (or clear) a problem with the selected job; it goes when the job's state
        changes (a refusal of a running job's park does not stay once it has ended)."""
        job = self.selected_job()
        self._error_state = job.state if text and job is not None else None
        say(self.action_error, text)

    def open_folder(self, job: JobRecord) -> bool:
        """Open the job's folder in the file manager; says so when it is gone."""
        folder = job_folder(job)
        if folder is None or not folder.is_dir():
            self._say_error(f"The job's folder {folder} does not exist any more.")
            return False
        if not QDesktopServices.openUrl(QUrl.fromLocalFile(str(folder))):
            self._say_error(f"No file manager opened {folder}.")
            return False
        return True
