"""The readout over the timelines: the values at the time pointed at, or now, one line per
plot, wrapped to the window's width; it grows to the most lines it has needed and shrinks only
when the window is resized, so the plots under it do not jump as the pointer moves."""

from __future__ import annotations

import html
import re

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QSizePolicy


class Readout:
    def __init__(self, label: QLabel):
        self.label = label
        label.setTextFormat(Qt.TextFormat.RichText)
        label.setWordWrap(True)
        label.setAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop)
        label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Minimum)
        self._html = ""

    def show(self, html: str) -> None:
        if html == self._html:
            return
        self._html = html
        self.label.setText(html)
        self.fit()

    def fit(self, resized: bool = False) -> None:
        """Room for the whole text at the label's width: never less than it had, unless the
        window was ``resized`` (then what the text needs at the new width)."""
        need = self.label.heightForWidth(max(1, self.label.width()))
        if resized or need > self.label.minimumHeight():
            self.label.setMinimumHeight(need)

    def plain(self) -> str:
        """The text without its markup, a line per plot."""
        text = re.sub(r"<[^>]+>", "", self._html.replace("<br>", "\n"))
        return html.unescape(text).replace("\xa0", " ")
