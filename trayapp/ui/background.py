"""Plain functions run on daemon threads for the windows (finding and probing interpreters),
their results handed to the GUI thread.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from typing import Any, Callable, Dict, Optional, Tuple

import shiboken6
from PySide6.QtCore import QObject, QTimer

log = logging.getLogger("headroom.ui")


class Background(QObject):
    """Runs plain functions on daemon threads; ``on_done(result)`` runs on the GUI thread.

    A thread holds nothing of Qt's, not even a reference to this object or to ``on_done`` (which
    refers to its dialog): the last reference to a window dropped on a thread would destroy it
    there, off the GUI thread, which crashes Qt. The thread only puts (ticket, result) in a
    queue, which a timer on the GUI thread empties."""

    POLL_MS = 30

    def __init__(self, parent: Optional[QObject] = None):
        super().__init__(parent)
        self._closed = threading.Event()
        self._results: queue.SimpleQueue[Tuple[int, Any]] = queue.SimpleQueue()
        self._waiting: Dict[int, Callable[[Any], None]] = {}
        self._tickets = itertools.count(1)
        self._timer = QTimer(self)
        self._timer.setInterval(self.POLL_MS)
        self._timer.timeout.connect(self._deliver)

    def submit(self, fn: Callable[[], Any], on_done: Callable[[Any], None]) -> None:
        if self._closed.is_set():
            return
        ticket = next(self._tickets)
        self._waiting[ticket] = on_done
        if not self._timer.isActive():
            self._timer.start()
        threading.Thread(
            target=_background_work,
            args=(fn, ticket, self._results, self._closed),
            name="headroom-launch",
            daemon=True,
        ).start()

    def pending(self) -> int:
        return len(self._waiting)

    def close(self) -> None:
        self._closed.set()
        self._waiting.clear()
        if shiboken_valid(self._timer):
            self._timer.stop()

    def _deliver(self) -> None:
        while True:
            try:
                ticket, result = self._results.get_nowait()
            except queue.Empty:
                break
            on_done = self._waiting.pop(ticket, None)
            if on_done is not None and not self._closed.is_set():
                on_done(result)
        if not self._waiting:
            self._timer.stop()


def _background_work(
    fn: Callable[[], Any],
    ticket: int,
    results: queue.SimpleQueue[Tuple[int, Any]],
    closed: threading.Event,
) -> None:
    try:
        result = fn()
    except Exception as e:  # a probe that breaks must not break the dialog
        log.exception("background work failed")
        result = e
    if not closed.is_set():
        results.put((ticket, result))


def shiboken_valid(obj: Any) -> bool:
    """Whether ``obj``'s C++ object still exists (a window's children go with it)."""
    return bool(shiboken6.isValid(obj))
