"""The command line: ``headroom [tray] | engine | status | run | jobs | logs | attach | pause |
resume | park | stop | doctor``. Every command is a client of the engine; bad usage exits 2 with
one line, no engine exits 3, and no traceback reaches the screen (it goes to ``crash.log``).

The package: ``base`` (exit statuses, UsageError), ``parser`` (the arguments), one module per
command (``status``, ``run`` with its follower in ``follow`` and the terminal in ``screen``,
``jobs`` with the job actions, ``logs`` with ``attach`` and ``resume --follow``, ``doctor``), and
here ``main``, which dispatches. The tray (Qt) and the engine's parts are imported by their own
commands only, so that ``headroom status`` starts fast.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import traceback
from typing import Callable, Dict, List, Optional, Sequence

from trayapp import config as configmod
from trayapp.cli.base import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_NO_ENGINE,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    say,
    show,
)
from trayapp.cli.doctor import cmd_doctor
from trayapp.cli.jobs import cmd_action, cmd_jobs
from trayapp.cli.kernel import cmd_kernel
from trayapp.cli.logs import cmd_attach, cmd_logs, cmd_resume
from trayapp.cli.parser import ACTIONS, build_parser
from trayapp.cli.run import cmd_run
from trayapp.cli.second_start import ask_running_tray
from trayapp.cli.status import cmd_status, format_status
from trayapp.config import Paths, get_paths
from trayapp.engine.client import EngineError, EngineUnavailable
from trayapp.private import UnsafePath, open_private_file, use_private_umask

Command = Callable[[argparse.Namespace, Paths], int]


def cmd_engine(args: argparse.Namespace, paths: Paths) -> int:
    # Here, not at the top: the engine's parts (store, guard, job manager) stay off the start
    # of every other command, ``headroom status`` first.
    from trayapp.engine.own_process import setup_logging  # off the other commands' path
    from trayapp.engine.service import Engine

    try:
        paths.ensure()
    except UnsafePath as e:
        # Bad input (the state folder): nothing is written to it, not even the log.
        say(f"refusing to start the engine: {e}")
        return EXIT_USAGE
    setup_logging(paths.log_file)
    engine = Engine(
        paths,
        configmod.load(paths.config_file),
        demo=args.demo,
        stay=args.stay,
        metrics=args.metrics,
    )
    return engine.run()


def cmd_tray(args: argparse.Namespace, paths: Paths) -> int:
    window = getattr(args, "open", None) or "dashboard"
    answer = ask_running_tray(paths, window)  # a tray runs: it opens the window, at once
    if answer == "":
        show(f"Headroom is already running; opened the {window}")
        return 0
    if answer is not None:
        say(answer)
        return EXIT_FAILED
    problem = no_display()
    if problem:
        say(problem)
        return EXIT_FAILED
    from trayapp.ui.app import run_tray  # here: Qt loads for the tray only, never for a command

    return run_tray(args, paths)


COMMANDS: Dict[Optional[str], Command] = {
    None: cmd_tray,
    "engine": cmd_engine,
    "status": cmd_status,
    "run": cmd_run,
    "jobs": cmd_jobs,
    "logs": cmd_logs,
    "attach": cmd_attach,
    "doctor": cmd_doctor,
    "kernel": cmd_kernel,
    **{name: cmd_action for name in ACTIONS},
    "resume": cmd_resume,
}
# The commands that may be given a --config file that is not there yet: the tray's settings
# window writes it, and the engine (the tray starts one with it) reads it once it is there.
CREATE_CONFIG = frozenset({None, "engine"})


def dispatch(args: argparse.Namespace, paths: Paths) -> int:
    """Run the command ``args.command`` (None: the tray); returns the exit status."""
    command = COMMANDS.get(args.command)
    if command is None:
        raise UsageError(f"unknown command {args.command}")
    if args.config and args.command not in CREATE_CONFIG and not paths.config_file.is_file():
        missing = "not a file" if paths.config_file.exists() else "no such file"
        raise UsageError(
            f"--config: {missing}: {paths.config_file} (to create it, start the "
            f"tray with it: headroom --config {paths.config_file})"
        )
    return command(args, paths)


def no_display() -> Optional[str]:
    """Why the tray cannot start here (a Linux machine with no desktop), or None. Qt would abort
    with a core dump and a page of plugin names; the commands work without a display."""
    if not sys.platform.startswith("linux"):
        return None
    platforms = [p.split(":")[0].strip() for p in os.environ.get("QT_QPA_PLATFORM", "").split(";")]
    if any(p and not p.startswith(("xcb", "wayland")) for p in platforms):
        return None  # offscreen, vnc, eglfs...: no desktop needed
    if os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"):
        return None
    return (
        "no display to show the tray on (DISPLAY and WAYLAND_DISPLAY are not set); "
        "without a desktop, use the commands: 'headroom run SCRIPT', 'headroom status', "
        "'headroom jobs' (see 'headroom --help')"
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The ``headroom`` command; returns its exit status."""
    use_private_umask()  # whatever Headroom writes is the user's alone
    args = build_parser().parse_args(argv)
    try:
        return dispatch(args, get_paths(args.config))
    except UsageError as e:
        say(e)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (``headroom status --json | head``): not an error.
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return EXIT_OK
    except EngineUnavailable as e:
        say(e)
        return EXIT_NO_ENGINE
    except EngineError as e:
        say(e)
        return EXIT_USAGE if e.code in ("refused", "bad_request") else EXIT_FAILED
    except Exception as e:  # no traceback on the user's screen; it goes to a file
        where = _save_traceback()
        say(
            f"internal error: {type(e).__name__}: {e}" + (f" (details in {where})" if where else "")
        )
        return EXIT_FAILED


def _argv_to_keep(argv: List[str]) -> List[str]:
    """``argv`` with the values of its --env options hidden (``NAME=...``): values are kept in
    one private file only, never in a log."""

    def hidden(value: str) -> str:
        return value.split("=", 1)[0] + "=..." if "=" in value else "..."

    def is_env(option: str) -> bool:  # argparse takes an abbreviation too (--en)
        return len(option) >= 3 and "--env".startswith(option)

    out: List[str] = []
    after_env = False
    for arg in argv:
        if after_env:
            out.append(hidden(arg))
            after_env = False
        elif arg.startswith("--") and "=" in arg and is_env(arg.split("=", 1)[0]):
            out.append(arg.split("=", 1)[0] + "=" + hidden(arg.split("=", 1)[1]))
        else:
            out.append(arg)
            after_env = is_env(arg)
    return out


def _save_traceback() -> Optional[str]:
    try:
        path = get_paths().data_dir / "crash.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open_private_file(path, "a", encoding="utf-8") as f:
            f.write(f"--- {time.ctime()} pid {os.getpid()} argv {_argv_to_keep(sys.argv)!r}\n")
            f.write(traceback.format_exc())
        return str(path)
    except Exception:
        logging.getLogger("headroom").debug("could not save the traceback", exc_info=True)
        return None


__all__ = [
    "main",
    "dispatch",
    "build_parser",
    "format_status",
    "no_display",
    "EXIT_OK",
    "EXIT_FAILED",
    "EXIT_USAGE",
    "EXIT_NO_ENGINE",
    "UsageError",
]
