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
from typing import Any, Dict, List, Mapping, Optional

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


class _JobCurves:
    def __init__(self) -> None:
        self.batches: List[Dict[str, Any]] = []
        self.epochs: List[Dict[str, Any]] = []
        self.names: List[str] = []
        self.fits: List[Dict[str, Any]] = []  # {"fit": n, "x": where it began}
        self.offset = 0.0  # where the current fit began
        self.end = 0.0  # the furthest point of the current fit

    def start_fit(self, fit: Optional[int]) -> None:
        if fit is None or (self.fits and self.fits[-1]["fit"] == fit):
            return
        if self.fits:
            self.offset = self.end
        if len(self.fits) < MAX_POINTS:
            self.fits.append({"fit": fit, "x": self.offset})

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
        point = {"x": x, "t": t, "m": values}
        into = self.epochs if epoch_end else self.batches
        if into and into[-1]["x"] == x:
            into[-1] = point  # the same position again: the newer values
        else:
            into.append(point)
        if len(into) > MAX_POINTS:
            del into[::2]

    def to_json(self) -> JSONObject:
        return {
            "names": list(self.names),
            "batches": [dict(p) for p in self.batches],
            "epochs": [dict(p) for p in self.epochs],
            "fits": [dict(f) for f in self.fits],
        }


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

    def get(self, job_id: str) -> Dict[str, Any]:
        """``{"names": [...], "batches": [{"x", "t", "m": {name: value}}], "epochs": [...],
        "fits": [{"fit", "x"}]}``: ``x`` is the epoch position (``position``, after the fits
        before), ``t`` the time; empty lists when the job sent no metrics (or the engine started
        after it)."""
        with self._lock:
            curves = self._jobs.get(job_id)
            return (
                curves.to_json()
                if curves is not None
                else {"names": [], "batches": [], "epochs": [], "fits": []}
            )
