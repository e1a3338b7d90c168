"""Floods of connections: the user's own client is still answered, and told the truth if not.

Each flood is a separate process (tests/scripts/flood.py) that holds its connections open for a
bounded time and opens again whatever the engine cuts. ``headroom status`` is the real CLI.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest

from tests.conftest import REPO, EngineProcess, run_cli, wait_for
from trayapp.config import Paths
from trayapp.engine.client import EngineClient, EngineError, Subscription

FLOOD = str(REPO / "tests" / "scripts" / "flood.py")
TICKER = str(REPO / "tests" / "scripts" / "jobs" / "ticker.py")
TRIES = 10
FLOOD_SECONDS = 90.0  # an upper bound: each flood is ended as soon as its test is done


@contextmanager
def flood(address: str, kind: str, count: int, keyfile: Optional[Path] = None
          ) -> Iterator[Dict[str, Any]]:
    """Run a flood until the block ends; the dict gets its counts (opened, cut, refused)."""
    argv = [sys.executable, FLOOD, kind, address, str(count), str(FLOOD_SECONDS)]
    if keyfile is not None:
        argv.append(str(keyfile))
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    counts: Dict[str, Any] = {}
    try:
        assert proc.stdout is not None and proc.stdin is not None
        ready = proc.stdout.readline().split()
        assert ready[:1] == ["ready"] and int(ready[1]) >= count, ready
        yield counts
        proc.stdin.close()  # the flood ends
        out = proc.stdout.read()
        proc.wait(30)
        counts.update(json.loads(out.strip().splitlines()[-1]))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for f in (proc.stdin, proc.stdout):
            if f is not None:
                f.close()


def status_tries(tries: int = TRIES) -> List[str]:
    """Run ``headroom status --json`` ``tries`` times; the list of what went wrong."""
    failures = []
    for _ in range(tries):
        r = run_cli("status", "--json", timeout=60)
        if r.returncode != 0:
            failures.append(f"exit {r.returncode}: {r.stderr.strip()}")
            continue
        st = json.loads(r.stdout)
        if not st["engine"]["running"]:
            failures.append(f"answered without the engine: {st['guard']['reasons']}")
    return failures


@pytest.mark.parametrize("kind, count", [("idle", 64), ("reconnect", 200), ("stall", 200)])
def test_status_is_answered_during_a_flood(engine: EngineProcess, kind: str,
                                           count: int) -> None:
    address = engine.paths.control_address
    started = time.monotonic()
    with flood(address, kind, count, engine.paths.key_file) as counts, \
            engine.client() as c:
        first = c.status().time
        failures = status_tries()
        assert not failures, f"{len(failures)} of {TRIES} failed: {failures[:3]}"
        # The engine's loop (the guard's readings) goes on meanwhile.
        wait_for(lambda: c.status().time >= first + 2.5, 30, "readings during the flood")
        # The handshake deadline holds in the middle of the flood.
        silent = _accepted(address)  # one more that never authenticates
        try:
            silent.settimeout(30)
            assert silent.recv(64) == b"", "a silent connection was never cut"
        finally:
            silent.close()
    seconds = time.monotonic() - started
    assert counts["opened"] >= count  # the flood held on all along
    with engine.client() as c:
        assert c.ping()["pid"] == engine.proc.pid
    # What the engine refused or cut is logged in one line a second at most.
    lines = [line for line in engine.paths.log_file.read_text().splitlines()
             if " headroom.api: " in line]
    assert len(lines) <= seconds + 3, "\n".join(lines[-10:])


def test_a_flood_on_a_jobs_channel_starves_neither_clients_nor_the_guard(
        engine: EngineProcess) -> None:
    with engine.client() as c:
        job = c.job_start({"script": TICKER, "args": ["0", "0.2"], "name": "ticker"})
        wait_for(lambda: c.job_get(job.id).connected, 30, "the job's channel")
        address = engine.paths.job_address(job.id)
        try:
            with flood(address, "reconnect", 200), flood(address, "stall", 200):
                first = c.status().time
                failures = status_tries()
                # The engine's loop (the guard's readings) goes on meanwhile.
                wait_for(lambda: c.status().time >= first + 2.5, 30,
                         "readings taken during the flood")
                assert c.job_get(job.id).state == "running"
            assert not failures, f"{len(failures)} of {TRIES} failed: {failures[:3]}"
        finally:
            c.job_action(job.id, "stop")


# -- an engine whose limits are small enough to reach -------------------------------------------


class LimitedEngine(EngineProcess):
    """A real engine whose channel limits (constants of trayapp.channel) are set by the
    test before it starts."""

    CODE = ("import json, sys\n"
            "from trayapp import channel as api\n"
            "for name, value in json.loads(sys.argv[1]).items():\n"
            "    assert hasattr(api, name), name\n"
            "    setattr(api, name, value)\n"
            "from trayapp.cli import main\n"
            "sys.exit(main(sys.argv[2:]))\n")

    def __init__(self, paths: Paths, **limits: Any):  # noqa: D107 - see the class
        self.paths = paths
        env = dict(os.environ, HEADROOM_HOME=str(paths.home))
        self.stderr_path = paths.home / f"engine-stderr-{time.monotonic_ns()}.log"
        self._stderr = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", self.CODE, json.dumps(limits), "engine", "--stay"],
            env=env, cwd=str(REPO), stdout=subprocess.DEVNULL, stderr=self._stderr,
            start_new_session=True)


@pytest.fixture
def limited(paths: Paths) -> Iterator[Any]:
    started: List[LimitedEngine] = []

    def start(**limits: Any) -> LimitedEngine:
        e = LimitedEngine(paths, **limits)
        started.append(e)
        e.wait_ready()
        return e

    yield start
    for e in started:
        e.stop()


def _accepted(address: str) -> socket.socket:
    """A connection the engine took (it sent its challenge), that never authenticates."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(address)
    assert s.recv(64)
    return s


