"""The jobs window's detail tabs, a part the window holds: the selected job's log, options,
events, curves and memory chart, and checkpoints, and their polling off the GUI thread (the log
from where the last read ended, the events after the last one seen, the curves, memory and
checkpoints while their tab shows), and what the checkpoint manager's buttons ask.
"""

from __future__ import annotations

import time
from typing import Any, Callable, List, Optional, Protocol

from PySide6.QtCore import Qt, QTimer, QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import QLabel, QSplitter, QTabWidget, QVBoxLayout, QWidget

from trayapp.engine.checkpoint_record import CheckpointListing
from trayapp.engine.client import EngineClient
from trayapp.engine.event_record import EngineEvent
from trayapp.engine.history_record import History
from trayapp.jobs.curves import JobCurves
from trayapp.jobs.logpages import LogPage
from trayapp.jobs.record import JobRecord
from trayapp.ui import job_checkpoints
from trayapp.ui.forms import one_line
from trayapp.ui.job_checkpoints import CheckpointPane
from trayapp.ui.job_details import (
    CurvesChart,
    EventList,
    LogPane,
    MemoryChart,
    chart_request,
    options_tree,
)
from trayapp.ui.job_rows import FINISHED_STATES
from trayapp.ui.jobs_table import JobsModel
from trayapp.ui.worker import CallRunner

TRAINING_TAB, CHECKPOINTS_TAB = 3, 4  # the curves and memory; the checkpoints
CURVES_SECONDS = 2.0  # a live job's curves are asked for this often while they show
CHECKPOINTS_SECONDS = 5.0


class _Window(Protocol):
    """What the tabs use of the jobs window."""

    model: JobsModel
    selected_id: Optional[str]
    confirm: Callable[[str], bool]
    _runner: CallRunner

    def selected_job(self) -> Optional[JobRecord]: ...

    def append_log(self, text: str) -> None: ...

    def _submit(
        self,
        kind: str,
        fn: Callable[[EngineClient], Any],
        done: Callable[[Any], None],
        error: Optional[Callable[[str], None]] = None,
    ) -> None: ...

    def _acted(self, job: JobRecord) -> None: ...

    def _relaunched(self, job: JobRecord) -> None: ...


