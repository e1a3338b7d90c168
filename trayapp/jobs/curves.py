"""The loss and metric curves of the jobs: the progress each runner sends (its ``fit()`` logs at
a batch or an epoch end), kept per job in the engine's memory, bounded, for the jobs window.

A point is where training stood (the epoch as a fraction: 2.5 is halfway through the third
epoch) and the metrics then. A script's later ``fit()`` calls go on from where the one before
ended: a second fit of 10 epochs after one of 6 runs from 6 to 16 (``fits`` says where each
began). A long run keeps its whole span: when a job has ``MAX_POINTS``
points, every other one is dropped (the curve keeps its shape at half the detail), and the
points at an epoch's end (which carry the ``val_`` metrics) are kept before the others. The
curves of ended jobs stay until ``MAX_JOBS`` newer jobs have curves, or the engine exits.

Stdlib only and no Qt; thread-safe.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

from trayapp.jsonvalue import JSONObject

MAX_POINTS = 2000  # a job's batch points (its epoch ends are kept apart, as many again)
MAX_METRICS = 16  # metric names a job's curves hold (the first ones it sent)
MAX_JOBS = 32  # jobs with curves


def position(epoch: Optional[int], step: Optional[int], steps: Optional[int]) -> Optional[float]:
    """Epochs done as a number (``epoch`` is 1-based, ``step`` of ``steps`` done in it): epoch
    3 at step 50 of 100 is 2.5; the end of epoch 3 is 3.0; None without an epoch."""
    if not isinstance(epoch, int) or epoch < 1:
        return None
    if isinstance(step, int) and isinstance(steps, int) and steps > 0:
        return epoch - 1 + max(0, min(step, steps)) / steps
    return float(epoch)


def _finite(value: Any) -> Optional[float]:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


@dataclass(frozen=True)
class CurvePoint:
    """Where training stood (``x``, the epoch position), when (``t``) and its metrics then."""

    x: float
    t: float
    m: Mapping[str, float]

    def to_json(self) -> JSONObject:
        return {"x": self.x, "t": self.t, "m": dict(self.m)}

    @classmethod
    def from_json(cls, data: Any) -> Optional[CurvePoint]:
        """A point from JSON; None for what is not one (a metric that is not a number is left
        out)."""
        if not isinstance(data, Mapping):
            return None
        x, t, m = _finite(data.get("x")), _finite(data.get("t")), data.get("m")
        if x is None or not isinstance(m, Mapping):
            return None
        values = {str(k): v for k, v in ((k, _finite(v)) for k, v in m.items()) if v is not None}
        return cls(x, t or 0.0, values)


@dataclass(frozen=True)
class FitStart:
    """Where a later ``fit()`` call began (``x``), and its number (from 1)."""

    fit: int
    x: float

    def to_json(self) -> JSONObject:
        return {"fit": self.fit, "x": self.x}

    @classmethod
    def from_json(cls, data: Any) -> Optional[FitStart]:
        if not isinstance(data, Mapping):
            return None
        fit, x = data.get("fit"), _finite(data.get("x"))
        if not isinstance(fit, int) or isinstance(fit, bool) or x is None:
            return None
        return cls(fit, x)


def _read(kind: Any, items: Any) -> Tuple[Any, ...]:
    found = (kind.from_json(i) for i in (items if isinstance(items, list) else ()))
    return tuple(i for i in found if i is not None)


@dataclass(frozen=True)
class JobCurves:
    """A job's curves: its metric names in the order they came, the points per batch and at
    each epoch's end, and where each ``fit()`` call began."""

    names: Tuple[str, ...] = ()
    batches: Tuple[CurvePoint, ...] = ()
    epochs: Tuple[CurvePoint, ...] = ()
    fits: Tuple[FitStart, ...] = ()

    def to_json(self) -> JSONObject:
        return {
            "names": list(self.names),
            "batches": [p.to_json() for p in self.batches],
            "epochs": [p.to_json() for p in self.epochs],
            "fits": [f.to_json() for f in self.fits],
        }

    @classmethod
    def from_json(cls, data: Any) -> JobCurves:
        """The curves from JSON; a part that is garbled is left out (no curves at all: empty)."""
        if not isinstance(data, Mapping):
            return cls()
        names = data.get("names")
        return cls(
            names=tuple(str(n) for n in (names if isinstance(names, list) else ())),
            batches=_read(CurvePoint, data.get("batches")),
            epochs=_read(CurvePoint, data.get("epochs")),
            fits=_read(FitStart, data.get("fits")),
        )


class _JobCurves:
    def __init__(self) -> None:
        self.batches: List[CurvePoint] = []
        self.epochs: List[CurvePoint] = []
        self.names: List[str] = []
        self.fits: List[FitStart] = []
        self.offset = 0.0  # where the current fit began
        self.end = 0.0  # the furthest point of the current fit

    def start_fit(self, fit: Optional[int]) -> None:
        if fit is None or (self.fits and self.fits[-1].fit == fit):
            return
        if self.fits:
            self.offset = self.end
        if len(self.fits) < MAX_POINTS:
            self.fits.append(FitStart(fit, self.offset))

    def add(self, x: float, t: float, metrics: Mapping[str, Any], epoch_end: bool) -> None:
        values: Dict[str, float] = {}
        for name, value in metrics.items():
            if name not in self.names:
                if len(self.names) >= MAX_METRICS:
                    continue
                self.names.append(name)
            if isinstance(value, (int, float)) and math.isfinite(value):
                values[name] = float(value)
        if not values:
            return
        x += self.offset
        self.end = max(self.end, x)
        point = CurvePoint(x, t, values)
        into = self.epochs if epoch_end else self.batches
        if into and into[-1].x == x:
            into[-1] = point  # the same position again: the newer values
        else:
            into.append(point)
        if len(into) > MAX_POINTS:
            del into[::2]

    def record(self) -> JobCurves:
        return JobCurves(
            tuple(self.names), tuple(self.batches), tuple(self.epochs), tuple(self.fits)
        )


class Curves:
    """Each job's curves: ``add`` a progress report, ``get`` a job's (JSON, see ``get``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: OrderedDict[str, _JobCurves] = OrderedDict()

    def add(
        self,
        job_id: str,
        t: float,
        *,
        epoch: Optional[int],
        step: Optional[int],
        steps: Optional[int],
        metrics: Mapping[str, Any],
        fit: Optional[int] = None,
    ) -> None:
        """Keep one progress report (already parsed: finite numbers) of ``fit()`` call ``fit``
        (from 1): at ``step == steps`` it is the epoch's end. Reports without an epoch or
        without metrics are not kept."""
        x = position(epoch, step, steps)
        if x is None or not metrics:
            return
        epoch_end = isinstance(step, int) and step == steps
        with self._lock:
            curves = self._jobs.get(job_id)
            if curves is None:
                curves = self._jobs[job_id] = _JobCurves()
                while len(self._jobs) > MAX_JOBS:
                    self._jobs.popitem(last=False)
            curves.start_fit(fit)
            curves.add(x, t, metrics, epoch_end)

    def get(self, job_id: str) -> JobCurves:
        """The job's curves: ``x`` is the epoch position (``position``, after the fits before),
        ``t`` the time; empty when the job sent no metrics (or the engine started after it).
        Their JSON: ``{"names": [...], "batches": [{"x", "t", "m": {name: value}}], "epochs":
        [...], "fits": [{"fit", "x"}]}``."""
        with self._lock:
            curves = self._jobs.get(job_id)
            return curves.record() if curves is not None else JobCurves()
