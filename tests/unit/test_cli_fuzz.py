"""The command line with flags and values made at random: a run's arguments give a valid spec or
exit 2 with one line; every command, run as a user types it against a real engine or with none,
keeps the contract of exit statuses (0, 1, 2, 3, 75), says what went wrong in one line and never
shows a traceback."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Iterator, List, Optional, Tuple

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.conftest import REPO, EngineProcess, end_processes_of, headroom_cmd
from trayapp.cli import build_parser, main, no_display
from trayapp.config import Paths, get_paths
from trayapp.engine.client import EngineClient
from trayapp.jobs.options import JobSpec, SpecError, spec_from_cli, validate
from trayapp.runner.protocol import PARK_EXIT_CODE

RUN_FLAGS = ["--python", "--gpu", "--cpu-only", "--memory-growth", "--no-memory-growth",
             "--vram-limit", "--vram-reserve", "--allocator", "--precision", "--xla",
             "--no-xla", "--threads", "--ram-budget", "--vram-budget", "--checkpoint-dir",
             "--checkpoint-every", "--resume", "--fresh", "--manual-resume", "--preset", "--name",
             "--cwd",
             "--env", "--dry-run", "--bogus", "-x"]
VALUES = st.sampled_from(["0", "1", "-1", "0,1", "4,2", "1024", "1e3", "abc", "", " ", "bfc",
                          "cuda_malloc_async", "mixed_float16", "desktop-safe", "throughput",
                          "cpu-only", "KEY=VALUE", "=x", "noequals", "999999999999", "1.5",
                          "/nonexistent", "train.py", "--", "ünïcode", "\r", "a\nb",
                          "\x1b[2J", "\u2028"]) | st.text(max_size=8)


@settings(max_examples=400, deadline=None)
@given(argv=st.lists(st.sampled_from(RUN_FLAGS) | VALUES, max_size=8))
def test_random_run_arguments(argv: List[str]) -> None:
    parser = build_parser()
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            ns = parser.parse_args(["run", *argv])
        except SystemExit as e:
            assert e.code == 2, err.getvalue()
            assert len(err.getvalue().strip().splitlines()) == 1, err.getvalue()
            return
    try:
        spec = spec_from_cli(ns)
        validate(spec, (), check_paths=False)
    except SpecError as e:
        assert str(e) and str(e).isprintable()


# What a command may exit with: done, failed, bad usage, no engine, parked (``run``).
CONTRACT = {0, 1, 2, 3, PARK_EXIT_CODE}
JOB_NAME = "sleeper"  # a job that runs in the engine's state folder, for the job actions
QUICK_SCRIPT = "quick.py"  # a script in the command's folder that prints a line and ends
# What each command knows (the tray's: no command), an option with its value as one phrase, and
# what its positional argument may be. A random word is put in among them now and then.
JOB_WORDS = [JOB_NAME, "nosuchjob"]
PHRASES = {
    "tray": [("--open", "dashboard"), ("--open", "launch"), ("--demo",)],
    "engine": [("--stay",), ("--demo",)],
    "status": [("--json",), ("--watch", "0.2"), ("--demo",)],
    "jobs": [("--json",), ("--all",), ("--demo",)],
    "pause": [("--demo",)], "resume": [("--demo",)], "park": [("--demo",)], "stop": [("--demo",)],
    "doctor": [("--json",), ("--python", sys.executable), ("--demo",)],
    "run": [("--dry-run",), ("--name", "fuzz"), ("--cpu-only",), ("--preset", "desktop-safe"),
            ("--env", "A=1"), ("--checkpoint-dir", "ckpt"), ("--ram-budget", "1G"),
            ("--python", sys.executable), ("--demo",)],
}
POSITIONAL = {"pause": JOB_WORDS, "resume": JOB_WORDS, "park": JOB_WORDS, "stop": JOB_WORDS,
              "run": [QUICK_SCRIPT]}
COMMON = [("--config", "config.toml")]
WATCH_SECONDS = 0.4  # a watching status is ended by a Ctrl-C after this long
ENGINE_TIMEOUT = 60  # ``headroom engine`` with one running: it says so and ends at once
# Qt's platform and the displays: without them the tray says in one line that it cannot start.
DISPLAY_VARIABLES = ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")


def command_line(command: str) -> st.SearchStrategy[List[str]]:
    """``command`` and words after it: its own options, its positional argument if it has one,
    now and then a random word among them."""
    phrases = st.lists(st.sampled_from(PHRASES[command] + COMMON), max_size=3, unique=True)
    words = phrases.map(lambda ps: [w for p in ps for w in p])
    if command in POSITIONAL:
        known = st.sampled_from(POSITIONAL[command])
        last = known | known | VALUES
        words = st.tuples(words, last).map(lambda t: [*t[0], t[1]])
    noisy = st.tuples(words, st.lists(VALUES, max_size=1), st.integers(0, 8)).map(
        lambda t: t[0][:t[2]] + t[1] + t[0][t[2]:])
    line = noisy | words | words
    return line if command == "tray" else line.map(lambda ws: [command, *ws])


posix_only = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals (Ctrl-C)")


class _Homes:
    """Two state folders: one with a running engine and a job, one where no engine runs."""

    def __init__(self, engine_home: Path, empty_home: Path, engine: EngineProcess):
        self.engine_home, self.empty_home, self.engine = engine_home, empty_home, engine


def _paths_of(home: Path) -> Paths:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HEADROOM_HOME", str(home))
        return get_paths()


@pytest.fixture(scope="module")
def homes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Homes]:
    engine_home = tmp_path_factory.mktemp("with-engine")
    empty_home = tmp_path_factory.mktemp("no-engine")
    (engine_home / "config.toml").write_text('[guard]\nmode = "off"\n')
    engine = EngineProcess(_paths_of(engine_home), stay=True).wait_ready()
    try:
        with engine.client() as c:
            ticker = REPO / "tests" / "scripts" / "jobs" / "ticker.py"
            c.job_start(JobSpec(script=str(ticker), args=("0", "0.5"), name=JOB_NAME).to_json())
        yield _Homes(engine_home, empty_home, engine)
    finally:
        engine.stop()
        end_processes_of(engine_home)
        end_processes_of(empty_home)


def _interrupt(signum: int, frame: Optional[FrameType]) -> None:
    raise KeyboardInterrupt  # what Ctrl-C does to a command in the terminal


def _run_in_process(argv: List[str], watch: bool) -> int:
    """``main(argv)``; a watching status is ended with a Ctrl-C, as a user ends it."""
    if not watch:
        return main(argv)
    previous = signal.signal(signal.SIGALRM, _interrupt)
    signal.setitimer(signal.ITIMER_REAL, WATCH_SECONDS)
    try:
        return main(argv)
    except KeyboardInterrupt:
        return 130  # the Ctrl-C came after the command's own handler had returned
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _run_engine_command(argv: List[str], home: Path) -> Tuple[int, str]:
    # In a process of its own: an engine sets up logging and signals for the whole process.
    env = {**os.environ, "HEADROOM_HOME": str(home)}
    r = subprocess.run(headroom_cmd(*argv), env=env, capture_output=True, text=True,
                       timeout=ENGINE_TIMEOUT, cwd=str(home))
    return r.returncode, r.stderr


@pytest.fixture
def plain_terminal(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in DISPLAY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    # A folder with one script in it, which ends at once: a run finds no other to start.
    (tmp_path / QUICK_SCRIPT).write_text("print('quick')\n")
    monkeypatch.chdir(tmp_path)


# capsys is read (and so emptied) in every example, which makes it safe to share.
@posix_only
@pytest.mark.parametrize("command", sorted(PHRASES))
@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), with_engine=st.booleans())
def test_random_commands_keep_the_exit_status_contract(
        command: str, data: st.DataObject, with_engine: bool, homes: _Homes,
        plain_terminal: None, capsys: pytest.CaptureFixture[str]) -> None:
    argv = data.draw(command_line(command), label="argv")
    try:
        ns = build_parser().parse_args(argv)
    except SystemExit as e:
        event(f"parsing ends with {e.code}")
        assert e.code in (0, 2)
        out = capsys.readouterr()
        assert "Traceback" not in out.err
        if e.code == 2:
            assert len(out.err.strip().splitlines()) == 1, out.err
        return
    if ns.command is None and no_display() is None:
        return  # a desktop to start the tray on (not Linux): nothing to check here
    # An engine, or a run that would start one, only where an engine already runs.
    if ns.command in ("engine", "run"):
        with_engine = True
    home = homes.engine_home if with_engine else homes.empty_home
    watch = bool(getattr(ns, "watch", None))
    started = time.monotonic()
    if ns.command == "engine":
        code, err = _run_engine_command(argv, home)
    else:
        old = os.environ.get("HEADROOM_HOME")
        os.environ["HEADROOM_HOME"] = str(home)
        try:
            code = _run_in_process(argv, watch)
        finally:
            if old is None:
                os.environ.pop("HEADROOM_HOME", None)
            else:
                os.environ["HEADROOM_HOME"] = old
        err = capsys.readouterr().err
    spent = time.monotonic() - started
    event(f"{ns.command or 'tray'} ran: {code}")
    assert code in CONTRACT | ({130} if watch else set()), (argv, code, err)
    assert "Traceback" not in err and "internal error" not in err, (argv, err)
    if code in (2, 3) or (code == 1 and ns.command is None):
        assert len(err.strip().splitlines()) == 1, (argv, err)
        assert err.startswith("headroom"), (argv, err)
    assert spent < 30, (argv, spent)
    if with_engine:  # whatever the command did, the engine still answers
        with EngineClient(_paths_of(homes.engine_home), timeout=10.0) as c:
            assert c.ping()["pid"] == homes.engine.proc.pid
    else:  # and where none ran, no command started one
        assert not _paths_of(homes.empty_home).key_file.exists()


@posix_only
def test_a_command_that_needs_an_engine_says_there_is_none(
        homes: _Homes, plain_terminal: None, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The examples above may not draw these: each of them, where no engine runs."""
    monkeypatch.setenv("HEADROOM_HOME", str(homes.empty_home))
    for argv in (["jobs"], ["pause", JOB_NAME], ["stop", "x"], ["resume", "x"], ["park", "x"]):
        assert main(argv) == 3, argv
        err = capsys.readouterr().err
        assert err.startswith("headroom: no engine is running for ") and \
            len(err.splitlines()) == 1, err
    assert main(["status"]) == 0  # read from the probes: the guard is not watching
    assert "no engine is running" in capsys.readouterr().out


@posix_only
def test_each_command_does_its_work_against_the_engine(
        homes: _Homes, plain_terminal: None, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The examples above may not draw these: each command on a job that can take it."""
    monkeypatch.setenv("HEADROOM_HOME", str(homes.engine_home))
    with homes.engine.client() as c:
        ticker = REPO / "tests" / "scripts" / "jobs" / "ticker.py"
        job = c.job_start(JobSpec(script=str(ticker), args=("0", "0.5"), name="steady").to_json())
    for argv, said in ((["pause", job.id], "(steady): pause"),
                       (["resume", "steady"], "(steady): "),
                       (["jobs"], "steady"), (["status"], "Job    steady [" + job.id),
                       (["stop", "steady"], "(steady): stop")):
        assert main(argv) == 0, (argv, capsys.readouterr())
        out = capsys.readouterr()
        assert said in out.out and out.err == "", (argv, out)
    assert main(["run", "--name", "quick", QUICK_SCRIPT]) == 0
    out = capsys.readouterr()
    assert out.out == "quick\n" and "job " in out.err and "finished" in out.err, out
