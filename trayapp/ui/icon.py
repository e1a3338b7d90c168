"""The tray icon: two bars, RAM and the VRAM of the fullest GPU, in the guard's colour.

Each bar is a dark outline around a light track, so it reads on light and on dark panels; the
fill rises from the bottom. A known level never draws an empty bar: the track is a pale tint of
the guard's colour and the fill is at least ``MIN_FILL_SHARE`` of the bar, so 2% in use still
reads as a green (or amber, orange, red) bar and not as an empty box. A level not known (no GPU)
is the plain light track. Drawn without antialiasing on whole pixels, so 16, 22, 24 and 32 px
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
TRACK = QColor("#f4f4f4")  # the track of a level not known
TINT = 0.2  # a known level's track: this much of the guard's colour over TRACK
MIN_FILL_SHARE = 1 / 6  # a known level fills at least this much of the bar (2 px at 16 px)


def track_colour(colour: QColor) -> QColor:
    """The pale tint of ``colour`` a known level's track is drawn in."""

    def mix(a: int, b: int) -> int:
        return int(round(TINT * a + (1 - TINT) * b))

    return QColor(
        mix(colour.red(), TRACK.red()),
        mix(colour.green(), TRACK.green()),
        mix(colour.blue(), TRACK.blue()),
    )


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

    @property
    def min_fill(self) -> int:
        return max(2, int(round(self.inner_height * MIN_FILL_SHARE)))

    def fill_height(self, level: int) -> int:
        """Pixels filled for ``level`` (0..LEVELS): at least ``min_fill``."""
        share = int(round(self.inner_height * max(0, min(LEVELS, level)) / LEVELS))
        return max(self.min_fill, share)


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
            if level is None:
                p.fillRect(inner, TRACK)
                continue
            p.fillRect(inner, track_colour(colour))
            h = g.fill_height(level)
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
