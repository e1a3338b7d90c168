"""The terminal of a followed job (``trayapp.cli.screen``): Headroom's lines and its status line
never land inside a line of the script's output (a Keras progress bar is one line redrawn with
``\\b`` and ``\\r`` for a whole epoch)."""

from __future__ import annotations

import io

from trayapp.cli.screen import CLEAR, Screen, visible_tail

BAR_1 = "\x1b[1m 3/30\x1b[0m ━━ 2s 50ms/step - loss: 0.7012"
BAR_2 = "\b" * 40 + "\r\x1b[1m 4/30\x1b[0m ━━━ 2s 50ms/step - loss: 0.6990"


def test_a_note_in_the_middle_of_a_bar_on_a_terminal_redraws_the_bar_under_it() -> None:
    out = io.StringIO()
    screen = Screen(out, out, tty=True, shared=True)
    screen.output("Epoch 1/3\n" + BAR_1)
    screen.note("headroom: job ab12 paused by you")
    screen.output(BAR_2 + "\n")
    text = out.getvalue()
    # The bar's row is cleared, the note gets its own line, the bar is drawn again below it.
    assert text == ("Epoch 1/3\n" + BAR_1 + CLEAR + "headroom: job ab12 paused by you\n" +
                    BAR_1 + BAR_2 + "\n")
    assert visible_tail(BAR_1 + BAR_2).endswith("loss: 0.6990")


def test_a_note_in_a_shared_file_ends_the_open_line_between_two_updates() -> None:
    out = io.StringIO()
    screen = Screen(out, out, tty=False, shared=True)
    screen.output("Epoch 1/3\n" + BAR_1)
    screen.note("headroom: note")
    screen.output(BAR_2 + "\n")
    lines = out.getvalue().split("\n")
    assert lines[1] == BAR_1  # whole
    assert lines[2] == "headroom: note"
    assert lines[3] == BAR_2


def test_apart_streams_need_nothing() -> None:
    out, err = io.StringIO(), io.StringIO()
    screen = Screen(out, err, tty=False, shared=False)
    screen.output(BAR_1)
    screen.note("headroom: note")
    screen.output(BAR_2)
    assert out.getvalue() == BAR_1 + BAR_2
    assert err.getvalue() == "headroom: note\n"


def test_the_status_line_waits_for_the_end_of_the_scripts_line() -> None:
    out = io.StringIO()
    screen = Screen(out, out, tty=True, shared=True)
    screen.output(BAR_1)
    assert not screen.status("[ab12] running · epoch 1/3")
    assert out.getvalue() == BAR_1
    screen.output(BAR_2 + "\n")
    assert screen.status("[ab12] running · epoch 1/3")
    screen.output("Epoch 2/3\n")
    # Cleared before the script wrote again: the status text never shares a row with output.
    assert out.getvalue().endswith("\n" + CLEAR + "[ab12] running · epoch 1/3" + CLEAR +
                                   "Epoch 2/3\n")


def test_no_status_line_off_a_terminal_and_the_open_line_ended_at_the_end() -> None:
    out = io.StringIO()
    screen = Screen(out, out, tty=False, shared=True)
    assert not screen.status("x")
    screen.output("partial")
    screen.end_line()
    assert out.getvalue() == "partial\n" and screen.at_line_start
