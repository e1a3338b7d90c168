"""Talking to the engine off the GUI thread.

``EngineWorker`` is a QThread that owns the subscription: it starts the engine when none runs,
hands the GUI one whole status dict per push, and reconnects when the engine goes away and comes
back (saying "unreachable" meanwhile). ``CallRunner`` runs requests (menu actions, history) on
daemon threads and delivers their answers on the GUI thread. ``collect_garbage_on_gui_thread``
keeps Python's cycle collector off those threads.
"""

from __future__ import annotations

import gc
import logging
import queue
import threading
from typing import Any, Callable, Dict, Optional

from PySide6.QtCore import QObject, QThread, QTimer, Signal

from trayapp.config import Paths
from trayapp.config.view import ConfigView
from trayapp.engine.client import (
    EngineBusy,
    EngineClient,
    EngineError,
    EngineUnavailable,
    Subscription,
    start_and_wait,
)
from trayapp.engine.event_record import EngineEvent
from trayapp.engine.status_record import Status

log = logging.getLogger("headroom.ui")

# The poller's own requests: short, so quitting never waits long for it.
REQUEST_SECONDS = 3.0
# Most pushes handed on at once; older snapshots in a burst are dropped (only the last counts).
_DRAIN_MAX = 64


def collect_garbage_on_gui_thread(parent: QObject, interval_ms: int = 1000) -> QTimer:
    """Run Python's cycle collector only on the GUI thread, from a timer owned by ``parent``.

    Left automatic, the collector runs in whichever thread happens to allocate when a threshold
    is crossed, here often an engine thread; a window or model collected there is destroyed off
    the GUI thread, which Qt warns about and which can crash. Automatic collection is turned off;
    the timer collects each generation whose threshold its count passed, as Python would.
    ``gc.enable()`` gives the automatic collector back (tests do, when they end)."""
    thresholds = gc.get_threshold()

    def collect() -> None:
        counts = gc.get_count()
        for generation in (2, 1, 0):
            if counts[generation] > thresholds[generation]:
                gc.collect(generation)  # collects the younger generations too
                break

    gc.disable()
    timer = QTimer(parent)
    timer.setObjectName("headroom-gc")
    timer.timeout.connect(collect)
    timer.start(interval_ms)
    return timer


class EngineWorker(QThread):
    """Owns the engine subscription. Signals carry plain Python objects.

    ``snapshot(Status)``: a whole status, read into its record (at most what the engine
    pushes, 4 Hz).
    ``event_received(EngineEvent)``: an engine event, in order.
    ``connected(dict)``: ``{"started_engine": bool, "config": dict or None}`` after each
    (re)connection.
    ``config(ConfigView)``: the engine's settings (``config_get()``), again after a change.
    ``unreachable(str)``: the engine cannot be reached; the reason in one line.
    """

    snapshot = Signal(object)
    event_received = Signal(object)  # not ``event``: that is QObject.event()
    connected = Signal(object)
    config = Signal(object)
    unreachable = Signal(str)

    def __init__(
        self,
        paths: Paths,
        *,
        start_engine: bool = True,
        demo: bool = False,
        config_file: Optional[str] = None,
        poll_seconds: float = 0.25,
        retry_seconds: float = 0.5,
        max_retry_seconds: float = 5.0,
        parent: Optional[QObject] = None,
    ):
        super().__init__(parent)
        self.paths = paths
        self.start_engine = start_engine
        self.demo = demo
        self.config_file = config_file
        self.poll_seconds = poll_seconds
        self.retry_seconds = retry_seconds
        self.max_retry_seconds = max_retry_seconds
        self.started_engine = False  # whether this tray started the engine it talks to
        self._halt = threading.Event()
        self._sub: Optional[Subscription] = None
        self._reached = False  # the last session got as far as a subscription

    def halt(self) -> None:
        """Ask the thread to end without waiting (it also stops starting engines)."""
        self._halt.set()

    def stop(self, wait_ms: int = 20000) -> bool:
        """Ask the thread to end and wait for it; returns whether it ended. It ends within
        the longest request it may be in (two ``REQUEST_SECONDS``), well inside ``wait_ms``."""
        self._halt.set()
        if not self.isRunning():
            return True
        return self.wait(wait_ms)

    def run(self) -> None:  # noqa: D401 - QThread entry point
        delay = self.retry_seconds
        last_reason: Optional[str] = None
        while not self._halt.is_set():
            try:
                self._session()
                reason = "the engine went away"
            except (EngineUnavailable, EngineError) as e:
                reason = str(e)
            except Exception as e:  # the poller must outlive any one bad answer
                log.exception("the engine poller failed")
                reason = f"{type(e).__name__}: {e}"
            if self._halt.is_set():
                break
            if reason != last_reason:
                self.unreachable.emit(reason)
                last_reason = reason
            if self._reached:
                delay = self.retry_seconds
            self._halt.wait(delay)
            delay = min(self.max_retry_seconds, delay * 2)

    def _session(self) -> None:
        self._reached = False
        client = EngineClient(self.paths, timeout=REQUEST_SECONDS)
        try:
            try:
                client.ping()
            except EngineUnavailable as e:
                # A busy engine runs: another one would not help.
                if not self.start_engine or isinstance(e, EngineBusy):
                    raise
                self.unreachable.emit("starting the engine")
                self._start_engine(client)
            config = self._config(client)
            sub = Subscription(self.paths, timeout=REQUEST_SECONDS)
            self._sub = sub
            try:
                self._reached = True
                self.connected.emit({"started_engine": self.started_engine, "config": config})
                if config is not None:
                    self.config.emit(config)
                initial = sub.initial.get("status")
                if isinstance(initial, dict):
                    self.snapshot.emit(Status.from_json(initial))
                self._pump(sub, client)
            finally:
                sub.close()
                self._sub = None
        finally:
            client.close()

    def _start_engine(self, client: EngineClient) -> None:
        """Start an engine and wait until it answers (or another one that won the race)."""
        proc = start_and_wait(
            self.paths, client, demo=self.demo, config_file=self.config_file, halt=self._halt
        )
        self.started_engine = True
        log.info("started an engine for %s (pid %d)", self.paths.home, proc.pid)

    def _config(self, client: EngineClient) -> Optional[ConfigView]:
        try:
            return client.config_get()
        except EngineError as e:
            log.warning("could not read the engine's settings: %s", e)
            return None

    def _pump(self, sub: Subscription, client: EngineClient) -> None:
        while not self._halt.is_set():
            msg = sub.get(self.poll_seconds)
            if msg is None:
                continue
            latest: Optional[Dict[str, Any]] = None
            for _ in range(_DRAIN_MAX):
                kind, data = msg.get("push"), msg.get("data")
                if kind == "snapshot" and isinstance(data, dict):
                    latest = data
                elif kind == "event" and (event := EngineEvent.from_json(data)) is not None:
                    self.event_received.emit(event)
                    if event.kind == "config_changed":
                        config = self._config(client)
                        if config is not None:
                            self.config.emit(config)
                nxt = sub.get(0)
                if nxt is None:
                    break
                msg = nxt
            if latest is not None:
                self.snapshot.emit(Status.from_json(latest))


