"""The exporter attacked in this process: a TLS key with a passphrase (OpenSSL would ask for it
on the engine's terminal), idle connections that drip a header now and then to hold every
serving slot, and settings flipped back and forth faster than the exporter restarts."""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import sys
import termios
import textwrap
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator, List

import pytest

from tests.prometheus_server import free_port
from trayapp import config as cfg
from trayapp.config.net import Listen
from trayapp.engine.metrics import MetricsService
from trayapp.engine.metrics_export import CONNECTIONS_MAX, MetricsServer

REPO = Path(__file__).resolve().parents[2]


def scrape(port: int) -> bytes:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return bytes(r.read())


@pytest.fixture(scope="module")
def encrypted_key(tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-passout", "pass:x",
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out",
                    str(cert)], check=True, capture_output=True, timeout=60)
    os.chmod(key, 0o600)
    return cert, key


def test_a_key_with_a_passphrase_is_one_line_not_a_prompt_on_the_terminal(
        encrypted_key: Any) -> None:
    """The engine run from a terminal: OpenSSL's own prompt would wait there for ever (the
    engine's start with it)."""
    cert, key = encrypted_key
    code = textwrap.dedent(f"""
        from trayapp import config as cfg
        from trayapp.engine.metrics import MetricsService
        c = cfg.from_mapping({{"metrics": {{"tls_cert": {str(cert)!r}, "tls_key": {str(key)!r}}}}})
        svc = MetricsService(lambda: c, "{free_port()}")
        svc.start(started=1.0)
        print("ERROR:", svc.state_json()["error"], flush=True)
    """)
    master, slave = os.openpty()

    def own_terminal() -> None:  # the child's controlling terminal is the pty (as in a shell)
        os.setsid()
        fcntl.ioctl(slave, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen([sys.executable, "-c", code], stdin=slave, stdout=slave,
                            stderr=slave, preexec_fn=own_terminal, cwd=str(REPO),
                            env=dict(os.environ, PYTHONPATH=str(REPO)))
    os.close(slave)
    out = b""
    try:
        deadline = time.monotonic() + 15
        while proc.poll() is None and time.monotonic() < deadline:
            os.set_blocking(master, False)
            try:
                out += os.read(master, 4096)
            except (BlockingIOError, OSError):
                time.sleep(0.05)
        assert proc.poll() is not None, f"the exporter waits on the terminal: {out!r}"
        try:
            out += os.read(master, 4096)
        except OSError:
            pass
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    text = out.decode(errors="replace")
    assert "pass phrase" not in text.lower(), text
    assert "ERROR:" in text and "passphrase" in text, text


def test_a_key_with_a_passphrase_without_a_terminal_says_what_is_wrong(
        encrypted_key: Any) -> None:
    cert, key = encrypted_key
    c = cfg.from_mapping({"metrics": {"tls_cert": str(cert), "tls_key": str(key)}})
    svc = MetricsService(lambda: c, str(free_port()))
    svc.start(started=1.0)
    error = svc.state_json()["error"]
    assert svc.port is None and "passphrase" in error, error


# -- connections that hold a slot ----------------------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[MetricsServer]:
    s = MetricsServer(Listen("127.0.0.1", free_port()), lambda: None)
    try:
        yield s
    finally:
        s.close()


def test_slow_dripping_connections_do_not_blind_the_exporter(server: MetricsServer) -> None:
    """A header a second on every slot (each under the per-read timeout) held them all: every
    scrape was turned away for as long as it went on."""
    held: List[socket.socket] = []
    try:
        for _ in range(CONNECTIONS_MAX * 2):
            c = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            c.sendall(b"GET /metrics HTTP/1.1\r\n")
            held.append(c)
        for _ in range(3):
            for c in held:
                try:
                    c.sendall(b"X-Slow: 1\r\n")
                except OSError:
                    pass
            assert scrape(server.port) == b""  # served (nothing held yet: an empty page)
    finally:
        for c in held:
            c.close()


def test_a_flood_of_idle_connections_leaves_the_slots_bounded(server: MetricsServer) -> None:
    before = threading.active_count()
    held = [socket.create_connection(("127.0.0.1", server.port), timeout=5)
            for _ in range(100)]
    try:
        assert scrape(server.port) == b""
        assert threading.active_count() - before <= CONNECTIONS_MAX + 2
    finally:
        for c in held:
            c.close()


# -- settings flipped quickly ---------------------------------------------------------------------


def test_settings_flipped_quickly_end_where_the_last_one_says() -> None:
    """Flips that come while a restart is under way (it holds the service's lock: closing a
    server waits for its thread) queue restarts; the last setting must win, not the last
    restart to get the lock."""
    ports = [free_port(), free_port()]
    current = [cfg.from_mapping({"metrics": {"listen": str(ports[0])}})]
    svc = MetricsService(lambda: current[0])
    svc.start(started=1.0)
    try:
        with svc._lock:  # a restart under way
            for i in range(1, 43):  # ends on ports[0], where it serves now
                current[0] = cfg.from_mapping({"metrics": {"listen": str(ports[i % 2])}})
                svc.serving()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(
                t.name == "metrics-restart" for t in threading.enumerate()):
            time.sleep(0.05)
        assert svc.port == ports[0], svc.state_json()
        assert scrape(ports[0]) == b""
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", ports[1])) != 0
    finally:
        svc.close()