def _busy(r: subprocess.CompletedProcess) -> None:
    assert r.returncode == 3, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "busy and refused the connection" in lines[0], lines[0]
    assert "no engine is running" not in r.stderr + r.stdout


def test_a_refused_client_says_the_engine_is_busy(limited: Any) -> None:
    eng = limited(MAX_CLIENTS=1, PENDING_PER_CLIENT=1, HANDSHAKE_SECONDS=120.0,
                  EVICT_AFTER_SECONDS=120.0)
    address = eng.paths.control_address
    # The one place for a connection in its handshake is taken (and too young to give way).
    held = _accepted(address)
    try:
        _busy(run_cli("status", "--json", timeout=60))
        _busy(run_cli("jobs", timeout=60))
        # Watching, it says so and goes on; it shows the status once there is room.
        with subprocess.Popen([sys.executable, "-m", "trayapp", "status", "--json", "--watch",
                               "0.5"], cwd=str(REPO), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, HEADROOM_HOME=str(eng.paths.home))) as watch:
            try:
                assert watch.stdout is not None and watch.stderr is not None
                assert "busy and refused the connection" in watch.stderr.readline()
                held.close()
                st = json.loads(watch.stdout.readline())
                assert st["engine"]["running"], st["guard"]["reasons"]
            finally:
                watch.kill()
                watch.communicate(timeout=10)
    finally:
        held.close()
    # The one place for a client is a subscriber's, which is never cut for another client.
    with Subscription(eng.paths, snapshots=True, events=False) as sub:
        assert sub.get(10) is not None
        _busy(run_cli("status", "--json", timeout=60))
    assert not status_tries(1)
    log = eng.paths.log_file.read_text()
    assert "refused" in log


def test_subscribers_leave_room_for_clients_that_ask(limited: Any) -> None:
    eng = limited(MAX_CLIENTS=2)
    with Subscription(eng.paths, snapshots=True, events=False):
        with pytest.raises(EngineError, match="subscribed clients"):
            Subscription(eng.paths, snapshots=True, events=False)
        assert not status_tries(2)


def test_an_idle_client_gives_way_to_a_new_one(limited: Any) -> None:
    eng = limited(MAX_CLIENTS=1)
    with EngineClient(eng.paths, timeout=10) as idle:
        assert idle.ping()["pid"] == eng.proc.pid
        assert not status_tries(2)  # each took the idle client's place
        # ... and the idle client, cut meanwhile, connects again by itself.
        assert idle.status().engine.running


def test_idle_clients_are_cut_and_come_back_unaware(limited: Any) -> None:
    eng = limited(IDLE_SECONDS=1.0)
    from multiprocessing.connection import Client

    raw = Client(eng.paths.control_address, family="AF_UNIX",
                 authkey=eng.paths.key_file.read_bytes())
    with EngineClient(eng.paths, timeout=10) as client, \
            Subscription(eng.paths, snapshots=True, events=False) as sub:
        assert client.status().engine.running
        # An authenticated connection that asks nothing is cut ...
        assert raw.poll(30), "the idle connection was never cut"
        with pytest.raises(EOFError):
            raw.recv_bytes()
        # ... a client whose connection was cut the same way reconnects without a word ...
        conn = client._conn
        assert conn is not None and conn.poll(30), "the idle client was never cut"
        assert client.status().engine.running
        assert client._conn is not conn
        # ... and a subscriber, quiet as it is, keeps its pushes.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and sub.get(0) is not None:
            pass
        assert sub.get(10) is not None
    # ``status --watch`` with a period longer than the idle time goes on answering.
    with subprocess.Popen([sys.executable, "-m", "trayapp", "status", "--json", "--watch",
                           "1.5"], cwd=str(REPO), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True,
                          env=dict(os.environ, HEADROOM_HOME=str(eng.paths.home))) as watch:
        try:
            assert watch.stdout is not None
            for _ in range(3):
                line = watch.stdout.readline()
                assert line, watch.stderr.read() if watch.stderr else ""
                st = json.loads(line)
                assert st["engine"]["running"], st["guard"]["reasons"]
        finally:
            watch.kill()
            watch.communicate(timeout=10)
    raw.close()


def test_a_client_being_answered_is_never_cut_for_another(tmp_path: Path) -> None:
    """One client place, taken by a request still being answered: a newcomer is refused,
    and the request is answered whole."""
    import threading
    from multiprocessing.connection import Client

    from trayapp.channel import ChannelServer

    release = threading.Event()

    def handler(peer: Any, data: bytes) -> Dict[str, Any]:
        release.wait(30)
        return {"id": 1, "ok": True, "result": data.decode()}

    key = os.urandom(32)
    server = ChannelServer(str(tmp_path / "s.sock"), key, handler, name="test", max_peers=1)
    server.start()
    try:
        first = Client(server.address, family="AF_UNIX", authkey=key)
        first.send_bytes(b"slow")
        wait_for(lambda: any(p.handling for p in server.peers), 10, "the request being answered")
        with pytest.raises((EOFError, OSError)):
            Client(server.address, family="AF_UNIX", authkey=key)
        release.set()
        assert json.loads(first.recv_bytes())["result"] == "slow"
        first.close()
        # Idle now, the place goes to the next client.
        second = Client(server.address, family="AF_UNIX", authkey=key)
        second.send_bytes(b"next")
        assert json.loads(second.recv_bytes())["result"] == "next"
        second.close()
    finally:
        release.set()
        server.close()
