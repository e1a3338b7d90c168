"""The launch form's one-line labels: a row's explanation and its problem in the same place,
each one line cut with "…" to the width there is, so that a problem that comes or goes moves
no field of the form.
"""

from __future__ import annotations

from typing import Optional

from PySide6.QtCore import Qt
from PySide6.QtGui import QPainter, QPaintEvent
from PySide6.QtWidgets import QLabel, QSizePolicy, QWidget

from trayapp.ui.forms import ERROR_STYLE, NOTE_STYLE


class OneLine(QLabel):
    """One line of text, cut with "…" to the width there is (the whole of it: ``text()``)."""

    def __init__(self, text: str = "", style: str = NOTE_STYLE, parent: Optional[QWidget] = None):
        super().__init__(text, parent)
        self.setStyleSheet(style)
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
        self.setFixedHeight(self.fontMetrics().lineSpacing() + 2)

    def paintEvent(self, event: QPaintEvent) -> None:  # noqa: N802 - Qt's name
        painter = QPainter(self)
        painter.setPen(self.palette().color(self.foregroundRole()))
        text = self.fontMetrics().elidedText(self.text(), Qt.TextElideMode.ElideRight, self.width())
        painter.drawText(
            self.rect(), int(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter), text
        )


class RowProblem(OneLine):
    """A row's problem, in the place of its explanation (which hides while it shows): one line,
    the whole text in its tooltip and in ``text()``. So a problem that comes or goes moves no
    field of the form."""

    def __init__(self, hint: Optional[QLabel], parent: Optional[QWidget] = None):
        super().__init__("", ERROR_STYLE, parent)
        self.hint = hint
        super().setVisible(False)

    def setVisible(self, visible: bool) -> None:  # noqa: N802 - Qt's name
        super().setVisible(visible)
        if self.hint is not None:
            self.hint.setVisible(not visible)
        self.setToolTip(self.text() if visible else "")


def one_line_note(text: str) -> QLabel:
    """A row's explanation: one line, as tall as a problem in its place."""
    note = OneLine(text)
    note.setToolTip(text)
    return note
