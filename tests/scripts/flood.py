"""Flood a Headroom channel with connections, for a bounded time; stdlib only.

    python flood.py KIND ADDRESS COUNT SECONDS [KEYFILE]

KIND:
  idle       COUNT connections that authenticate (with the key in KEYFILE) and then send nothing
  reconnect  COUNT clients that connect and never authenticate, in a loop: half of them hang up
             as soon as the engine has sent its first bytes, the other half say nothing until
             the engine cuts them; each connects again at once
  stall      COUNT connections that stop half-way through a message: half of them in the middle
             of the handshake (a length prefix and part of the answer), the other half (when a
             KEYFILE is given) authenticated and in the middle of a request

A connection the engine cuts is opened again at once, so the pressure stays on. It prints
``ready N`` once N connections have been opened, then runs until SECONDS have passed or its
standard input closes, and prints one JSON line: how many connections were opened, cut by the
engine and refused. Each client is a thread; everything stops by itself.
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import threading
import time
from multiprocessing.connection import Client

KIND, ADDRESS, COUNT, SECONDS = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
KEY = open(sys.argv[5], "rb").read() if len(sys.argv) > 5 else None
DEADLINE = time.monotonic() + SECONDS
stop = threading.Event()
lock = threading.Lock()
counts = {"opened": 0, "cut": 0, "refused": 0}
announced = threading.Event()


def count(what: str) -> None:
    with lock:
        counts[what] += 1
        if what == "opened" and counts["opened"] >= COUNT and not announced.is_set():
            announced.set()
            print(f"ready {counts['opened']}", flush=True)


def running() -> bool:
    return not stop.is_set() and time.monotonic() < DEADLINE


def wait_until_cut(sock: socket.socket) -> None:
    """Hold the connection until the engine closes it (or the flood ends)."""
    sock.settimeout(0.25)
    while running():
        try:
            if not sock.recv(4096):
                count("cut")
                return
        except socket.timeout:
            continue
        except OSError:
            count("cut")
            return


def raw() -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5.0)
    s.connect(ADDRESS)
    return s


def authenticated() -> socket.socket:
    conn = Client(ADDRESS, family="AF_UNIX", authkey=KEY)
    sock = socket.socket(fileno=conn.fileno())  # the socket object owns the descriptor now
    conn._handle = None  # type: ignore[attr-defined]
    return sock


def one_client(index: int) -> None:
    stall_in_handshake = KIND == "stall" and (KEY is None or index % 2 == 0)
    while running():
        try:
            if KIND == "idle" or (KIND == "stall" and not stall_in_handshake):
                sock = authenticated()
            else:
                sock = raw()
        except Exception:  # refused in the handshake, or not accepted at all
            count("refused")
            time.sleep(0.01)
            continue
        count("opened")
        try:
            if KIND == "reconnect" and index % 2 == 0:
                try:
                    sock.recv(64)  # the engine took the connection: hang up and come again
                except OSError:
                    pass
                continue
            if KIND == "stall":
                if stall_in_handshake:
                    sock.recv(64)  # the challenge; answer a few bytes of it, then nothing
                    sock.sendall(struct.pack("!i", 16) + b"\x00" * 5)
                else:
                    sock.sendall(struct.pack("!i", 1000) + b'{"id": 1, "op": "st')
            wait_until_cut(sock)
        except OSError:
            count("cut")
        finally:
            sock.close()


def main() -> int:
    threads = [threading.Thread(target=one_client, args=(i,), daemon=True) for i in range(COUNT)]
    for t in threads:
        t.start()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    while running():
        time.sleep(0.1)
    stop.set()
    for t in threads:
        t.join(2.0)
    if not announced.is_set():
        print(f"ready {counts['opened']}", flush=True)
    print(json.dumps(counts), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
