"""The engine's Prometheus exporter: where it listens (``headroom engine --metrics`` or
``[metrics] listen``), starting and stopping it as the settings change, the reading the loop
hands it, and the guard's action counts.

A scrape reads only what the loop handed over (``Held``): no NVML, no /proc, no lock the loop
needs. Off by default: then nothing listens and ``prometheus_client`` is not even imported.
A port in use, an address this machine does not have or a TLS file that cannot be read is one
line in the log and in the status; the engine goes on without the exporter.
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

from trayapp import __version__
from trayapp.config import Config, ConfigError
from trayapp.config.net import Listen, parse_listen
from trayapp.jobs.record import JobRecord
from trayapp.jsonvalue import JSONObject
from trayapp.readings import Snapshot
from trayapp.text import one_line
from trayapp.vocab import GUARD_EVENTS

if TYPE_CHECKING:  # the export module imports prometheus_client: only when the exporter is on
    from trayapp.engine.metrics_export import Held, MetricsServer

log = logging.getLogger("headroom.engine")

# The event of each guard action, back to the action ("guard_pause" -> "pause").
_ACTION_OF_EVENT = {str(kind): action for action, kind in GUARD_EVENTS.items()}
# (listen, cert, key): what the settings and the flag ask for.
Wanted = Tuple[Optional[Listen], str, str]


class ActionTally:
    """The guard's actions counted from its events (a dry run's are not). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Dict[str, int] = {}

    def note(self, kind: str, data: Optional[Mapping[str, Any]]) -> None:
        action = _ACTION_OF_EVENT.get(str(kind))
        if action is None or (isinstance(data, Mapping) and data.get("dry_run")):
            return
        with self._lock:
            self._counts[action] = self._counts.get(action, 0) + 1

    def counts(self) -> Dict[str, int]:
        with self._lock:
            return dict(self._counts)


def wanted(config: Config, flag: Optional[str]) -> Tuple[Wanted, Optional[str]]:
    """What to serve: ``--metrics`` when given, else ``metrics.listen``; and why it cannot be
    (a TLS file without the other), or None."""
    listen: Optional[Listen] = None
    problem = None
    try:  # both are checked where they are read (the command line, the file): this is a net
        listen = parse_listen(flag if flag is not None else config["metrics.listen"])
    except ConfigError as e:
        problem = f"{one_line(str(flag), limit=60)!r}: {e}"
    cert, key = str(config["metrics.tls_cert"]), str(config["metrics.tls_key"])
    if listen is not None and bool(cert) != bool(key):
        problem = "metrics.tls_cert and metrics.tls_key must both be set for TLS"
    return (listen, cert, key), problem


class MetricsService:
    """The exporter as the engine runs it. ``config()`` gives the settings in use; ``flag`` is
    ``--metrics``'s value (it wins over ``metrics.listen``). ``publish`` is called by the loop
    after each tick; ``note_event`` by every event; ``state_json`` for the status."""

    def __init__(self, config: Callable[[], Config], flag: Optional[str] = None):
        self._config = config
        self.flag = flag
        self.tally = ActionTally()
        self._lock = threading.Lock()  # guards the server, the state and a restart under way
        self._held: Optional[Held] = None
        self._server: Optional[MetricsServer] = None
        self._serving: Wanted = (None, "", "")
        # What the settings ask for now, and why it cannot be: a restart applies this, the
        # latest, not what was asked when it was queued (flips can overtake each other).
        self._want: Tuple[Wanted, Optional[str]] = ((None, "", ""), None)
        self._error: Optional[str] = None
        self._seen: Optional[Config] = None
        self._host = socket.gethostname()
        self._started = 0.0

    # -- what the engine calls ------------------------------------------------------------------

    def start(self, started: float) -> None:
        """At the engine's start: listen where asked (or nowhere)."""
        self._started = started
        cfg = self._config()
        self._seen = cfg
        self._want = wanted(cfg, self.flag)
        self._apply()

    def serving(self) -> bool:
        """Whether a reading is wanted (the exporter is on). A changed setting restarts the
        exporter here, off the loop's thread. Called by the loop on every tick: one identity
        check while nothing changed."""
        cfg = self._config()
        if cfg is not self._seen:
            self._seen = cfg
            want = wanted(cfg, self.flag)
            if want != self._want or self._error is not None:
                self._want = want
                threading.Thread(target=self._apply, name="metrics-restart", daemon=True).start()
        return self._server is not None

    def publish(self, snap: Snapshot, guard: Mapping[str, Any], jobs: Sequence[JobRecord]) -> None:
        """The loop's reading, for the scrapes until the next one."""
        from trayapp.engine.metrics_export import Held  # loaded with the server

        self._held = Held(
            snap, guard, tuple(jobs), self.tally.counts(), __version__, self._host, self._started
        )

    def note_event(self, kind: str, data: Optional[Mapping[str, Any]]) -> None:
        self.tally.note(kind, data)

    def state_json(self) -> JSONObject:
        """``{"listen": "127.0.0.1:9835" or None, "tls": bool, "error": why it is off or
        None}``."""
        with self._lock:
            listen, cert, _ = self._serving
            return {
                "listen": str(listen) if self._server is not None and listen else None,
                "tls": bool(cert) and self._server is not None,
                "error": self._error,
            }

    @property
    def port(self) -> Optional[int]:
        server = self._server
        return server.port if server is not None else None

    def close(self) -> None:
        with self._lock:
            self._stop_server()

    # -- starting and stopping ------------------------------------------------------------------

    def _apply(self) -> None:
        with self._lock:
            want, problem = self._want
            if want == self._serving and self._server is not None and problem is None:
                return
            self._stop_server()
            self._serving, self._error = want, None
            listen, cert, key = want
            if problem is not None:
                self._fail(listen, problem)
                return
            if listen is None:
                return
            self._start_server(listen, cert, key)

    def _start_server(self, listen: Listen, cert: str, key: str) -> None:
        try:
            from trayapp.engine.metrics_export import MetricsServer  # the exporter is on
        except ImportError as e:
            self._fail(listen, f"prometheus-client is not installed ({one_line(e)})")
            return
        try:
            self._server = MetricsServer(listen, lambda: self._held, cert=cert, key=key)
        except (OSError, ValueError) as e:  # ssl.SSLError and socket.gaierror are OSErrors
            why = one_line(getattr(e, "strerror", None) or e, limit=200)
            self._fail(listen, why)
            return
        scheme = "https" if cert else "http"
        log.info("metrics: serving Prometheus metrics at %s://%s/metrics", scheme, listen)
        if not listen.loopback:
            log.warning(
                "metrics: listening on %s, which other machines can reach%s",
                listen,
                ""
                if cert
                else " without TLS (anyone on the network can read the "
                "machine's memory and jobs); set metrics.tls_cert and metrics.tls_key",
            )

    def _fail(self, listen: Optional[Listen], why: str) -> None:
        self._error = (
            f"cannot serve metrics on {listen}: {why}" if listen else f"cannot serve metrics: {why}"
        )
        log.warning("metrics: %s; the engine goes on without them", self._error)

    def _stop_server(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            log.info("metrics: stopped serving on %s", self._serving[0])
