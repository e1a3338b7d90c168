"""What a user reads in a terminal or a log line: one line, whatever the input held.

A value a user typed (an argument, a path, a key in ``config.toml``) can hold a carriage return,
a newline or an escape sequence; echoed as it is, it would break the message over several lines
or move the cursor. Such characters are shown as Python escapes (``\\r``, ``\\x1b``) instead.
"""

from __future__ import annotations

from typing import Union


def _escape(ch: str) -> str:
    return ch if ch.isprintable() or ch == " " else repr(ch)[1:-1]


def one_line(value: Union[str, BaseException], limit: int = 0) -> str:
    """``value`` as one printable line; an exception gives its message (or its type's name when
    the message is empty). ``limit`` > 0 cuts the result to that length."""
    if isinstance(value, BaseException):
        text = str(value).strip() or type(value).__name__
    else:
        text = value
    if not text.isprintable():
        text = "".join(_escape(ch) for ch in text)
    return text[:limit] if limit > 0 else text
