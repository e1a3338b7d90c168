"""Fixed-size buffers for the dashboard's curves: aligned columns over one time column.

Each ring writes every value twice (at ``i`` and ``i + capacity``), so the newest ``n`` values
are always one contiguous numpy view: appending is O(1) and plotting copies nothing.
"""

from __future__ import annotations

import math
from typing import Dict, Iterable, Mapping, Optional

import numpy as np

from trayapp.engine.history_record import Series

NAN = float("nan")


class Ring:
    """The last ``capacity`` floats; missing values are NaN."""

    def __init__(self, capacity: int):
        self.capacity = max(1, int(capacity))
        self._buf = np.full(2 * self.capacity, np.nan)
        self._w = 0  # next write position, 0 <= _w < capacity
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def append(self, value: float) -> None:
        c = self.capacity
        self._buf[self._w] = value
        self._buf[self._w + c] = value
        self._w = (self._w + 1) % c
        if self._n < c:
            self._n += 1

    def set_last(self, value: float) -> None:
        if self._n == 0:
            self.append(value)
            return
        i = (self._w - 1) % self.capacity
        self._buf[i] = value
        self._buf[i + self.capacity] = value

    def last(self) -> float:
        if self._n == 0:
            return NAN
        return float(self._buf[(self._w - 1) % self.capacity])

    def view(self) -> np.ndarray:
        """The values, oldest first: a view that the next append may change."""
        start = (self._w - self._n) % self.capacity
        return self._buf[start : start + self._n]

    def align(self, other: Ring) -> None:
        """Take ``other``'s length and position, as NaN (a column that starts late)."""
        self._buf[:] = np.nan
        self._w = other._w
        self._n = other._n

    def load(self, values: np.ndarray) -> None:
        """Replace the contents with the last ``capacity`` of ``values``."""
        values = np.asarray(values, dtype=float)[-self.capacity :]
        n = len(values)
        self._buf[:] = np.nan
        self._buf[:n] = values
        self._buf[self.capacity : self.capacity + n] = values
        self._n = n
        self._w = n % self.capacity


class Table:
    """Columns of floats aligned on one time column, each a ``Ring`` of the same capacity.

    ``append(t, values, merge_within)``: a row, or, when ``t`` is within ``merge_within``
    seconds of the last row, folded into it keeping the peak (the highest value, or the lowest
    for the columns in ``low``), so decimated live data keeps its spikes.
    """

    def __init__(self, capacity: int, low: Iterable[str] = ()):
        self.capacity = max(1, int(capacity))
        self.times = Ring(self.capacity)
        self.columns: Dict[str, Ring] = {}
        self.low = frozenset(low)
        self._bucket_start = NAN

    def __len__(self) -> int:
        return len(self.times)

    def column(self, name: str) -> np.ndarray:
        ring = self.columns.get(name)
        if ring is None:
            return np.full(len(self.times), np.nan)
        return ring.view()

    def t(self) -> np.ndarray:
        return self.times.view()

    def _ring(self, name: str) -> Ring:
        ring = self.columns.get(name)
        if ring is None:
            ring = self.columns[name] = Ring(self.capacity)
            ring.align(self.times)
        return ring

    def append(
        self, t: float, values: Mapping[str, Optional[float]], merge_within: float = 0.0
    ) -> bool:
        """Add a row (True) or fold it into the last one (False)."""
        last = self.times.last()
        if (
            merge_within > 0
            and len(self.times)
            and not math.isnan(last)
            and t - self._bucket_start < merge_within
        ):
            for name, v in values.items():
                if v is None:
                    continue
                ring = self._ring(name)
                old = ring.last()
                if math.isnan(old):
                    ring.set_last(float(v))
                else:
                    ring.set_last(min(old, float(v)) if name in self.low else max(old, float(v)))
            return False
        self._bucket_start = t
        for name in values:  # new columns first: they take the length before this row
            self._ring(name)
        self.times.append(t)
        for name, ring in self.columns.items():
            v = values.get(name)
            ring.append(NAN if v is None else float(v))
        return True

    def load(self, t: np.ndarray, columns: Mapping[str, np.ndarray]) -> None:
        """Replace everything with ``t`` and columns of the same length."""
        t = np.asarray(t, dtype=float)
        self.times.load(t)
        self.columns = {}
        for name, values in columns.items():
            ring = self.columns[name] = Ring(self.capacity)
            ring.load(np.asarray(values, dtype=float))
        self._bucket_start = float(t[-1]) if len(t) else NAN

    def nearest(self, x: float) -> Optional[int]:
        """Index of the row nearest to time ``x`` (in ``t()``), or None when empty."""
        ts = self.times.view()
        if not len(ts):
            return None
        i = int(np.searchsorted(ts, x))
        if i <= 0:
            return 0
        if i >= len(ts):
            return len(ts) - 1
        return i if ts[i] - x < x - ts[i - 1] else i - 1


def align_series(
    series: Mapping[str, Series], low: Iterable[str] = ()
) -> tuple[np.ndarray, Dict[str, np.ndarray]]:
    """History series (raw or minute rows) on one time column: the union of the series'
    times, NaN where a series has no row. Minute rows keep the peak: the highest, or the
    lowest for the names in ``low``."""
    low = frozenset(low)
    picked: Dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name, rows in series.items():
        t = np.asarray(rows.t, dtype=float)
        values = rows.values(low=name in low)
        v = np.asarray([NAN if x is None else x for x in values], dtype=float)
        n = min(len(t), len(v))
        picked[name] = (t[:n], v[:n])
    if not picked:
        return np.empty(0), {}
    times = np.unique(np.concatenate([t for t, _ in picked.values()]))
    out: Dict[str, np.ndarray] = {}
    for name, (t, v) in picked.items():
        col = np.full(len(times), np.nan)
        col[np.searchsorted(times, t)] = v
        out[name] = col
    return times, out
