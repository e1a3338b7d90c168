"""The tray icon never draws a known level as an empty box: at 0%, 2%, 50% and 100% in use, at
16, 22 and 24 px, the bar holds pixels of the guard's colour and its track is a tint of that
colour (not the plain track of a level not known); each state keeps its own colour."""

from __future__ import annotations

from typing import Dict, List, Tuple

import pytest
from PySide6.QtCore import QRect
from PySide6.QtGui import QColor, QImage

from tests.ui.statuses import make_status
from trayapp.ui.icon import COLOURS, TRACK, geometry, render_image, track_colour
from trayapp.ui.model import IconState, icon_state
from trayapp.vocab import GuardLevel as L

SIZES = (16, 22, 24)
USE = (0.0, 0.02, 0.5, 1.0)
STATES = (L.OK, L.WARN, L.PAUSE, L.PARK)


def inside(size: int, which: int) -> QRect:
    g = geometry(size)
    return g.bar_rect(which).adjusted(g.border, g.border, -g.border, -g.border)


def counts(img: QImage, rect: QRect) -> Dict[Tuple[int, int, int], int]:
    out: Dict[Tuple[int, int, int], int] = {}
    for x in range(rect.left(), rect.right() + 1):
        for y in range(rect.top(), rect.bottom() + 1):
            c = img.pixelColor(x, y)
            key = (c.red(), c.green(), c.blue())
            out[key] = out.get(key, 0) + 1
    return out


def key(c: QColor) -> Tuple[int, int, int]:
    return c.red(), c.green(), c.blue()


def state_at(state: str, use: float) -> IconState:
    """The icon of an engine status with ``use`` of RAM and of GPU 0's memory in use."""
    st = make_status(state)
    assert st.memory is not None
    total = st.memory.total_bytes
    gpu_total = st.gpus[0].memory_total_bytes
    return icon_state(make_status(state, available=total * (1 - use),
                                  vram_used=gpu_total * use))


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("use", USE)
@pytest.mark.parametrize("state", STATES)
def test_a_known_level_is_never_an_empty_bar(qapp, size: int, use: float, state: str) -> None:
    img = render_image(state_at(state, use), size)
    g = geometry(size)
    colour, tint = key(COLOURS[state]), key(track_colour(COLOURS[state]))
    for which in (0, 1):  # RAM, then VRAM
        rect = inside(size, which)
        px = counts(img, rect)
        filled = px.get(colour, 0)
        assert filled >= g.min_fill * rect.width() > 0, (which, px)
        # The rest is the tinted track: no plain (white) track, no other state's colour.
        assert filled + px.get(tint, 0) == rect.width() * rect.height(), (which, px)
        assert key(TRACK) not in px
        if use == 1.0:
            assert filled == rect.width() * rect.height()
        elif use == 0.5:
            assert filled == rect.width() * round(g.inner_height / 2)
        else:  # 0% and 2%: the minimum fill, a visible run at the bottom
            assert filled == rect.width() * g.min_fill >= 2 * rect.width()


@pytest.mark.parametrize("size", SIZES)
def test_the_states_stay_apart_at_low_use(qapp, size: int) -> None:
    """At 2% in use each state's bar is told from every other's by both its fill and its
    track colour."""
    seen: List[Tuple[Tuple[int, int, int], Tuple[int, int, int]]] = []
    for state in STATES:
        img = render_image(state_at(state, 0.02), size)
        px = counts(img, inside(size, 0))
        fill, tint = key(COLOURS[state]), key(track_colour(COLOURS[state]))
        assert set(px) == {fill, tint}
        seen.append((fill, tint))
    fills = [f for f, _ in seen]
    tints = [t for _, t in seen]
    assert len(set(fills)) == len(set(tints)) == len(STATES)
    assert not set(fills) & set(tints)


@pytest.mark.parametrize("size", SIZES)
def test_the_track_tint_is_pale_and_the_fill_stands_out_of_it(qapp, size: int) -> None:
    for state in STATES:
        fill, tint = COLOURS[state], track_colour(COLOURS[state])
        assert tint.lightness() >= 170  # a light track: it reads on a dark panel too
        assert tint.lightness() - fill.lightness() >= 50


def test_a_level_not_known_stays_the_plain_track(qapp) -> None:
    img = render_image(IconState(L.OK, 0, None), 16)
    assert set(counts(img, inside(16, 1))) == {key(TRACK)}
