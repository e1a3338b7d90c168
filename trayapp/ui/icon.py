"""The tray icon: two bars, RAM and the VRAM of the fullest GPU, in the guard's colour.

Each bar is a dark outline around a light track, so it reads on light and on dark panels; the
fill rises from the bottom. Drawn without antialiasing on whole pixels, so 16, 22, 24 and 32 px
stay crisp and tests can count pixels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Tuple

from PySide6.QtCore import QRect, Qt
from PySide6.QtGui import QColor, QIcon, QImage, QPainter, QPixmap

from trayapp.ui.model import LEVELS, UNREACHABLE, IconState
from trayapp.vocab import GuardLevel as L

SIZES: Tuple[int, ...] = (16, 22, 24, 32, 48, 64)

COLOURS: Dict[str, QColor] = {
    L.OK: QColor("#2e9d46"),
    L.WARN: QColor("#f2a900"),
    L.PAUSE: QColor("#ee6a1c"),
    L.PARK: QColor("#d7263d"),
    UNREACHABLE: QColor("#8c8c8c"),
}
OUTLINE = QColor("#1c1c1c")
TRACK = QColor("#f4f4f4")


@dataclass(frozen=True)
class BarGeometry:
    """Where the bars sit in an icon of one size (pixels)."""

    size: int
    left_x: int  # the RAM bar's outer left edge; the VRAM bar follows after ``gap``
    top: int
    bar_width: int
    bar_height: int
    border: int
    gap: int

    @property
    def inner_height(self) -> int:
        return self.bar_height - 2 * self.border

    def bar_rect(self, which: int) -> QRect:
        x = self.left_x + which * (self.bar_width + self.gap)
        return QRect(x, self.top, self.bar_width, self.bar_height)

    def fill_height(self, level: int) -> int:
        return int(round(self.inner_height * max(0, min(LEVELS, level)) / LEVELS))


def geometry(size: int) -> BarGeometry:
    pad = max(1, size // 16)
    gap = max(2, size // 8)
    border = max(1, size // 16)
    bar_width = (size - 2 * pad - gap) // 2
    left = (size - (2 * bar_width + gap)) // 2
    return BarGeometry(size, left, pad, bar_width, size - 2 * pad, border, gap)


def render_image(state: IconState, size: int) -> QImage:
    """The icon at ``size`` x ``size`` pixels on a transparent background."""
    img = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    img.fill(Qt.GlobalColor.transparent)
    g = geometry(size)
    colour = COLOURS.get(state.state, COLOURS[UNREACHABLE])
    p = QPainter(img)
    try:
        p.setRenderHint(QPainter.RenderHint.Antialiasing, False)
        for which, level in enumerate((state.ram_level, state.vram_level)):
            outer = g.bar_rect(which)
            p.fillRect(outer, OUTLINE)
            inner = outer.adjusted(g.border, g.border, -g.border, -g.border)
            p.fillRect(inner, TRACK)
            if level is None:
                continue
            h = g.fill_height(level)
            if h > 0:
                p.fillRect(QRect(inner.left(), inner.bottom() + 1 - h, inner.width(), h), colour)
    finally:
        p.end()
    return img


def make_icon(state: IconState) -> QIcon:
    """A QIcon holding the drawing at every tray size, so the panel picks a crisp one."""
    icon = QIcon()
    for size in SIZES:
        icon.addPixmap(QPixmap.fromImage(render_image(state, size)))
    return icon
