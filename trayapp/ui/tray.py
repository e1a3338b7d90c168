"""The tray icon, its tooltip, its menu (rebuilt each time it opens) and the notifications."""

from __future__ import annotations

from typing import List, Optional

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QAction, QActionGroup, QIcon
from PySide6.QtWidgets import QMenu, QSystemTrayIcon

from trayapp.engine.event_record import EngineEvent
from trayapp.engine.status_record import Status
from trayapp.text import notice as notice_text
from trayapp.ui.icon import make_icon
from trayapp.ui.model import (
    IconState,
    MenuEntry,
    icon_state,
    menu_entries,
    notice_for,
    tooltip_text,
)
from trayapp.vocab import GuardCause as C

_MESSAGE_ICONS = {
    "info": QSystemTrayIcon.MessageIcon.Information,
    "warn": QSystemTrayIcon.MessageIcon.Warning,
    "error": QSystemTrayIcon.MessageIcon.Critical,
}
NOTICE_MS = 10_000
_GPU_CAUSES = frozenset({C.GPU_VRAM, C.BUDGET_VRAM, C.BUDGET_VRAM_WARN})


def _about_gpus(event: EngineEvent) -> bool:
    """Whether a notice concerns the GPUs (in demo mode only those are simulated: a RAM
    warning there is as real as anywhere)."""
    return (event.data or {}).get("cause") in _GPU_CAUSES


class TrayController(QObject):
    """Owns the QSystemTrayIcon. ``chosen(str)`` carries a menu entry's key (see
    ``model.menu_entries``); ``toggled()`` a left-click; ``notice_clicked(dict)`` the event of
    the notification the user clicked."""

    chosen = Signal(str)
    toggled = Signal()
    notice_clicked = Signal(object)

    def __init__(self, demo: bool = False, parent: Optional[QObject] = None):
        super().__init__(parent)
        self.demo = demo
        self.status: Optional[Status] = None
        self.reachable = False
        self.reason: Optional[str] = "connecting to the engine"
        self.icon_state: Optional[IconState] = None
        self.redraws = 0
        self._notice_event: Optional[EngineEvent] = None
        self.icon = QSystemTrayIcon(self)
        self.menu = QMenu()
        self.menu.aboutToShow.connect(self.rebuild_menu)
        self.icon.setContextMenu(self.menu)
        self.icon.activated.connect(self._activated)
        self.icon.messageClicked.connect(self._message_clicked)
        self._set_icon(IconState())
        self._set_tooltip()
        self.rebuild_menu()

    def show(self) -> None:
        self.icon.show()

    def hide(self) -> None:
        self.icon.hide()

    # -- state -----------------------------------------------------------------------------

    def update(
        self, status: Optional[Status], reachable: bool, reason: Optional[str] = None
    ) -> bool:
        """Show a new status (or the loss of the engine); returns whether the icon was redrawn
        (only when what it shows changed)."""
        if status is not None:
            self.status = status
        self.reachable = reachable
        self.reason = None if reachable else reason
        self._set_tooltip()
        return self._set_icon(icon_state(self.status, reachable))

    def _set_icon(self, state: IconState) -> bool:
        if state == self.icon_state:
            return False
        self.icon_state = state
        self.icon.setIcon(make_icon(state))
        self.redraws += 1
        return True

    def _set_tooltip(self) -> None:
        text = tooltip_text(self.status, self.reachable, self.reason, demo=self.demo)
        if text != self.icon.toolTip():
            self.icon.setToolTip(text)

    # -- the menu --------------------------------------------------------------------------

    def rebuild_menu(self) -> None:
        """Fill the menu from the latest status (connected to ``aboutToShow``)."""
        self.menu.clear()
        for child in self.menu.findChildren(QMenu):
            child.deleteLater()
        for group in self.menu.findChildren(QActionGroup):
            group.deleteLater()
        self._fill(self.menu, menu_entries(self.status, self.reachable))

    def _fill(self, menu: QMenu, entries: List[MenuEntry]) -> None:
        group: Optional[QActionGroup] = None
        for entry in entries:
            if entry.kind == "separator":
                menu.addSeparator()
                continue
            if entry.kind == "submenu":
                sub = QMenu(entry.text, self.menu)
                sub.setEnabled(entry.enabled)
                self._fill(sub, entry.children)
                menu.addMenu(sub)
                continue
            action = QAction(entry.text, menu)
            action.setEnabled(entry.enabled and entry.kind != "label")
            action.setData(entry.key)
            if entry.checked is not None:
                if group is None:
                    group = QActionGroup(menu)
                    group.setExclusive(True)
                action.setCheckable(True)
                action.setChecked(entry.checked)
                group.addAction(action)
            if entry.key and entry.kind == "action":
                action.triggered.connect(lambda _=False, k=entry.key: self.chosen.emit(k))
            menu.addAction(action)

    def _activated(self, reason: QSystemTrayIcon.ActivationReason) -> None:
        if reason == QSystemTrayIcon.ActivationReason.Trigger:
            self.toggled.emit()

    # -- notifications ---------------------------------------------------------------------

    def notify(self, event: EngineEvent) -> bool:
        """Show the notification for an event; False for kinds that do not notify."""
        notice = notice_for(event)
        if notice is None:
            return False
        self._notice_event = event
        title = notice.title + (" (simulated GPUs)" if self.demo and _about_gpus(event) else "")
        self.icon.showMessage(
            title,
            notice.message,  # escaped for a notification already
            _MESSAGE_ICONS.get(notice.level, QSystemTrayIcon.MessageIcon.Information),
            NOTICE_MS,
        )
        return True

    def message(self, title: str, text: str, level: str = "warn") -> None:
        """A notification of the app's own (a message may quote a job or a file: escaped)."""
        self.icon.showMessage(
            notice_text(title),
            notice_text(text),
            _MESSAGE_ICONS.get(level, _MESSAGE_ICONS["warn"]),
            NOTICE_MS,
        )

    def _message_clicked(self) -> None:
        self.notice_clicked.emit(self._notice_event)

    def current_icon(self) -> QIcon:
        return self.icon.icon()
