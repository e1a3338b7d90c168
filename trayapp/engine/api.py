"""An authenticated message server over a Unix socket (a named pipe on Windows).

Used for the control channel (one key for the user's clients) and for each job's channel (a key
per job). Every connection has its own thread, so a slow or hostile client only ever blocks
itself: one that does not authenticate in time, or stalls in the middle of a message, is cut
off. Messages are bytes (JSON, decoded by the handler); a message over the size limit gets an
error answer and the connection is closed. Nothing a client sends can stop the server.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import sys
import threading
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from typing import Any, Callable, Dict, List, Optional

from trayapp.engine.protocol import MAX_MESSAGE_BYTES, encode

log = logging.getLogger("headroom.api")

WINDOWS = sys.platform == "win32"


class Peer:
    """One connected client. ``send`` answers; ``push`` queues for a subscriber without ever
    blocking the caller (a subscriber that cannot keep up is disconnected)."""

    _ids = 0

    def __init__(self, server: ChannelServer, conn: Any, wake: Optional[socket.socket]):
        Peer._ids += 1
        self.id = Peer._ids
        self.server = server
        self.conn = conn
        self._wake = wake
        self.connected_at = time.monotonic()
        self.authenticated = False
        self.busy_since: Optional[float] = None
        self.closed = False
        self.subscriptions: set = set()
        self.context: Dict[str, Any] = {}  # free for the handler (e.g. the job id)
        self._send_lock = threading.Lock()
        self._queue: Optional[queue.Queue[Optional[bytes]]] = None

    def send(self, obj: Any) -> bool:
        return self.send_bytes(encode(obj))

    def send_bytes(self, data: bytes) -> bool:
        if self.closed:
            return False
        try:
            with self._send_lock:
                self.conn.send_bytes(data)
            return True
        except (OSError, EOFError, ValueError):
            self.close()
            return False

    def subscribe(self, kinds: set, queue_size: int = 256) -> None:
        self.subscriptions = set(kinds)
        if self._queue is None:
            self._queue = queue.Queue(maxsize=queue_size)
            threading.Thread(target=self._sender, name=f"push-{self.id}", daemon=True).start()

    def push(self, kind: str, data: bytes) -> None:
        """Queue an encoded push if this peer subscribed to ``kind``."""
        if self.closed or self._queue is None or kind not in self.subscriptions:
            return
        try:
            self._queue.put_nowait(data)
        except queue.Full:
            log.info("client %d does not keep up with its subscription; disconnected", self.id)
            self.close()

    def _sender(self) -> None:
        q = self._queue
        assert q is not None
        while not self.closed:
            data = q.get()
            if data is None or not self.send_bytes(data):
                return

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._queue is not None:
            try:
                self._queue.put_nowait(None)
            except queue.Full:
                pass
        # shutdown() wakes a thread blocked in recv on this socket; close() alone may not.
        if self._wake is not None:
            try:
                self._wake.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._wake.close()
        try:
            self.conn.close()
        except OSError:
            pass


Handler = Callable[[Peer, bytes], Optional[Any]]


class ChannelServer:
    """Accepts authenticated connections at ``address`` and hands each message to ``handler``.

    ``handler(peer, data)`` returns an answer object (sent back as JSON) or None. It must not
    raise; if it does, the error is logged and the client gets an error answer.
    """

    def __init__(self, address: str, authkey: bytes, handler: Handler, *, name: str = "control",
                 max_peers: int = 64, auth_timeout: float = 5.0, stall_timeout: float = 10.0,
                 max_message_bytes: int = MAX_MESSAGE_BYTES,
                 on_open: Optional[Callable[[Peer], None]] = None,
                 on_close: Optional[Callable[[Peer], None]] = None):
        self.address = address
        self.authkey = authkey
        self.handler = handler
        self.name = name
        self.max_peers = max_peers
        self.auth_timeout = auth_timeout
        self.stall_timeout = stall_timeout
        self.max_message_bytes = max_message_bytes
        self.on_open = on_open
        self.on_close = on_close
        self.peers: List[Peer] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._sock: Optional[socket.socket] = None
        self._threads: List[threading.Thread] = []
        self.last_activity = time.monotonic()

    # -- life cycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Bind and start accepting. Raises OSError if the address cannot be bound."""
        if WINDOWS:
            self._start_windows()
        else:
            try:
                os.unlink(self.address)  # a socket left by an engine that was killed
            except FileNotFoundError:
                pass
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            old_umask = os.umask(0o177)
            try:
                sock.bind(self.address)
            finally:
                os.umask(old_umask)
            os.chmod(self.address, 0o600)
            sock.listen(16)
            sock.settimeout(0.5)
            self._sock = sock
            t = threading.Thread(target=self._accept_loop, name=f"{self.name}-accept", daemon=True)
            t.start()
            self._threads.append(t)
        r = threading.Thread(target=self._reaper, name=f"{self.name}-reaper", daemon=True)
        r.start()
        self._threads.append(r)

    def close(self) -> None:
        self._closed.set()
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
            try:
                os.unlink(self.address)
            except OSError:
                pass
        if WINDOWS and getattr(self, "_listener", None) is not None:
            try:
                self._listener.close()
            except OSError:
                pass
        for p in list(self.peers):
            p.close()

    @property
    def client_count(self) -> int:
        return sum(1 for p in self.peers if p.authenticated and not p.closed)

    def broadcast(self, kind: str, obj: Any) -> None:
        """Push ``obj`` to every peer subscribed to ``kind`` (encoded once)."""
        subscribers = [p for p in self.peers if kind in p.subscriptions and not p.closed]
        if not subscribers:
            return
        data = encode({"push": kind, "data": obj})
        for p in subscribers:
            p.push(kind, data)

    # -- accepting ----------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        assert self._sock is not None
        while not self._closed.is_set():
            try:
                client, _ = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                if self._closed.is_set():
                    return
                time.sleep(0.05)
                continue
            client.settimeout(None)
            if not self._admit():
                client.close()
                continue
            wake = client.dup()
            conn = Connection(client.detach())
            self._spawn(Peer(self, conn, wake))

    def _start_windows(self) -> None:  # pragma: no cover - Windows only
        from trayapp.engine.winpipe import UserOnlyPipeListener  # type: ignore[attr-defined]

        self._listener = UserOnlyPipeListener(self.address)
        t = threading.Thread(target=self._accept_loop_windows, name=f"{self.name}-accept",
                             daemon=True)
        t.start()
        self._threads.append(t)

    def _accept_loop_windows(self) -> None:  # pragma: no cover - Windows only
        while not self._closed.is_set():
            try:
                conn = self._listener.accept()
            except OSError:
                if self._closed.is_set():
                    return
                continue
            if not self._admit():
                conn.close()
                continue
            self._spawn(Peer(self, conn, None))

    def _admit(self) -> bool:
        with self._lock:
            self.peers = [p for p in self.peers if not p.closed]
            if len(self.peers) >= self.max_peers:
                log.warning("%s: too many connections (%d); refusing one", self.name,
                            len(self.peers))
                return False
            return True

    def _spawn(self, peer: Peer) -> None:
        with self._lock:
            self.peers.append(peer)
        threading.Thread(target=self._serve, args=(peer,), name=f"{self.name}-{peer.id}",
                         daemon=True).start()

    # -- one connection -----------------------------------------------------------------------

    def _serve(self, peer: Peer) -> None:
        conn = peer.conn
        try:
            try:
                deliver_challenge(conn, self.authkey)
                answer_challenge(conn, self.authkey)
            except (AuthenticationError, EOFError, OSError, ValueError) as e:
                log.info("%s: refused a client that did not authenticate (%s)", self.name,
                         type(e).__name__)
                return
            peer.authenticated = True
            self.last_activity = time.monotonic()
            if self.on_open is not None:
                self.on_open(peer)
            while not peer.closed and not self._closed.is_set():
                try:
                    if not conn.poll(1.0):
                        continue
                    peer.busy_since = time.monotonic()
                    data = conn.recv_bytes(self.max_message_bytes)
                except OSError as e:
                    if peer.closed:
                        return
                    if "bad message length" in str(e):
                        peer.send({"id": None, "ok": False, "code": "too_large",
                                   "error": f"message larger than {self.max_message_bytes} bytes"})
                    return
                except EOFError:
                    return
                finally:
                    peer.busy_since = None
                self.last_activity = time.monotonic()
                try:
                    answer = self.handler(peer, data)
                except Exception:  # the server must outlive any handler bug
                    log.exception("%s: handler failed", self.name)
                    answer = {"id": None, "ok": False, "code": "internal",
                              "error": "internal error in the engine (see its log)"}
                if answer is not None:
                    peer.send(answer)
        finally:
            peer.close()
            with self._lock:
                if peer in self.peers:
                    self.peers.remove(peer)
            if peer.authenticated and self.on_close is not None:
                try:
                    self.on_close(peer)
                except Exception:
                    log.exception("%s: on_close failed", self.name)

    def _reaper(self) -> None:
        """Cut off clients that never authenticate or stall half-way through a message."""
        while not self._closed.wait(0.5):
            now = time.monotonic()
            for p in list(self.peers):
                if p.closed:
                    continue
                if not p.authenticated and now - p.connected_at > self.auth_timeout:
                    log.info("%s: client %d did not authenticate in time", self.name, p.id)
                    p.close()
                elif p.busy_since is not None and now - p.busy_since > self.stall_timeout:
                    log.info("%s: client %d stalled in the middle of a message", self.name, p.id)
                    p.close()
