"""One tray per user (per state folder): a second ``headroom`` asks the first to open a window.

The first instance holds a lock file (QLockFile: it notices a holder that died) and listens on a
local socket in the private runtime folder (a user-only named pipe on Windows). A later instance
that cannot take the lock sends ``{"open": NAME}`` and exits once the first one says "ok".
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from typing import Optional

from PySide6.QtCore import QLockFile, QObject, Signal
from PySide6.QtNetwork import QLocalServer, QLocalSocket

from trayapp.config import Paths

WINDOWS = ("dashboard", "launch", "jobs", "settings", "machines")


def server_name(paths: Paths) -> str:
    """The local socket's name: a path in the private runtime folder, or a pipe name."""
    if sys.platform == "win32":
        return "headroom-tray-" + hashlib.sha256(str(paths.data_dir).encode()).hexdigest()[:16]
    return str(paths.runtime_dir / "tray.sock")


class SingleInstance(QObject):
    """``acquire()`` makes this the one tray, or returns False when another one runs.
    ``activated(str)`` names the window another instance asked for."""

    activated = Signal(str)

    def __init__(self, paths: Paths, parent: Optional[QObject] = None):
        super().__init__(parent)
        self.paths = paths
        self.name = server_name(paths)
        self._lock = QLockFile(str(paths.data_dir / "tray.lock"))
        self._lock.setStaleLockTime(0)  # a lock whose process is gone is stale, however fresh
        self._server: Optional[QLocalServer] = None

    def acquire(self) -> bool:
        """Take the lock and listen. False when another live tray holds the lock."""
        self.paths.ensure()
        if not self._lock.tryLock(0):
            return False
        server = QLocalServer()
        server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)
        # We hold the lock, so a socket left at this name belongs to a tray that died.
        QLocalServer.removeServer(self.name)
        if not server.listen(self.name):
            self._lock.unlock()
            raise OSError(f"cannot listen on {self.name}: {server.errorString()}")
        server.newConnection.connect(self._accept)
        self._server = server
        return True

    def forward(self, window: str, timeout_s: float = 3.0) -> bool:
        """Ask the running tray to open ``window``; True once it said so. Retries while the
        other tray is still starting (it holds the lock but does not listen yet)."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self._send(window, 1000):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)

    def _send(self, window: str, timeout_ms: int) -> bool:
        sock = QLocalSocket()
        sock.connectToServer(self.name)
        try:
            if not sock.waitForConnected(timeout_ms):
                return False
            sock.write(json.dumps({"open": window}).encode() + b"\n")
            if not sock.waitForBytesWritten(timeout_ms):
                return False
            while not bytes(sock.peek(64).data()).endswith(b"\n"):
                if not sock.waitForReadyRead(timeout_ms):
                    return False
            return bytes(sock.readLine().data()).strip() == b"ok"
        finally:
            sock.abort()

    def _accept(self) -> None:
        assert self._server is not None
        while self._server.hasPendingConnections():
            sock = self._server.nextPendingConnection()
            sock.readyRead.connect(lambda s=sock: self._read(s))
            sock.disconnected.connect(sock.deleteLater)
            if sock.bytesAvailable():
                self._read(sock)

    def _read(self, sock: QLocalSocket) -> None:
        if not sock.canReadLine():
            if sock.bytesAvailable() > 4096:  # not one of ours
                sock.abort()
            return
        line = bytes(sock.readLine().data())
        try:
            window = json.loads(line.decode("utf-8")).get("open")
        except (ValueError, AttributeError):
            window = None
        if window not in WINDOWS:
            window = "dashboard"
        sock.write(b"ok\n")
        sock.flush()
        sock.disconnectFromServer()
        self.activated.emit(window)

    def close(self) -> None:
        """Stop listening and release the lock. Open connections are cut, and the server goes
        through the event loop (deleting it here would delete sockets still in use)."""
        server, self._server = self._server, None
        if server is not None:
            for sock in server.findChildren(QLocalSocket):
                sock.abort()
            server.close()
            server.setParent(None)
            server.deleteLater()
        self._lock.unlock()
