"""Property-based tests of the control channel against a real engine: random bytes, broken JSON,
wrong types, huge and half messages. The engine answers or drops, and keeps answering others."""

from __future__ import annotations

import json
import os
import socket
import struct
from multiprocessing.connection import Client
from pathlib import Path
from typing import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import EngineProcess
from trayapp.config import get_paths
from trayapp.engine.protocol import REQUESTS

FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


@pytest.fixture(scope="module")
def fuzz_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    home = tmp_path_factory.mktemp("fuzz-home")
    old = os.environ.get("HEADROOM_HOME")
    os.environ["HEADROOM_HOME"] = str(home)
    try:
        engine = EngineProcess(get_paths()).wait_ready()
        yield engine
        assert engine.proc.poll() is None, "the engine died during fuzzing:\n" + engine.stderr
        engine.stop()
        assert "Traceback" not in engine.stderr, engine.stderr
    finally:
        if old is None:
            os.environ.pop("HEADROOM_HOME", None)
        else:
            os.environ["HEADROOM_HOME"] = old


def _conn(engine: EngineProcess):  # type: ignore[no-untyped-def]
    return Client(engine.paths.control_address, family="AF_UNIX",
                  authkey=engine.paths.key_file.read_bytes())


def _still_answers(engine: EngineProcess) -> None:
    c = _conn(engine)
    try:
        c.send_bytes(b'{"id": "probe", "op": "ping"}')
        assert json.loads(c.recv_bytes())["ok"] is True
    finally:
        c.close()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8),
                                                                       children, max_size=4),
    max_leaves=12,
)


@FUZZ
@given(data=st.binary(max_size=2048))
def test_random_bytes_get_an_answer(fuzz_engine: EngineProcess, data: bytes) -> None:
    c = _conn(fuzz_engine)
    try:
        c.send_bytes(data)
        answer = json.loads(c.recv_bytes())
        # Random bytes are almost never a valid request; when they are, ok must be a bool.
        assert isinstance(answer.get("ok"), bool)
    finally:
        c.close()


@FUZZ
@given(op=st.sampled_from(sorted(set(REQUESTS) - {"shutdown", "subscribe", "job_start"}))
       | st.text(max_size=12),
       args=st.dictionaries(st.text(max_size=10), json_values, max_size=5) | json_values,
       req_id=json_values)
def test_wrong_types_and_names_are_refused_cleanly(fuzz_engine: EngineProcess, op: str,
                                                   args: object, req_id: object) -> None:
    c = _conn(fuzz_engine)
    try:
        c.send_bytes(json.dumps({"id": req_id, "op": op, "args": args}).encode())
        answer = json.loads(c.recv_bytes())
        assert isinstance(answer["ok"], bool)
        if not answer["ok"]:
            assert isinstance(answer["error"], str) and "\n" not in answer["error"]
    finally:
        c.close()
    _still_answers(fuzz_engine)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(claimed=st.integers(min_value=10, max_value=1 << 20), sent=st.integers(0, 9))
def test_half_messages_do_not_block_others(fuzz_engine: EngineProcess, claimed: int,
                                           sent: int) -> None:
    c = _conn(fuzz_engine)
    raw = socket.socket(fileno=os.dup(c.fileno()))
    try:
        raw.sendall(struct.pack("!i", claimed) + b'{"op":"pin'[:sent])
        _still_answers(fuzz_engine)
    finally:
        raw.close()
        c.close()


def test_unauthenticated_garbage_and_slow_clients(fuzz_engine: EngineProcess) -> None:
    socks = []
    try:
        for i in range(20):  # clients that connect and never authenticate
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(fuzz_engine.paths.control_address)
            if i % 2:
                s.sendall(os.urandom(64))
            socks.append(s)
        _still_answers(fuzz_engine)
    finally:
        for s in socks:
            s.close()
    _still_answers(fuzz_engine)


def test_a_pickle_is_never_unpickled(fuzz_engine: EngineProcess, tmp_path: Path) -> None:
    import pickle

    marker = tmp_path / "unpickled"

    class Evil:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (open, (str(marker), "w"))

    c = _conn(fuzz_engine)
    try:
        c.send_bytes(pickle.dumps(Evil()))
        answer = json.loads(c.recv_bytes())
        assert answer["ok"] is False and "JSON" in answer["error"]
    finally:
        c.close()
    assert not marker.exists()


def test_a_number_of_4400_digits_is_answered_as_out_of_range(fuzz_engine: EngineProcess) -> None:
    """Python refuses to convert an integer of more than 4300 digits: the request is JSON all
    the same, and the answer says what is wrong with it."""
    for number in ("9" * 4400, "-" + "1" * 5000):
        c = _conn(fuzz_engine)
        try:
            c.send_bytes(b'{"id": 7, "op": "history", "args": {"start": ' + number.encode()
                         + b"}}")
            answer = json.loads(c.recv_bytes())
        finally:
            c.close()
        assert answer["ok"] is False
        assert answer["error"] == "request holds a number out of range", answer
    _still_answers(fuzz_engine)
