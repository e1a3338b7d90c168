"""Messages echo what a user typed or a job sent; whatever it holds, the message stays one
printable line: no control character, no bidi control, no markup where markup is rendered."""

from __future__ import annotations

import io
import logging
import subprocess
import sys
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trayapp.logformat import LogFormatter
from trayapp.text import lines, notice, one_line

# Each character a terminal or a text renderer acts on rather than shows.
HOSTILE = {
    "ESC": "\x1b", "BEL": "\x07", "NUL": "\x00", "BS": "\x08", "TAB": "\t", "DEL": "\x7f",
    "CSI (C1)": "\x9b", "NEL (C1)": "\x85", "OSC (C1)": "\x9d",
    "LRE": "\u202a", "RLE": "\u202b", "PDF": "\u202c", "LRO": "\u202d", "RLO": "\u202e",
    "LRI": "\u2066", "RLI": "\u2067", "FSI": "\u2068", "PDI": "\u2069",
    "LRM": "\u200e", "RLM": "\u200f", "ALM": "\u061c",
    "LINE SEPARATOR": "\u2028", "PARAGRAPH SEPARATOR": "\u2029",
}


def raw_controls(text: str, allowed: str = "") -> list:
    """The characters of ``text`` that a terminal or renderer would act on."""
    return [ch for ch in text if ch not in allowed and (
        unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp") or ch in HOSTILE.values())]


def test_control_characters_are_shown_as_escapes() -> None:
    assert one_line("a\rb\nc\x1b[31m\x00") == "a\\rb\\nc\\x1b[31m\\x00"
    assert one_line("line\u2028sep\x85") == "line\\u2028sep\\x85"


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_every_control_and_bidi_character_is_shown_as_its_escape(name: str) -> None:
    ch = HOSTILE[name]
    out = one_line(f"a{ch}b")
    assert out == "a" + repr(ch)[1:-1] + "b"
    assert raw_controls(out) == []


def test_printable_text_is_kept_as_it_is() -> None:
    assert one_line("ünïcode 日本 path/with spaces") == "ünïcode 日本 path/with spaces"
    assert one_line("שלום עולם مرحبا <b>&amp;</b> 🙂") == "שלום עולם مرحبا <b>&amp;</b> 🙂"


def test_escaping_twice_changes_nothing() -> None:
    once = one_line("\x1b]0;pwned\x07\u202e")
    assert one_line(once) == once == "\\x1b]0;pwned\\x07\\u202e"


def test_a_view_keeps_its_lines_and_escapes_the_rest() -> None:
    assert lines("ID  NAME\nj1  \x1b[2Jevil\r\u202e\n") == "ID  NAME\nj1  \\x1b[2Jevil\\r\\u202e\n"


def test_a_notification_body_has_no_markup_and_no_control_character() -> None:
    out = notice("job a1: <a href=x><img src=y> & \x1b[2J\u202e")
    assert out == "job a1: &lt;a href=x&gt;&lt;img src=y&gt; &amp; \\x1b[2J\\u202e"
    assert "<" not in out and raw_controls(out) == []


def test_a_log_record_is_one_line_and_its_traceback_stays_readable() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(LogFormatter("%(levelname)s %(name)s: %(message)s"))
    log = logging.getLogger("headroom.test-text")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning("job %s: %s", "a1", "\x1b]0;pwned\x07\nFAKE engine line\u202e\x9b")
        try:
            raise ValueError("bad \x1b[2J name")
        except ValueError:
            log.exception("failed for %s", "\x1b[31mred")
    finally:
        log.removeHandler(handler)
    out = stream.getvalue()
    assert raw_controls(out, allowed="\n") == []
    first, second, *trace = out.rstrip("\n").split("\n")
    assert first == ("WARNING headroom.test-text: job a1: \\x1b]0;pwned\\x07\\nFAKE engine "
                     "line\\u202e\\x9b")
    assert second == "ERROR headroom.test-text: failed for \\x1b[31mred"
    assert trace[0] == "Traceback (most recent call last):"  # its lines are kept
    assert trace[-1] == "ValueError: bad \\x1b[2J name"


def test_an_exception_gives_its_message_or_its_type() -> None:
    assert one_line(OSError("disk\nfull")) == "disk\\nfull"
    assert one_line(ValueError("  ")) == "ValueError"


def test_limit_cuts_the_line() -> None:
    assert one_line("x" * 500, 300) == "x" * 300


@given(st.text())
def test_any_text_is_one_printable_line(text: str) -> None:
    out = one_line(text)
    assert len(out.splitlines()) <= 1
    assert all(ch.isprintable() for ch in out)
    assert raw_controls(out) == []
    assert "<" not in notice(text)


def test_the_command_line_echoes_a_carriage_return_as_an_escape() -> None:
    proc = subprocess.run([sys.executable, "-m", "trayapp", "status", "\r\x1b[2J"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "headroom status: unrecognized arguments: \\r\\x1b[2J (see 'headroom status --help')"]
