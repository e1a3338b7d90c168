"""The engine's answer to ``history`` as a record: each series' rows between two times.

Raw rows are one sample a second (``{"t", "v"}`` on the wire); older ranges come as one-minute
rows (``{"t", "min", "mean", "max"}``). ``from_json`` reads an answer leniently: a row whose
time is not a number is left out, a value that is not one is None, and what is not a series is
not kept. The tray, the CLI and the tests read attributes, never the answer's keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple

from trayapp.jsonvalue import JSONObject

RAW = "raw"
MINUTE = "minute"
RESOLUTIONS = (RAW, MINUTE)

Values = Tuple[Optional[float], ...]
_MINUTE_COLUMNS = (("low", "min"), ("mean", "mean"), ("high", "max"))  # attribute, wire name


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


@dataclass(frozen=True)
class Series:
    """One series' rows, oldest first: the time of each and its raw sample (``v``), or a
    minute's lowest, mean and highest sample. A value is None where the row had none."""

    t: Tuple[float, ...] = ()
    v: Optional[Values] = None
    low: Optional[Values] = None
    mean: Optional[Values] = None
    high: Optional[Values] = None

    def values(self, low: bool = False) -> Values:
        """A value for each row: the sample; of a minute row its peak, the highest or, with
        ``low`` (a series where less is worse, such as available memory), the lowest, or its
        mean where the peak was not sent."""
        if self.v is not None:
            return self.v
        peak = self.low if low else self.high
        if peak is not None:
            return peak
        return self.mean if self.mean is not None else (None,) * len(self.t)

    def after(self, t: float) -> Series:
        """The rows later than ``t``."""
        skip = 0
        while skip < len(self.t) and self.t[skip] <= t:
            skip += 1
        return self._rows(slice(skip, None))

    def joined(self, later: Series) -> Series:
        """These rows, then those of ``later`` after the last of them (two answers whose
        ranges share an edge give that row once)."""
        if not self.t:
            return later
        more = later.after(self.t[-1])
        return Series(
            self.t + more.t,
            *(_join(getattr(self, a), getattr(more, a)) for a in ("v", "low", "mean", "high")),
        )

    def _rows(self, which: slice) -> Series:
        def cut(col: Optional[Values]) -> Optional[Values]:
            return None if col is None else col[which]

        return Series(self.t[which], cut(self.v), cut(self.low), cut(self.mean), cut(self.high))

    def to_json(self) -> JSONObject:
        out: JSONObject = {"t": list(self.t)}
        if self.v is not None:
            out["v"] = list(self.v)
        for attr, wire in _MINUTE_COLUMNS:
            col = getattr(self, attr)
            if col is not None:
                out[wire] = list(col)
        return out

    @classmethod
    def from_json(cls, value: Any) -> Optional[Series]:
        """The series in an answer; None for what is not one."""
        if not isinstance(value, Mapping) or not isinstance(value.get("t"), list):
            return None
        times = [_number(x) for x in value["t"]]
        keep = [i for i, x in enumerate(times) if x is not None]

        def column(name: str) -> Optional[Values]:
            col = value.get(name)
            if not isinstance(col, list):
                return None
            return tuple(_number(col[i]) if i < len(col) else None for i in keep)

        kept = tuple(t for t in times if t is not None)
        return cls(kept, column("v"), column("min"), column("mean"), column("max"))


def _join(a: Optional[Values], b: Optional[Values]) -> Optional[Values]:
    if a is None or b is None:
        return a if b is None else None
    return a + b


@dataclass(frozen=True)
class History:
    """The series asked for between ``start`` and ``end`` (absent: no data in the range), at
    one resolution; None where the answer did not say."""

    resolution: Optional[str] = None
    start: Optional[float] = None
    end: Optional[float] = None
    series: Mapping[str, Series] = field(default_factory=dict)

    def joined(self, later: History) -> History:
        """This answer with a later one's rows added, series by series."""
        series: Dict[str, Series] = dict(self.series)
        for name, rows in later.series.items():
            series[name] = series[name].joined(rows) if name in series else rows
        return History(self.resolution, self.start, later.end, series)

    def to_json(self) -> JSONObject:
        return {
            "resolution": self.resolution,
            "start": self.start,
            "end": self.end,
            "series": {name: rows.to_json() for name, rows in self.series.items()},
        }

    @classmethod
    def from_json(cls, value: Any) -> History:
        if not isinstance(value, Mapping):
            return cls()
        found = value.get("series")
        series: Dict[str, Series] = {}
        for name, cols in found.items() if isinstance(found, Mapping) else ():
            rows = Series.from_json(cols)
            if isinstance(name, str) and rows is not None:
                series[name] = rows
        resolution = value.get("resolution")
        return cls(
            resolution if resolution in RESOLUTIONS else None,
            _number(value.get("start")),
            _number(value.get("end")),
            series,
        )
