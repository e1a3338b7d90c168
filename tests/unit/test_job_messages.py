"""A job's messages parsed at the engine's edge (trayapp.jobs.messages), the parts of a tick run
each on its own (trayapp.engine.parts), and the control channel's bounds: tables of what the
runner really sends, of what a hostile script could send, and properties over both."""

from __future__ import annotations

import copy
import json
import logging
from typing import Any, Dict, List

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trayapp.config import get_paths
from trayapp.engine import protocol
from trayapp.engine.parts import Parts
from trayapp.engine.store import Store
from trayapp.jobs import messages as m
from trayapp.jobs.manager import JobManager
from trayapp.jobs.record import JobRecord
from trayapp.jobs.record_parts import Checkpoint, Note, ProcessSettings
from trayapp.runner import protocol as rp

DEEP = "[" * 600 + "]" * 600


def parse(obj: Any) -> Any:
    return m.parse(json.dumps(obj).encode())


# -- what the runner really sends is kept as it was ----------------------------------------------

RUNNER_SENDS: List[Dict[str, Any]] = [
    {"type": "hello", "job_id": "ab12cd34", "pid": 4242, "python": "/usr/bin/python3",
     "python_version": "3.11.7", "script": "/home/u/train.py", "runner_version": 1,
     "options": {"memory_growth": True, "vram_limit_mb": [2048, 1024], "precision": None,
                 "vram_option": "--vram-limit", "xla": False, "intra_threads": 4},
     "applied": [{"option": "memory_growth", "value": True,
                  "call": "tf.config.experimental.set_memory_growth",
                  "devices": ["/physical_device:GPU:0"]},
                 {"option": "vram_limit", "value": 2048,
                  "call": "tf.config.set_logical_device_configuration",
                  "devices": [{"name": "/physical_device:GPU:0", "memory_limit_mb": 2048}]},
                 {"option": "precision", "value": "mixed_float16",
                  "call": "keras.config.set_dtype_policy", "module": "keras"}],
     "tf_version": "2.16.1", "keras_version": None, "tf_imported": True,
     "build_info": {"is_cuda_build": True, "cuda_version": "12.3", "cudnn_version": "8"},
     "tf_devices": [{"name": "/physical_device:CPU:0", "type": "CPU"}],
     "fit_hook": "installed"},
    {"type": "hello", "error": "hello failed: boom"},
    {"type": "progress", "fit": 1, "epoch": 2, "epochs": 30, "step": 17, "steps": None,
     "logs": {"loss": 0.25, "accuracy": None},
     "tf_memory": [{"device": "/device:GPU:0", "current_bytes": 1 << 30,
                    "peak_bytes": 3 << 30}]},
    {"type": "progress", "fit": 1, "epoch": 1, "epochs": 1, "step": 0, "steps": 10, "logs": {},
     "tf_memory": None},
    {"type": "state", "state": "paused", "epoch": 3, "step": 12},
    {"type": "state", "state": "checkpointing"},
    {"type": "checkpointed", "path": "/home/u/ckpt/fit-1", "epoch": 3, "step": 0, "fit": 1,
     "reason": "epoch"},
    {"type": "note", "level": "warn", "message": "loss is not a number (NaN or inf)"},
    {"type": "bye", "reason": "parked", "exit_code": 75},
    {"type": "bye", "reason": "error", "exit_code": -9},
]


@pytest.mark.parametrize("sent", RUNNER_SENDS, ids=lambda s: s["type"])
def test_what_the_runner_sends_is_kept_as_it_was(sent: Dict[str, Any]) -> None:
    record, dropped = parse(sent)
    assert dropped == []
    assert isinstance(record, m.Message)
    expected = {k: v for k, v in sent.items() if k != "type"}
    out = record.to_json()
    assert out == expected


# -- what a hostile script could send is dropped, and named ----------------------------------------

