"""A second ``headroom`` start: it asks the running tray over its socket without loading Qt,
and says within its bound when that tray does not answer. Real Unix sockets, real processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator, List

import pytest

from tests.conftest import REPO, headroom_cmd
from trayapp.cli.second_start import ask_running_tray, tray_socket
from trayapp.config import Paths

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="Unix sockets")


@pytest.fixture
def listener(paths: Paths) -> Iterator[socket.socket]:
    paths.ensure()
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(tray_socket(paths))
    srv.listen(4)
    yield srv
    srv.close()


def serve(srv: socket.socket, reply: bytes, got: List[bytes]) -> threading.Thread:
    def run() -> None:
        conn, _ = srv.accept()
        with conn:
            got.append(conn.recv(4096))
            if reply:
                conn.sendall(reply)
            else:
                conn.recv(4096)  # says nothing: until the asker gives up
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_tray_that_answers_opens_the_window(listener: socket.socket, paths: Paths) -> None:
    got: List[bytes] = []
    serve(listener, b"ok\n", got)
    assert ask_running_tray(paths, "jobs") == ""
    assert got == [b'{"open": "jobs"}\n']


def test_a_busy_tray_is_said_within_the_bound(listener: socket.socket, paths: Paths) -> None:
    serve(listener, b"", [])
    start = time.monotonic()
    why = ask_running_tray(paths, "dashboard", timeout_s=0.5)
    assert why == ("Headroom is already running but its tray did not answer within 0.5 s "
                   "(it may be busy); try again in a moment")
    assert time.monotonic() - start < 5  # bounded by its timeout, not by the tray


def test_a_socket_left_by_a_dead_tray_means_no_tray(paths: Paths) -> None:
    paths.ensure()
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(tray_socket(paths))
    dead.close()  # the file stays, nobody listens
    assert Path(tray_socket(paths)).exists()
    assert ask_running_tray(paths, "dashboard") is None


def test_the_second_start_says_so_in_one_line_and_exits(listener: socket.socket, paths: Paths,
                                                         home: Path) -> None:
    got: List[bytes] = []
    serve(listener, b"ok\n", got)
    env = dict(os.environ, HEADROOM_HOME=str(home))
    env.pop("DISPLAY", None)  # the running tray has the display: this start needs none
    done = subprocess.run(headroom_cmd("--open", "settings"), env=env, cwd=str(REPO),
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (
        0, "Headroom is already running; opened the settings\n", "")
    assert got == [b'{"open": "settings"}\n']


def asked(srv: socket.socket) -> bool:
    """Whether anyone connected to ``srv``."""
    srv.settimeout(0.2)
    try:
        srv.accept()[0].close()
        return True
    except socket.timeout:
        return False


def test_a_listener_that_floods_bytes_is_no_tray_and_is_left_at_once(
        listener: socket.socket, paths: Paths) -> None:
    def flood() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(4096)
            try:
                while True:
                    conn.sendall(b"x" * 65536)
            except OSError:
                pass
    threading.Thread(target=flood, daemon=True).start()
    start = time.monotonic()
    assert ask_running_tray(paths, "dashboard", timeout_s=5) == \
        "the running Headroom gave no answer it should"
    assert time.monotonic() - start < 2  # not read until the bound


def test_a_socket_in_a_runtime_folder_others_can_write_is_not_asked(
        listener: socket.socket, paths: Paths) -> None:
    os.chmod(paths.runtime_dir, 0o777)
    try:
        why = ask_running_tray(paths, "dashboard", timeout_s=0.5)
    finally:
        os.chmod(paths.runtime_dir, 0o700)
    assert why is not None and why.startswith("refusing to trust the running Headroom's socket")
    assert "can be written by other users" in why
    assert not asked(listener)


def test_a_link_planted_at_the_socket_is_not_followed(paths: Paths, tmp_path: Path) -> None:
    paths.ensure()
    elsewhere = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    elsewhere.bind(str(tmp_path / "other.sock"))
    elsewhere.listen(1)
    os.symlink(tmp_path / "other.sock", tray_socket(paths))
    try:
        why = ask_running_tray(paths, "dashboard", timeout_s=0.5)
        assert why is not None and "is a symbolic link" in why
        assert not asked(elsewhere)
    finally:
        elsewhere.close()


def test_no_runtime_folder_means_no_tray(paths: Paths) -> None:
    assert not paths.runtime_dir.exists()
    assert ask_running_tray(paths, "dashboard") is None
