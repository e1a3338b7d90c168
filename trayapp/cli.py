"""The command line: ``headroom [tray] | engine | status | run | jobs | pause | resume | park |
stop | doctor``. Every command is a client of the engine; bad usage exits 2 with one line."""

from __future__ import annotations

import argparse
import difflib
import json
import logging
import os
import sys
import time
import traceback
from typing import Any, Dict, List, NoReturn, Optional, Sequence

from trayapp import __version__
from trayapp.cli_base import EXIT_FAILED, EXIT_NO_ENGINE, EXIT_OK, EXIT_USAGE, UsageError
from trayapp.text import one_line


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
            parser = self.commands.get(getattr(ns, "command", None) or "", self)
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
    parser.add_argument("--config", metavar="PATH", default=default,
                        help="use this config.toml instead of the one in the state folder")
    parser.add_argument("--demo", action="store_true",
                        default=False if top else argparse.SUPPRESS,
                        help="use simulated GPUs (to try Headroom without an NVIDIA GPU)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="headroom",
                description="Headroom watches RAM and GPU memory, launches Keras/TensorFlow "
                            "training with real memory options, and pauses jobs before the "
                            "machine locks up. Without a command it starts the tray.",
                epilog="HEADROOM_HOME=DIR keeps all state (settings, history, jobs) under DIR.")
    p.add_argument("--version", action="version", version=f"headroom {__version__}")
    _common(p, top=True)
    p.add_argument("--open", choices=("dashboard", "launch", "jobs", "settings"),
                   help="also open this window at start")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    e = sub.add_parser("engine", help="run the engine (the guard) in the foreground")
    _common(e, top=False)
    e.add_argument("--stay", action="store_true",
                   help="keep running with no clients and no jobs")

    s = sub.add_parser("status", help="RAM, swap, pressure, GPUs, the guard and the jobs")
    _common(s, top=False)
    s.add_argument("--json", action="store_true", help="print the status as JSON")
    s.add_argument("--watch", type=_positive_float, metavar="SECONDS",
                   help="refresh every SECONDS until Ctrl-C")

    r = sub.add_parser("run", help="launch a training script under the guard")
    _common(r, top=False)
    from trayapp.jobs.options import add_run_arguments

    add_run_arguments(r)

    j = sub.add_parser("jobs", help="list the jobs")
    _common(j, top=False)
    j.add_argument("--json", action="store_true", help="print the jobs as JSON")
    j.add_argument("--all", action="store_true", help="include ended jobs (finished, stopped...)")

    for name, what in (("pause", "pause a job (it stops growing; memory stays)"),
                       ("resume", "resume a paused job, or continue a parked or stopped one "
                                  "from its checkpoint"),
                       ("park", "checkpoint a job and end it, freeing its memory"),
                       ("stop", "end a job at the next batch (after a checkpoint, with a "
                                "checkpoint folder); the rest of its script does not run")):
        a = sub.add_parser(name, help=what)
        _common(a, top=False)
        a.add_argument("job", metavar="JOB", help="job id or unique name")

    d = sub.add_parser("doctor", help="check the driver, CUDA and TensorFlow build")
    _common(d, top=False)
    d.add_argument("--python", metavar="PATH", help="the interpreter to check")
    d.add_argument("--json", action="store_true", help="print the checks as JSON")
    p.commands = dict(sub.choices)
    return p


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0")
    return value


# -- status -------------------------------------------------------------------------------------


def _fmt(n: Optional[float]) -> str:
    from trayapp.config import format_bytes

    return format_bytes(n)


def _pct(part: Optional[float], whole: Optional[float]) -> str:
    if part is None or not whole:
        return "n/a"
    return f"{100.0 * part / whole:.0f}%"


def _num(v: Optional[float], unit: str, digits: int = 0) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}{unit}"


