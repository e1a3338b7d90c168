"""No answer is larger than a client reads: a request that quotes a long text back in its
refusal, a long id, or a handler whose answer would be too large. A real ChannelServer on a
real Unix socket and a real client reading with the protocol's bound; and the engine's own
request handling, whose refusals quote the request."""

from __future__ import annotations

import json
import sys
from multiprocessing.connection import Client
from pathlib import Path
from typing import Any, Iterator

import pytest

from trayapp.channel import ChannelServer
from trayapp.engine import protocol
from trayapp.runner.protocol import MAX_MESSAGE_BYTES

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="Unix sockets")
KEY = b"k" * 32


def answer(server: ChannelServer, data: bytes) -> Any:
    conn = Client(server.address, family="AF_UNIX", authkey=KEY)
    try:
        conn.send_bytes(data)
        assert conn.poll(20), "no answer"
        return json.loads(conn.recv_bytes(MAX_MESSAGE_BYTES))
    finally:
        conn.close()


@pytest.fixture
def echo(tmp_path: Path) -> Iterator[ChannelServer]:
    """A server whose handler answers with as many bytes as the request names."""
    def handle(peer: Any, data: bytes) -> Any:
        return {"id": 7, "ok": True, "data": "x" * int(data)}

    srv = ChannelServer(str(tmp_path / "s"), KEY, handle, name="test")
    srv.start()
    yield srv
    srv.close()


def test_an_answer_larger_than_a_client_reads_is_a_refusal_that_says_so(echo: ChannelServer
                                                                        ) -> None:
    big = answer(echo, str(MAX_MESSAGE_BYTES).encode())
    assert big == {"id": 7, "ok": False, "code": "too_large",
                   "error": f"the answer is larger than {MAX_MESSAGE_BYTES} bytes; ask for less"}
    small = answer(echo, b"10")
    assert small == {"id": 7, "ok": True, "data": "x" * 10}  # the connection serves on


@pytest.mark.parametrize("text", ["\udfff" * 170_000, "\U0010ffff" * 80_000, "\x00" * 150_000])
def test_a_refusal_quoting_a_long_request_stays_one_short_line(text: str) -> None:
    # Escaped by repr and again by JSON, such a text once grew past the bound in the answer.
    request = json.dumps({"id": 1, "op": text}).encode()
    assert len(request) < MAX_MESSAGE_BYTES
    with pytest.raises(protocol.ProtocolError) as e:
        protocol.parse_request(request)
    refusal = protocol.error(None, str(e.value), "bad_request")
    assert len(refusal["error"]) <= protocol.MAX_ERROR_CHARS
    assert refusal["error"].isprintable() and refusal["error"].startswith("unknown op ")
    assert len(protocol.encode(refusal)) < 8 * protocol.MAX_ERROR_CHARS


def test_a_long_id_is_refused_not_given_back() -> None:
    with pytest.raises(protocol.ProtocolError, match="id is longer than 200 characters"):
        protocol.parse_request(json.dumps({"id": "i" * 201, "op": "ping"}).encode())
    assert protocol.parse_request(json.dumps({"id": "i" * 200, "op": "ping"}).encode())[0] \
        == "i" * 200


def test_an_answer_json_cannot_hold_is_an_internal_error_and_the_connection_serves_on(
        tmp_path: Path) -> None:
    def handle(peer: Any, data: bytes) -> Any:
        if data == b"bad":
            return {"id": 7, "ok": True, "data": {1, 2}, Path("x"): b"bytes"}
        return {"id": 7, "ok": True}

    srv = ChannelServer(str(tmp_path / "s"), KEY, handle, name="test")
    srv.start()
    try:
        conn = Client(srv.address, family="AF_UNIX", authkey=KEY)
        try:
            for data, expected in ((b"bad", {"id": 7, "ok": False, "code": "internal",
                                             "error": "internal error in the engine (see its "
                                                      "log)"}),
                                   (b"good", {"id": 7, "ok": True})):
                conn.send_bytes(data)
                assert conn.poll(20), "no answer"
                assert json.loads(conn.recv_bytes(MAX_MESSAGE_BYTES)) == expected
        finally:
            conn.close()
    finally:
        srv.close()
