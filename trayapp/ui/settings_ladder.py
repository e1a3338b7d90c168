"""The guard's thresholds in the settings window: where each sits on the memory available
now (a line under its field, and ticks on a bar), and whether they nest."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from PySide6.QtCore import QRectF, QSize
from PySide6.QtGui import QColor, QPainter, QPen
from PySide6.QtWidgets import QSizePolicy, QWidget

from trayapp.config import ConfigError, Threshold, format_bytes
from trayapp.vocab import GuardAct as A

# The guard's ladder, lowest first; each step with the word for it and its colour.
LADDER: Tuple[Tuple[str, str, str], ...] = (
    ("guard.stop_available", A.STOP, "#7b1020"),
    ("guard.park_available", A.PARK, "#d7263d"),
    ("guard.pause_available", A.PAUSE, "#ee6a1c"),
    ("guard.warn_available", A.WARN, "#f2a900"),
    ("guard.resume_available", A.RESUME, "#2e9d46"),
)

LABEL_ROWS = 3  # rows for the words above the thresholds' ticks

# -- where the thresholds sit ---------------------------------------------------------------------


def threshold_preview(
    text: str, total_bytes: Optional[int], available_bytes: Optional[int], word: str
) -> str:
    """One line saying what a threshold means on this machine now, e.g.
    ``"= 3.6 GiB of 24.0 GiB; 12.0 GiB available now, above it"``. Raises ConfigError for a
    value that is not a threshold."""
    t = Threshold.parse(text)
    if not total_bytes:
        return "(the total memory is not known yet)"
    b = t.bytes_of(int(total_bytes))
    line = f"= {format_bytes(b)} of {format_bytes(total_bytes)}"
    if available_bytes is None or not word:
        return line
    if word == A.RESUME:
        where = "above it" if available_bytes > b else "below it: paused jobs stay paused"
    else:
        where = "above it" if available_bytes > b else f"below it: the guard would {word} now"
    return f"{line}; {format_bytes(available_bytes)} available now, {where}"


def order_problem(values: Dict[str, str], total_bytes: int) -> Optional[str]:
    """A line when the ladder does not nest (stop <= park <= pause <= warn, resume above
    pause), else None."""
    try:
        b = {
            name: Threshold.parse(values[name]).bytes_of(total_bytes)
            for name, _w, _c in LADDER
            if name in values
        }
    except ConfigError:
        return None
    steps = [b[name] for name, word, _c in LADDER if word != A.RESUME and name in b]
    if steps != sorted(steps):
        return "The steps should nest: stop ≤ park ≤ pause ≤ warn (they still apply as written)."
    resume, pause = b.get("guard.resume_available"), b.get("guard.pause_available")
    if resume is not None and pause is not None and resume < pause:
        return "Resume sits below pause: jobs would resume into a shortage and pause again."
    return None


class ThresholdBar(QWidget):
    """Available memory from 0 (left) to the total (right): the green part is what is
    available now; a tick marks each threshold."""

    def __init__(self, parent: Optional[QWidget] = None):
        super().__init__(parent)
        self.total_bytes: Optional[int] = None
        self.available_bytes: Optional[int] = None
        self.marks: List[Tuple[str, int, str]] = []  # (word, bytes, colour)
        self.setMinimumHeight(LABEL_ROWS * 14 + 20)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setAccessibleName("Where the thresholds sit on the memory available now")

    def sizeHint(self) -> QSize:
        return QSize(360, LABEL_ROWS * 14 + 20)

    def set_values(
        self,
        total_bytes: Optional[int],
        available_bytes: Optional[int],
        marks: List[Tuple[str, int, str]],
    ) -> None:
        self.total_bytes, self.available_bytes, self.marks = total_bytes, available_bytes, marks
        parts = [f"{w} at {format_bytes(b)}" for w, b, _ in marks]
        if available_bytes is not None:
            parts.insert(0, f"{format_bytes(available_bytes)} available now")
        self.setAccessibleDescription("; ".join(parts))
        self.update()

    def paintEvent(self, event: Any) -> None:  # noqa: N802 - Qt's name
        p = QPainter(self)
        try:
            w, h = self.width(), self.height()
            label_h = 14
            top = LABEL_ROWS * label_h + 2
            bar = QRectF(0.5, top + 0.5, w - 1.0, h - top - 2.0)
            p.setPen(QPen(QColor("#555555"), 1))
            p.setBrush(QColor("#e8e8e8"))
            p.drawRect(bar)
            total = self.total_bytes
            if not total:
                return
            if self.available_bytes is not None:
                frac = max(0.0, min(1.0, self.available_bytes / total))
                fill = QRectF(
                    bar.left() + 1, bar.top() + 1, (bar.width() - 2) * frac, bar.height() - 2
                )
                p.fillRect(fill, QColor("#8fd19e"))
            font = p.font()
            font.setPointSizeF(max(6.0, font.pointSizeF() * 0.8))
            p.setFont(font)
            row_ends = [float("-inf")] * LABEL_ROWS
            for word, b, colour in sorted(self.marks, key=lambda m: m[1]):
                x = bar.left() + bar.width() * max(0.0, min(1.0, b / total))
                p.setPen(QPen(QColor(colour), 2))
                p.drawLine(int(x), int(bar.top()), int(x), int(bar.bottom()))
                tw = p.fontMetrics().horizontalAdvance(word)
                tx = max(0, min(w - tw, int(x - tw / 2)))
                # Close thresholds put their words on different rows, so none covers another.
                free = [r for r in range(LABEL_ROWS) if tx >= row_ends[r] + 3]
                row = free[0] if free else min(range(LABEL_ROWS), key=lambda r: row_ends[r])
                row_ends[row] = tx + tw
                p.setPen(QColor(colour).darker(140))
                p.drawText(tx, row * label_h + label_h - 3, word)
        finally:
            p.end()
