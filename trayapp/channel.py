"""An authenticated message server over a Unix socket (a named pipe on Windows).

Used for the engine's control channel (one key for the user's clients, ``engine/``) and for each
job's channel (a key per job, ``jobs/``): it knows neither, and imports nothing of Headroom but
the runner's protocol constants. Every connection has its own thread, so a slow or hostile
client only ever blocks itself: one that does not authenticate in time, or stalls in the middle
of a message, is cut off. Messages are bytes (JSON, decoded by the handler); a message over the
size limit gets an error answer and the connection is closed. Nothing a client sends can stop
the server.

A flood of connections cannot lock the user's clients out. Connections still in their handshake
and authenticated ones have separate limits; when the handshake places are full, the oldest
connection that has had its chance gives its place to the newcomer; when the client places are
full, a client that proves the key takes the place of the client that has gone the longest
without progress (never a subscriber's, never one whose request is being answered), and
subscribers may not take the last places. New connections are taken at a
bounded rate (the rest wait in the kernel's queue, costing nothing), so a flood on one channel
cannot starve the others or the guard. Refusals and cuts are logged at most once a second, with
counts.
"""

from __future__ import annotations

import json
import logging
import math
import os
import queue
import socket
import sys
import threading
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from typing import Any, Callable, Dict, List, Optional

from trayapp.channel_parts import Outbox, Pace, Tally
from trayapp.errors import Refused
from trayapp.runner.protocol import MAX_MESSAGE_BYTES

log = logging.getLogger("headroom.api")

WINDOWS = sys.platform == "win32"

# The limits of a channel. Module constants, read when a server is made (so a test can set them
# small); a server's own arguments override them.
MAX_CLIENTS = 64  # authenticated connections at once
PENDING_PER_CLIENT = 4  # connections still in their handshake, per client place
HANDSHAKE_SECONDS = 3.0  # a connection that has not authenticated by then is cut
EVICT_AFTER_SECONDS = 1.0  # ...and may give its place to a newcomer once this old
STALL_SECONDS = 10.0  # a message once begun must arrive whole within this
# The control channel cuts a client that neither asks nor subscribes for this long; the client
# connects again when it next asks (EngineClient does so by itself).
IDLE_SECONDS = 30.0
ACCEPTS_PER_CLIENT = 8  # new connections taken per second, per client place
BACKLOG = 512  # connections the kernel queues until they are taken
REFUSALS_LOG_SECONDS = 1.0
# What the engine tells a job goes through the job's outbox, written by a thread of its own:
# a peer whose write has not gone through in this long does not read, and is cut off.
WRITE_SECONDS = 5.0
OUTBOX_SIZE = 16  # messages waiting for a peer at once (commands coalesce by their kind)


def encode(obj: Any) -> bytes:
    """JSON bytes; NaN and infinities become null so the other side can always parse them."""
    return json.dumps(_finite(obj), separators=(",", ":"), allow_nan=False).encode("utf-8")


