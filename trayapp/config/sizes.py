"""Sizes and thresholds as settings write them ("2 GiB", "15%"), and the error a bad value
raises (its message names the problem in one line)."""

from __future__ import annotations

import math
import re
import reprlib
from dataclasses import dataclass
from typing import Any, Optional

from trayapp.errors import Refused
from trayapp.formats import format_bytes
from trayapp.text import one_line


class ConfigError(Refused):
    """A value that cannot be used; the message names the problem in one line. ``whole``: the
    message says all there is (a caller that words the error anew keeps it as it is)."""

    def __init__(self, message: str, *, whole: bool = False) -> None:
        super().__init__(message)
        self.whole = whole


class ConfigConflict(Refused):
    """The file changed since the caller read it; nothing was written."""


# A value in a message is shown cut short: a file may hold a megabyte string or a deep array.
_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = 40
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxdict, _SHOWN.maxlong = 1, 3, 2, 30


def _shown(value: Any) -> str:
    return _SHOWN.repr(value)


def _named(key: Any) -> str:
    """A key from the file as it can be printed: one line, cut short."""
    return one_line(str(key), limit=60)


SIZE_MAX_BYTES = 2**63 - 1  # what the kernel and SQLite can count


_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kb": 1000,
    "kib": 1024,
    "m": 1024**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1024**4,
    "tb": 1000**4,
    "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: Any) -> int:
    """``"2 GiB"`` -> bytes. A bare number is bytes. Raises ConfigError on anything else."""
    if isinstance(text, bool):
        raise ConfigError(f"{text!r} is not a size")
    if isinstance(text, (int, float)):
        if text < 0:
            raise ConfigError(f"{_shown(text)} is negative")
        return _bounded_size(text, text)
    m = _SIZE_RE.match(str(text)) if isinstance(text, str) else None
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise ConfigError(f'{_shown(text)} is not a size like "2048 MiB" or "2 GiB"')
    return _bounded_size(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()], text)


def _bounded_size(n: float, text: Any) -> int:
    if not (isinstance(n, int) or math.isfinite(n)) or n > SIZE_MAX_BYTES:
        raise ConfigError(f"{_shown(text)} is larger than any memory (8 EiB at most)", whole=True)
    return int(n)


@dataclass(frozen=True)
class Threshold:
    """An amount of available memory, as a share of the total or as a size."""

    percent: Optional[float] = None
    size_bytes: Optional[int] = None

    @classmethod
    def parse(cls, value: Any) -> Threshold:
        text = value.strip() if isinstance(value, str) else ""
        if text.endswith("%"):
            try:
                pct = float(text[:-1])
            except ValueError:
                raise ConfigError(f'{_shown(value)} is not a percentage like "15%"') from None
            if not 0 <= pct <= 100:
                raise ConfigError(f"{_shown(value)} is not between 0% and 100%")
            return cls(percent=pct)
        try:
            return cls(size_bytes=parse_size(value))
        except ConfigError as e:
            if e.whole:
                raise
            raise ConfigError(
                f'{_shown(value)} is not a percentage like "15%" or a size like "2 GiB"'
            ) from None

    def bytes_of(self, total_bytes: int) -> int:
        if self.percent is not None:
            return int(total_bytes * self.percent / 100.0)
        return int(self.size_bytes or 0)

    def __str__(self) -> str:
        if self.percent is not None:
            return f"{self.percent:g}%"
        return format_bytes(self.size_bytes or 0)
