"""The engine's history answer as a record: read leniently (what is not a row is left out, a
value that is not a number is None), chunks joined without doubling the row on their shared
edge, and the peak of a minute row chosen by which way is worse."""

from __future__ import annotations

import json
import math

from trayapp.engine.history_record import MINUTE, RAW, History, Series


def test_an_answer_is_read_as_series_of_rows() -> None:
    h = History.from_json({"resolution": "raw", "start": 10, "end": 20, "series": {
        "mem.available": {"t": [10, 11, 12], "v": [5, None, 7]},
        "mem.used": {"t": [10], "min": [1], "mean": [2], "max": [3]}}})
    assert h.resolution == RAW and (h.start, h.end) == (10.0, 20.0)
    assert h.series["mem.available"] == Series((10.0, 11.0, 12.0), (5.0, None, 7.0))
    used = h.series["mem.used"]
    assert used.v is None and used.values() == (3.0,) and used.values(low=True) == (1.0,)
    assert History.from_json(json.loads(json.dumps(h.to_json()))) == h  # a round trip


def test_a_garbled_answer_keeps_what_can_be_read() -> None:
    h = History.from_json({"resolution": "weekly", "end": "soon", "series": {
        "a": {"t": [1, "x", math.inf, 4, True], "v": [10, 20, 30, "y"]},  # v one short too
        "b": "not a series", "c": {"v": [1]}, "d": {"t": "1,2"}, 7: {"t": [1], "v": [1]}}})
    assert h.resolution is None and h.end is None
    assert set(h.series) == {"a"}  # what is not a series, or not named by text, is not kept
    a = h.series["a"]
    # The rows whose time is not a number go with their values; a value missing is None.
    assert a.t == (1.0, 4.0) and a.v == (10.0, None)
    assert History.from_json(None) == History() and History.from_json([1]).series == {}


def test_chunks_sharing_an_edge_are_joined_without_the_row_twice() -> None:
    first = History(RAW, 0, 10, {"a": Series((8.0, 9.0, 10.0), (1.0, 2.0, 3.0))})
    second = History(RAW, 10, 20, {"a": Series((10.0, 11.0), (3.0, 4.0)),
                                   "b": Series((12.0,), (9.0,))})
    both = first.joined(second)
    assert both.series["a"] == Series((8.0, 9.0, 10.0, 11.0), (1.0, 2.0, 3.0, 4.0))
    assert both.series["b"] == Series((12.0,), (9.0,))
    assert (both.start, both.end) == (0, 20)
    assert Series().joined(Series((1.0,), (2.0,))) == Series((1.0,), (2.0,))


def test_a_minute_row_without_its_peak_falls_back_to_its_mean() -> None:
    rows = Series((60.0, 120.0), low=None, mean=(2.0, 3.0), high=None)
    assert rows.values() == (2.0, 3.0) and rows.values(low=True) == (2.0, 3.0)
    assert Series((60.0,)).values() == (None,)  # no column at all: no value, one per row
    assert History(MINUTE).to_json()["resolution"] == "minute"
