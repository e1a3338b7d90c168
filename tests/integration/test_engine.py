"""The engine for real: a process on a temporary HEADROOM_HOME, spoken to over its socket."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import struct
import subprocess
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client
from typing import Any

import pytest

from tests.conftest import EngineProcess, headroom_cmd, run_cli, wait_for
from trayapp import __version__
from trayapp.engine.client import EngineClient, EngineError, EngineUnavailable, Subscription

STATUS_KEYS = {"time", "memory", "gpus", "guard", "jobs"}
MEMORY_KEYS = {"total_bytes", "available_bytes", "used_bytes", "swap_total_bytes",
               "swap_used_bytes", "psi_some_avg10", "psi_full_avg10", "limit_source"}


def test_status_through_the_channel(engine: EngineProcess) -> None:
    with engine.client() as c:
        st = c.request("status")  # the status object of DESIGN.md, as it is sent
    assert STATUS_KEYS <= set(st)
    assert MEMORY_KEYS <= set(st["memory"])
    mem = st["memory"]
    assert 0 < mem["available_bytes"] <= mem["total_bytes"]
    assert mem["limit_source"] in ("host", "cgroup")
    assert st["gpus"] == []  # no NVIDIA driver on this machine
    assert st["gpu_status"]["message"].startswith("no NVIDIA GPU found")
    assert st["guard"]["state"] in ("ok", "warn", "pause", "park")
    assert st["engine"]["running"] is True and st["engine"]["pid"] == engine.proc.pid


def test_history_after_some_samples(engine: EngineProcess) -> None:
    t0 = time.time()

    def history() -> Any:
        with engine.client() as c:
            h = c.history(t0 - 5)
        return h if len(h.series["mem.available"].t) >= 2 else None

    # Samples are kept at most one a second: two of them within a few seconds.
    h = wait_for(history, 10, "two samples in the history", every=0.2)
    avail = h.series["mem.available"]
    assert h.resolution == "raw"
    assert len(avail.t) >= 2 and avail.v is not None and len(avail.v) == len(avail.t)
    assert all(t0 - 5 <= t <= time.time() for t in avail.t)
    assert all(v is not None and v > 0 for v in avail.v)
    assert list(avail.t) == sorted(avail.t)


def test_subscription_pushes_snapshots(engine: EngineProcess) -> None:
    with Subscription(engine.paths) as sub:
        assert STATUS_KEYS <= set(sub.initial["status"])
        snapshots = []
        deadline = time.monotonic() + 5
        while len(snapshots) < 2 and time.monotonic() < deadline:
            msg = sub.get(timeout=2)
            if msg and msg.get("push") == "snapshot":
                snapshots.append(msg["data"])
    assert len(snapshots) == 2
    assert snapshots[1]["time"] > snapshots[0]["time"]


def test_runtime_folder_and_key_are_private(engine: EngineProcess) -> None:
    p = engine.paths
    assert stat.S_IMODE(os.stat(p.runtime_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(p.key_file).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(p.control_address).st_mode) == 0o600


def test_a_client_without_the_key_is_refused(engine: EngineProcess) -> None:
    with pytest.raises(AuthenticationError):
        Client(engine.paths.control_address, family="AF_UNIX", authkey=b"not the key")
    wrong = engine.paths.home / "wrong.key"
    wrong.write_bytes(b"x" * 32)
    with engine.client() as c:  # and the engine still answers the right one
        assert c.ping()["pid"] == engine.proc.pid


def _authenticated(engine: EngineProcess):  # type: ignore[no-untyped-def]
    return Client(engine.paths.control_address, family="AF_UNIX",
                  authkey=engine.paths.key_file.read_bytes())


def test_garbage_is_answered_and_the_engine_keeps_answering(engine: EngineProcess) -> None:
    # Raw bytes from a client that never authenticates.
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    raw.connect(engine.paths.control_address)
    raw.sendall(os.urandom(4096))
    conn = _authenticated(engine)
    answers = []
    for bad in (b"not json", b"[1, 2]", b'{"op": "nope"}', b'{"op": "history"}',
                b'{"op": "history", "args": {"start": "yesterday"}}', b"\xff\xfe",
                b'{"op": "status", "args": {"surprise": 1}}'):
        conn.send_bytes(bad)
        answers.append(json.loads(conn.recv_bytes()))
    assert all(a["ok"] is False and a["error"] for a in answers)
    conn.send_bytes(b'{"id": 9, "op": "ping"}')
    assert json.loads(conn.recv_bytes())["result"]["pid"] == engine.proc.pid
    conn.close()
    raw.close()
    with engine.client() as c:
        assert c.status().engine.running


def test_a_huge_message_is_refused(engine: EngineProcess) -> None:
    conn = _authenticated(engine)
    try:
        conn.send_bytes(b"{" + b" " * (2 << 20) + b"}")
        answer = json.loads(conn.recv_bytes())
        assert answer["ok"] is False and "larger" in answer["error"]
    except (EOFError, OSError):
        pass  # dropped: also acceptable
    conn.close()
    with engine.client() as c:
        assert c.ping()["pid"] == engine.proc.pid


def test_a_client_stalled_mid_message_does_not_block_others(engine: EngineProcess) -> None:
    stalled = _authenticated(engine)
    sock = socket.socket(fileno=os.dup(stalled.fileno()))
    sock.sendall(struct.pack("!i", 1000) + b'{"op": "st')  # half a message, then nothing
    for _ in range(3):
        with engine.client(timeout=5) as c:
            assert c.status().engine.running
    sock.close()
    stalled.close()


def test_bad_requests_through_the_client_raise_engine_error(engine: EngineProcess) -> None:
    with engine.client() as c:
        with pytest.raises(EngineError, match="unknown setting"):
            c.config_set("guard.nonsense", 1)
        with pytest.raises(EngineError, match="not one of"):
            c.guard_mode("sometimes")
        with pytest.raises(EngineError, match="start is after end"):
            c.history(time.time() + 100, time.time())


def test_config_set_keeps_the_users_comments(engine: EngineProcess) -> None:
    cfg = engine.paths.config_file
    cfg.write_text("# my own note\n[guard]\nmode = \"act\"  # keep acting\n")
    with engine.client() as c:
        result = c.guard_mode("dry-run")
        assert result.value("guard.mode") == "dry-run"
        assert c.status().guard.mode == "dry-run"
    text = cfg.read_text()
    assert "# my own note" in text and "dry-run" in text


def test_corrupt_database_is_moved_aside(paths, start_engine) -> None:  # type: ignore[no-untyped-def]
    paths.ensure()
    paths.db_file.write_bytes(b"this is not a database" * 100)
    engine = start_engine()
    with engine.client() as c:
        events = c.events()
    assert any(e.kind == "store_recovered" for e in events)
    aside = [p.name for p in paths.db_file.parent.iterdir() if ".corrupt-" in p.name]
    assert aside, "the damaged database should be kept beside the new one"


def test_a_broken_config_gives_messages_and_defaults(paths, start_engine) -> None:  # type: ignore[no-untyped-def]
    paths.ensure()
    paths.config_file.write_text("[guard]\nwarn_available = \"lots\"\nmystery = 3\n[engine\n")
    engine = start_engine()
    with engine.client() as c:
        cfg = c.config_get()
    assert cfg.value("guard.warn_available") == "15%"
    assert any("cannot be read" in p for p in cfg.problems)


def test_a_killed_engine_leaves_nothing_that_stops_the_next(start_engine) -> None:  # type: ignore[no-untyped-def]
    first = start_engine()
    first.kill()
    with pytest.raises(EngineUnavailable):
        EngineClient(first.paths, timeout=2).ping()
    second = start_engine()
    with second.client() as c:
        assert c.ping()["pid"] == second.proc.pid


def test_a_second_engine_says_one_is_running(engine: EngineProcess) -> None:
    r = run_cli("engine")
    assert r.returncode == 0
    assert "already running" in r.stderr
    with engine.client() as c:
        assert c.ping()["pid"] == engine.proc.pid


def test_shutdown_request_stops_the_engine(engine: EngineProcess) -> None:
    with engine.client() as c:
        assert c.shutdown()["stopping"] is True
    assert engine.proc.wait(10) == 0
    assert not engine.paths.key_file.exists()


def test_engine_exits_when_idle(paths, start_engine) -> None:  # type: ignore[no-untyped-def]
    paths.ensure()
    paths.config_file.write_text("[engine]\nidle_exit_seconds = 1\n")
    e = start_engine(stay=False)
    assert e.proc.wait(15) == 0
    assert "no clients and no jobs" in e.stderr


def test_sigterm_stops_the_engine_cleanly(engine: EngineProcess) -> None:
    engine.proc.send_signal(signal.SIGTERM)
    assert engine.proc.wait(10) == 0
    assert "Traceback" not in engine.stderr


# -- the command line ---------------------------------------------------------------------------


def test_status_without_engine_reads_the_probes(home) -> None:  # type: ignore[no-untyped-def]
    r = run_cli("status")
    assert r.returncode == 0, r.stderr
    assert "no engine is running" in r.stdout
    assert "RAM" in r.stdout and "no NVIDIA GPU found" in r.stdout
    j = run_cli("status", "--json")
    st = json.loads(j.stdout)
    assert STATUS_KEYS <= set(st) and st["engine"]["running"] is False
    assert st["memory"]["total_bytes"] > 0


def test_status_demo_shows_simulated_gpus(home) -> None:  # type: ignore[no-untyped-def]
    st = json.loads(run_cli("--demo", "status", "--json").stdout)
    assert st["gpus"] and all(g["simulated"] for g in st["gpus"])
    text = run_cli("status", "--demo").stdout
    assert "simulated" in text.lower()


def test_status_with_engine(engine: EngineProcess) -> None:
    r = run_cli("status")
    assert r.returncode == 0
    assert f"engine running (pid {engine.proc.pid})" in r.stdout
    st = json.loads(run_cli("status", "--json").stdout)
    assert st["engine"]["pid"] == engine.proc.pid


def test_status_watch_refreshes_until_ctrl_c(home) -> None:  # type: ignore[no-untyped-def]
    shown = home / "watch.out"
    with open(shown, "wb") as out_file:
        p = subprocess.Popen(headroom_cmd("status", "--json", "--watch", "0.2"),
                             stdout=out_file, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: shown.read_text().count("\n") >= 2, 30, "two refreshes")
    finally:
        p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=10)
    out = shown.read_text()
    assert p.returncode == 0, err
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert len(lines) >= 2
    assert "Traceback" not in err


@pytest.mark.parametrize("args", [
    ["status", "--bogus"],
    ["status", "--watch", "soon"],
    ["status", "--watch", "-1"],
    ["nonsense"],
    ["--open", "kitchen"],
])
def test_bad_flags_exit_2_with_one_line(home, args) -> None:  # type: ignore[no-untyped-def]
    r = run_cli(*args)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr


def test_version(home) -> None:  # type: ignore[no-untyped-def]
    r = run_cli("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"headroom {__version__}"
