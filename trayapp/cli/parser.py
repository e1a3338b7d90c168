"""The command line's arguments: ``headroom [tray] | engine | status | run | jobs | logs | attach
| pause | resume | park | stop | doctor | kernel``. Bad usage exits 2 with one line, naming the
command."""

from __future__ import annotations

import argparse
import difflib
from typing import Any, Dict, NoReturn

from trayapp import __version__
from trayapp.cli.base import EXIT_USAGE
from trayapp.jobs.options import add_run_arguments
from trayapp.jobs.spec_values import add_env_argument, add_option_arguments
from trayapp.text import one_line

ACTIONS = ("pause", "resume", "park", "stop")  # the job actions, each a command


class _Parser(argparse.ArgumentParser):
    commands: Dict[str, argparse.ArgumentParser] = {}  # the sub-commands, by name

    def error(self, message: str) -> NoReturn:
        # One line, no usage dump: the user sees what is wrong and where to look.
        for action in self._actions:
            # A REMAINDER positional (the script's own arguments) may be empty: never "required".
            if action.nargs == argparse.REMAINDER and action.metavar:
                message = message.replace(f", {action.metavar}", "")
        self.exit(EXIT_USAGE, f"{self.prog}: {one_line(message)} (see '{self.prog} --help')\n")

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        # An unknown option is named by the command it was given to, with the closest one it
        # has ("did you mean"), rather than by the top level.
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            command = getattr(ns, "command", None) or ""
            parser = self.commands.get(
                f"{command} {getattr(ns, 'kernel_command', None)}"
            ) or self.commands.get(command, self)
            message = f"unrecognized arguments: {' '.join(extras)}"
            known = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
            first = next((e.split("=", 1)[0] for e in extras if e.startswith("--")), None)
            close = difflib.get_close_matches(first, known, n=1) if first else []
            if close:
                message += f"; did you mean {close[0]}?"
            parser.error(message)
        return ns


def _common(parser: argparse.ArgumentParser, top: bool) -> None:
    # On sub-commands the defaults are SUPPRESS so they do not overwrite the top level's values.
    default = None if top else argparse.SUPPRESS
    parser.add_argument(
        "--config",
        metavar="PATH",
        default=default,
        help="use this config.toml instead of the one in the state folder",
    )
    parser.add_argument(
        "--demo",
        action="store_true",
        default=False if top else argparse.SUPPRESS,
        help="use simulated GPUs (to try Headroom without an NVIDIA GPU)",
    )


def _listen(text: str) -> str:
    from trayapp.config import ConfigError
    from trayapp.config.net import parse_listen

    try:
        if parse_listen(text) is None:
            raise ConfigError("it is empty")
    except ConfigError as e:
        raise argparse.ArgumentTypeError(f"{one_line(text, limit=60)!r}: {e}") from None
    return text.strip()


