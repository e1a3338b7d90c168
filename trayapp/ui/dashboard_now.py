"""The dashboard's "now" bars: what holds the RAM and each GPU's memory at this moment, as one
labelled bar each (like a task manager's memory composition), readable whatever the scale: a
job using 2% of 64 GiB is a band of its own, at least ``MIN_SEGMENT_PX`` wide, named inside
where its name fits and on hover always.

``Segment``s come from the dashboard's stacks (``Stack.now``); this module only draws them.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from PySide6.QtCore import QEvent, QRect, QSize, Qt
from PySide6.QtGui import QColor, QFontMetrics, QHelpEvent, QPainter, QPen
from PySide6.QtWidgets import QGridLayout, QLabel, QToolTip, QWidget

MIN_SEGMENT_PX = 4  # a consumer that holds anything is at least this wide
BAR_HEIGHT = 18
TEXT = QColor("#1c1c1c")


@dataclass(frozen=True)
class Segment:
    label: str
    value: float  # bytes
    colour: str
    job: bool = False


def widths(
    values: Sequence[float], total: float, width: int, minimum: int = MIN_SEGMENT_PX
) -> List[int]:
    """Pixel widths for ``values`` out of ``total`` in a bar ``width`` wide: each value above 0
    gets at least ``minimum``, taken from the widest, and together they fill no more of the bar
    than their share of ``total`` (or ``minimum`` each, where that is more). A value or a total
    that is not a finite number (no reading) counts as nothing."""
    if width <= 0 or not (math.isfinite(total) and total > 0):
        return [0 for _ in values]
    raw = [v / total * width if math.isfinite(v) and v > 0 else 0.0 for v in values]
    out = [max(minimum, int(round(r))) if r > 0 else 0 for r in raw]
    shown = sum(1 for r in raw if r > 0)
    limit = min(width, max(int(round(sum(raw))), minimum * shown))
    while sum(out) > limit and any(w > minimum for w in out):
        widest = max(range(len(out)), key=lambda k: out[k])
        out[widest] -= 1
    return out


class CompositionBar(QWidget):
    """One memory (RAM or a GPU's) split into its consumers, left to right."""

    def __init__(self, parent: Optional[QWidget] = None):
        super().__init__(parent)
        self.segments: List[Segment] = []
        self.total = 0.0
        self._rects: List[Tuple[QRect, Segment]] = []
        self.setMinimumHeight(BAR_HEIGHT)
        self.setMouseTracking(True)

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt override
        return QSize(400, BAR_HEIGHT)

    def set_parts(self, segments: Sequence[Segment], total: float) -> None:
        segments = [s for s in segments if s.value > 0]
        if list(segments) != self.segments or total != self.total:
            self.segments, self.total = list(segments), float(total or 0)
            self.update()

    def layout_rects(self) -> List[Tuple[QRect, Segment]]:
        """Where each segment is drawn (for painting and for the tooltip)."""
        inner = self.rect().adjusted(0, 1, -1, -2)
        ws = widths([s.value for s in self.segments], self.total, inner.width())
        x = inner.left()
        out = []
        for w, seg in zip(ws, self.segments):
            if w > 0:
                out.append((QRect(x, inner.top(), w, inner.height()), seg))
                x += w
        return out

    def paintEvent(self, event: object) -> None:  # noqa: N802 - Qt override
        painter = QPainter(self)
        inner = self.rect().adjusted(0, 1, -1, -2)
        painter.fillRect(inner, QColor("#fbfbfb"))
        metrics = QFontMetrics(self.font())
        self._rects = self.layout_rects()
        for rect, seg in self._rects:
            colour = QColor(seg.colour)
            painter.fillRect(rect, colour)
            painter.setPen(QPen(colour.darker(170 if seg.job else 125), 1))
            painter.drawRect(rect.adjusted(0, 0, -1, -1))
            text = fitted(seg, self.total, rect.width() - 6, metrics)
            if text:
                painter.setPen(TEXT if colour.lightness() >= 128 else QColor("#ffffff"))
                painter.drawText(
                    rect.adjusted(3, 0, -3, 0),
                    int(Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft),
                    text,
                )
        painter.setPen(QPen(QColor("#888888"), 1))
        painter.drawRect(inner)
        painter.end()

    def segment_at(self, x: int) -> Optional[Segment]:
        for rect, seg in self._rects or self.layout_rects():
            if rect.left() <= x <= rect.right():
                return seg
        return None

    def event(self, e: QEvent) -> bool:
        if isinstance(e, QHelpEvent):
            seg = self.segment_at(e.pos().x())
            if seg is not None:
                # Rich text with the name escaped: a name is never read as markup.
                text = f"{seg.label}: {gib(seg.value)} ({share(seg.value, self.total)})"
                QToolTip.showText(e.globalPos(), f"<span>{html.escape(text)}</span>", self)
            else:
                QToolTip.hideText()
            return True
        return super().event(e)


def fitted(seg: Segment, total: float, room: int, metrics: QFontMetrics) -> str:
    """The words a segment ``room`` pixels wide shows: its label and share, else its name
    without the job's id, else that name cut short (at least three letters); "" for none."""
    pct = share(seg.value, total)
    name = seg.label.split(" (job ")[0]
    for text in (f"{seg.label} {pct}", f"{name} {pct}"):
        if metrics.horizontalAdvance(text) <= room:
            return text
    cut = metrics.elidedText(
        name, Qt.TextElideMode.ElideRight, room - metrics.horizontalAdvance(f" {pct}")
    )
    return f"{cut} {pct}" if len(cut.rstrip("\u2026")) >= 3 else ""


def gib(v: float) -> str:
    return f"{v / (1 << 30):.2f} GiB" if v >= (1 << 30) / 10 else f"{v / (1 << 20):.0f} MiB"


def share(v: float, total: float) -> str:
    if total <= 0:
        return ""
    pct = 100.0 * v / total
    return f"{pct:.0f}%" if pct >= 1 else "<1%"


class NowBars(QWidget):
    """A labelled composition bar for RAM and for each GPU."""

    def __init__(self, parent: Optional[QWidget] = None):
        super().__init__(parent)
        self._grid = QGridLayout(self)
        self._grid.setContentsMargins(6, 0, 6, 0)
        self._grid.setHorizontalSpacing(8)
        self._grid.setVerticalSpacing(2)
        self._grid.setColumnStretch(1, 1)  # the bars take the width; their names what they need
        self.bars: Dict[str, CompositionBar] = {}
        self._names: Dict[str, QLabel] = {}

    def show_parts(self, parts: Sequence[Tuple[str, Sequence[Segment], float]]) -> None:
        """``parts``: (name, segments, total) for each memory, in order ("RAM", "GPU 0"...)."""
        names = [name for name, _, _ in parts]
        for name in list(self.bars):
            if name not in names:
                for w in (self.bars.pop(name), self._names.pop(name)):
                    self._grid.removeWidget(w)
                    w.hide()
                    w.deleteLater()
        for row, (name, segments, total) in enumerate(parts):
            bar = self.bars.get(name)
            if bar is None:
                label = QLabel(f"<b>{name}</b>")
                bar = self.bars[name] = CompositionBar()
                bar.setAccessibleName(f"{name} now, by consumer")
                self._names[name] = label
            self._grid.addWidget(self._names[name], row, 0)
            self._grid.addWidget(bar, row, 1)
            bar.set_parts(segments, total)
