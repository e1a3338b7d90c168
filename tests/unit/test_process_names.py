"""Processes named as a person knows them: a table of command lines, and real processes (a
script, a module, an interpreter that reads stdin) seen by the dashboard's consumer scan and by
``process_name`` (the GPU processes' names)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

from tests.conftest import wait_for
from trayapp.probes import consumers, names, processes
from trayapp.probes.names import Namer, person_name

PY = "/home/me/.venv/bin/python"


@pytest.mark.parametrize("name, argv, expected", [
    ("python3", [PY, "train.py", "--epochs", "5"], "train.py"),
    ("python3.11", [PY, "-u", "-X", "dev", "-W", "ignore", "/work/exp/train_cnn.py"],
     "train_cnn.py"),
    ("python3", [PY, "-m", "pytest", "-q"], "pytest"),
    ("python3", [PY, "-mpytest"], "pytest"),
    ("python3", [PY, "-m", "ipykernel_launcher", "-f", "/run/user/1000/kernel-1.json"],
     names.KERNEL),
    ("headroom", [PY, "/home/me/.venv/bin/headroom"], names.TRAY),
    ("headroom", [PY, "/home/me/.venv/bin/headroom", "--open", "jobs"], names.TRAY),
    ("python3", [PY, "/home/me/.venv/bin/headroom", "--config", "x.toml", "engine"], names.ENGINE),
    ("python3", [PY, "-m", "trayapp", "engine", "--stay"], names.ENGINE),
    ("python3", [PY, "-m", "trayapp"], names.TRAY),
    ("headroom", ["/opt/Headroom/headroom", "engine"], names.ENGINE),  # a frozen build
    ("python3", [PY, "/home/me/.venv/bin/headroom", "run", "train.py"], "headroom run"),
    ("python3", [PY, "/src/trayapp/__main__.py", "status"], "headroom status"),
    ("python3", [PY, "/src/tool/__main__.py"], "tool"),
    ("python3", [PY, "-c", "import time; time.sleep(9)"], "python -c"),
    ("python3", [PY], "python3"),  # an interactive interpreter
    ("python3", [PY, "-"], "python3"),  # a script read from stdin
    ("python3", [], "python3"),  # a command line we may not read
    ("python.exe", ["C:\\Py\\python.exe", "C:\\work\\train.py"], "train.py"),
    ("Xorg", ["/usr/lib/xorg/Xorg", ":0"], "Xorg"),
    ("chrome", ["/opt/google/chrome/chrome", "--type=renderer"], "chrome"),
    ("bash", ["bash", "train.py"], "bash"),  # not Python: its own name
    # A job Headroom runs, through its runner's bootstrap: the script, or the kernel.
    ("python3", [PY, "/opt/headroom/trayapp/runner/bootstrap.py", "/w/train.py", "-e", "3"],
     "train.py"),
    ("python3", [PY, "/opt/headroom/trayapp/runner/bootstrap.py", "--kernel", "-f", "k.json"],
     names.KERNEL),
    ("python3", [PY, "/w/tools/bootstrap.py"], "bootstrap.py"),  # someone else's bootstrap
])
def test_a_process_is_named_by_what_it_runs(name: str, argv: List[str], expected: str) -> None:
    assert person_name(name, argv) == expected


@pytest.fixture
def children(tmp_path: Path):  # type: ignore[no-untyped-def]
    started: List[subprocess.Popen] = []

    def start(*args: str) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, *args], stdin=subprocess.PIPE, cwd=tmp_path)
        started.append(p)
        return p

    yield start
    for p in started:
        p.kill()
        p.wait(10)
        if p.stdin:
            p.stdin.close()


def test_real_processes_are_named_by_their_script_or_module(children, tmp_path: Path) -> None:
    script = tmp_path / "train_mnist.py"
    script.write_text("import sys\nsys.stdin.read()\n")
    module = tmp_path / "sweeper.py"
    module.write_text("import sys\nbig = b'x' * (40 << 20)\nsys.stdin.read()\n")
    trainer = children(str(script))
    sweep = children("-m", "sweeper")
    wait_for(lambda: processes.process_name(trainer.pid) == "train_mnist.py", 20,
             "the script's name")
    wait_for(lambda: processes.process_name(sweep.pid) == "sweeper", 20, "the module's name")
    found = wait_for(lambda: (lambda by: by if by.get("sweeper", 0) >= 40 << 20 else None)(
        {c.name: c.rss_bytes for c in consumers.ram_by_name(limit=500)}), 20,
        "the module's 40 MiB under its own name")
    assert found["train_mnist.py"] > 0


def test_a_reused_pid_is_named_again(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "42").mkdir(parents=True)
    (proc / "42" / "cmdline").write_bytes(b"python3\0first.py\0")
    namer = Namer(str(proc))
    assert namer.name(42, "python3", start=100) == "first.py"
    (proc / "42" / "cmdline").write_bytes(b"python3\0second.py\0")
    assert namer.name(42, "python3", start=100) == "first.py"  # read once in its life
    assert namer.name(42, "python3", start=200) == "second.py"  # a new process, the same pid
    (proc / "42" / "cmdline").unlink()
    assert namer.name(42, "python3", start=300) == "python3"  # gone: its kernel name
    namer.keep_only([])
    assert namer.name(43, "bash", start=1) == "bash"


@pytest.mark.parametrize("cmdline, kernel_name", [
    (b"python3\0" + b"x" * 60000 + b".py\0", "python3"),  # a script's name as long as argv goes
    (b"python3\0train\x1b]0;owned\x07\n.py\0", "python3"),  # escapes and a newline
    (b"python3\0-m\0" + b"m" * 60000 + b"\0", "python3"),  # a module's
    (b"bash\0", "evil\x1b[2J\r"),  # a kernel name set by the process itself
])
def test_a_name_a_process_chose_is_one_short_printable_line(tmp_path: Path, cmdline: bytes,
                                                            kernel_name: str) -> None:
    proc = tmp_path / "proc"
    (proc / "42").mkdir(parents=True)
    (proc / "42" / "cmdline").write_bytes(cmdline)
    shown = Namer(str(proc)).name(42, kernel_name, start=1)
    assert shown.isprintable() and 0 < len(shown) <= names.MAX_NAME_CHARS, shown[:200]
