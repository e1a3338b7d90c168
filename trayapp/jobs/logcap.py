"""The engine's part of the job logs' cap: a thread that looks at each running job's log ten
times a second (fifty while one grows fast enough to need trims), trims one that has gone
further over its cap than the runner lets it go (output that bypasses Python: TensorFlow's C++
logs, child processes), and trims a job's log once more when the job has ended. The trim itself
is ``trayapp.runner.joblog.trim``, the one the runner uses inside the job.

Its own thread, so the guard's loop never waits on a log's disk.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Dict, Iterable, Optional, Tuple

from trayapp.runner import joblog

log = logging.getLogger("headroom.jobs")

CHECK_INTERVAL = 0.1  # seconds between two looks at the running jobs' logs (a stat each)
FAST_INTERVAL = 0.02  # ... while a log is growing fast enough to need trims
IDLE_INTERVAL = 1.0  # ... while no job runs

# (log path, cap in bytes) of each running job.
Logs = Callable[[], Iterable[Tuple[str, int]]]


class LogKeeper:
    """``LogKeeper(logs)``: ``logs()`` lists the running jobs' (log path, cap); a log that
    leaves that list (its job ended) is trimmed once more, to its cap; ``close()`` ends the
    thread."""

    def __init__(self, logs: Logs, interval: float = CHECK_INTERVAL):
        self._logs = logs
        self._interval = interval
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._running: Dict[str, int] = {}  # as of the last look
        self._failed: Dict[str, str] = {}  # path -> the error already logged for it
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        if not joblog.SUPPORTED or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="job-logs", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self.check()  # the logs of jobs that ended since the last look

    def _run(self) -> None:
        wait = self._interval
        while not self._stop.wait(wait):
            trimmed = self.check()
            # A log that needed a trim is growing fast: look again sooner.
            wait = FAST_INTERVAL if trimmed else self._interval if self._running else IDLE_INTERVAL

    def check(self) -> bool:
        """One look at every log (the thread's work, callable directly); True when a running
        job's log needed a trim."""
        try:
            running = dict(self._logs())
        except Exception:  # the job list is the manager's; its trouble is not ours to raise
            log.exception("cannot list the jobs' logs")
            return False
        with self._lock:
            ended = {p: c for p, c in self._running.items() if p not in running}
            self._running = running
        trimmed = False
        for path, cap in running.items():
            trimmed = self._trim(path, cap, joblog.engine_slack(cap)) or trimmed
        for path, cap in ended.items():
            self._trim(path, cap, 0)
        return trimmed

    def _trim(self, path: str, cap: int, slack: int) -> bool:
        try:
            dropped = joblog.trim(path, cap, slack)
        except FileNotFoundError:
            return False
        except OSError as e:
            # Once per log and error: a full disk must not fill engine.log instead.
            reason = e.strerror or str(e)
            if self._failed.get(path) != reason:
                self._failed[path] = reason
                log.warning("cannot trim the job log %s: %s", path, reason)
            return False
        self._failed.pop(path, None)
        if dropped:
            log.debug("trimmed %d bytes from the middle of %s", dropped, path)
        return dropped > 0
