"""Labels on a plot that never overlap: each label has candidate places, in pixels, and takes the
first one inside the plot that no label placed before it covers; a label with no such place is
hidden (its line stays, and the readout names it).

Labels of horizontal lines (the guard's thresholds, the limit) sit on their line, from the
left edge rightwards, above it and then below it; labels of vertical lines (the jobs' events) in
rows from the top, right of their line and then left of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pyqtgraph as pg
from PySide6.QtCore import QPointF

Rect = Tuple[float, float, float, float]  # x, y, width, height in pixels, y downwards
GAP = 3.0
EVENT_ROWS = 4
# Where on a horizontal line, from the left: the newest data, at the right edge while the view
# follows live, stays uncovered as long as there is room elsewhere.
ALONG = (0.0, 0.25, 0.5, 0.75, 1.0)


def overlaps(a: Rect, b: Rect) -> bool:
    return a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[3] and b[1] < a[1] + a[3]


def inside(r: Rect, bounds: Rect) -> bool:
    return (
        r[0] >= bounds[0]
        and r[1] >= bounds[1]
        and r[0] + r[2] <= bounds[0] + bounds[2]
        and r[1] + r[3] <= bounds[1] + bounds[3]
    )


def place(requests: Sequence[Sequence[Rect]], bounds: Rect) -> List[Optional[Rect]]:
    """For each label in order, its first candidate inside ``bounds`` that overlaps none of the
    places taken before it; None when every candidate is out or taken."""
    taken: List[Rect] = []
    out: List[Optional[Rect]] = []
    for candidates in requests:
        chosen = next(
            (c for c in candidates if inside(c, bounds) and not any(overlaps(c, t) for t in taken)),
            None,
        )
        if chosen is not None:
            taken.append(chosen)
        out.append(chosen)
    return out


def line_candidates(y: float, w: float, h: float, bounds: Rect) -> List[Rect]:
    """A horizontal line's label at pixel height ``y``: along the line, above then below."""
    x0, _y0, bw, _bh = bounds
    xs = [x0 + GAP + (bw - w - 2 * GAP) * f for f in ALONG]
    return [(x, y - h - 1, w, h) for x in xs] + [(x, y + 1, w, h) for x in xs]


def event_candidates(x: float, w: float, h: float, bounds: Rect) -> List[Rect]:
    """A vertical line's label at pixel ``x``: rows from the top, right then left of it."""
    top = bounds[1] + GAP
    rows = [top + k * (h + 1) for k in range(EVENT_ROWS)]
    return [(x + GAP, y, w, h) for y in rows] + [(x - GAP - w, y, w, h) for y in rows]


@dataclass
class Label:
    item: Any  # pg.TextItem
    horizontal: bool  # on a horizontal line (a value of y) or a vertical one (a time)
    value: float
    priority: int  # lower is placed first


class LabelLayer:
    """The labels of one plot, placed again when its view moves or is resized."""

    def __init__(self, plot: Any):
        self.plot = plot
        self.labels: Dict[Any, Label] = {}
        plot.vb.sigRangeChanged.connect(self.relayout)
        plot.vb.sigResized.connect(self.relayout)

    def set(
        self, key: Any, text: str, colour: str, horizontal: bool, value: float, priority: int
    ) -> None:
        label = self.labels.get(key)
        if label is None:
            item = pg.TextItem(
                text, color=colour, fill=pg.mkBrush(255, 255, 255, 210), anchor=(0, 0)
            )
            item.setZValue(50)
            self.plot.addItem(item, ignoreBounds=True)
            label = self.labels[key] = Label(item, horizontal, value, priority)
        elif label.item.textItem.toPlainText() != text:
            label.item.setText(text, color=colour)
        label.value, label.priority = value, priority

    def remove(self, key: Any) -> None:
        label = self.labels.pop(key, None)
        if label is not None:
            self.plot.removeItem(label.item)

    def shown(self) -> List[Any]:
        """The keys of the labels placed (not hidden for want of room)."""
        return [k for k, la in self.labels.items() if la.item.isVisible()]

    def relayout(self, *_: Any) -> None:
        vb = self.plot.vb
        r = vb.sceneBoundingRect()
        bounds: Rect = (r.x(), r.y(), r.width(), r.height())
        if r.width() <= 0 or r.height() <= 0:
            return
        (x_lo, x_hi), (y_lo, y_hi) = vb.viewRange()
        order = sorted(self.labels.values(), key=lambda la: la.priority)
        requests: List[List[Rect]] = []
        for la in order:
            size = la.item.boundingRect()
            w, h = size.width(), size.height()
            in_view = (y_lo <= la.value <= y_hi) if la.horizontal else (x_lo <= la.value <= x_hi)
            if not in_view:
                requests.append([])
            elif la.horizontal:
                y = vb.mapViewToScene(QPointF(x_lo, la.value)).y()
                requests.append(line_candidates(y, w, h, bounds))
            else:
                x = vb.mapViewToScene(QPointF(la.value, y_hi)).x()
                requests.append(event_candidates(x, w, h, bounds))
        for la, spot in zip(order, place(requests, bounds)):
            la.item.setVisible(spot is not None)
            if spot is not None:
                la.item.setPos(vb.mapSceneToView(QPointF(spot[0], spot[1])))
