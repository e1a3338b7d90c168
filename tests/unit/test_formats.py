"""The shared formatters, as tables: what a number reads as in the terminal and in the tray."""

from __future__ import annotations

import re
import time
from typing import Any, Optional

import pytest

from trayapp import formats
from trayapp.config import format_bytes as config_format_bytes
from trayapp.engine.status_record import Status
from trayapp.jobs.record import JobRecord
from trayapp.ui import model

KiB, MiB, GiB = 1024, 1024**2, 1024**3


@pytest.mark.parametrize("n, digits, text", [
    (None, 1, "n/a"),
    (0, 1, "0 B"),
    (1023, 1, "1023 B"),
    (1536, 1, "1.5 KiB"),
    (5 * MiB, 1, "5.0 MiB"),
    (3 * GiB, 1, "3.0 GiB"),
    (int(2.25 * GiB), 2, "2.25 GiB"),
    (5 * 1024 * GiB, 1, "5.0 TiB"),
    (5000 * 1024 * GiB, 1, "4.9 PiB"),
    (2**60, 1, "1.0 EiB"),
    (-2 * MiB, 1, "-2.0 MiB"),
    # No memory holds 1024 EiB: a figure above it is a bad one, never printed in full.
    (2**113, 1, "over 1024 EiB"), (2**70, 1, "over 1024 EiB"), (10**400, 1, "over 1024 EiB"),
    (-(2**80), 1, "under -1024 EiB"),
    (float("inf"), 1, "n/a"), (float("nan"), 1, "n/a"),
])
def test_sizes(n: Optional[float], digits: int, text: str) -> None:
    assert formats.format_bytes(n, digits) == text
    assert config_format_bytes(n, digits) == text  # the settings' name for it


@pytest.mark.parametrize("power", range(0, 400, 3))
def test_a_size_never_reads_with_more_than_four_digits_before_its_point(power: int) -> None:
    for n in (2**power, 2**power - 1, -(2**power)):
        text = formats.format_bytes(n)
        assert re.fullmatch(r"-?\d{1,4}(\.\d)? (B|[KMGTPE]iB)|over 1024 EiB|under -1024 EiB",
                            text), text


@pytest.mark.parametrize("part, whole, text", [
    (None, 100, "n/a"), (5, None, "n/a"), (5, 0, "n/a"),
    (0, 100, "0%"), (29, 32, "91%"), (1, 3, "33%"), (2, 3, "67%"), (7.5, 10, "75%"),
])
def test_percentages(part: Any, whole: Any, text: str) -> None:
    assert formats.percent(part, whole) == text
    assert model.percent(part, whole) == text


@pytest.mark.parametrize("value, unit, digits, text", [
    (None, "%", 0, "n/a"), (97.0, "%", 0, "97%"), (71.4, "°C", 0, "71°C"),
    (250.26, " W", 1, "250.3 W"),
])
def test_numbers(value: Optional[float], unit: str, digits: int, text: str) -> None:
    assert formats.number(value, unit, digits) == text


@pytest.mark.parametrize("seconds, words, compact", [
    (None, "n/a", "n/a"),
    (float("nan"), "n/a", "n/a"),
    (0, "0 s", "0s"),
    (7.4, "7 s", "7s"),
    (59.6, "1 min 00 s", "1m00s"),
    (303, "5 min 03 s", "5m03s"),
    (599, "9 min 59 s", "9m59s"),
    (600, "10 min", "10m00s"),
    (3599, "59 min", "59m59s"),
    (3725, "1 h 2 min", "1h02m"),
    (86399, "23 h 59 min", "23h59m"),
    (90000, "1 d 1 h", "25h00m"),
    (-5, "0 s", "-5s"),
])
def test_durations(seconds: Optional[float], words: str, compact: str) -> None:
    assert formats.duration(seconds) == words
    assert model.format_duration(seconds) == words
    assert formats.duration(seconds, compact=True) == compact


def test_clock_and_start_times() -> None:
    t = time.mktime((2026, 3, 4, 9, 12, 5, 0, 0, -1))
    assert formats.clock(t) == "09:12:05" == model.clock_text(t)
    assert formats.started(t, now=t + 3600) == "09:12:05"
    assert formats.started(t, now=t + 20 * 3600) == "Mar 04 09:12"
    assert formats.started(None) == "n/a" and formats.started(0) == "n/a"


@pytest.mark.parametrize("epoch, epochs, step, steps, parts", [
    (None, None, None, None, []),
    (3, 10, None, None, ["epoch 3/10"]),
    (None, 10, None, None, ["epoch 0/10"]),
    (3, 10, 50, 100, ["epoch 3/10", "step 50/100"]),
    (None, None, None, 100, ["step 0/100"]),
    (3, 0, 5, 0, []),  # a count of 0 is no count
])
def test_progress(epoch: Any, epochs: Any, step: Any, steps: Any, parts: list) -> None:
    assert formats.progress_parts(epoch, epochs, step, steps) == parts
    assert formats.progress(epoch, epochs, step, steps) == ", ".join(parts)
    assert formats.progress(epoch, epochs, step, steps, sep=" · ") == " · ".join(parts)
    job = JobRecord("j1", epoch=epoch, epochs=epochs, step=step, steps=steps)
    assert model.job_progress(job) == ", ".join(parts)


@pytest.mark.parametrize("value, text", [(None, ""), (0.123456, "0.1235"), (12345.6, "1.235e+04"),
                                         (2, "2")])
def test_loss(value: Optional[float], text: str) -> None:
    assert formats.loss(value) == text


def test_memory_runs_out_is_said_only_where_the_guard_is_not_at_ease() -> None:
    from trayapp.cli.status import format_status
    from trayapp.ui.model import guard_line, tooltip_text

    # 22 GiB free and a job loading its data at 38 MB/s: a straight line says 9 min 39 s.
    at_ease = {"state": "ok", "mode": "act", "reasons": [], "seconds_to_exhaustion": 579.0}
    warning = dict(at_ease, state="warn", reasons=["RAM 91% used"], seconds_to_exhaustion=42.0)
    assert formats.exhaustion_words(at_ease) == ""
    assert formats.exhaustion_words(warning) == "memory runs out in ~42 s"
    assert formats.exhaustion_words({"state": "warn", "seconds_to_exhaustion": None}) == ""
    assert formats.exhaustion_words({"state": "warn", "seconds_to_exhaustion": True}) == ""
    assert guard_line(Status.from_json({"guard": at_ease})) == "Guard: ok"
    assert guard_line(Status.from_json({"guard": warning})) == (
        "Guard: warn — RAM 91% used; memory runs out in ~42 s")
    status = {"engine": {"running": True, "pid": 9}, "guard": at_ease, "memory": {}, "jobs": []}
    assert "runs out" not in format_status(Status.from_json(status))
    assert "runs out" not in tooltip_text(Status.from_json(status))
    warned = Status.from_json(dict(status, guard=warning))
    assert "memory runs out in ~42 s" in format_status(warned)
    assert "memory runs out in ~42 s" in tooltip_text(warned)