HOSTILE: List[Any] = [
    # (message, what survives of it, the fields named as dropped)
    ('{"type":"progress","epoch":1,"epochs":3,"tf_memory":' + DEEP + "}",
     {"epoch": 1, "epochs": 3}, ["tf_memory"]),
    ('{"type":"progress","step":' + str(2**70) + ',"steps":-1,"epoch":1.5,"fit":true}',
     {}, ["step", "steps", "epoch", "fit"]),
    ('{"type":"progress","logs":{"loss":' + DEEP + "}}", {}, ["logs"]),
    ('{"type":"progress","logs":{"loss":NaN},"epoch":1e400}', {}, ["logs", "epoch"]),
    ('{"type":"progress","tf_memory":[{"device":"g","current_bytes":-5}]}', {}, ["tf_memory"]),
    ('{"type":"progress","tf_memory":[' + ",".join(['{"device":"g"}'] * 65) + "]}", {},
     ["tf_memory"]),
    ('{"type":"progress","tf_memory":[{"device":"g","extra":1}]}', {}, ["tf_memory"]),
    ('{"type":"state","state":"\\u001b]0;x\\u0007","epoch":' + str(2**64) + "}", {},
     ["state", "epoch"]),
    ('{"type":"checkpointed","path":' + DEEP + ',"epoch":1e400}', {}, ["path", "epoch"]),
    ('{"type":"note","level":"fatal","message":["x"]}', {}, ["level", "message"]),
    ('{"type":"bye","reason":"parked","exit_code":' + str(2**63) + "}", {"reason": "parked"},
     ["exit_code"]),
    ('{"type":"hello","options":' + DEEP + ',"applied":{"x":1},"pid":-1,"extra":1}', {},
     ["options", "applied", "pid", "unknown field 'extra'"]),
    ('{"type":"hello","build_info":{"is_cuda_build":true,"x":' + DEEP + "}}", {},
     ["build_info"]),
    ('{"type":"hello","tf_devices":[{"name":{"deeper":[1]}}]}', {}, ["tf_devices"]),
]


@pytest.mark.parametrize("text,kept,dropped", HOSTILE)
def test_what_a_hostile_script_sends_is_dropped_and_named(text: str, kept: Dict[str, Any],
                                                          dropped: List[str]) -> None:
    record, said = m.parse(text.encode())
    assert record.to_json() == kept
    assert len(said) == len(dropped)
    for field, line in zip(dropped, said):
        assert field in line and "\n" not in line
    copy.deepcopy(record.to_json())  # bounded: any copy or dump of it is cheap
    json.dumps(record.to_json(), allow_nan=False)


def test_text_from_a_job_is_one_line_with_control_characters_escaped() -> None:
    record, dropped = parse({"type": "note", "level": "warn",
                             "message": "\x1b[2J\x1b[31mowned\r\nfake line" + "x" * 2000})
    assert dropped == []
    assert record.message.startswith("\\x1b[2J\\x1b[31mowned\\r\\nfake line")
    assert record.message.isprintable() and len(record.message) == m.MAX_TEXT
    record, _ = parse({"type": "progress", "logs": {"lo\x1bss": 1.0}})
    assert record.to_json()["logs"] == {"lo\\x1bss": 1.0}
    record, _ = parse({"type": "hello", "script": "/tmp/a\nb.py",
                       "applied": [{"option": "x\x07", "value": "\x9b2J"}]})
    assert record.script == "/tmp/a\\nb.py"
    assert record.applied == ({"option": "x\\x07", "value": "\\x9b2J"},)


@pytest.mark.parametrize("data", [
    b"not json", b"[1]", b'{"type": 5}', b'{"type": "nope"}', b"[" * 100_000,
    b'{"type":"note","message":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b"{" + b" " * (2 << 20) + b"}",
])
def test_a_message_that_cannot_be_used_at_all_is_a_protocol_error(data: bytes) -> None:
    with pytest.raises(rp.ProtocolError) as e:
        m.parse(data)
    assert "\n" not in str(e.value)


# -- properties ----------------------------------------------------------------------------------

values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda children: st.lists(children, max_size=6) | st.dictionaries(
        st.text(max_size=10), children, max_size=6),
    max_leaves=30)
fields = st.sampled_from(["fit", "epoch", "epochs", "step", "steps", "logs", "tf_memory",
                          "state", "path", "reason", "level", "message", "exit_code", "options",
                          "applied", "build_info", "tf_devices", "fit_hook", "hooked", "pid",
                          "python", "script", "job_id", "error"]) | st.text(max_size=10)


@settings(max_examples=150, deadline=None)
@given(kind=st.sampled_from(sorted(rp.JOB_MESSAGES)),
       body=st.dictionaries(fields, values, max_size=8))
