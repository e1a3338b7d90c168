"""The Machines window's queries against a hostile or broken server (a real one on loopback):
a password in the URL (sent as basic auth, never shown), a redirect to another server, an
answer dripped a byte at a time, an endless body, labels that are not one short line, a GPU
index that only looks like a number."""

from __future__ import annotations

import base64
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, Iterator, List

import pytest

from tests.prometheus_answers import closed_port
from trayapp.ui.machines_query import (
    MAX_LABEL,
    PrometheusError,
    _vector,
    fetch_fleet,
    instant_query,
    parse_fleet,
)
from trayapp.ui.machines_text import status_line

SECRET = "s3cr3t-pw"
EMPTY = json.dumps({"status": "success",
                    "data": {"resultType": "vector", "result": []}}).encode()


class Hostile:
    """Behaviours by the URL's first path part: /auth (answers only with the right basic
    auth), /away (redirects to the same server as "localhost"), /drip, /endless."""

    def __init__(self) -> None:
        self.seen: List[Dict[str, Any]] = []
        hostile = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                hostile.seen.append({"host": self.headers.get("Host"), "path": self.path,
                                     "auth": self.headers.get("Authorization")})
                kind = self.path.split("/")[1]
                getattr(self, "_" + kind, self._auth)()

            def _auth(self) -> None:
                want = "Basic " + base64.b64encode(f"alice:{SECRET}".encode()).decode()
                ok = self.headers.get("Authorization") == want
                self._send(200 if ok else 401, EMPTY if ok else b"Unauthorized\n")

            def _away(self) -> None:
                self.send_response(302)
                port = self.server.server_address[1]
                self.send_header("Location", f"http://localhost:{port}/auth/api/v1/query")
                self.end_headers()

            def _drip(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                try:
                    for _ in range(200):
                        self.wfile.write(b" ")
                        self.wfile.flush()
                        time.sleep(0.1)
                except OSError:
                    pass

            def _endless(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.end_headers()
                chunk = b"<b>" * 20000
                try:
                    while True:
                        self.wfile.write(chunk)
                except OSError:
                    pass

            def _send(self, code: int, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def url(self, kind: str, userinfo: str = "") -> str:
        return f"http://{userinfo}127.0.0.1:{self.port}/{kind}"


@pytest.fixture(scope="module")
def hostile() -> Iterator[Hostile]:
    server = Hostile()
    try:
        yield server
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()


def test_a_password_in_the_url_is_sent_as_basic_auth_and_never_shown(hostile: Hostile) -> None:
    url = hostile.url("auth", f"alice:{SECRET}@")
    fleet = fetch_fleet(url, timeout=5)  # it used to ask DNS for "alice:s3cr3t-pw@127.0.0.1"
    assert fleet.machines == ()
    line = status_line(url, fleet, None, 5)
    assert SECRET not in line and "alice" not in line and f"127.0.0.1:{hostile.port}" in line
    assert all(SECRET not in s["path"] for s in hostile.seen)


def test_a_url_that_does_not_parse_with_a_password_is_one_line_without_it() -> None:
    url = f"http://alice:{SECRET}@127.0.0.1:{closed_port()}x/"  # "port" with a letter
    with pytest.raises(PrometheusError) as e:
        instant_query(url, "up", timeout=2)  # was http.client.InvalidURL, the password in it
    assert SECRET not in str(e.value)
    assert SECRET not in status_line(url, None, str(e.value), 5)


def test_a_redirect_to_another_server_is_refused_and_gets_no_password(hostile: Hostile) -> None:
    before = len(hostile.seen)
    with pytest.raises(PrometheusError, match="another server"):
        instant_query(hostile.url("away", f"alice:{SECRET}@"), "up", timeout=5)
    hosts = [s["host"] for s in hostile.seen[before:]]
    assert not [h for h in hosts if h.startswith("localhost")], hostile.seen[before:]


def test_an_answer_dripped_a_byte_at_a_time_is_given_up_on_in_time(hostile: Hostile) -> None:
    start = time.monotonic()
    with pytest.raises(PrometheusError, match="within"):
        instant_query(hostile.url("drip"), "up", timeout=1.0)
    assert time.monotonic() - start < 5  # each byte came well under the socket's timeout


def test_an_endless_body_is_cut_and_named(hostile: Hostile) -> None:
    with pytest.raises(PrometheusError, match="too large"):
        instant_query(hostile.url("endless"), "up", timeout=20)


def sample(metric: str, value: float = 1.0, **labels: str) -> Dict[str, Any]:
    return {"metric": {"__name__": metric, "instance": "box:9835", **labels}, "value": value}


def test_labels_are_one_short_line_and_an_odd_gpu_index_breaks_nothing() -> None:
    long = "x" * 100_000
    series = [sample("headroom_job_state", job="1", name="a\nb<b>bold</b>\u202e" + long,
                     state="running"),
              sample("headroom_gpu_memory_total_bytes", 8.0, gpu="\u00b2", name="odd"),
              sample("headroom_gpu_memory_total_bytes", 8.0, gpu="9" * 5000, name="big"),
              sample("headroom_gpu_memory_total_bytes", 8.0, gpu="0", name="zero")]
    _, samples = _vector({"resultType": "vector",
                          "result": [dict(s, value=[1.0, str(s["value"])]) for s in series]})
    fleet = parse_fleet("http://p", 1.0, samples, [])
    (m,) = fleet.machines
    assert [g.name for g in m.gpus][0] == "zero"
    (job,) = m.jobs
    assert len(job.name) <= MAX_LABEL and "\n" not in job.name and "\u202e" not in job.name
