"""The job's side of the job channel: connect to the engine, keep reconnecting, never block.

Training must not wait for the engine: messages go into a queue that a writer thread drains, and
commands arrive on a reader thread that also (re)connects with backoff. If the engine goes away the
job keeps training; when it comes back the job says ``hello`` again.
"""

import collections
import os
import re
import sys
import threading
import time

from . import protocol

PROGRESS_INTERVAL_SECONDS = 0.25  # at most 4 progress messages a second
_BACKLOG = 1000  # messages kept while the engine is away; the oldest go first


def parse_address(text):
    """The engine's address as ``multiprocessing.connection`` wants it.

    ``host:port`` is TCP, a name starting with two backslashes is a Windows named pipe, anything
    else is a Unix socket path (a leading NUL byte or ``@`` is the Linux abstract namespace).
    """
    if text.startswith("\\\\"):
        return text
    m = re.match(r"^([A-Za-z0-9_.\-]+|\[[0-9A-Fa-f:.]+\]):(\d+)$", text)
    if m:
        return (m.group(1).strip("[]"), int(m.group(2)))
    if text.startswith("@"):
        return "\0" + text[1:]
    return text


SMALL_STACK = 512 * 1024


def start_small(thread):
    """Start one of the runner's own threads with a small stack. Each thread's default stack
    reserves 8 MiB of address space: a job under an address-space limit (``ulimit -v``, a
    container's) keeps that room for its training."""
    old = threading.stack_size(SMALL_STACK)
    try:
        thread.start()
    finally:
        threading.stack_size(old)


def _shut(conn):
    """End every read and write under way on ``conn``'s socket, and fail those to come,
    without letting its descriptor go (the thread that reads it does, in ``_let_go``: a number
    let go while another thread may still use it can be handed to a file the training opens).
    False where it is not a socket (a Windows pipe)."""
    if sys.platform == "win32":
        return False
    import socket  # here: a kernel starts before it needs it

    try:
        sock = socket.socket(fileno=os.dup(conn.fileno()))
    except (OSError, ValueError, TypeError):
        return False
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.close()
    return True


def _close(conn):
    try:
        conn.close()
    except OSError:
        pass


class NullChannel:
    """Stands in when the job runs without an engine (a plain dry run, no address given)."""

    connected = False

    def send(self, message):
        pass

    def send_progress(self, message, now=False):
        pass

    def hello_changed(self):
        pass

    def close(self, final=None, timeout=2.0):
        pass