def test_any_message_becomes_a_bounded_record(kind: str, body: Dict[str, Any]) -> None:
    record, dropped = m.parse_message({**body, "type": kind})
    out = record.to_json()
    assert set(out) <= set(body) and len(out) + len(dropped) == len(body)
    text = json.dumps(out, allow_nan=False)  # finite numbers only
    assert _depth(out) <= m.MAX_DEPTH + 2
    assert len(text) < 300_000
    for line in dropped:
        assert line.isprintable()


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


# -- a record read back from the store -------------------------------------------------------------


def test_a_saved_record_poisoned_by_an_earlier_engine_is_reset_when_read_back() -> None:
    deep: Any = []
    for _ in range(600):
        deep = [deep]
    info = {"id": "j1", "state": "running", "tf_memory": deep, "metrics": {"loss": deep},
            "hello": {"options": deep, "pid": 7}, "bye": None, "notes": [
                {"time": 1.0, "level": "warn", "message": "\x1b[2J"}, "junk"],
            "checkpoint": {"path": "/x", "epoch": 2, "time": 3.0}, "runner_state": "evil",
            "epoch": 2**70, "rss_bytes": 5}
    reset = m.clean_record(info)
    assert set(reset) == {"tf_memory", "metrics", "runner_state", "epoch"}
    # The parts of the record are read again as the engine reads the job's messages.
    rec = JobRecord.from_json(info)
    assert rec.tf_memory is None and rec.metrics == {} and rec.runner_state is None
    assert rec.epoch is None
    assert rec.notes == (Note("\\x1b[2J", "warn", 1.0),)  # escaped; the junk one left out
    assert rec.hello is not None and rec.hello.to_json() == {"pid": 7}  # its bad field dropped
    assert rec.checkpoint == Checkpoint("/x", 2, None, 3.0)
    assert rec.rss_bytes == 5  # the engine's own fields are not touched
    copy.deepcopy(rec.to_json())  # nothing nested too deep is kept


def test_a_records_tf_memory_and_process_settings_are_read_back_as_records() -> None:
    row = {"id": "j2", "state": "running",
           "tf_memory": [{"device": "GPU:0", "current_bytes": 10, "peak_bytes": 20},
                         {"device": "GPU:1", "current_bytes": -5, "peak_bytes": 1},  # bad
                         {"device": "x", "extra": 1}, "junk"],
           "process": {"nice": 5, "oom_score_adj": 5000, "log_max_bytes": True},
           "cgroup_memory": {"usage_bytes": 3, "limit_bytes": None}}
    rec = JobRecord.from_json(row)
    assert rec.tf_memory == (m.TfMemory("GPU:0", 10, 20),)  # the entries that fail are left out
    # A value out of its range is not recorded; the others are kept.
    assert rec.process == ProcessSettings(nice=5, oom_score_adj=None, log_max_bytes=None)
    assert rec.cgroup_memory == {"usage_bytes": 3, "limit_bytes": None}
    out = rec.to_json()
    assert out["tf_memory"] == [{"device": "GPU:0", "current_bytes": 10, "peak_bytes": 20}]
    assert out["process"] == {"nice": 5, "oom_score_adj": None, "log_max_bytes": None}
    assert JobRecord.from_json(json.loads(json.dumps(out))) == rec  # a round trip is the same
    # Not an object at all: the record reads without it.
    assert JobRecord.from_json({**row, "process": [1, 2], "tf_memory": "x"}).process is None


def test_a_clean_record_is_left_as_it_is() -> None:
    info = {"tf_memory": [{"device": "g", "current_bytes": 1, "peak_bytes": 2}],
            "metrics": {"loss": 0.5}, "notes": [{"time": 1.0, "level": "info",
                                                  "message": "hi"}],
            "hello": None, "bye": {"reason": "finished", "exit_code": 0}, "checkpoint": None,
            "runner_state": "running", "epoch": 3, "steps": None}
    before = copy.deepcopy(info)
    assert m.clean_record(info) == []
    assert info == before


# -- saying so at a bounded rate -----------------------------------------------------------------


def test_drops_are_counted_per_job_and_reported_at_most_once_a_minute() -> None:
    now = [0.0]
    log = m.DropLog(quiet=60.0, clock=lambda: now[0])
    assert log.add("a", 2) == (True, 2)
    assert log.add("a", 1) is None and log.add("b", 1) == (True, 1)
    now[0] = 30.0
    assert log.add("a", 5) is None
    now[0] = 61.0
    assert log.add("a", 1) == (False, 7)
    assert log.count("a") == 9 and log.count("b") == 1 and log.count("c") == 0