class DetailTabs:
    """``DetailTabs(window)``: ``box`` holds the selected job's header and tabs."""

    def __init__(self, window: _Window) -> None:
        self._w = window
        self._log_offset: Optional[int] = None
        self._log_job: Optional[str] = None
        self._events_after: Optional[int] = None
        self._events_job: Optional[str] = None
        self._chart_due = 0.0
        self._curves_due = 0.0
        self._checkpoints_due = 0.0
        self.box = self._build_details()

    def _build_details(self) -> QWidget:
        box = QWidget()
        layout = QVBoxLayout(box)
        layout.setContentsMargins(0, 0, 0, 0)
        self.header_label = QLabel(
            "Select a job to see its log, options, events, curves, memory and checkpoints."
        )
        self.header_label.setWordWrap(True)
        self.header_label.setTextFormat(Qt.TextFormat.PlainText)  # it shows the job's name
        self.header_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.header_label.setAccessibleName("Selected job")
        layout.addWidget(self.header_label)
        self.detail_tabs = QTabWidget()
        self.detail_tabs.setAccessibleName("Job details")
        layout.addWidget(self.detail_tabs, 1)

        self.log_pane = LogPane()
        self.detail_tabs.addTab(self.log_pane, "Log")
        self.options_tree = options_tree()
        self.detail_tabs.addTab(self.options_tree, "Options")
        self.events_tree = EventList()
        self.detail_tabs.addTab(self.events_tree, "Events")
        self.curves_chart = CurvesChart()
        self.memory_chart = MemoryChart()
        training = QSplitter(Qt.Orientation.Horizontal)
        training.addWidget(self.curves_chart)
        training.addWidget(self.memory_chart)
        training.setChildrenCollapsible(False)
        self.detail_tabs.addTab(training, "Curves and memory")
        self.checkpoint_pane = CheckpointPane()
        self.checkpoint_pane.asked.connect(self._checkpoint_asked)
        self.detail_tabs.addTab(self.checkpoint_pane, "Checkpoints")
        self.detail_tabs.currentChanged.connect(lambda _i: self._due_tab())
        return box

    def select(self, new_id: Optional[str]) -> None:
        """Another job is selected (or none): its tabs start empty and are asked for."""
        self.log_pane.view.clear()
        self.events_tree.clear()
        self._log_offset, self._log_job = None, new_id
        self._events_after, self._events_job = None, new_id
        self.memory_chart.clear()
        self.curves_chart.clear()
        self.checkpoint_pane.clear()
        self._chart_due = self._curves_due = self._checkpoints_due = 0.0

    def fill(self, job_id: str) -> None:
        """The newly selected job's log, events and shown tab, asked for at once."""
        self._poll_log(job_id)
        self._poll_events(job_id)
        self._due_tab()

    def poll(self, job_id: str) -> None:
        """The selected job's new log and events, and what its tab shows when it is due."""
        self._poll_log(job_id)
        self._poll_events(job_id)
        now, tab = time.monotonic(), self.detail_tabs.currentIndex()
        if tab == TRAINING_TAB and now >= self._chart_due:
            self._poll_chart(job_id)
        if tab == TRAINING_TAB and now >= self._curves_due:
            self._poll_curves(job_id)
        if tab == CHECKPOINTS_TAB and now >= self._checkpoints_due:
            self._poll_checkpoints(job_id)

    def add_event(self, event: EngineEvent) -> None:
        """An engine event: shown at once when it is about the selected job."""
        if (
            self._w.selected_id
            and event.job_id == self._w.selected_id
            and self._events_job == self._w.selected_id
        ):
            self._add_events([event])

    # -- the log -----------------------------------------------------------------------------------

    def _poll_log(self, job_id: str) -> None:
        offset = self._log_offset
        self._w._submit(
            "log",
            lambda c: c.job_log(job_id, offset=offset),
            lambda r: self._got_log(job_id, offset, r),
        )

    def _got_log(self, job_id: str, asked: Optional[int], page: LogPage) -> None:
        if job_id != self._log_job or asked != self._log_offset:
            return  # the selection changed, or another answer came first
        self._log_offset = page.offset
        if page.data:
            self._w.append_log(page.data)
        # A long log arrives in pieces: read on at once rather than a second later.
        if page.size > self._log_offset and self._w.selected_id == job_id:
            QTimer.singleShot(0, lambda: self._poll_log(job_id))

    # -- events ---------------------------------------------------------------------------------

    def _poll_events(self, job_id: str) -> None:
        after = self._events_after
        self._w._submit(
            "events",
            lambda c: c.events(
                job=job_id, after_id=after, limit=500 if after is not None else None
            ),
            lambda r: self._got_events(job_id, after, r),
        )

    def _got_events(self, job_id: str, after: Optional[int], events: List[EngineEvent]) -> None:
        if job_id != self._events_job or after != self._events_after:
            return
        self._add_events(events or [])
        if self._events_after is None:
            self._events_after = 0

    def _add_events(self, events: List[EngineEvent]) -> None:
        for ev in events:
            eid = ev.id
            if eid is not None:
                if self._events_after is not None and eid <= self._events_after:
                    continue
                self._events_after = eid
            self.events_tree.add(ev)
        if events:
            self.events_tree.scrollToBottom()

    # -- the chart ---------------------------------------------------------------------------------

    def _due_tab(self) -> None:
        """The tab shown is filled now rather than at the next poll."""
        job_id, tab = self._w.selected_id, self.detail_tabs.currentIndex()
        if job_id and tab == TRAINING_TAB:
            self._poll_chart(job_id)
            self._poll_curves(job_id)
        elif job_id and tab == CHECKPOINTS_TAB:
            self._poll_checkpoints(job_id)

    def _poll_chart(self, job_id: str) -> None:
        start, end, names = chart_request(self._w.model.job(job_id), job_id, time.time())
        self._chart_due = time.monotonic() + 5.0
        self._w._submit(
            "chart",
            lambda c: c.history(start, end, series=names),
            lambda r: self._got_chart(job_id, r),
        )

    def _got_chart(self, job_id: str, result: History) -> None:
        if job_id == self._w.selected_id:
            self.memory_chart.show_history(job_id, result, self._w.model.job(job_id))

    def _poll_curves(self, job_id: str) -> None:
        job = self._w.model.job(job_id)
        # An ended job's curves do not change: asked again only when it is selected again.
        self._curves_due = time.monotonic() + (
            CURVES_SECONDS if job is None or job.state not in FINISHED_STATES else 1e9
        )
        self._w._submit(
            "curves",
            lambda c: c.job_curves(job_id),
            lambda r: self._got_curves(job_id, r),
        )

    def _got_curves(self, job_id: str, curves: JobCurves) -> None:
        if job_id == self._w.selected_id:
            self.curves_chart.show_curves(curves, self._w.model.job(job_id))

    # -- checkpoints ------------------------------------------------------------------------

    def _poll_checkpoints(self, job_id: str) -> None:
        self._checkpoints_due = time.monotonic() + CHECKPOINTS_SECONDS
        self._w._submit(
            "checkpoints",
            lambda c: c.job_checkpoints(job_id),
            lambda r: self._got_checkpoints(job_id, r),
            lambda m: self.checkpoint_pane.show_error(one_line(m)),
        )

    def _got_checkpoints(self, job_id: str, listing: CheckpointListing) -> None:
        if job_id == self._w.selected_id:
            self.checkpoint_pane.show_listing(self._w.model.job(job_id), listing)

    def _checkpoint_asked(self, action: str, name: str) -> None:
        """The checkpoint manager's buttons: open ``name``'s folder, delete it (asks first),
        or continue the job from it (asks first)."""
        job = self._w.selected_job()
        listing = self.checkpoint_pane.listing
        found = listing.named(name)
        if job is None or found is None:
            return
        pane = self.checkpoint_pane
        if action == "open":
            path = found.path
            if not QDesktopServices.openUrl(QUrl.fromLocalFile(path)):
                pane.show_error(f"No file manager opened {path}.")
            return
        if action == "delete":
            if not self._w.confirm(job_checkpoints.delete_question(job, found)):
                return
            job_id = job.id
            self._w._runner.submit(
                lambda c: c.job_checkpoint_delete(job_id, name),
                lambda _r: self._poll_checkpoints(job_id),
                lambda m: pane.show_error(one_line(m)),
            )
            return
        later = listing.later_than(name)
        if not self._w.confirm(job_checkpoints.continue_question(job, found, later)):
            return
        self._w._runner.submit(
            lambda c: job_checkpoints.continue_from(c, job, later),
            self._continued,
            lambda m: pane.show_error(one_line(m)),
        )

    def _continued(self, job: JobRecord) -> None:
        if job.id == self._w.selected_id:
            self._w._acted(job)  # resumed under its own id (a parked or stopped job)
        else:
            self._w._relaunched(job)
