"""The parts of a tick, each run on its own: one that fails does not stop the others.

The memory ladder must act even when job bookkeeping, history or the events fail (a full disk,
a bug, a record a job spoiled). A failing part is logged with its traceback the first time,
then in one line at most once a minute (a part that fails on every tick must not flood the
log), and once more when it works again.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Dict, List

from trayapp.text import one_line

QUIET_SECONDS = 60.0


class Parts:
    """``run(name, fn, *args, **kwargs)``: call ``fn``; True when it returned, False when it
    raised (and was reported)."""

    def __init__(
        self,
        logger: logging.Logger,
        quiet: float = QUIET_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.log = logger
        self.quiet = quiet
        self.clock = clock
        self._failing: Dict[str, List[float]] = {}  # part -> [last report, failures since]
        self._lock = threading.Lock()  # events are recorded from the channels' threads too

    def run(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
        try:
            fn(*args, **kwargs)
        except Exception as e:  # the whole point: the next part runs whatever this one did
            self.failed(name, e)
            return False
        self.worked(name)
        return True

    def worked(self, name: str) -> None:
        """``name`` worked this time: said once if it had failed."""
        if name in self._failing:
            with self._lock:
                recovered = self._failing.pop(name, None) is not None
            if recovered:
                self.log.info("%s works again", name)

    def failing(self) -> List[str]:
        """The parts whose last run failed."""
        return sorted(self._failing)

    def failed(self, name: str, error: Exception) -> None:
        """Report that ``name`` failed with ``error`` (at the rate described above)."""
        now = self.clock()
        with self._lock:
            entry = self._failing.get(name)
            if entry is None:
                self._failing[name] = [now, 0]
                first, count, since = True, 0, 0.0
            else:
                entry[1] += 1
                first, count, since = False, int(entry[1]), now - entry[0]
                if since < self.quiet:
                    return
                entry[0], entry[1] = now, 0
        if first:
            self.log.error("%s failed; the rest of the tick goes on", name, exc_info=error)
        else:
            self.log.error(
                "%s still fails (%d times in %.0f s): %s", name, count, since, one_line(error, 300)
            )
