"""The terminal of a followed job: the script's output as it comes, Headroom's own lines, and a
status line, kept out of each other's way.

A script's line can stay open for a long time: a Keras progress bar is one line redrawn with
``\\b`` and ``\\r`` for the whole epoch. Headroom never writes into it. Its status line (a
terminal only) is drawn only when the script's output stands at the start of a line, and cleared
before the script writes again. A message that cannot wait (the guard paused the job) gets its
own line: on a terminal the open line is cleared, the message printed, and the open line drawn
again under it, so the bar goes on redrawing itself there; in a file or a pipe shared with the
script's output, the open line is ended first (between two of the bar's updates, never inside
one). When the script's output and Headroom's lines go to different places, nothing is needed.
"""

from __future__ import annotations

import os
import shutil
from typing import Optional, TextIO

CLEAR = "\r\x1b[K"
OPEN_LINE_MAX = 4096  # of the script's open line kept to draw it again


def same_file(a: TextIO, b: TextIO) -> bool:
    """Whether two streams write to the same file, pipe or terminal (True when it cannot be
    told: the cautious answer)."""
    try:
        sa, sb = os.fstat(a.fileno()), os.fstat(b.fileno())
    except (AttributeError, OSError, ValueError):
        return True
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def visible_tail(line: str) -> str:
    """What a terminal shows of an open line: the text after its last carriage return, without
    the backspaces a progress bar redraws with."""
    return line[line.rfind("\r") + 1 :].replace("\b", "")


class Screen:
    """``out``: where the script's output goes; ``err``: where Headroom's lines go. ``tty``:
    ``out`` is a terminal (a status line may be drawn); ``shared``: both reach the same place
    (default: they are the same file)."""

    def __init__(
        self, out: TextIO, err: TextIO, tty: Optional[bool] = None, shared: Optional[bool] = None
    ):
        self.out = out
        self.err = err
        self.tty = out.isatty() if tty is None else tty
        self.shared = same_file(out, err) if shared is None else shared
        self.open_line = ""  # the script's output since its last newline
        self.status_shown = False

    @property
    def at_line_start(self) -> bool:
        """The script's output ends with a newline (or there is none yet)."""
        return not self.open_line

    def output(self, text: str) -> None:
        """The script's output, as it came."""
        if not text:
            return
        self.clear_status()
        self.out.write(text)
        self.out.flush()
        cut = text.rfind("\n")
        if cut >= 0:
            self.open_line = text[cut + 1 :]
        else:
            self.open_line = (self.open_line + text)[-OPEN_LINE_MAX:]

    def note(self, line: str) -> None:
        """One of Headroom's lines (``line`` without its newline), on its own line."""
        self.clear_status()
        open_line = self.open_line if self.shared else ""
        if open_line:
            if self.tty:
                self.out.write(CLEAR)
            else:
                self.out.write("\n")
            self.out.flush()
        self.err.write(line + "\n")
        self.err.flush()
        if open_line:
            if self.tty:
                self.out.write(visible_tail(open_line))  # the bar, under the message
                self.out.flush()
            else:
                self.open_line = ""

    def status(self, line: str) -> bool:
        """Draw the status line (a terminal only, where the script's line is not open);
        returns whether it was drawn."""
        if not self.tty or self.open_line:
            return False
        self.out.write(CLEAR + line[: max(10, terminal_width() - 1)])
        self.out.flush()
        self.status_shown = True
        return True

    def clear_status(self) -> None:
        if self.status_shown:
            self.out.write(CLEAR)
            self.out.flush()
            self.status_shown = False

    def end_line(self) -> None:
        """Before the command's last words: the script's open line is ended."""
        self.clear_status()
        if self.open_line and self.shared:
            self.out.write("\n")
            self.out.flush()
            self.open_line = ""


def terminal_width() -> int:
    columns = shutil.get_terminal_size((100, 24)).columns
    return columns if columns >= 20 else 100  # a pseudo-terminal may say 0
