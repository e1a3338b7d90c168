"""Files a job's script can put in its own folder, met by the engine's file helpers: a FIFO
where its log was must be refused at once, never waited on (the launcher's lock is held while a
parked job is relaunched, by the guard too)."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any, List

import pytest

from trayapp import private

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="FIFOs")


def _in_thread(fn: Any) -> List[Any]:
    out: List[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except Exception as e:  # the test looks at what it was
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(20)
    assert not t.is_alive(), "blocked on a FIFO"
    return out


def test_opening_a_fifo_to_append_is_refused_without_waiting(tmp_path: Path) -> None:
    fifo = tmp_path / "log"
    os.mkfifo(fifo, 0o600)
    (result,) = _in_thread(lambda: private.open_private_file(fifo, "ab"))
    assert isinstance(result, private.UnsafePath)
    assert "not a regular file" in str(result)


def test_a_log_opened_to_append_blocks_on_writes_as_before(tmp_path: Path) -> None:
    """The descriptor a job gets as its stdout is in blocking mode."""
    import fcntl

    with private.open_private_file(tmp_path / "log", "ab") as f:
        assert not fcntl.fcntl(f.fileno(), fcntl.F_GETFL) & os.O_NONBLOCK
        f.write(b"x")
    assert (tmp_path / "log").read_bytes() == b"x"


@pytest.mark.parametrize("form", [["--env", "API_KEY=sekrit-crash-value"],
                                  ["--env=API_KEY=sekrit-crash-value"],
                                  ["--en", "API_KEY=sekrit-crash-value"]])
def test_a_crash_of_run_keeps_the_env_names_but_not_their_values(
        home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
        form: List[str]) -> None:
    from trayapp import cli

    def broken(*args: Any, **kw: Any) -> int:
        raise RuntimeError("a bug")

    monkeypatch.setattr(cli, "dispatch", broken)
    argv = ["run", *form, "train.py"]
    monkeypatch.setattr(sys, "argv", ["headroom", *argv])
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "internal error" in err and "Traceback" not in err
    crash = (home / "crash.log").read_text()
    assert "a bug" in crash and "API_KEY" in crash
    assert "sekrit-crash-value" not in crash


def test_a_runner_repeating_stopping_cannot_put_off_the_stop_for_good(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner's "stopping" buys it one grace period to save, not one per message."""
    import time
    from multiprocessing.connection import Client

    from tests.unit.test_launcher import _fake_python, ticker
    from trayapp.config import get_paths
    from trayapp.engine.store import Store
    from trayapp.jobs import ladder
    from trayapp.jobs import manager as managers
    from trayapp.runner import protocol as rp

    monkeypatch.setenv("HEADROOM_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(ladder, "STOP_ASK_SECONDS", 0.2)
    monkeypatch.setattr(ladder, "STOP_RUNNER_SECONDS", 1.0)
    paths = get_paths()
    paths.ensure()
    store = Store(paths.db_file)
    manager = managers.JobManager(paths, store, emit=lambda *a, **k: None)
    try:
        jid = manager.start(ticker(python=_fake_python(tmp_path))).id
        key = (paths.jobs_dir / jid / "key").read_bytes()
        with Client(paths.job_address(jid), family="AF_UNIX", authkey=key) as conn:
            conn.send_bytes(rp.encode(rp.make(rp.HELLO, job_id=jid, fit_hook="installed")))
            deadline = time.monotonic() + 20
            while not manager.get(jid).connected and time.monotonic() < deadline:
                manager.tick(None)
                time.sleep(0.02)
            manager.stop(jid)
            assert conn.poll(5) and rp.decode(conn.recv_bytes(),
                                              rp.ENGINE_COMMANDS)["type"] == rp.STOP
            # Many grace periods' worth of "stopping", sent all along.
            deadline = time.monotonic() + 8
            while manager.get(jid).state != "stopped" and time.monotonic() < deadline:
                conn.send_bytes(rp.encode(rp.make(rp.STATE, state="stopping")))
                for _ in range(10):
                    manager.tick(None)
                    time.sleep(0.02)
            assert manager.get(jid).state == "stopped"
    finally:
        manager.stop_all("test over", timeout=5)
        manager.close()
        store.close()
