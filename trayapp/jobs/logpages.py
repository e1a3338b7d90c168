"""A job's log: opened to append (the job's stdout and stderr), and read back a page at a time
for the control channel, without following a link, waiting on a FIFO or cutting a character.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

from trayapp import private
from trayapp.errors import Refused
from trayapp.jobs.record import JobRecord
from trayapp.jsonvalue import JSONObject
from trayapp.runner import joblog
from trayapp.text import one_line

LOG_TAIL_BYTES = 64 * 1024


@dataclass(frozen=True)
class LogPage:
    """A page of a job's log: its text, the offset to read on from, the log's size and the
    offset this page was read from."""

    data: str = ""
    offset: int = 0
    size: int = 0
    start: int = 0

    def to_json(self) -> JSONObject:
        return {"data": self.data, "offset": self.offset, "size": self.size, "start": self.start}

    @classmethod
    def from_json(cls, data: Any) -> LogPage:
        """A page from the engine's answer; a field missing or of the wrong type reads as
        empty (0, "")."""
        values = data if isinstance(data, Mapping) else {}
        text = values.get("data")

        def count(name: str) -> int:
            v = values.get(name)
            return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0

        return cls(
            text if isinstance(text, str) else "", count("offset"), count("size"), count("start")
        )


# Logs go back as JSON with non-ASCII escaped (up to 6 bytes a byte): stay under the 1 MiB limit.
LOG_MAX_BYTES = 128 * 1024


def read_page(path: Path, offset: Optional[int], max_bytes: Optional[int], cap: int) -> LogPage:
    """The log from byte ``offset`` (default: the last 64 KiB); ``cap``: the size the log is
    trimmed at (to find where a trimmed log goes on).

    Returns the page (its text, the next offset, the file's size, the offset read from); a
    character cut at either end is left for the next read. Raises ValueError for a
    negative offset, OSError for a log that cannot be read."""
    limit = LOG_MAX_BYTES if max_bytes is None else max(1, min(int(max_bytes), LOG_MAX_BYTES))
    if offset is not None and offset < 0:
        raise Refused("job_log: offset must be 0 or more")
    try:
        with open_to_read(path) as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            tail = offset is None
            start = max(0, size - LOG_TAIL_BYTES) if offset is None else offset
            if start > size:  # trimmed (at its marker) or replaced (from the top)
                start = joblog.marker_offset(f.fileno(), cap) or 0
            f.seek(start)
            data = f.read(min(limit, size - start))
    except FileNotFoundError:
        return LogPage("", offset or 0, 0, offset or 0)
    skip = 0
    if tail and start > 0:
        while skip < len(data) and skip < 4 and (data[skip] & 0xC0) == 0x80:
            skip += 1
    keep = complete_utf8(data)
    text = data[skip:keep].decode("utf-8", errors="replace")
    return LogPage(text, start + keep, size, start + skip)


def log_cap(rec: JobRecord, default: int) -> int:
    """The cap a job's log was launched with (``default``, the setting, for one launched
    before caps were kept)."""
    cap = rec.process.log_max_bytes if rec.process is not None else None
    if cap is not None and cap > 0:
        return cap
    return default


def complete_utf8(data: bytes) -> int:
    """Length of ``data`` without a UTF-8 character cut off at its end."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        b = data[n - back]
        if b & 0x80 == 0:
            return n
        if b & 0xC0 == 0xC0:  # a lead byte: is its character complete?
            need = 2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4
            return n if back >= need else n - back
    return n


def open_to_read(path: Path) -> Any:
    """A job's log, opened to read without following a link or waiting on a FIFO (the job's
    script can put either in its folder). Raises OSError, one that says what is wrong."""
    flags = (
        os.O_RDONLY
        | getattr(os, "O_NOFOLLOW", 0)
        | getattr(os, "O_NONBLOCK", 0)
        | getattr(os, "O_CLOEXEC", 0)
        | getattr(os, "O_BINARY", 0)
    )
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OSError(e.errno, "it is a link, not a regular file") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "it is not a regular file")
        return open(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def open_to_append(path: Path) -> Any:
    """The job's log, opened to append (the job's stdout and stderr: O_APPEND, so writes land at
    the end after the log keeper trims it). Raises ValueError saying why it cannot be opened."""
    try:
        return private.open_private_file(path, "ab")
    except OSError as e:
        raise Refused(
            f"cannot start the job: cannot open its log {path}: {e.strerror or one_line(e)}"
        ) from None
