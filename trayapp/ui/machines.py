"""The Machines window: every machine running Headroom that a Prometheus server scrapes, with
its RAM, VRAM, guard state and jobs (with their progress), asked again every few seconds.

The server is ``[machines] prometheus`` in the settings (the app hands the window its config
through ``set_config``), the pace ``[machines] refresh_seconds``. The queries run on a daemon
thread (``Background``); the window shows one whole answer at a time, or one line saying why
there is none (no URL, unreachable, an empty or unreadable answer).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, List, Optional

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QBrush, QColor, QShowEvent
from PySide6.QtWidgets import (
    QHeaderView,
    QLabel,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from trayapp.config import SETTINGS_BY_NAME
from trayapp.config.view import ConfigView
from trayapp.ui.background import Background, shiboken_valid
from trayapp.ui.forms import ERROR_STYLE, WARNING_STYLE, escape_closes, window_title
from trayapp.ui.machines_query import Fleet, PrometheusError, fetch_fleet
from trayapp.ui.machines_text import (
    COLUMNS,
    NO_SETTINGS,
    gpu_cells,
    job_cells,
    machine_cells,
    status_line,
)

log = logging.getLogger("headroom.ui")

DEFAULT_REFRESH = float(SETTINGS_BY_NAME["machines.refresh_seconds"].default)
_GUARD_COLOURS = {"warn": "#a15c00", "pause": "#c0392b", "park": "#c0392b"}
MIN_COLUMN_WIDTH = 110  # px: a column of an empty window still reads as a column


class MachinesWindow(QWidget):
    """``MachinesWindow(client_factory, parent=None)``, as the app opens its windows (the
    engine's client is not needed: everything comes from Prometheus). ``configure(url,
    refresh_seconds)`` sets the server directly; ``set_config(config)`` takes it from the
    engine's settings. ``fleet`` is the last answer, ``error`` the last failure's line."""

    def __init__(
        self,
        client_factory: Optional[Callable[[], Any]] = None,
        parent: Optional[QWidget] = None,
        *,
        fetch: Callable[[str], Fleet] = fetch_fleet,
    ):
        super().__init__(parent)
        self.setWindowFlag(Qt.WindowType.Window, True)
        self.setWindowTitle(window_title("Machines"))
        self.setObjectName("machines")
        self._fetch = fetch
        self.url: Optional[str] = None  # None: the settings have not arrived yet
        self.refresh_seconds = DEFAULT_REFRESH
        self.fleet: Optional[Fleet] = None
        self.error: Optional[str] = None
        self.answers = 0  # answers (or failures) shown so far
        self._asking = False
        self._background = Background(self)
        self.destroyed.connect(self._background.close)

        layout = QVBoxLayout(self)
        self.status_label = QLabel(NO_SETTINGS)
        self.status_label.setWordWrap(True)
        self.status_label.setTextFormat(Qt.TextFormat.PlainText)
        self.status_label.setAccessibleName("Machines status")
        layout.addWidget(self.status_label)
        self.tree = QTreeWidget()
        self.tree.setColumnCount(len(COLUMNS))
        self.tree.setHeaderLabels(list(COLUMNS))
        self.tree.setAccessibleName("Machines")
        self.tree.setRootIsDecorated(True)
        self.tree.setUniformRowHeights(True)
        self.tree.header().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.tree.header().setStretchLastSection(True)
        # Empty (no server, or it cannot be reached), the columns would shrink to their titles.
        self.tree.header().setMinimumSectionSize(MIN_COLUMN_WIDTH)
        layout.addWidget(self.tree)
        escape_closes(self)
        self._timer = QTimer(self)
        self._timer.timeout.connect(self.refresh)
        self.resize(900, 420)

    # -- settings ---------------------------------------------------------------------------------

    def set_config(self, config: ConfigView) -> None:
        """Take the server and the pace from the engine's settings (``config_get()``)."""
        machines = config.section("machines")
        url = machines.get("prometheus", "")
        refresh = machines.get("refresh_seconds", DEFAULT_REFRESH)
        self.configure(
            url if isinstance(url, str) else "",
            float(refresh) if isinstance(refresh, (int, float)) else DEFAULT_REFRESH,
        )

    def configure(self, url: str, refresh_seconds: float = DEFAULT_REFRESH) -> None:
        """Ask ``url`` every ``refresh_seconds`` (``""``: no server; the window says so)."""
        url = url.strip()
        refresh_seconds = max(1.0, refresh_seconds)
        if url == self.url and refresh_seconds == self.refresh_seconds:
            return
        changed = url != self.url
        self.url, self.refresh_seconds = url, refresh_seconds
        self._timer.setInterval(int(refresh_seconds * 1000))
        if changed:
            self.fleet, self.error = None, None
            self._show()
        if self.isVisible():
            self._timer.start()
            if changed:
                self.refresh()

    def set_reachable(self, reachable: bool, reason: Optional[str] = None) -> None:
        """The engine's state: only its settings matter here, and only until they arrived."""
        if self.url is None:
            self.status_label.setText(
                NO_SETTINGS
                if reachable
                else "The engine is not reachable"
                + (f" ({reason})" if reason else "")
                + ": the Prometheus server to ask is in its settings."
            )

    # -- asking -----------------------------------------------------------------------------------

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802 - Qt's name
        super().showEvent(event)
        if not event.spontaneous() and self.url is not None:
            self._timer.start()
            self.refresh()

    def hideEvent(self, event: Any) -> None:  # noqa: N802 - Qt's name
        # Nobody looks: no queries.
        self._timer.stop()
        super().hideEvent(event)

    def refresh(self) -> None:
        """Ask Prometheus now (off the GUI thread), unless an answer is still on its way."""
        if not self.url or self._asking:
            self._show()
            return
        self._asking = True
        url, fetch = self.url, self._fetch
        self._background.submit(lambda: fetch(url), lambda result: self._answered(url, result))

    def _answered(self, url: str, result: Any) -> None:
        self._asking = False
        if not shiboken_valid(self.tree) or url != self.url:
            return  # the window went, or the server changed while it was asked
        if isinstance(result, Fleet):
            self.fleet, self.error = result, None
        elif isinstance(result, PrometheusError):
            self.error = str(result)
        else:  # a bug in reading the answer: one line here, the details in the log
            self.error = f"its answer could not be read ({type(result).__name__}: {result})"
        self.answers += 1
        self._show()

    # -- showing ----------------------------------------------------------------------------------

    def _show(self) -> None:
        if self.url is None:
            self.status_label.setText(NO_SETTINGS)
            return
        self.status_label.setText(
            status_line(self.url, self.fleet, self.error, self.refresh_seconds)
        )
        bad = (
            not self.url
            or self.error is not None
            or (self.fleet is not None and not self.fleet.machines)
        )
        self.status_label.setStyleSheet(ERROR_STYLE if self.error else WARNING_STYLE if bad else "")
        self._fill()

    def _fill(self) -> None:
        """The table from the last answer; kept (greyed by the line above) while the server
        does not answer, so a blip does not empty the window."""
        tops = self._tops()
        expanded = {t.data(0, Qt.ItemDataRole.UserRole) for t in tops if t.isExpanded()}
        first = not tops
        self.tree.clear()
        if not self.url or self.fleet is None:
            return
        for m in self.fleet.machines:
            item = QTreeWidgetItem(machine_cells(m))
            item.setData(0, Qt.ItemDataRole.UserRole, m.instance)
            colour = "#c0392b" if m.up is False else _GUARD_COLOURS.get(m.guard or "")
            if colour:
                item.setForeground(3, QBrush(QColor(colour)))
            for g in m.gpus:
                item.addChild(
                    QTreeWidgetItem(gpu_cells(g.index, g.name, g.used_bytes, g.total_bytes))
                )
            for j in m.jobs:
                item.addChild(QTreeWidgetItem(job_cells(j)))
            self.tree.addTopLevelItem(item)
            item.setExpanded(first or m.instance in expanded)

    def rows(self) -> List[List[str]]:
        """What the table shows, machine rows and their children, as text (for tests)."""
        out = []
        for top in self._tops():
            out.append([top.text(c) for c in range(len(COLUMNS))])
            for k in range(top.childCount()):
                child = top.child(k)
                if child is not None:
                    out.append(
                        ["  " + child.text(0)] + [child.text(c) for c in range(1, len(COLUMNS))]
                    )
        return out

    def _tops(self) -> List[QTreeWidgetItem]:
        items = (self.tree.topLevelItem(i) for i in range(self.tree.topLevelItemCount()))
        return [item for item in items if item is not None]
