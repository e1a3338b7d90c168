"""Shared fixtures: a private state folder per test and real engine processes on it."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import pytest

from trayapp.config import Paths, get_paths
from trayapp.engine.client import EngineClient, EngineUnavailable

REPO = Path(__file__).resolve().parent.parent


# -- tests that run alone ----------------------------------------------------------------------
# With pytest-xdist (scripts/test.sh runs two workers), a test marked ``alone`` measures the whole
# machine's memory or time, so it holds a lock that every other test takes shared: it waits for
# the other worker's test to end and no other test starts until it is done. A turnstile lock keeps
# the shared takers from starving it.


def _lock_files() -> Optional[tuple]:
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run:
        return None
    base = Path(os.environ.get("TMPDIR", "/tmp")) / f"headroom-tests-{run}"
    return base.with_suffix(".turnstile"), base.with_suffix(".lock")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    files = _lock_files()
    if files is None:
        yield
        return
    alone = item.get_closest_marker("alone") is not None
    turnstile = os.open(files[0], os.O_RDWR | os.O_CREAT, 0o600)
    lock = os.open(files[1], os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        fcntl.flock(turnstile, fcntl.LOCK_UN)
        yield
    finally:
        os.close(lock)
        os.close(turnstile)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh HEADROOM_HOME for this test (set in the environment for child processes too).

    Afterwards, every job and engine still running on it is ended: an engine never ends its
    jobs, so a test that leaves one running would otherwise leave it for good."""
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("HEADROOM_HOME", str(h))
    yield h
    end_processes_of(h)


def end_processes_of(home: Path) -> None:
    """Kill the jobs (and their trees) and engines that belong to the state folder ``home``."""
    import psutil

    mine = []
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == os.getpid():
            continue
        try:
            env = proc.environ()
        except (psutil.Error, OSError):
            continue
        keyfile = env.get("HEADROOM_JOB_KEYFILE", "")
        if keyfile.startswith(str(home)) or env.get("HEADROOM_HOME") == str(home):
            mine.append(proc)
    for proc in mine:
        try:
            tree = [*proc.children(recursive=True), proc]
            for p in tree:
                _thaw(p.pid)  # a frozen task dies of SIGKILL only once thawed
            for p in tree:
                p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(mine, timeout=5)


def suspended(pid: int) -> bool:
    """Stopped by signal, or frozen by its v1 freezer cgroup; not merely held at its cgroup's
    memory limit by the kernel brake (state D too), which the guard's pause follows."""
    import psutil

    try:
        if psutil.Process(pid).status() == psutil.STATUS_STOPPED:
            return True
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "freezer" in controllers.split(","):
                state = Path(f"/sys/fs/cgroup/freezer{path}/freezer.state")
                # FREEZING: asked, and a task held at its limit in the kernel freezes later
                return state.exists() and state.read_text().strip() in ("FROZEN", "FREEZING")
    except (psutil.Error, OSError, ValueError):
        pass
    return False


def _thaw(pid: int) -> None:
    """Thaw the v1 freezer cgroup ``pid`` is in, where it has one of its own (a job paused by
    an engine that was killed stays frozen)."""
    try:
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "freezer" in controllers.split(",") and path not in ("", "/"):
                Path(f"/sys/fs/cgroup/freezer{path}/freezer.state").write_text("THAWED")
    except (OSError, ValueError):
        pass


@pytest.fixture
def paths(home: Path) -> Paths:
    return get_paths()


def headroom_cmd(*args: str) -> List[str]:
    return [sys.executable, "-m", "trayapp", *args]


class EngineProcess:
    """A real engine (``python -m trayapp engine``) on the test's state folder."""

    def __init__(self, paths: Paths, demo: bool = False, stay: bool = True,
                 env: Optional[Dict[str, str]] = None, config: Optional[str] = None,
                 cgroups: Sequence[Path] = ()):
        """``cgroups``: folders of cgroup v1 hierarchies the engine starts in (its jobs' cgroups
        are then made under them, apart from every other engine's)."""
        self.paths = paths
        args = []
        if config:
            args += ["--config", config]
        if demo:
            args.append("--demo")
        args.append("engine")
        if stay:
            args.append("--stay")
        full_env = dict(os.environ)
        full_env["HEADROOM_HOME"] = str(paths.home)
        full_env.update(env or {})
        self.stderr_path = paths.home / f"engine-stderr-{time.monotonic_ns()}.log"
        self._stderr = open(self.stderr_path, "wb")
        procs = [str(folder / "cgroup.procs") for folder in cgroups]

        def join() -> None:  # in the child, before the engine runs
            for name in procs:
                with open(name, "w") as f:
                    f.write(str(os.getpid()))

        self.proc = subprocess.Popen(headroom_cmd(*args), env=full_env, cwd=str(REPO),
                                     stdout=subprocess.DEVNULL, stderr=self._stderr,
                                     start_new_session=True, preexec_fn=join if procs else None)

    def wait_ready(self, timeout: float = 20.0) -> EngineProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"engine exited with {self.proc.returncode}:\n{self.stderr}")
            try:
                with EngineClient(self.paths, timeout=2.0) as c:
                    if c.ping()["pid"] == self.proc.pid:
                        return self
            except EngineUnavailable:
                pass
            time.sleep(0.05)
        raise AssertionError(f"engine not ready in {timeout} s:\n{self.stderr}")

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def client(self, timeout: float = 10.0) -> EngineClient:
        return EngineClient(self.paths, timeout=timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._stderr.close()
        return self.proc.returncode


@pytest.fixture
def start_engine(paths: Paths) -> Iterator:
    """A factory: ``start_engine(demo=False, stay=True)`` -> a ready EngineProcess; every engine
    it started is stopped at the end of the test."""
    started: List[EngineProcess] = []

    def start(demo: bool = False, stay: bool = True, wait: bool = True,
              env: Optional[Dict[str, str]] = None, config: Optional[str] = None,
              cgroups: Sequence[Path] = ()) -> EngineProcess:
        e = EngineProcess(paths, demo=demo, stay=stay, env=env, config=config, cgroups=cgroups)
        started.append(e)
        return e.wait_ready() if wait else e

    yield start
    for e in started:
        e.stop()


@pytest.fixture
def engine(start_engine) -> EngineProcess:  # type: ignore[no-untyped-def]
    """One running engine (no simulated GPUs) on the test's state folder."""
    return start_engine()


def wait_for(fn: Callable[[], Any], timeout: float, what: str, every: float = 0.05) -> Any:
    """Poll ``fn`` until it returns something true and return that; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def run_cli(*args: str, env: Optional[Dict[str, str]] = None, timeout: float = 120,
            cwd: Optional[str] = None, input: Optional[str] = None) -> subprocess.CompletedProcess:
    """Run ``headroom ARGS`` as a user would; returns the completed process (text output)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(headroom_cmd(*args), env=full_env, cwd=cwd or str(REPO),
                          capture_output=True, text=True, timeout=timeout, input=input)