def test_a_failing_part_is_logged_once_then_quietly_and_the_next_part_runs(
        caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    parts = Parts(logging.getLogger("headroom.test"), quiet=60.0, clock=lambda: now[0])
    ran: List[str] = []

    def boom() -> None:
        raise RuntimeError("no\nway")

    with caplog.at_level(logging.INFO, logger="headroom.test"):
        for t in range(0, 130, 10):
            now[0] = float(t)
            assert parts.run("bookkeeping", boom) is False
            assert parts.run("ladder", ran.append, t) is True
        assert parts.failing() == ["bookkeeping"]
        assert parts.run("bookkeeping", lambda: None) is True
    lines = [r.getMessage() for r in caplog.records]
    assert len(ran) == 13
    assert lines[0] == "bookkeeping failed; the rest of the tick goes on"
    assert caplog.records[0].exc_info is not None  # the traceback, the first time only
    assert [x.split(" (")[0] for x in lines[1:3]] == ["bookkeeping still fails"] * 2
    assert "no\\nway" in lines[1] and lines[-1] == "bookkeeping works again"
    assert len(lines) == 4


# -- the control channel's bounds ----------------------------------------------------------------


@pytest.mark.parametrize("data,why", [
    (b'{"id":1,"op":"history","args":{"start":0,"end":' + str(2**64).encode() + b"}}",
     "out of range"),
    (b'{"id":' + str(2**63).encode() + b',"op":"ping"}', "out of range"),
    (b'{"id":1,"op":"events","args":{"after_id":' + str(-(2**64)).encode() + b"}}",
     "out of range"),
    # More digits than Python converts: JSON all the same, a number out of range.
    (b'{"id":1,"op":"history","args":{"start":' + b"9" * 4400 + b"}}", "out of range"),
    (b'{"id":1,"op":"history","args":{"start":1e400}}', "not finite"),
    (b'{"id":1,"op":"history","args":{"start":NaN}}', "not finite"),
    (b'{"id":1,"op":"job_start","args":{"spec":{"args":[' + b"[" * 40 + b"]" * 40 + b"]}}}",
     "nested"),
    (b"[" * 100_000 + b"]" * 100_000, "nested"),
    (b'{"id":1,"op":"ping","args":' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested"),
])
def test_deep_or_out_of_range_requests_are_protocol_errors(data: bytes, why: str) -> None:
    with pytest.raises(protocol.ProtocolError) as e:
        protocol.parse_request(data)
    assert why in str(e.value)


def test_requests_within_the_bounds_pass() -> None:
    spec = {"script": "/x.py", "args": ["a"] * 10, "env": {"A": "1"}, "ram_budget_mb": 2**40}
    data = json.dumps({"id": 2**53, "op": "job_start", "args": {"spec": spec}}).encode()
    assert protocol.parse_request(data) == (2**53, "job_start", {"spec": spec})
    data = json.dumps({"id": 1, "op": "history", "args": {"start": -(2**53), "end": 1.8e9}})
    assert protocol.parse_request(data.encode())[2] == {"start": -(2**53), "end": 1.8e9}


def test_an_engine_adopting_a_poisoned_saved_job_can_list_it(tmp_path: Any,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    monkeypatch.setenv("HEADROOM_HOME", str(tmp_path / "home"))
    paths = get_paths()
    paths.ensure()
    store = Store(paths.db_file)
    try:
        deep: Any = []
        for _ in range(600):
            deep = [deep]
        # What an earlier engine kept of a job that sent the poisoned progress, then was parked.
        store.save_row({"id": "feedf00d", "name": "old", "state": "parked", "started": 1.0,
                        "pids": [], "tf_memory": deep, "notes": [], "metrics": {}})
        manager = JobManager(paths, store, emit=lambda *a, **k: None, subreaper=False)
        try:
            manager.adopt()
            (job,) = manager.list()
            assert job.id == "feedf00d" and job.tf_memory is None
            assert manager.guard_jobs()[0].state == "parked"
        finally:
            manager.close()
    finally:
        store.close()