class CallRunner(QObject):
    """Runs engine requests on daemon threads; each thread keeps its own client.

    ``submit(fn, on_done, on_error)``: ``fn(client)`` runs off the GUI thread; ``on_done(result)``
    or ``on_error(message)`` then run on the GUI thread. Without ``on_error`` a failure is
    announced through ``failed(str)``.
    """

    failed = Signal(str)
    _finished = Signal(object)

    def __init__(
        self,
        client_factory: Callable[[], EngineClient],
        workers: int = 2,
        parent: Optional[QObject] = None,
    ):
        super().__init__(parent)
        self._factory = client_factory
        self._queue: queue.Queue[Any] = queue.Queue()
        self._closed = threading.Event()
        self._pending = 0
        self._lock = threading.Lock()
        self._finished.connect(self._deliver)
        self._threads = [
            threading.Thread(target=self._serve, name=f"headroom-calls-{i}", daemon=True)
            for i in range(workers)
        ]
        for t in self._threads:
            t.start()

    def submit(
        self,
        fn: Callable[[EngineClient], Any],
        on_done: Optional[Callable[[Any], None]] = None,
        on_error: Optional[Callable[[str], None]] = None,
    ) -> None:
        if self._closed.is_set():
            return
        with self._lock:
            self._pending += 1
        self._queue.put((fn, on_done, on_error))

    def pending(self) -> int:
        with self._lock:
            return self._pending

    def close(self) -> None:
        """No more calls; the threads end after their current one (they never block exit)."""
        self._closed.set()
        for _ in self._threads:
            self._queue.put(None)

    def _serve(self) -> None:
        client: Optional[EngineClient] = None
        while True:
            item = self._queue.get()
            if item is None:
                break
            fn, on_done, on_error = item
            result: Any = None
            error: Optional[str] = None
            try:
                if client is None:
                    client = self._factory()
                result = fn(client)
            except EngineUnavailable as e:
                error = str(e)
                if client is not None:
                    client.close()
                client = None
            except EngineError as e:
                error = str(e)
            except Exception as e:  # one line for the user; the details go to the log
                log.exception("an engine request failed")
                error = f"{type(e).__name__}: {e}"
            with self._lock:
                self._pending -= 1
            if not self._closed.is_set():
                self._finished.emit((on_done, on_error, result, error))
        if client is not None:
            client.close()

    def _deliver(self, item: Any) -> None:
        on_done, on_error, result, error = item
        if error is not None:
            if on_error is not None:
                on_error(error)
            else:
                self.failed.emit(error)
        elif on_done is not None:
            on_done(result)
