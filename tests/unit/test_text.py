"""Messages echo what a user typed; whatever it holds, the message stays one printable line."""

from __future__ import annotations

import subprocess
import sys

from hypothesis import given
from hypothesis import strategies as st

from trayapp.text import one_line


def test_control_characters_are_shown_as_escapes() -> None:
    assert one_line("a\rb\nc\x1b[31m\x00") == "a\\rb\\nc\\x1b[31m\\x00"
    assert one_line("line\u2028sep\x85") == "line\\u2028sep\\x85"


def test_printable_text_is_kept_as_it_is() -> None:
    assert one_line("ünïcode 日本 path/with spaces") == "ünïcode 日本 path/with spaces"


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


def test_the_command_line_echoes_a_carriage_return_as_an_escape() -> None:
    proc = subprocess.run([sys.executable, "-m", "trayapp", "status", "\r\x1b[2J"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "headroom status: unrecognized arguments: \\r\\x1b[2J (see 'headroom status --help')"]
