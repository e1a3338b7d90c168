"""Small pieces the launch dialog, the jobs window and the settings dialog share."""

from __future__ import annotations

import html
from typing import Optional, Sequence

from PySide6.QtCore import Qt
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import QLabel, QWidget

from trayapp.text import lines

PRODUCT = "Headroom"
ERROR_STYLE = "color: #c0392b;"
WARNING_STYLE = "color: #a15c00;"
NOTE_STYLE = "color: palette(mid);"


def window_title(name: str) -> str:
    """``"Launch training"`` -> ``"Launch training — Headroom"``."""
    return f"{name} — {PRODUCT}"


def message_label(
    style: str = ERROR_STYLE, accessible_name: str = "", parent: Optional[QWidget] = None
) -> QLabel:
    """A word-wrapped label for a field's reason; hidden while it has no text."""
    label = QLabel(parent)
    label.setWordWrap(True)
    label.setStyleSheet(style)
    label.setTextFormat(Qt.TextFormat.PlainText)
    if accessible_name:
        label.setAccessibleName(accessible_name)
    label.hide()
    return label


def plain_tip(text: Optional[str]) -> str:
    """A tooltip that shows ``text`` as it is, each line escaped as ``text.one_line`` does. Qt
    renders a tooltip that looks like markup as markup (a job's name can hold ``<img>``): such
    a text goes markup-escaped inside a paragraph of rich text, which shows it literally."""
    shown = lines(text or "")
    if "<" not in shown and "&" not in shown:
        return shown
    return "<p>" + html.escape(shown, quote=False).replace("\n", "<br>") + "</p>"


def plain_label(text: str = "", parent: Optional[QWidget] = None) -> QLabel:
    """A label that never reads its text as markup (it shows a job's words)."""
    label = QLabel(text, parent)
    label.setTextFormat(Qt.TextFormat.PlainText)
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
