"""What every command module shares: the exit statuses, the bad-usage error, the one line a
command says on stderr and the one way a view reaches stdout. Imports nothing of the other
command modules, which all import it."""

from __future__ import annotations

import argparse
import sys
from typing import Optional

from trayapp.text import lines, one_line

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NO_ENGINE = 0, 1, 2, 3
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports SIGINT


class UsageError(Exception):
    """Bad usage or bad input: one line, exit status 2."""


def say(message: object) -> None:
    """``headroom: MESSAGE`` on stderr, as one printable line."""
    text = message if isinstance(message, (str, BaseException)) else str(message)
    print(f"headroom: {one_line(text)}", file=sys.stderr, flush=True)


def show(text: str, end: str = "\n") -> None:
    """A view on stdout, each of its lines escaped as ``one_line`` does: a view shows what jobs
    and files hold (a job's name, its notes, a GPU process's name), which may be anything."""
    print(lines(text), end=end, flush=True)


def demo(args: argparse.Namespace) -> bool:
    """Whether the command was given ``--demo`` (simulated GPUs)."""
    return bool(getattr(args, "demo", False))


def config_file(args: argparse.Namespace) -> Optional[str]:
    """The ``--config`` the command was given, or None."""
    return getattr(args, "config", None)
