"""Checks of what a job sends, bounded: integers in range, finite numbers, short texts with
control characters escaped, lists of bounded length, free-form values of bounded depth. Each
check takes a value and gives it back checked, or raises ``Bad`` (a few words why).

Stdlib only, no I/O: the job's messages (``jobs.messages``) are parsed with these.
"""

from __future__ import annotations

import math
from typing import Any, Callable, FrozenSet, Tuple

from trayapp.text import one_line

# Bounds for what a job may send. Generous for a real runner, small enough that nothing built
# from them (a copy, a JSON dump, a table row) can be slow or deep.
MAX_COUNT = 2**53  # epochs, steps, a fit's number: exact as a float too
MAX_BYTES = 2**60  # a byte count (an exabyte)
MAX_PID = 2**31
MAX_NAME = 200  # a metric, device, option or version name
MAX_TEXT = 500  # a note
MAX_PATH = 4096
MAX_ITEMS = 64  # list items or object keys in one value
MAX_DEPTH = 4  # nesting of a free-form value (an applied option's value, the options)


class Bad(ValueError):
    """A field that failed its check; the message says why, in a few words."""


# -- field checks -------------------------------------------------------------------------------


def int_in(lo: int, hi: int) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, bool):
            raise Bad("not a number")
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        if not isinstance(value, int):
            raise Bad("not an integer")
        if not lo <= value <= hi:
            raise Bad("out of range")
        return value

    return check


def optional(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def check_optional(value: Any) -> Any:
        return None if value is None else check(value)

    return check_optional


def text(limit: int) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if not isinstance(value, str):
            raise Bad("not a text")
        return one_line(value[: limit * 4], limit)

    return check


def choice(allowed: FrozenSet[str]) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if not isinstance(value, str) or value not in allowed:
            raise Bad("not one of " + ", ".join(sorted(allowed)))
        return value

    return check


def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise Bad("not true or false")
    return value


def number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Bad("not a number")
    try:
        number = float(value)
    except OverflowError:
        raise Bad("out of range") from None
    if not math.isfinite(number):
        raise Bad("not a finite number")
    return number


def plain(value: Any, depth: int = MAX_DEPTH) -> Any:
    """A free-form JSON value, checked: texts escaped and cut, numbers finite (integers within
    ``MAX_COUNT``), at most ``MAX_ITEMS`` items or keys, nested at most ``depth`` deep.
    Raises Bad for anything else (a deeper value is dropped whole, not cut)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if abs(value) > MAX_COUNT:
            raise Bad("out of range")
        return value
    if isinstance(value, float):
        return number(value)
    if isinstance(value, str):
        return text(MAX_NAME)(value)
    if isinstance(value, (list, dict)):
        if depth <= 0:
            raise Bad("nested too deeply")
        if len(value) > MAX_ITEMS:
            raise Bad("too many items")
        if isinstance(value, list):
            return [plain(v, depth - 1) for v in value]
        out = {}
        for k, v in value.items():
            out[text(MAX_NAME)(k)] = plain(v, depth - 1)
        return out
    raise Bad("not JSON")


def plain_at(depth: int) -> Callable[[Any], Any]:
    return lambda value: plain(value, depth)


def objects(item: Callable[[Any], Any], limit: int = MAX_ITEMS) -> Callable[[Any], Tuple]:
    def check(value: Any) -> Tuple:
        if not isinstance(value, list):
            raise Bad("not a list")
        if len(value) > limit:
            raise Bad("too many items")
        return tuple(item(v) for v in value)

    return check
