"""Small pieces the launch dialog, the jobs window and the settings dialog share."""

from __future__ import annotations

from typing import Optional, Sequence

from PySide6.QtCore import Qt
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import QLabel, QWidget

PRODUCT = "Headroom"
ERROR_STYLE = "color: #c0392b;"
WARNING_STYLE = "color: #a15c00;"
NOTE_STYLE = "color: palette(mid);"


def window_title(name: str) -> str:
    """``"Launch training"`` -> ``"Launch training — Headroom"``."""
    return f"{name} — {PRODUCT}"


def message_label(style: str = ERROR_STYLE, accessible_name: str = "",
                  parent: Optional[QWidget] = None) -> QLabel:
    """A word-wrapped label for a field's reason; hidden while it has no text."""
    label = QLabel(parent)
    label.setWordWrap(True)
    label.setStyleSheet(style)
    label.setTextFormat(Qt.TextFormat.PlainText)
    if accessible_name:
        label.setAccessibleName(accessible_name)
    label.hide()
    return label


def set_message(label: QLabel, text: Optional[str]) -> None:
    """Show ``text`` in ``label``, or hide the label when there is nothing to say."""
    label.setText(text or "")
    label.setVisible(bool(text))


def escape_closes(window: QWidget) -> QShortcut:
    """Esc closes ``window`` (dialogs do this by themselves; plain windows do not)."""
    shortcut = QShortcut(QKeySequence("Esc"), window)
    shortcut.activated.connect(window.close)
    return shortcut


def chain_tab_order(widgets: Sequence[QWidget]) -> None:
    """Tab moves through ``widgets`` in this order."""
    for a, b in zip(widgets, widgets[1:]):
        QWidget.setTabOrder(a, b)


def one_line(text: object) -> str:
    """The first line of a message, for a label that must not grow a traceback."""
    lines = str(text).strip().splitlines()
    return lines[0] if lines else ""
