"""The dashboard's buffers: fixed-size rings, aligned columns, peak-keeping folds, and history
answers put on one time column."""

from __future__ import annotations

import math
from typing import Any, Dict, Mapping

import numpy as np

from trayapp.engine.history_record import History, Series
from trayapp.ui.data import fetch_history, series_for
from trayapp.ui.timeline import Ring, Table, align_series


def test_ring_keeps_the_last_values_as_one_view() -> None:
    r = Ring(4)
    assert len(r) == 0 and math.isnan(r.last())
    for v in range(1, 11):
        r.append(float(v))
        want = list(range(max(1, v - 3), v + 1))
        assert r.view().tolist() == want
    r.set_last(99.0)
    assert r.view().tolist() == [7.0, 8.0, 9.0, 99.0]
    r.load(np.arange(10.0))
    assert r.view().tolist() == [6.0, 7.0, 8.0, 9.0]
    r.append(10.0)
    assert r.view().tolist() == [7.0, 8.0, 9.0, 10.0]
    assert r.view().base is not None  # a view: plotting copies nothing


def test_table_aligns_late_and_missing_columns() -> None:
    tb = Table(5)
    tb.append(1.0, {"a": 1.0})
    tb.append(2.0, {"a": 2.0, "b": 20.0})
    tb.append(3.0, {"b": 30.0, "a": None})
    assert tb.t().tolist() == [1.0, 2.0, 3.0]
    assert np.array_equal(tb.column("a"), [1.0, 2.0, np.nan], equal_nan=True)
    assert np.array_equal(tb.column("b"), [np.nan, 20.0, 30.0], equal_nan=True)
    assert np.isnan(tb.column("nothing")).all() and len(tb.column("nothing")) == 3
    for t in range(4, 20):
        tb.append(float(t), {"a": float(t)})
    assert len(tb) == 5 and all(len(c.view()) == 5 for c in tb.columns.values())
    assert tb.t().tolist() == [15.0, 16.0, 17.0, 18.0, 19.0]
    assert tb.nearest(16.4) == 1 and tb.nearest(16.6) == 2
    assert tb.nearest(-5) == 0 and tb.nearest(1e9) == 4


def test_folding_rows_keeps_the_peaks() -> None:
    tb = Table(10, low=["avail"])
    assert tb.append(0.0, {"used": 5.0, "avail": 50.0}, merge_within=10)
    assert not tb.append(3.0, {"used": 9.0, "avail": 20.0}, merge_within=10)
    assert not tb.append(6.0, {"used": 1.0, "avail": 70.0}, merge_within=10)
    assert tb.append(10.5, {"used": 2.0, "avail": 60.0}, merge_within=10)
    assert tb.t().tolist() == [0.0, 10.5]
    assert tb.column("used").tolist() == [9.0, 2.0]
    assert tb.column("avail").tolist() == [20.0, 60.0]


def test_align_series_raw_and_minute() -> None:
    def rows(answer: Dict[str, Any]) -> Mapping[str, Series]:
        return History.from_json({"series": answer}).series

    t, cols = align_series(rows({"a": {"t": [1, 2, 3], "v": [1, None, 3]},
                                 "b": {"t": [2, 4], "v": [20, 40]}}))
    assert t.tolist() == [1, 2, 3, 4]
    assert np.array_equal(cols["a"], [1, np.nan, 3, np.nan], equal_nan=True)
    assert np.array_equal(cols["b"], [np.nan, 20, np.nan, 40], equal_nan=True)
    t, cols = align_series(rows({"mem.available": {"t": [60], "min": [1], "mean": [2],
                                                   "max": [3]},
                                 "mem.used": {"t": [60], "min": [1], "mean": [2], "max": [3]}}),
                           low=["mem.available"])
    assert cols["mem.available"].tolist() == [1] and cols["mem.used"].tolist() == [3]
    assert align_series({})[0].size == 0


class RecordingClient:
    """Answers like the engine's history request and records what was asked."""

    def __init__(self, resolution: str = "raw"):
        self.calls = []
        self.resolution = resolution

    def history(self, start, end, series=None, prefix=None):  # type: ignore[no-untyped-def]
        self.calls.append((start, end, series, prefix))
        name = (series or prefix)[0]
        if prefix:
            name = prefix[0] + "j1"
        ts = [float(x) for x in range(int(math.ceil(start)), int(end) + 1, 60)]
        return History.from_json({"resolution": self.resolution,
                                  "series": {name: {"t": ts, "v": [1.0] * len(ts)}}})


def test_history_is_fetched_in_pieces_below_the_message_limit() -> None:
    names, prefixes = series_for([0, 1])
    assert "gpu1.util" in names and prefixes == ["job.", "ram.proc.", "gpu0.job.", "gpu0.proc.",
                                                 "gpu1.job.", "gpu1.proc."]
    client = RecordingClient("minute")
    week = 7 * 86400.0
    out = fetch_history(client, 1000.0, 1000.0 + week, [0])
    assert out.resolution == "minute"
    # Every request asks for one series or one prefix over a bounded stretch of time.
    for start, end, series, prefix in client.calls:
        assert (series is None) != (prefix is None)
        assert end - start <= 5000 * 60
    # Chunk edges do not double a row.
    ts = list(out.series["mem.used"].t)
    assert ts == sorted(set(ts)) and ts[0] == 1000.0 and ts[-1] <= 1000.0 + week
    assert out.series["mem.used"].values() == (1.0,) * len(ts)  # each row's value kept with it
    assert "gpu0.job.j1" in out.series and "job.j1" in out.series
    # The series by process name live in the engine's memory only: not asked for a week.
    assert not any(p and ".proc." in p[0] for _s, _e, _n, p in client.calls)
