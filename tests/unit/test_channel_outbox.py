"""The outbox a channel's peer is written through: a command to a peer that never reads never
blocks its caller, repeated commands wait as one, and a peer whose write does not go through
is cut off. A real ChannelServer on a real Unix socket, a real client that never reads."""

from __future__ import annotations

import sys
import threading
import time
from multiprocessing.connection import Client
from pathlib import Path
from typing import Any, Iterator, List

import pytest

from tests.conftest import wait_for
from trayapp import channel
from trayapp.channel import ChannelServer, Outbox, Peer

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="Unix sockets")
KEY = b"k" * 32


def test_the_latest_of_each_kind_waits_in_the_order_last_given() -> None:
    box = Outbox(4)
    assert box.put(b"pause-1", "pause") and box.put(b"resume", "resume")
    assert box.put(b"pause-2", "pause")  # replaces the first pause, after the resume
    assert box.put(b"fit", None) and box.put(b"fit", None)  # no key: each one kept
    assert len(box) == 4 and box.coalesced == 1
    assert not box.put(b"one too many", "stop")  # full: nothing queued
    assert box.put(b"pause-3", "pause")  # a replacement fits in a full box
    assert [box.get() for _ in range(4)] == [b"resume", b"fit", b"fit", b"pause-3"]
    box.close()
    assert box.get() is None and not box.put(b"late", "pause")


def test_a_closed_box_wakes_its_reader() -> None:
    box = Outbox(2)
    got: List[Any] = []
    t = threading.Thread(target=lambda: got.append(box.get()))
    t.start()
    box.close()
    t.join(10)
    assert got == [None]


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setattr(channel, "WRITE_SECONDS", 0.5)
    peers: List[Peer] = []
    closed: List[Peer] = []
    srv = ChannelServer(str(tmp_path / "s"), KEY, lambda peer, data: peers.append(peer),
                        name="test", on_close=closed.append)
    srv.start()
    srv.seen, srv.closed_peers = peers, closed  # type: ignore[attr-defined]
    yield srv
    srv.close()


def test_a_peer_that_never_reads_is_cut_off_and_its_poster_never_waits(server: Any) -> None:
    conn = Client(server.address, family="AF_UNIX", authkey=KEY)
    try:
        conn.send_bytes(b"{}")  # so the server has the peer at hand
        peer = wait_for(lambda: server.seen[:1], 10, "the message")[0]
        big = {"type": "park", "pad": "x" * 60_000}  # a few of these fill the socket
        slowest, posted = 0.0, 0
        while not peer.closed:
            t = time.monotonic()
            peer.post(big, key=None)  # no key: each one a message of its own
            slowest = max(slowest, time.monotonic() - t)
            posted += 1
            assert posted < 100_000
            time.sleep(0.001)
        assert peer.cut_off  # not read: cut off by the reaper
        assert slowest < 0.2, slowest  # posting never waited on the socket
        assert posted > channel.OUTBOX_SIZE  # the box filled up, and was refused, meanwhile
        wait_for(lambda: peer in server.closed_peers, 10, "the server's on_close")
        assert not peer.post(big, key="park")  # a cut peer takes nothing more
    finally:
        conn.close()


def test_a_peer_that_reads_gets_what_was_posted_in_order(server: Any) -> None:
    conn = Client(server.address, family="AF_UNIX", authkey=KEY)
    try:
        conn.send_bytes(b"{}")
        peer = wait_for(lambda: server.seen[:1], 10, "the message")[0]
        for i in range(50):
            assert peer.post({"n": i}, key="n")
            assert conn.recv_bytes() == channel.encode({"n": i})
        assert not peer.cut_off and not peer.closed
    finally:
        conn.close()


def test_a_jobs_messages_over_its_rate_are_counted_and_handed_over_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from trayapp.jobs import runner_link

    clock = [100.0]
    monkeypatch.setattr(runner_link.time, "monotonic", lambda: clock[0])
    rate = runner_link.Rate(rate=10.0, burst=5)
    assert [rate.take("a") for _ in range(8)] == [True] * 5 + [False] * 3
    assert rate.take("b")  # each job has its own
    assert rate.excess("a") == 3 and rate.excess("a") == 0
    clock[0] += 0.25  # 2.5 messages' worth
    assert [rate.take("a") for _ in range(3)] == [True, True, False]
    clock[0] += 100.0  # never more than the burst saved up
    assert sum(rate.take("a") for _ in range(20)) == 5
    rate.forget("a")
    assert rate.excess("a") == 0
