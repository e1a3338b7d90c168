"""The channel's small parts: a peer's outbox, the pace of new connections, and the tally of
refusals that is logged at most once a second (``trayapp.channel``)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Dict, List, Optional

log = logging.getLogger("headroom.api")


class Outbox:
    """A small bounded queue of encoded messages for one peer. A message put with the key of
    one still waiting replaces it and goes to the end: the latest of each kind, in the order
    they were last given (pause, resume, pause leaves resume, pause). ``get`` blocks until
    there is one, or returns None once closed."""

    def __init__(self, size: int):
        self.size = max(1, size)
        self._items: List[List[Any]] = []  # [key, data]
        self._cond = threading.Condition()
        self._closed = False
        self.coalesced = 0  # messages replaced by a newer one of the same key

    def put(self, data: bytes, key: Optional[str] = None) -> bool:
        """Queue ``data``; False (nothing queued) when the box is full or closed."""
        with self._cond:
            if self._closed:
                return False
            if key is not None:
                before = len(self._items)
                self._items = [item for item in self._items if item[0] != key]
                self.coalesced += before - len(self._items)
            if len(self._items) >= self.size:
                return False
            self._items.append([key, data])
            self._cond.notify()
            return True

    def get(self) -> Optional[bytes]:
        with self._cond:
            while not self._items and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            return self._items.pop(0)[1]

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._items.clear()
            self._cond.notify_all()


class Pace:
    """At most ``rate`` events a second on average, ``burst`` at once: ``wait`` blocks until
    the next one may happen (or ``stop`` is set)."""

    def __init__(self, rate: float, burst: int):
        self.rate = max(rate, 0.001)
        self.burst = max(burst, 1)
        self._tokens = float(self.burst)
        self._at = time.monotonic()

    def wait(self, stop: threading.Event) -> None:
        while True:
            now = time.monotonic()
            self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.rate)
            self._at = now
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return
            if stop.wait((1.0 - self._tokens) / self.rate):
                return


class Tally:
    """Counts refused and cut connections by reason and logs them at most once per
    ``every`` seconds, in one line, so a flood cannot flood the log too."""

    def __init__(self, name: str, every: float = 1.0):
        self.name = name
        self.every = every
        self._counts: Dict[str, int] = {}
        self._serious = False
        self._lock = threading.Lock()
        self._since = time.monotonic()
        self._logged = 0.0

    def note(self, reason: str, serious: bool = False) -> None:
        with self._lock:
            if not self._counts:
                self._since = time.monotonic()
            self._counts[reason] = self._counts.get(reason, 0) + 1
            self._serious = self._serious or serious
        self.flush()

    def flush(self, force: bool = False) -> None:
        now = time.monotonic()
        with self._lock:
            if not self._counts or (now - self._logged < self.every and not force):
                return
            counts, serious, since = self._counts, self._serious, self._since
            self._counts, self._serious, self._since, self._logged = {}, False, now, now
        text = ", ".join(f"{reason}: {n}" for reason, n in sorted(counts.items()))
        log.log(
            logging.WARNING if serious else logging.INFO,
            "%s, in the last %.1f s: %s",
            self.name,
            max(now - since, 0.0),
            text,
        )
