"""Processes named as a person knows them, not as the kernel does.

Every training script, notebook and test run is "python3" to the kernel. ``person_name`` names
a Python process by what it runs: ``python train.py`` -> "train.py", ``python -m pytest`` ->
"pytest", ``python -m ipykernel_launcher -f ...`` -> "Jupyter kernel", and Headroom's own
processes "Headroom engine" and "Headroom tray" (a bare "headroom" reads as memory left).
Any other process keeps its name. What a process chose (its command line, its kernel name) is
shown as one printable line of at most ``MAX_NAME_CHARS`` (``text.one_line``). ``Namer`` reads
a Python process's command line once and keeps its name for as long as that process lives (its
pid and start time).

Pure but for ``Namer.name``'s read of ``/proc/<pid>/cmdline`` (psutil elsewhere); never raises.
"""

from __future__ import annotations

import re
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import psutil

from trayapp.text import one_line

ENGINE = "Headroom engine"
TRAY = "Headroom tray"
KERNEL = "Jupyter kernel"
# python, python3, python3.11, pythonw, python3.12-dbg; py.exe and pythonw.exe on Windows
_PYTHON = re.compile(r"^(python|pythonw|py)(\d+(\.\d+)*)?(-[a-z]+)?(\.exe)?$", re.IGNORECASE)
# Interpreter options that take the next argument as their value.
_WITH_VALUE = frozenset({"-W", "-X", "--check-hash-based-pycs"})
_KERNELS = frozenset({"ipykernel_launcher", "ipykernel", "ipykernel.kernelapp"})
_HEADROOM = frozenset({"headroom", "headroom.exe", "headroom-script.py", "trayapp"})
_HEADROOM_WITH_VALUE = frozenset({"--config", "--open"})  # headroom's options with a value
MAX_NAMES = 4096  # pids a Namer keeps a name for
MAX_NAME_CHARS = 120  # a name as shown: whatever a process wrote in its argv


def _basename(path: str) -> str:
    return re.split(r"[\\/]", path.rstrip("\\/"))[-1] if path else path


def is_python(name: str) -> bool:
    """``name`` (a process's name or its interpreter's file name) is a Python interpreter."""
    return bool(_PYTHON.match(_basename(name)))


def _headroom(args: Sequence[str]) -> str:
    """Headroom's own process, from the arguments after ``headroom`` / ``-m trayapp``."""
    command, i = None, 0
    while i < len(args):
        if args[i] in _HEADROOM_WITH_VALUE:
            i += 2
        elif args[i].startswith("-"):
            i += 1
        else:
            command = args[i]
            break
    if command is None:
        return TRAY
    if command == "engine":
        return ENGINE
    return "headroom " + command


def _module(module: str, rest: Sequence[str]) -> str:
    if module in _KERNELS:
        return KERNEL
    if module == "trayapp" or module.startswith("trayapp."):
        return ENGINE if module.startswith("trayapp.engine") else _headroom(rest)
    return module


def person_name(name: str, argv: Sequence[str]) -> str:
    """What a person calls the process named ``name`` (its kernel name) with ``argv`` (its
    command line; empty when it cannot be read): see the module's docstring."""
    if argv and _basename(argv[0]).lower() in ("headroom", "headroom.exe"):
        return _headroom(argv[1:])  # the console script as its own executable (frozen builds)
    if not argv or not (is_python(name) or is_python(argv[0])):
        return name
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "-m" and i + 1 < len(argv):
            return _module(argv[i + 1], argv[i + 2 :])
        if arg.startswith("-m") and len(arg) > 2:
            return _module(arg[2:], argv[i + 1 :])
        if arg == "-c" or arg.startswith("-c"):
            return "python -c"
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            break
        i += 2 if arg in _WITH_VALUE else 1
    if i >= len(argv) or argv[i] == "-":
        return name  # an interactive interpreter, or a script read from stdin
    script = _basename(argv[i])
    if script == "__main__.py":  # a package run by its folder's path: the package's name
        script = _basename(argv[i][: -len(script)]) or script
    if script.lower() in _HEADROOM:
        return _headroom(argv[i + 1 :])
    if script == "ipykernel_launcher.py":
        return KERNEL
    if script == "bootstrap.py" and _basename(argv[i][: -len(script)]) == "runner":
        # A job Headroom runs: ``<python> <runner>/bootstrap.py <script> ...`` (or --kernel).
        rest = argv[i + 1 :]
        if "--kernel" in rest[:1]:
            return KERNEL
        if rest and rest[0] == "-m" and len(rest) > 1:
            return _module(rest[1], rest[2:])
        return _basename(rest[0]) if rest else script
    return script or name


def read_argv(pid: int, proc_root: Optional[str] = None) -> List[str]:
    """``pid``'s command line; [] when it is gone, hidden from us or empty (a kernel thread)."""
    if proc_root is None and sys.platform.startswith("linux"):
        proc_root = "/proc"
    try:
        if proc_root:
            with open(f"{proc_root}/{pid}/cmdline", "rb") as f:
                raw = f.read(65536)
            return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]
        return list(psutil.Process(pid).cmdline())
    except (OSError, psutil.Error, ValueError):
        return []


class Namer:
    """Person names for pids, each Python process's command line read once in its life."""

    def __init__(self, proc_root: Optional[str] = None):
        self.proc_root = proc_root
        self._names: Dict[int, Tuple[object, str, str]] = {}  # pid -> (start, kernel name, name)

    def name(self, pid: int, name: str, start: object = None) -> str:
        """The person name of ``pid`` whose kernel name is ``name``; ``start`` tells a pid
        reused by a new process apart (its start time, where the caller has it)."""
        if not is_python(name) and name.lower() not in ("headroom", "headroom.exe"):
            return one_line(name, MAX_NAME_CHARS)
        kept = self._names.get(pid)
        if kept is not None and kept[0] == start and kept[1] == name:
            return kept[2]
        argv = read_argv(pid, self.proc_root)
        found = one_line(person_name(name, argv), MAX_NAME_CHARS)
        if argv:  # not yet readable (a process starting): asked again next time
            if len(self._names) >= MAX_NAMES:
                self._names.clear()
            self._names[pid] = (start, name, found)
        return found

    def keep_only(self, pids: object) -> None:
        """Forget the pids not in ``pids`` (those that have ended)."""
        live = set(pids)  # type: ignore[call-overload]
        for pid in [p for p in self._names if p not in live]:
            del self._names[pid]
