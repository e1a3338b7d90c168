"""What the runner says about shrinking, as the engine reads it: the batch fields of progress,
the topic of a shrink note, and what a hostile job cannot make of them."""

from __future__ import annotations

import json

import pytest

from trayapp.engine.event_record import EngineEvent
from trayapp.jobs import messages
from trayapp.runner import protocol as rp
from trayapp.ui.model import notice_for
from trayapp.vocab import EventKind as E


def parse(**fields):  # type: ignore[no-untyped-def]
    return messages.parse_message(fields)


def test_progress_carries_the_batch_and_whether_it_can_shrink() -> None:
    msg, dropped = parse(type=rp.PROGRESS, epoch=2, epochs=3, step=4, steps=16, batch=256,
                         micro_batch=64, accumulation=4, shrinkable=True)
    assert dropped == []
    assert (msg.batch, msg.micro_batch, msg.accumulation, msg.shrinkable) == (256, 64, 4, True)


@pytest.mark.parametrize("field,value", [
    ("batch", -1), ("micro_batch", 1.5), ("accumulation", "2"), ("shrinkable", "yes"),
    ("batch", 2**60), ("shrinkable", 1),
])
def test_bad_batch_fields_are_dropped_and_counted(field, value) -> None:  # type: ignore
    msg, dropped = parse(type=rp.PROGRESS, epoch=1, **{field: value})
    assert getattr(msg, field) is None and dropped and field in dropped[0]


def test_a_shrink_note_has_its_topic_and_the_tray_notifies_it() -> None:
    msg, dropped = parse(type=rp.NOTE, level="warn", message="out of memory ...",
                         topic=rp.TOPIC_SHRUNK)
    assert dropped == [] and msg.topic == rp.TOPIC_SHRUNK
    notice = notice_for(EngineEvent(0.0, E.JOB_SHRUNK, "warn", "job x: shrunk"))
    assert notice is not None and notice.title == "Training shrunk to fit"


def test_a_note_with_a_topic_the_engine_does_not_know_keeps_its_text() -> None:
    msg, dropped = parse(type=rp.NOTE, level="warn", message="hello", topic="\x1b[2Jowned")
    assert msg.topic is None and msg.message == "hello" and dropped
    assert "\x1b" not in json.dumps(dropped)