def _finite(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


class ChannelFull(Refused):
    """A subscription refused: the channel keeps its last places for clients that ask."""


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
        self.last_active = self.connected_at  # the last request answered (or the handshake)
        self.proven = False  # it answered the challenge with the key (it holds a client place)
        self.authenticated = False
        self.busy_since: Optional[float] = None
        self.handling = False  # a request of its is being answered (it is never cut then)
        self.closed = False
        self.subscriptions: set = set()
        self.context: Dict[str, Any] = {}  # free for the handler (e.g. the job id)
        self._send_lock = threading.Lock()
        self._queue: Optional[queue.Queue[Optional[bytes]]] = None
        self.writing_since: Optional[float] = None  # a write under way (the reaper's watch)
        self.cut_off = False  # closed because it did not read (see ``post``)
        self._outbox: Optional[Outbox] = None
        self._outbox_lock = threading.Lock()  # never held over I/O (the send lock may be)

    def send(self, obj: Any) -> bool:
        return self.send_bytes(encode(obj))

    def send_bytes(self, data: bytes) -> bool:
        if self.closed:
            return False
        try:
            with self._send_lock:
                self.writing_since = time.monotonic()
                try:
                    self.conn.send_bytes(data)
                finally:
                    self.writing_since = None
            return True
        except (OSError, EOFError, ValueError, TypeError):  # TypeError: closed mid-write
            self.close()
            return False

    def post(self, obj: Any, key: Optional[str] = None) -> bool:
        """Queue ``obj`` for this peer's own writer thread and return at once: the caller may
        hold any lock. A message with the same ``key`` still waiting is replaced (one pending
        "park", not 500). False when the peer is closed, or its outbox is full (its writer is
        stuck on a peer that does not read: the reaper cuts it off once its write has not gone
        through in ``WRITE_SECONDS``, and ``cut_off`` says so)."""
        if self.closed:
            return False
        if self._outbox is None:
            with self._outbox_lock:
                if self._outbox is None:
                    self._outbox = Outbox(OUTBOX_SIZE)
                    threading.Thread(
                        target=self._write_outbox, name=f"outbox-{self.id}", daemon=True
                    ).start()
        return self._outbox.put(encode(obj), key)

    def cut(self) -> None:
        """Close a peer that does not read."""
        self.cut_off = True
        self.close()

    def _write_outbox(self) -> None:
        box = self._outbox
        assert box is not None
        while not self.closed:
            data = box.get()
            if data is None or not self.send_bytes(data):
                return

    def subscribe(self, kinds: set, queue_size: int = 256) -> None:
        """Receive pushes of ``kinds``. Raises ChannelFull when the channel already has its
        most subscribers (its last places are kept for clients that ask)."""
        if kinds and not self.subscriptions:
            self.server.reserve_subscription(self)
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
        if self._outbox is not None:
            self._outbox.close()
        if self._queue is not None:
            try:
                self._queue.put_nowait(None)
            except queue.Full:
                pass
        if self._wake is None:  # Windows: a pipe handle, closed at once
            self._close_conn()
            return
        # shutdown() ends every read and write under way on this socket and fails those to
        # come. Its descriptor is let go only by ``release``, from the thread that reads it:
        # closed here, from any thread, its number could be handed to the next connection the
        # engine takes while a reader or writer of this one is about to use it, and that
        # connection would get this one's bytes (a client then sees "wrong key", or waits).
        try:
            self._wake.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def release(self) -> None:
        """Close, and let the descriptors go. Called by the thread that reads the connection,
        when it has done with it; a write under way ends first (``close`` failed it)."""
        self.close()
        with self._send_lock:  # no writer is between taking the descriptor and using it
            self._close_conn()
            if self._wake is not None:
                self._wake.close()

    def _close_conn(self) -> None:
        try:
            self.conn.close()
        except OSError:
            pass


Handler = Callable[[Peer, bytes], Optional[Any]]


class ChannelServer:
    """Accepts authenticated connections at ``address`` and hands each message to ``handler``.

    ``handler(peer, data)`` returns an answer object (sent back as JSON) or None. It must not
    raise; if it does, the error is logged and the client gets an error answer.

    Limits (None: the module's constants): ``max_peers`` authenticated clients,
    ``max_pending`` connections in their handshake (default ``PENDING_PER_CLIENT`` per client
    place), ``auth_timeout`` for the handshake, ``stall_timeout`` for a message begun,
    ``idle_timeout`` for a client that neither asks nor subscribes (None: never cut).
    """

    def __init__(
        self,
        address: str,
        authkey: bytes,
        handler: Handler,
        *,
        name: str = "control",
        max_peers: Optional[int] = None,
        auth_timeout: Optional[float] = None,
        stall_timeout: Optional[float] = None,
        max_pending: Optional[int] = None,
        idle_timeout: Optional[float] = None,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        on_open: Optional[Callable[[Peer], None]] = None,
        on_close: Optional[Callable[[Peer], None]] = None,
    ):
        self.address = address
        self.authkey = authkey
        self.handler = handler
        self.name = name
        self.max_peers = max(1, MAX_CLIENTS if max_peers is None else max_peers)
        self.max_pending = max(
            1, PENDING_PER_CLIENT * self.max_peers if max_pending is None else max_pending
        )
        # The last places are kept for clients that ask (a subscriber is never cut for them).
        self.max_subscribers = max(1, self.max_peers - max(1, self.max_peers // 8))
        self.auth_timeout = HANDSHAKE_SECONDS if auth_timeout is None else auth_timeout
        self.evict_after = min(EVICT_AFTER_SECONDS, self.auth_timeout)
        self.stall_timeout = STALL_SECONDS if stall_timeout is None else stall_timeout
        self.idle_timeout = idle_timeout
        self.accept_rate = float(ACCEPTS_PER_CLIENT * self.max_peers)
        self.max_message_bytes = max_message_bytes
        self.on_open = on_open
        self.on_close = on_close
        self.peers: List[Peer] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._sock: Optional[socket.socket] = None
        self._threads: List[threading.Thread] = []
        self._tally = Tally(name, REFUSALS_LOG_SECONDS)
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
            # A long queue: a client waiting behind a flood waits there for its turn instead of
            # being turned away by the kernel.
            sock.listen(BACKLOG)
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
        self._tally.flush(force=True)

    @property
    def client_count(self) -> int:
        return sum(1 for p in self.peers if p.authenticated and not p.closed)

    def subscribed(self, kind: str) -> bool:
        """Whether any peer takes pushes of ``kind`` (what nobody reads need not be made)."""
        return any(kind in p.subscriptions and not p.closed for p in list(self.peers))

    def broadcast(self, kind: str, obj: Any) -> None:
        """Push ``obj`` to every peer subscribed to ``kind`` (encoded once)."""
        subscribers = [p for p in self.peers if kind in p.subscriptions and not p.closed]
        if not subscribers:
            return
        data = encode({"push": kind, "data": obj})
        for p in subscribers:
            p.push(kind, data)

    def reserve_subscription(self, peer: Peer) -> None:
        """Raises ChannelFull when ``peer`` may not subscribe (see ``Peer.subscribe``)."""
        with self._lock:
            n = sum(1 for p in self.peers if p.subscriptions and not p.closed and p is not peer)
        if n >= self.max_subscribers:
            self._tally.note("subscriptions refused (too many subscribers)", serious=True)
            raise ChannelFull(
                f"the engine already has {n} subscribed clients, its most; close some of them"
            )

    # -- accepting ----------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        assert self._sock is not None
        pace = Pace(self.accept_rate, self.max_pending)
        while not self._closed.is_set():
            pace.wait(self._closed)
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
        # Windows only: winpipe needs _winapi and ctypes' Windows types.
        from trayapp.winpipe import UserOnlyPipeListener  # type: ignore[attr-defined]

        self._listener = UserOnlyPipeListener(self.address)
        t = threading.Thread(
            target=self._accept_loop_windows, name=f"{self.name}-accept", daemon=True
        )
        t.start()
        self._threads.append(t)

    def _accept_loop_windows(self) -> None:  # pragma: no cover - Windows only
        pace = Pace(self.accept_rate, self.max_pending)
        while not self._closed.is_set():
            pace.wait(self._closed)
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
        """Whether a new connection gets a handshake place. When they are all taken, the oldest
        connection in its handshake gives way if it has had ``evict_after`` seconds."""
        victim: Optional[Peer] = None
        with self._lock:
            self.peers = [p for p in self.peers if not p.closed]
            pending = [p for p in self.peers if not p.proven]
            if len(pending) >= self.max_pending:
                oldest = min(pending, key=lambda p: p.connected_at)
                if time.monotonic() - oldest.connected_at < self.evict_after:
                    self._tally.note(
                        "connections refused (every handshake place taken)", serious=True
                    )
                    return False
                victim = oldest
        if victim is not None:
            self._tally.note("connections cut in their handshake to make room")
            victim.close()
        return True

    def _admit_client(self, peer: Peer) -> bool:
        """Whether ``peer``, which has just proven the key, gets a client place. When they are
        all taken, the client that has gone the longest without progress (idle since its last
        answer, or stalled since it began a message) gives way, so a client that has only just
        arrived is the last to; a subscriber, or a client being answered, never does."""
        victim: Optional[Peer] = None
        with self._lock:
            if peer.closed:
                return False
            clients = [p for p in self.peers if p.proven and not p.closed and p is not peer]
            if len(clients) >= self.max_peers:
                free = [p for p in clients if not p.handling and not p.subscriptions]
                if not free:
                    self._tally.note("clients refused (every place busy)", serious=True)
                    return False
                victim = min(free, key=lambda p: p.busy_since or p.last_active)
                victim.close()  # under the lock: its thread cannot start answering it now
            peer.proven = True
        if victim is not None:
            self._tally.note("clients cut to make room for a new one", serious=True)
        return True

    def _spawn(self, peer: Peer) -> None:
        with self._lock:
            self.peers.append(peer)
        threading.Thread(
            target=self._serve, args=(peer,), name=f"{self.name}-{peer.id}", daemon=True
        ).start()

    # -- one connection -----------------------------------------------------------------------

    def _serve(self, peer: Peer) -> None:
        conn = peer.conn
        try:
            try:
                deliver_challenge(conn, self.authkey)
                # The client proved the key: it needs a client place before the handshake ends
                # (refused, it sees the connection closed in the middle of its handshake).
                if not self._admit_client(peer):
                    return
                answer_challenge(conn, self.authkey)
            except (AuthenticationError, EOFError, OSError, ValueError) as e:
                if not peer.closed:
                    self._tally.note(f"handshakes failed ({type(e).__name__})")
                return
            peer.authenticated = True
            peer.last_active = self.last_activity = time.monotonic()
            if self.on_open is not None:
                self.on_open(peer)
            while not peer.closed and not self._closed.is_set():
                try:
                    if not conn.poll(1.0):
                        if self._idle_too_long(peer):
                            # Routine: its client connects again when it next asks.
                            log.debug("%s: client %d idle; disconnected", self.name, peer.id)
                            return
                        continue
                    peer.busy_since = time.monotonic()
                    data = conn.recv_bytes(self.max_message_bytes)
                except OSError as e:
                    if peer.closed:
                        return
                    if "bad message length" in str(e):
                        peer.send(
                            {
                                "id": None,
                                "ok": False,
                                "code": "too_large",
                                "error": f"message larger than {self.max_message_bytes} bytes",
                            }
                        )
                    return
                except EOFError:
                    return
                finally:
                    peer.busy_since = None
                with self._lock:
                    if peer.closed:  # cut to make room meanwhile: the request is not answered
                        return
                    peer.handling = True
                try:
                    self.last_activity = time.monotonic()
                    try:
                        answer = self.handler(peer, data)
                    except Exception:  # the server must outlive any handler bug
                        log.exception("%s: handler failed", self.name)
                        answer = {
                            "id": None,
                            "ok": False,
                            "code": "internal",
                            "error": "internal error in the engine (see its log)",
                        }
                    if answer is not None:
                        peer.send_bytes(self._bounded(answer))
                finally:
                    peer.last_active = time.monotonic()
                    peer.handling = False
        finally:
            peer.release()
            with self._lock:
                if peer in self.peers:
                    self.peers.remove(peer)
            if peer.authenticated and self.on_close is not None:
                try:
                    self.on_close(peer)
                except Exception:
                    log.exception("%s: on_close failed", self.name)

    def _bounded(self, answer: Any) -> bytes:
        """``answer`` encoded; one larger than a client reads is replaced by a refusal that says
        so (the client would otherwise drop the connection on it); one JSON cannot hold (a
        handler's bug) is an internal error, the connection serving on."""
        req_id = answer.get("id") if isinstance(answer, dict) else None
        if not isinstance(req_id, (int, str)) or len(str(req_id)) > 200:
            req_id = None
        try:
            data = encode(answer)
        except (TypeError, ValueError, RecursionError):
            log.exception("%s: an answer that is not JSON was not sent", self.name)
            return encode(
                {
                    "id": req_id,
                    "ok": False,
                    "code": "internal",
                    "error": "internal error in the engine (see its log)",
                }
            )
        if len(data) <= self.max_message_bytes:
            return data
        log.warning(
            "%s: an answer of %d bytes was not sent (at most %d)",
            self.name,
            len(data),
            self.max_message_bytes,
        )
        return encode(
            {
                "id": req_id,
                "ok": False,
                "code": "too_large",
                "error": f"the answer is larger than {self.max_message_bytes} bytes; ask for less",
            }
        )

    def _idle_too_long(self, peer: Peer) -> bool:
        return (
            self.idle_timeout is not None
            and not peer.subscriptions
            and time.monotonic() - peer.last_active > self.idle_timeout
        )

    def _reaper(self) -> None:
        """Cut off clients that never authenticate or stall half-way through a message."""
        while not self._closed.wait(0.5):
            now = time.monotonic()
            for p in list(self.peers):
                if p.closed:
                    continue
                if not p.authenticated and now - p.connected_at > self.auth_timeout:
                    self._tally.note("connections cut (no handshake in time)")
                    p.close()
                elif p.busy_since is not None and now - p.busy_since > self.stall_timeout:
                    self._tally.note("clients cut (stalled in the middle of a message)")
                    p.close()
                elif p.writing_since is not None and now - p.writing_since > WRITE_SECONDS:
                    # shutdown() in close() ends the blocked write with an error.
                    self._tally.note("clients cut (they do not read what they are sent)")
                    p.cut()
            self._tally.flush()