class Channel:
    """A reconnecting client. ``on_command(message)`` runs on the reader thread; ``hello()``
    builds the hello message each time it is needed."""

    def __init__(self, address, authkey, on_command, hello, retry_max_seconds=5.0):
        self._address = parse_address(address)
        self._authkey = authkey
        self._on_command = on_command
        self._hello = hello
        self._retry_max = retry_max_seconds
        self._cond = threading.Condition()
        self._queue = collections.deque(maxlen=_BACKLOG)
        self._progress = None
        self._last_progress = 0.0
        self._final = None
        self._conn = None
        self._send_lock = threading.Lock()  # held over each write (see ``_let_go``)
        self._generation = 0
        self._broken_generation = -1
        self._hello_needed = False
        self._closing = False
        self._stopped = False
        self._attempted = False
        self._last_attempt_failed = False
        self.connected = False
        self.last_error = None

    def start(self):
        for target, name in ((self._read, "headroom-channel"), (self._write, "headroom-send")):
            start_small(threading.Thread(target=target, name=name, daemon=True))

    # -- called from any thread -----------------------------------------------------------

    def send(self, message):
        """Queue a message; returns at once."""
        with self._cond:
            if self._stopped:
                return
            self._queue.append(message)
            self._cond.notify_all()

    def send_progress(self, message, now=False):
        """Queue a progress message; only the newest waiting one is sent, at most 4 a second.
        ``now``: sent in any case, in its turn, in place of a waiting one (an epoch's end:
        its logs hold the validation metrics, which a later batch's would not)."""
        with self._cond:
            if self._stopped:
                return
            if now:
                self._progress = None
                self._queue.append(message)
            else:
                self._progress = message
            self._cond.notify_all()

    def hello_changed(self):
        """Send a fresh hello (what it reports has changed)."""
        with self._cond:
            self._hello_needed = True
            self._cond.notify_all()

    def close(self, final=None, timeout=2.0):
        """Send what is waiting, then ``final`` (the bye), then disconnect.

        Waits at most ``timeout`` seconds, and not at all when the engine could not be reached.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            self._final = final
            self._closing = True
            self._cond.notify_all()
            while not self._stopped:
                reachable = self._conn is not None or not self._last_attempt_failed
                left = deadline - time.monotonic()
                if not reachable or left <= 0:
                    break
                self._cond.wait(min(left, 0.05))
            self._stopped = True
            conn = self._conn
            self._cond.notify_all()
        if conn is not None and not _shut(conn):
            _close(conn)  # a pipe, closed at once; the reader, woken, lets a socket go itself

    def _let_go(self, conn):
        """Close ``conn`` once no write is under way on it (the reader's, when done with it)."""
        if not _shut(conn):  # a write blocked on an engine that does not read ends now
            _close(conn)  # a pipe: as before, at once
            return
        with self._send_lock:
            _close(conn)

    # -- reader: connect, receive commands --------------------------------------------------

    def _read(self):
        # Imported here: a job without an engine does not pay for multiprocessing's imports.
        from multiprocessing.connection import Client

        delay = 0.1
        while True:
            with self._cond:
                if self._stopped:
                    return
                self._attempted = True
            try:
                conn = Client(self._address, authkey=self._authkey)
            except Exception as e:  # refused, missing socket, bad key: keep trying, quietly
                with self._cond:
                    self.last_error = e
                    self._last_attempt_failed = True
                    self._cond.notify_all()
                    if self._stopped:
                        return
                    self._cond.wait(delay)
                delay = min(delay * 2, self._retry_max)
                continue
            delay = 0.1
            with self._cond:
                if self._stopped:
                    conn.close()
                    return
                self._conn = conn
                self._generation += 1
                generation = self._generation
                self._hello_needed = True
                self._last_attempt_failed = False
                self.connected = True
                self._cond.notify_all()
            try:
                self._receive(conn, generation)
            finally:
                with self._cond:
                    if self._conn is conn:
                        self._conn = None
                    self.connected = False
                    self._cond.notify_all()
                self._let_go(conn)

    def _receive(self, conn, generation):
        while True:
            with self._cond:
                if self._stopped or self._broken_generation == generation:
                    return
            try:
                # poll() wakes at once on data; the timeout only bounds how late a broken
                # connection (seen by the writer) is noticed here.
                if not conn.poll(0.5):
                    continue
                data = conn.recv_bytes(protocol.MAX_MESSAGE_BYTES)
            except (EOFError, OSError):
                return
            try:
                message = protocol.decode(data, protocol.ENGINE_COMMANDS)
            except protocol.ProtocolError as e:
                self.send(
                    protocol.make(protocol.NOTE, level=protocol.NOTE_WARN, message=f"ignored: {e}")
                )
                continue
            try:
                self._on_command(message)
            except Exception as e:  # a command must never end the reader
                self.send(protocol.make(protocol.NOTE, level=protocol.NOTE_ERROR, message=str(e)))

    # -- writer: drain the queue ------------------------------------------------------------

    def _next(self):
        """(connection, generation, message, kind) to send, or None when stopped."""
        with self._cond:
            while True:
                if self._stopped:
                    return None
                conn = self._conn
                usable = conn is not None and self._broken_generation != self._generation
                if usable:
                    if self._hello_needed:
                        self._hello_needed = False
                        return conn, self._generation, None, "hello"
                    if self._queue:
                        return conn, self._generation, self._queue.popleft(), "queued"
                    if self._progress is not None:
                        wait = PROGRESS_INTERVAL_SECONDS - (time.monotonic() - self._last_progress)
                        # Closing: the last progress goes at once rather than hold up the exit.
                        if wait <= 0 or self._closing:
                            message, self._progress = self._progress, None
                            self._last_progress = time.monotonic()
                            return conn, self._generation, message, "progress"
                        self._cond.wait(wait)
                        continue
                    if self._closing:
                        if self._final is not None:
                            message, self._final = self._final, None
                            return conn, self._generation, message, "final"
                        self._stopped = True
                        self._cond.notify_all()
                        return None
                self._cond.wait()

    def _write(self):
        while True:
            item = self._next()
            if item is None:
                return
            conn, generation, message, kind = item
            if kind == "hello":
                try:
                    message = self._hello()
                except Exception as e:
                    message = protocol.make(protocol.HELLO, error=f"hello failed: {e}")
            try:
                data = protocol.encode(message)
            except (ValueError, TypeError):
                continue  # not JSON-able: drop it rather than stop the channel
            try:
                with self._send_lock:
                    conn.send_bytes(data)
            except (OSError, ValueError, TypeError):  # TypeError: let go in the middle
                with self._cond:
                    self._broken_generation = generation
                    if kind == "hello":
                        self._hello_needed = True
                    elif kind == "queued":
                        self._queue.appendleft(message)
                    elif kind == "final":
                        self._final = message
                    elif kind == "progress" and self._progress is None:
                        self._progress = message
                    self._cond.notify_all()
