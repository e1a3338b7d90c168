"""A connection the engine cuts from another thread (the reaper, a client place given to a
newer client, a job's channel full) keeps its descriptor until the thread that reads it is
done: the next connection the engine takes never gets its number while a reader or writer of
the old one may still use it, and so never gets the old one's bytes. Real sockets, a real
server, real threads."""

from __future__ import annotations

import json
import os
import random
import sys
import threading
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest

from tests.conftest import wait_for
from trayapp.channel import ChannelServer, Peer

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX descriptors")

KEY = b"k" * 32


class Held:
    """A handler that answers each message with what it said, and holds the one that says
    "hold" until ``go`` is set."""

    def __init__(self) -> None:
        self.inside = threading.Event()
        self.go = threading.Event()
        self.held: Optional[Peer] = None

    def __call__(self, peer: Peer, data: bytes) -> Dict[str, Any]:
        said = json.loads(data)
        if said == "hold":
            self.held = peer
            self.inside.set()
            self.go.wait(30)
        return {"echo": said}


@pytest.fixture
def held(tmp_path: Path) -> Iterator[Any]:
    handler = Held()
    srv = ChannelServer(str(tmp_path / "s"), KEY, handler, name="test")
    srv.start()
    try:
        yield srv, handler
    finally:
        handler.go.set()
        srv.close()


def test_a_peer_cut_while_it_is_answered_keeps_its_descriptor_until_its_thread_is_done(
        held: Any) -> None:
    srv, handler = held
    first = Client(srv.address, family="AF_UNIX", authkey=KEY)
    second: Optional[Connection] = None
    try:
        first.send_bytes(b'"hold"')
        assert handler.inside.wait(30)
        peer = handler.held
        fd = peer.conn.fileno()
        inode = os.fstat(fd).st_ino
        peer.close()  # as the reaper does, from a thread that is not the peer's

        second = Client(srv.address, family="AF_UNIX", authkey=KEY)
        second.send_bytes(b'"mine"')
        assert json.loads(second.recv_bytes()) == {"echo": "mine"}
        others = [p for p in srv.peers if p is not peer and not p.closed]
        assert others and all(p.conn.fileno() != fd for p in others)
        assert os.fstat(fd).st_ino == inode  # the number is still the cut peer's socket

        handler.go.set()
        wait_for(lambda: peer.conn.closed, 10, "the cut peer's thread to let it go")
        with pytest.raises((EOFError, OSError)):  # cut: its answer is not sent
            first.recv_bytes()
        second.send_bytes(b'"again"')
        assert json.loads(second.recv_bytes()) == {"echo": "again"}
    finally:
        first.close()
        if second is not None:
            second.close()


def test_clients_cut_at_random_never_get_another_clients_bytes(tmp_path: Path) -> None:
    """Clients connect, say a word of their own and read the answer, while another thread cuts
    peers at random: each client gets its own word back or a closed connection, never a
    handshake gone wrong or another client's answer."""
    srv = ChannelServer(str(tmp_path / "s"), KEY, lambda peer, data: {"echo": json.loads(data)},
                        name="test", max_peers=64)
    srv.start()
    stop = threading.Event()
    wrong: List[str] = []
    done = [0, 0]  # answered, cut

    def cutter() -> None:
        rng = random.Random(7)
        while not stop.is_set():
            for p in list(srv.peers):
                if rng.random() < 0.3:
                    p.close()
            stop.wait(0.0005)

    def client(n: int) -> None:
        for i in range(150):
            word = f"client-{n}-{i}"
            try:
                conn = Client(srv.address, family="AF_UNIX", authkey=KEY)
            except (EOFError, ConnectionError):
                done[1] += 1
                continue
            except Exception as e:  # a handshake that read bytes that were not its own
                wrong.append(f"{type(e).__name__}: {e}")
                continue
            try:
                conn.send_bytes(json.dumps(word).encode())
                answer = json.loads(conn.recv_bytes())
                if answer != {"echo": word}:
                    wrong.append(f"{word} got {answer}")
                done[0] += 1
            except (EOFError, OSError):
                done[1] += 1
            finally:
                conn.close()

    cut = threading.Thread(target=cutter, daemon=True)
    clients = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(3)]
    cut.start()
    try:
        for t in clients:
            t.start()
        for t in clients:
            t.join(120)
        assert not any(t.is_alive() for t in clients)
    finally:
        stop.set()
        cut.join(10)
        srv.close()
    assert not wrong, wrong[:5]
    assert done[0] > 0 and done[1] > 0, done  # both happened: answers, and cuts
