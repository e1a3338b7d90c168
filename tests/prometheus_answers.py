"""Answers a real Prometheus gave, served again on loopback for the Machines window's tests.

``tests/fixtures/prometheus/*.json`` hold them (``capture_prometheus.py`` there records them
from two real engines scraped by a real Prometheus). ``AnswerServer`` serves
``/api/v1/query`` with them, by query, over a real socket, so the tests go through urllib and
the parsing exactly as against the server itself; ``silent_port`` accepts connections and never
answers.
"""

from __future__ import annotations

import json
import socket
import threading
import urllib.parse
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Tuple

from trayapp.ui.machines_query import SERIES_QUERY, UP_QUERY

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "prometheus"

Answer = Tuple[int, str, bytes]  # HTTP status, content type, body


def recorded(name: str) -> Dict[str, Any]:
    """A recorded file: ``fleet`` ({"series", "up", "status": {instance: status --json}}),
    ``empty`` (a Prometheus that scrapes nothing yet), ``refused`` (its answer to a bad query)."""
    data: Dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return data


def json_answer(answer: Any, status: int = 200) -> Answer:
    return status, "application/json", json.dumps(answer).encode()


def fleet_answers(fleet: Optional[Dict[str, Any]] = None) -> Dict[str, Answer]:
    """The two queries of ``fetch_fleet`` answered as the recorded server answered them."""
    fleet = fleet or recorded("fleet")
    return {SERIES_QUERY: json_answer(fleet["series"]), UP_QUERY: json_answer(fleet["up"])}


class AnswerServer:
    """An HTTP server on 127.0.0.1 answering ``/api/v1/query?query=Q`` with ``answers[Q]``
    (``answers[None]`` for any other query; 404 without it). ``answers`` may be replaced while
    it runs. ``queries`` lists what it was asked."""

    def __init__(self, answers: Dict[Optional[str], Answer]):
        self.answers = answers
        self.queries: list = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                parts = urllib.parse.urlsplit(self.path)
                query = urllib.parse.parse_qs(parts.query).get("query", [None])[0]
                server.queries.append((parts.path, query))
                found = server.answers.get(query, server.answers.get(None))
                if parts.path != "/api/v1/query" or found is None:
                    found = (404, "text/plain", b"404 page not found\n")
                status, kind, body = found
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        # A short poll: shutting down waits for it.
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,),
                                        daemon=True)

    def __enter__(self) -> AnswerServer:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@contextmanager
def silent_port() -> Iterator[int]:
    """A port that takes connections (the kernel's backlog) and never answers."""
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield int(s.getsockname()[1])
    finally:
        s.close()


def closed_port() -> int:
    """A port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
