"""The tray icon's pixels: colour per guard state, bar heights per fill level, every tray size,
readable on light and dark panels; and it is redrawn only when what it shows changes."""

from __future__ import annotations

from typing import List, Tuple

import pytest
from PySide6.QtGui import QColor, QImage, QPainter

from tests.ui.statuses import GiB, make_status
from trayapp.ui.icon import COLOURS, OUTLINE, SIZES, TRACK, geometry, make_icon, render_image
from trayapp.ui.model import LEVELS, UNREACHABLE, IconState, icon_state, quantise
from trayapp.ui.tray import TrayController
from trayapp.vocab import GuardLevel as L

TRAY_SIZES = (16, 22, 24, 32)
STATES = ("ok", "warn", "pause", "park", UNREACHABLE)


def rgb(img: QImage, x: int, y: int) -> Tuple[int, int, int, int]:
    c = img.pixelColor(x, y)
    return c.red(), c.green(), c.blue(), c.alpha()


def same(c: QColor, px: Tuple[int, int, int, int]) -> bool:
    return (c.red(), c.green(), c.blue(), 255) == px


def fill_rows(img: QImage, x: int, colour: QColor) -> List[int]:
    """Rows of column ``x`` painted in ``colour``."""
    return [y for y in range(img.height()) if same(colour, rgb(img, x, y))]


def bar_centres(size: int) -> Tuple[int, int]:
    g = geometry(size)
    return tuple(g.bar_rect(i).center().x() for i in (0, 1))  # type: ignore[return-value]


@pytest.mark.parametrize("size", TRAY_SIZES)
@pytest.mark.parametrize("state", STATES)
def test_bars_have_the_state_colour_and_the_right_height(qapp, size: int, state: str) -> None:
    img = render_image(IconState(state, ram_level=10, vram_level=LEVELS), size)
    assert (img.width(), img.height()) == (size, size)
    colour = COLOURS[state]
    ram_x, vram_x = bar_centres(size)
    ram, vram = fill_rows(img, ram_x, colour), fill_rows(img, vram_x, colour)
    g = geometry(size)
    # The VRAM bar (100%) is filled over its whole inside; the RAM bar (50%) over half of it.
    assert len(vram) == g.inner_height >= size // 2
    assert len(ram) == round(g.inner_height / 2)
    # Both fills are one run from the bottom of the track up.
    assert ram == list(range(ram[0], ram[0] + len(ram)))
    assert ram[-1] == vram[-1] == size - 1 - g.top - g.border
    # No other state's colour anywhere: the state reads from the colour alone.
    others = [COLOURS[s] for s in STATES if s != state]
    for x in range(size):
        for y in range(size):
            px = rgb(img, x, y)
            assert not any(same(o, px) for o in others), (x, y, px)


@pytest.mark.parametrize("size", TRAY_SIZES)
def test_levels_rise_with_the_fill(qapp, size: int) -> None:
    ram_x, _ = bar_centres(size)
    heights = [len(fill_rows(render_image(IconState(L.OK, level, None), size), ram_x,
                             COLOURS["ok"])) for level in range(LEVELS + 1)]
    assert heights[0] == geometry(size).min_fill > 0  # a known level is never an empty bar
    assert heights[-1] == geometry(size).inner_height
    assert heights == sorted(heights)
    assert len(set(heights)) >= min(LEVELS, geometry(size).inner_height) // 2


@pytest.mark.parametrize("size", TRAY_SIZES)
def test_unknown_vram_leaves_an_empty_track(qapp, size: int) -> None:
    img = render_image(IconState(L.WARN, 5, None), size)
    _, vram_x = bar_centres(size)
    assert fill_rows(img, vram_x, COLOURS["warn"]) == []
    assert len(fill_rows(img, vram_x, TRACK)) == geometry(size).inner_height


@pytest.mark.parametrize("size", TRAY_SIZES)
@pytest.mark.parametrize("panel", ["#f0f0f0", "#ffffff", "#202020", "#000000", "#3c3c3c"])
def test_bars_stand_out_on_light_and_dark_panels(qapp, size: int, panel: str) -> None:
    icon = render_image(IconState(L.OK, 0, 0), size)
    shown = QImage(size, size, QImage.Format.Format_ARGB32)
    shown.fill(QColor(panel))
    p = QPainter(shown)
    p.drawImage(0, 0, icon)
    p.end()
    bg = QColor(panel)
    for x in bar_centres(size):
        column = [shown.pixelColor(x, y) for y in range(size)]
        # Some pixel of each (empty) bar differs strongly from the panel: outline or track.
        contrast = max(abs(c.lightness() - bg.lightness()) for c in column)
        assert contrast >= 150, (panel, size, contrast)
    assert same(OUTLINE, rgb(icon, bar_centres(size)[0], geometry(size).top))


def test_the_icon_holds_every_size(qapp) -> None:
    icon = make_icon(IconState(L.PARK, 3, 7))
    assert sorted(s.width() for s in icon.availableSizes()) == sorted(SIZES)


def test_quantised_levels_ignore_tiny_changes() -> None:
    assert quantise(0.501) == quantise(0.509) == 10
    assert quantise(None) is None and quantise(float("nan")) is None
    assert quantise(-1) == 0 and quantise(2) == LEVELS
    a = icon_state(make_status(available=8 * GiB))
    b = icon_state(make_status(available=8 * GiB + 20 * 1024**2))  # 20 MiB more free
    assert a == b
    assert icon_state(make_status(available=2 * GiB)) != a
    assert icon_state(make_status(L.WARN, available=8 * GiB)).state == "warn"
    assert icon_state(make_status(), reachable=False).state == UNREACHABLE
    assert icon_state(None) == IconState()


def test_the_tray_redraws_only_when_the_icon_changes(qtbot) -> None:
    tray = TrayController()
    first = tray.redraws
    assert tray.icon_state == IconState()  # grey and empty before the engine answers
    assert tray.update(make_status(available=8 * GiB), True) is True
    key = tray.current_icon().cacheKey()
    for extra in range(0, 50 * 1024**2, 5 * 1024**2):  # 0..50 MiB of noise
        assert tray.update(make_status(available=8 * GiB + extra), True) is False
    assert tray.current_icon().cacheKey() == key
    assert tray.update(make_status(L.WARN, available=8 * GiB), True) is True
    assert tray.update(None, False, "the engine went away") is True
    assert tray.icon_state is not None and tray.icon_state.state == UNREACHABLE
    # Unreachable keeps the last levels, drawn grey.
    assert tray.icon_state.ram_level == quantise(0.5)
    assert tray.redraws == first + 3