def format_status(st: Dict[str, Any]) -> str:
    """The status object as a compact, glanceable text (one block per part)."""
    lines: List[str] = []
    eng = st.get("engine") or {}
    guard = st.get("guard") or {}
    if eng.get("running"):
        head = f"engine running (pid {eng.get('pid')})"
        state = guard.get("state") or "ok"
        mode = guard.get("mode")
        head += f" · guard {state}" + (f" ({mode})" if mode and mode != "act" else "")
        tte = guard.get("seconds_to_exhaustion")
        if tte is not None:
            head += f" · memory runs out in ~{tte:.0f} s"
    else:
        head = "no engine is running: readings taken now; the guard is not watching"
    lines.append(f"Headroom {__version__} · {head}")
    for reason in guard.get("reasons") or []:
        lines.append(f"  ! {reason}")
    for problem in eng.get("config_problems") or []:
        lines.append(f"  ! {one_line(str(problem))}")
    m = st.get("memory") or {}
    source = m.get("limit_source", "host")
    limit = "cgroup limit" if source == "cgroup" else "host"
    lines.append(f"RAM    {_fmt(m.get('available_bytes'))} available of "
                 f"{_fmt(m.get('total_bytes'))} ({limit}), "
                 f"{_pct(m.get('used_bytes'), m.get('total_bytes'))} used")
    if m.get("swap_total_bytes"):
        lines.append(f"Swap   {_fmt(m.get('swap_used_bytes'))} used of "
                     f"{_fmt(m.get('swap_total_bytes'))}")
    else:
        lines.append("Swap   none")
    if m.get("psi_some_avg10") is None:
        lines.append("Pressure n/a (this kernel does not report memory pressure)")
    else:
        lines.append(f"Pressure some {m['psi_some_avg10']:.1f}%  full "
                     f"{m.get('psi_full_avg10') or 0:.1f}%  (avg10)")
    gpu_status = st.get("gpu_status") or {}
    gpus = st.get("gpus") or []
    if not gpus:
        lines.append(f"GPU    {gpu_status.get('message') or 'no NVIDIA GPU found'}")
    for g in gpus:
        sim = " [simulated]" if g.get("simulated") else ""
        lines.append(
            f"GPU {g['index']}  {g.get('name')}{sim} | {_fmt(g.get('memory_used_bytes'))} / "
            f"{_fmt(g.get('memory_total_bytes'))} | util {_num(g.get('utilization_percent'), '%')}"
            f" | {_num(g.get('temperature_c'), '°C')} | {_num(g.get('power_watts'), ' W')}")
        procs = g.get("processes") or []
        if procs:
            lines.append("       " + ", ".join(
                f"{p.get('name')} ({p.get('pid')}) {_fmt(p.get('used_memory_bytes'))}"
                for p in procs))
    if gpu_status.get("driver_version"):
        lines.append(f"       driver {gpu_status['driver_version']}, CUDA "
                     f"{gpu_status.get('cuda_driver_version') or 'n/a'}")
    jobs = st.get("jobs") or []
    if not jobs:
        lines.append("Jobs   none")
    for jb in jobs:
        lines.append("Job    " + format_job_line(jb))
    return "\n".join(lines)


def format_job_line(jb: Dict[str, Any]) -> str:
    """A job in one line: its name, then what ``headroom run`` shows of its progress."""
    from trayapp.cli_jobs import progress_text

    text = f"{jb.get('name')} {progress_text(jb)}"
    if jb.get("exit_code") is not None:
        text += f" · exit {jb['exit_code']}"
    return text


def local_status(demo: bool) -> Dict[str, Any]:
    """The status read from the probes directly, for when no engine runs."""
    from trayapp.probes.gpu import make_backend
    from trayapp.probes.memory import make_memory_probe
    from trayapp.probes.snapshot import Snapshot

    backend = make_backend(demo=demo)
    try:
        memory = make_memory_probe().read()
        snap = Snapshot(memory.time, memory, tuple(backend.read()), backend.status)
    finally:
        backend.close()
    mem = snap.memory.to_json()
    mem.pop("time", None)
    return {"time": snap.time, "memory": mem, "gpus": [g.to_json() for g in snap.gpus],
            "gpu_status": snap.gpu_status.to_json(),
            "guard": {"state": None, "mode": None, "reasons": ["no engine is running"],
                      "seconds_to_exhaustion": None},
            "jobs": [], "engine": {"running": False}}


