"""Log lines that a job's words cannot break: ``LogFormatter`` escapes every line it writes
(``text.one_line``). Apart from ``trayapp.text`` so that what only needs the words (the guard's
pure parts) does not load ``logging`` and its threads."""

from __future__ import annotations

import logging
from typing import Any

from trayapp.text import lines, one_line


class LogFormatter(logging.Formatter):
    """A log line per record whatever its message held: the line escaped as ``one_line`` does
    (so a job's name cannot break it or reach the terminal that tails the log), a traceback
    below it escaped line by line."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        return one_line(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:  # noqa: N802 - logging's name
        return lines(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:  # noqa: N802 - logging's name
        return lines(super().formatStack(stack_info))
