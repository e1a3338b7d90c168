"""What a user reads in a terminal, a log line, a window or a notification: whatever the input
held, nothing in it can move the cursor, retitle the terminal, reorder the line or add markup.

A value a user typed (an argument, a path, a key in ``config.toml``) or a job sent (its name,
its script's file name, a note) can hold a carriage return, a newline, an escape sequence, a
bell or a bidi override; shown as it is, it would break the message over several lines, clear
the screen or make the line read backwards. Such characters are shown as Python escapes
(``\\r``, ``\\x1b``, ``\\u202e``) instead: every character that ``str.isprintable`` refuses
(Unicode's control, format, surrogate, private-use, unassigned and separator characters, so C0,
DEL, C1, the bidi embeddings, overrides, isolates and marks, U+2028 and U+2029), except the
plain space. Every other character is kept as it is.

``one_line`` is the one function every exit uses; ``lines`` is the same for a multi-line view,
``notice`` adds markup escaping for a notification, ``LogFormatter`` applies it to log records.
"""

from __future__ import annotations

import html
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


def lines(text: str) -> str:
    """A multi-line view (a table, a report) with each line escaped as ``one_line`` does: the
    newlines between its lines are kept, any other control character in them is not."""
    return "\n".join(one_line(line) for line in text.split("\n"))


def notice(value: Union[str, BaseException], limit: int = 0) -> str:
    """``one_line(value)`` for a desktop notification's body, which notification daemons may
    render as markup: ``&``, ``<`` and ``>`` escaped, so a job's text cannot show a link or an
    image (``limit`` cuts before the markup is escaped)."""
    return html.escape(one_line(value, limit), quote=False)
