"""The job's side of its channel, closed while its writer is blocked on an engine that does not
read: the write ends, the writer's thread ends without an error, and the descriptor is let go
only once no thread uses it. A real listener that takes the connection and never reads."""

from __future__ import annotations

import sys
import threading
from multiprocessing.connection import Listener
from pathlib import Path
from typing import Any, List

import pytest

from tests.conftest import wait_for
from trayapp.runner import protocol
from trayapp.runner.channel import Channel

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX sockets")

KEY = b"k" * 32


def test_closing_while_a_write_is_blocked_ends_the_writer_and_lets_the_socket_go(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    errors: List[Any] = []
    monkeypatch.setattr(threading, "excepthook", errors.append)
    address = str(tmp_path / "engine")
    listener = Listener(address, family="AF_UNIX", authkey=KEY)
    taken: List[Any] = []
    accept = threading.Thread(target=lambda: taken.append(listener.accept()), daemon=True)
    accept.start()
    channel = Channel(address, KEY, lambda message: None, lambda: protocol.make(protocol.HELLO))
    channel.start()
    try:
        wait_for(lambda: channel.connected and taken, 30, "the channel to connect")
        conn = channel._conn
        pad = "x" * 1_000_000  # more than a socket's buffer holds: the writer blocks on it
        for _ in range(20):
            channel.send(protocol.make(protocol.NOTE, level=protocol.NOTE_INFO, message=pad))
        writer = next(t for t in threading.enumerate() if t.name == "headroom-send")
        wait_for(lambda: len(channel._queue) < 20, 30, "the writer to take the first")

        channel.close(timeout=0.2)  # the engine does not read: no bye gets through
        wait_for(lambda: not writer.is_alive(), 30, "the writer to end")
        wait_for(lambda: conn.closed, 30, "the reader to let the socket go")
        assert not errors, errors
    finally:
        channel.close(timeout=0)
        for c in taken:
            c.close()
        listener.close()
