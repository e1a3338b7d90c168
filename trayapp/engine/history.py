"""The last hour of samples in memory, column by column, so recent history needs no disk."""

from __future__ import annotations

import threading
from array import array
from bisect import bisect_left, bisect_right
from typing import Any, Callable, Collection, Dict, List, Optional, Sequence, Tuple


def select_series(
    names: Sequence[str], series: Optional[Sequence[str]], prefix: Optional[Sequence[str]]
) -> List[str]:
    """The names matching ``series`` (exact) or ``prefix``; all of them when both are None."""
    if series is None and prefix is None:
        return list(names)
    wanted = set(series or ())
    prefixes = tuple(prefix or ())
    return [n for n in names if n in wanted or (prefixes and n.startswith(prefixes))]


class RecentHistory:
    """Samples of the last ``seconds``, at most one per ``min_step`` seconds."""

    def __init__(self, seconds: float = 3600.0, min_step: float = 1.0):
        self.seconds = seconds
        self.min_step = min_step
        self._lock = threading.Lock()
        self._series: Dict[str, Tuple[array, array]] = {}
        self._last_t: Optional[float] = None
        self._first_t: Optional[float] = None

    def due(self, t: float) -> bool:
        """Whether a sample at ``t`` would be kept (``min_step`` after the last one)."""
        return self._last_t is None or t - self._last_t >= self.min_step

    def add(self, t: float, values: Dict[str, Optional[float]]) -> bool:
        """Keep the sample unless it comes sooner than ``min_step`` after the last one.
        Returns whether it was kept."""
        if not self.due(t):
            return False
        with self._lock:
            self._last_t = t
            if self._first_t is None:
                self._first_t = t
            for name, v in values.items():
                if v is None:
                    continue
                cols = self._series.get(name)
                if cols is None:
                    cols = self._series[name] = (array("d"), array("d"))
                cols[0].append(t)
                cols[1].append(float(v))
            self._trim(t - self.seconds)
        return True

    def _trim(self, horizon: float) -> None:
        # Trimming in chunks keeps the cost of deleting from the front of an array low.
        for name in list(self._series):
            ts, vs = self._series[name]
            cut = bisect_left(ts, horizon)
            if cut >= 64 or (cut and cut == len(ts)):
                del ts[:cut]
                del vs[:cut]
            if not ts:
                del self._series[name]
        if self._first_t is not None and self._first_t < horizon:
            self._first_t = horizon

    def covers(self, start: float) -> bool:
        """Whether memory holds everything from ``start`` on (the engine ran since then)."""
        return self._first_t is not None and start >= self._first_t

    def query(
        self,
        start: float,
        end: float,
        series: Optional[Sequence[str]] = None,
        prefix: Optional[Sequence[str]] = None,
    ) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        with self._lock:
            for name in select_series(list(self._series), series, prefix):
                ts, vs = self._series[name]
                i, j = bisect_left(ts, start), bisect_right(ts, end)
                if j > i:
                    out[name] = {"t": ts[i:j].tolist(), "v": vs[i:j].tolist()}
        return {"resolution": "raw", "start": start, "end": end, "series": out}

    def latest(self, name: str) -> Optional[float]:
        with self._lock:
            cols = self._series.get(name)
            return cols[1][-1] if cols and len(cols[1]) else None


class ConsumerScan:
    """The RAM consumers by name (``probes.consumers.ram_by_name``), read again at most once
    per ``interval`` seconds: one pass over the process list costs about a millisecond per
    hundred processes, too much for every sample."""

    def __init__(
        self,
        scan: Callable[..., List[Any]],
        interval: float = 5.0,
        limit: int = 4,
        min_bytes: int = 32 << 20,
    ):
        self._scan = scan
        self.interval = interval
        self.limit = limit
        self.min_bytes = min_bytes
        self.latest: List[Any] = []
        self._at: Optional[float] = None

    def update(self, t: float, skip: Collection[int]) -> List[Any]:
        """The consumers as of ``t``, leaving out ``skip`` (the jobs' pids): a new scan when the
        last one is ``interval`` old (or the clock went back), else the last one's."""
        if self._at is None or not 0 <= t - self._at < self.interval:
            self._at = t
            self.latest = list(self._scan(skip=skip, limit=self.limit, min_bytes=self.min_bytes))
        return self.latest