def cmd_status(args: argparse.Namespace, paths: Any) -> int:
    from trayapp.engine.client import EngineBusy, EngineClient, EngineUnavailable, UnsafeState

    client = EngineClient(paths, timeout=5.0)
    tty = sys.stdout.isatty()
    try:
        while True:
            try:
                st: Optional[Dict[str, Any]] = client.status()
            except UnsafeState:
                raise  # an engine folder that cannot be trusted is said, not hidden
            except EngineBusy as e:
                # An engine runs: readings of our own would say it does not. Once: exit 3;
                # watching: say so and try again at the next refresh.
                if not args.watch:
                    raise
                print(f"headroom: {one_line(e)}", file=sys.stderr, flush=True)
                st = None
            except EngineUnavailable:
                st = local_status(args.demo)
            if st is None:
                pass
            elif args.json:
                print(json.dumps(st), flush=True)
            else:
                text = format_status(st)
                if args.watch and tty:
                    sys.stdout.write("\x1b[H\x1b[2J" + text + "\n")
                    sys.stdout.flush()
                else:
                    print(text, flush=True)
            if not args.watch:
                return EXIT_OK
            time.sleep(args.watch)
            if not tty and not args.json:
                print()
    except KeyboardInterrupt:
        return EXIT_OK
    finally:
        client.close()


# -- engine ---------------------------------------------------------------------------------------


def cmd_engine(args: argparse.Namespace, paths: Any) -> int:
    from trayapp import config as configmod
    from trayapp.engine.service import Engine, setup_logging
    from trayapp.private import UnsafePath

    try:
        paths.ensure()
    except UnsafePath as e:
        # Bad input (the state folder): nothing is written to it, not even the log.
        print(f"headroom: refusing to start the engine: {one_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    setup_logging(paths.log_file)
    engine = Engine(paths, configmod.load(paths.config_file), demo=args.demo, stay=args.stay)
    return engine.run()


# -- main -----------------------------------------------------------------------------------------


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
    return ("no display to show the tray on (DISPLAY and WAYLAND_DISPLAY are not set); "
            "without a desktop, use the commands: 'headroom run SCRIPT', 'headroom status', "
            "'headroom jobs' (see 'headroom --help')")


def main(argv: Optional[Sequence[str]] = None) -> int:
    from trayapp.private import use_private_umask

    use_private_umask()  # whatever Headroom writes is the user's alone
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        from trayapp.config import get_paths

        paths = get_paths(args.config)
        if args.command is None:
            problem = no_display()
            if problem:
                print(f"headroom: {problem}", file=sys.stderr)
                return EXIT_FAILED
            from trayapp.ui.app import run_tray

            return run_tray(args, paths)
        if args.command == "engine":
            return cmd_engine(args, paths)
        if args.command == "status":
            return cmd_status(args, paths)
        from trayapp import cli_jobs

        return cli_jobs.dispatch(args, paths)
    except UsageError as e:
        print(f"headroom: {one_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (``headroom status --json | head``): not an error.
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return EXIT_OK
    except Exception as e:  # no traceback on the user's screen; it goes to a file
        from trayapp.engine.client import EngineError, EngineUnavailable

        if isinstance(e, EngineUnavailable):
            print(f"headroom: {one_line(e)}", file=sys.stderr)
            return EXIT_NO_ENGINE
        if isinstance(e, EngineError):
            print(f"headroom: {one_line(e)}", file=sys.stderr)
            return EXIT_USAGE if e.code in ("refused", "bad_request") else EXIT_FAILED
        where = _save_traceback()
        print(f"headroom: internal error: {type(e).__name__}: {one_line(e)}"
              + (f" (details in {where})" if where else ""), file=sys.stderr)
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
        from trayapp.config import get_paths
        from trayapp.private import open_private_file

        path = get_paths().data_dir / "crash.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open_private_file(path, "a", encoding="utf-8") as f:
            f.write(f"--- {time.ctime()} pid {os.getpid()} argv {_argv_to_keep(sys.argv)!r}\n")
            f.write(traceback.format_exc())
        return str(path)
    except Exception:
        logging.getLogger("headroom").debug("could not save the traceback", exc_info=True)
        return None