_ACTION_HELP = {
    "pause": "pause a job (it stops growing; memory stays)",
    "resume": "resume a paused job, or continue a parked or stopped one from its checkpoint",
    "park": "checkpoint a job and end it, freeing its memory",
    "stop": "end a job at the next batch (after a checkpoint, with a checkpoint folder); the "
    "rest of its script does not run",
}


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command; ``parse_args`` exits 2 with one line on bad usage."""
    p = _Parser(
        prog="headroom",
        description="Headroom watches RAM and GPU memory, launches Keras/TensorFlow "
        "training with real memory options, and pauses jobs before the "
        "machine locks up. Without a command it starts the tray.",
        epilog="HEADROOM_HOME=DIR keeps all state (settings, history, jobs) under DIR.",
    )
    p.add_argument("--version", action="version", version=f"headroom {__version__}")
    _common(p, top=True)
    p.add_argument(
        "--open",
        choices=("dashboard", "launch", "jobs", "settings", "machines"),
        help="also open this window at start",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    _engine_parsers(sub)
    _job_parsers(sub)
    _doctor_parser(sub)
    p.commands = dict(sub.choices)
    p.commands.update(_kernel_parsers(sub))
    return p


def _engine_parsers(sub: Any) -> None:
    """``engine`` and ``status``."""
    e = sub.add_parser("engine", help="run the engine (the guard) in the foreground")
    _common(e, top=False)
    e.add_argument("--stay", action="store_true", help="keep running with no clients and no jobs")
    e.add_argument(
        "--metrics",
        type=_listen,
        metavar="[ADDR:]PORT",
        help="serve Prometheus metrics at http://ADDR:PORT/metrics (a bare PORT "
        "listens on 127.0.0.1 only); overrides [metrics] listen in config.toml",
    )

    s = sub.add_parser("status", help="RAM, swap, pressure, GPUs, the guard and the jobs")
    _common(s, top=False)
    s.add_argument("--json", action="store_true", help="print the status as JSON")
    s.add_argument(
        "--watch",
        type=_positive_float,
        metavar="SECONDS",
        help="refresh every SECONDS until Ctrl-C",
    )


def _job_parsers(sub: Any) -> None:
    """``run``, ``jobs``, the job actions, ``logs`` and ``attach``."""
    r = sub.add_parser("run", help="launch a training script under the guard")
    _common(r, top=False)
    add_run_arguments(r)

    j = sub.add_parser("jobs", help="list the jobs")
    _common(j, top=False)
    j.add_argument("--json", action="store_true", help="print the jobs as JSON")
    j.add_argument("--all", action="store_true", help="include ended jobs (finished, stopped...)")

    for name in ACTIONS:
        a = sub.add_parser(name, help=_ACTION_HELP[name])
        _common(a, top=False)
        a.add_argument("job", metavar="JOB", help="job id or unique name")
        if name == "resume":
            a.add_argument(
                "--follow",
                "-f",
                action="store_true",
                help="then follow its output as 'headroom run' does (Ctrl-C leaves it running)",
            )

    lg = sub.add_parser("logs", help="a job's output (its log), ended jobs' too")
    _common(lg, top=False)
    lg.add_argument("job", metavar="JOB", help="job id or unique name")
    lg.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="go on printing its output until the job ends (Ctrl-C leaves it running)",
    )
    lg.add_argument("--tail", type=_count, metavar="N", help="only its last N lines")

    at = sub.add_parser(
        "attach",
        help="follow a job's output, progress and the guard's events "
        "again, as 'headroom run' does (Ctrl-C leaves it running)",
    )
    _common(at, top=False)
    at.add_argument("job", metavar="JOB", help="job id or unique name")


def _doctor_parser(sub: Any) -> None:
    d = sub.add_parser("doctor", help="check the driver, CUDA and TensorFlow build")
    _common(d, top=False)
    d.add_argument("--python", metavar="PATH", help="the interpreter to check")
    d.add_argument("--json", action="store_true", help="print the checks as JSON")


def _kernel_parsers(sub: Any) -> Dict[str, argparse.ArgumentParser]:
    """``headroom kernel install | list | remove``; returns them by "kernel ACTION"."""
    k = sub.add_parser(
        "kernel", help="install, list or remove a Jupyter kernel spec whose kernel is a guarded job"
    )
    _common(k, top=False)
    actions = k.add_subparsers(dest="kernel_command", metavar="ACTION", parser_class=_Parser)
    i = actions.add_parser(
        "install", help="write a kernel spec: Jupyter lists it as 'Python 3 (Headroom: PRESET)'"
    )
    _common(i, top=False)
    g = i.add_argument_group("the kernel")
    g.add_argument(
        "--python",
        metavar="PATH",
        help="the kernel's interpreter, which needs "
        "ipykernel (default: a venv in this folder, else the current Python)",
    )
    g.add_argument(
        "--name",
        metavar="NAME",
        help="the kernel spec's name (default: headroom-PRESET, or headroom)",
    )
    g.add_argument(
        "--display-name",
        metavar="TEXT",
        help="what Jupyter shows (default: 'Python 3 (Headroom: PRESET)')",
    )
    add_env_argument(g)
    g.add_argument(
        "--replace",
        action="store_true",
        help="also replace a kernel spec of that "
        "name that Headroom did not write (Headroom's own are always replaced)",
    )
    g.add_argument(
        "--dry-run",
        action="store_true",
        help="print the kernel.json and where it would go, and write nothing",
    )
    _kernel_folder(i)
    add_option_arguments(i, resume=False)
    ls = actions.add_parser("list", help="Headroom's kernel specs, and which are broken")
    _common(ls, top=False)
    ls.add_argument("--json", action="store_true", help="print the kernel specs as JSON")
    _kernel_folder(ls, python=True)
    rm = actions.add_parser("remove", help="remove one of Headroom's kernel specs")
    _common(rm, top=False)
    rm.add_argument("kernel", metavar="NAME", help="the kernel spec's name")
    _kernel_folder(rm, python=True)
    return {f"kernel {name}": parser for name, parser in actions.choices.items()}


def _kernel_folder(parser: argparse.ArgumentParser, python: bool = False) -> None:
    """--user | --prefix P | --sys-prefix, as for ``ipykernel install``."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--user", action="store_true", help="the user's Jupyter folder (the default)"
    )
    where.add_argument(
        "--prefix",
        metavar="P",
        help="P/share/jupyter/kernels (a Jupyter run from the environment at P finds it)",
    )
    where.add_argument(
        "--sys-prefix",
        action="store_true",
        help="the kernel interpreter's sys.prefix/share/jupyter/kernels",
    )
    if python:
        parser.add_argument(
            "--python",
            metavar="PATH",
            help="with --sys-prefix: the interpreter whose prefix is meant",
        )


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0")
    return value
