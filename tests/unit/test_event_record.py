"""An engine event read back from its JSON: what the engine sends reads back the same, and
anything else (an older engine's event, a garbled push) is an event with what it could read,
or no event at all, never an exception in the tray's worker."""

from __future__ import annotations

import math
from typing import Any

import pytest

from trayapp.engine.event_record import EngineEvent


def test_an_event_reads_back_as_the_engine_sent_it() -> None:
    sent = EngineEvent(1800000000.5, "guard_pause", "warn", "job a1 paused", "a1",
                       {"cause": "mem_pause", "rss_bytes": 1 << 30}, 17)
    assert EngineEvent.from_json(sent.to_json()) == sent
    assert sent.to_json() == {"id": 17, "time": 1800000000.5, "kind": "guard_pause",
                              "level": "warn", "message": "job a1 paused", "job_id": "a1",
                              "data": {"cause": "mem_pause", "rss_bytes": 1 << 30}}


@pytest.mark.parametrize("garbled", [
    None, 3, "guard_pause", [], [{"kind": "x", "time": 1}], {}, {"kind": "x"}, {"time": 1.0},
    {"kind": 7, "time": 1.0}, {"kind": "x", "time": "soon"}, {"kind": "x", "time": True},
    {"kind": "x", "time": math.nan}, {"kind": "x", "time": math.inf},
])
def test_what_is_not_an_event_reads_as_none(garbled: Any) -> None:
    assert EngineEvent.from_json(garbled) is None


def test_a_part_that_cannot_be_read_is_not_known() -> None:
    got = EngineEvent.from_json({"kind": "job_note", "time": 5, "level": ["warn"],
                                 "message": {"x": 1}, "job_id": 42, "data": "text",
                                 "id": "7", "extra": "kept out"})
    assert got == EngineEvent(5.0, "job_note")
    assert got is not None and got.text == "job note" and isinstance(got.time, float)
