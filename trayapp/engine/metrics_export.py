"""The Prometheus side of the exporter: the metric families made from one held reading (a
custom collector: nothing is read from the machine at a scrape), and the small HTTP(S) server
that serves them at ``/metrics``.

Loaded only when the exporter is on (``trayapp.engine.metrics``): an engine without it never
imports ``prometheus_client``.
"""

from __future__ import annotations

import socket
import socketserver
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from trayapp.config.net import Listen
from trayapp.jobs.cgroups import tag_of
from trayapp.jobs.eta import progress_units
from trayapp.jobs.record import JobRecord
from trayapp.readings import Snapshot
from trayapp.text import one_line
from trayapp.vocab import GUARD_EVENTS, GuardLevel, GuardMode, JobState

JOBS_MAX = 100  # jobs in one scrape (newest first): the labels stay bounded whatever happens
LABEL_MAX = 64  # characters of a job's or a GPU's name in a label
CONNECTIONS_MAX = 8  # scrapes served at once; more are closed at once
REQUEST_TIMEOUT = 10.0  # seconds a connection may take to send its request (TLS included)
EVICT_WAIT = 1.0  # seconds a new connection waits for the slot of one cut to make room
IDLE_POLL = 3600.0  # seconds the serving thread sleeps between scrapes
GUARD_ACTIONS = tuple(GUARD_EVENTS)  # warn, ok, pause, resume, park, stop


@dataclass(frozen=True)
class Held:
    """What one scrape reads: the loop's last reading, the guard's status, the live and parked
    jobs, the guard's action counts, and who the engine is."""

    snapshot: Snapshot
    guard: Mapping[str, Any]
    jobs: Tuple[JobRecord, ...]
    actions: Mapping[str, int] = field(default_factory=dict)
    version: str = ""
    host: str = ""
    started: float = 0.0


def label(text: Any) -> str:
    """A value as a label: one printable line, cut short (Prometheus escapes the rest)."""
    return one_line(str(text if text is not None else ""), limit=LABEL_MAX)


def _gauge(name: str, doc: str, labels: Iterable[str] = (), unit: str = "") -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels), unit=unit)


def _add(family: GaugeMetricFamily, labels: List[str], value: Optional[float]) -> None:
    """A sample only where there is a value: what the hardware cannot give stays absent."""
    if value is not None:
        family.add_metric(labels, float(value))


def _ratio(percent: Optional[float]) -> Optional[float]:
    return None if percent is None else max(0.0, min(1.0, percent / 100.0))


def engine_families(held: Held) -> List[Metric]:
    info = _gauge(
        "headroom_info", "The engine's version and host name (always 1).", ["version", "host"]
    )
    info.add_metric([label(held.version), label(held.host)], 1)
    started = _gauge(
        "headroom_engine_start_time_seconds", "When the engine started (seconds since the epoch)."
    )
    started.add_metric([], held.started)
    sampled = _gauge(
        "headroom_last_sample_timestamp_seconds",
        "When the reading these metrics come from was taken (seconds since the "
        "epoch): far behind time() means the engine's loop is stuck.",
    )
    sampled.add_metric([], held.snapshot.time)
    return [info, started, sampled]


def memory_families(held: Held) -> List[Metric]:
    m = held.snapshot.memory
    out: List[Metric] = []
    for name, doc, value in (
        (
            "headroom_memory_total_bytes",
            "RAM the guard counts with (a cgroup's limit where one bounds it).",
            m.total_bytes,
        ),
        ("headroom_memory_available_bytes", "RAM available (cgroup-aware).", m.available_bytes),
        ("headroom_memory_used_bytes", "RAM in use (cgroup-aware).", m.used_bytes),
        ("headroom_swap_total_bytes", "Swap space.", m.swap_total_bytes),
        ("headroom_swap_used_bytes", "Swap in use.", m.swap_used_bytes),
        (
            "headroom_memory_pressure_some_ratio",
            'PSI memory "some" avg10: share of the last '
            "10 s some task stalled on memory (absent without PSI).",
            _ratio(m.psi_some_avg10),
        ),
        (
            "headroom_memory_pressure_full_ratio",
            'PSI memory "full" avg10: share of the last '
            "10 s all tasks stalled on memory (absent without PSI).",
            _ratio(m.psi_full_avg10),
        ),
    ):
        family = _gauge(name, doc)
        _add(family, [], value)
        out.append(family)
    cgroup = _gauge(
        "headroom_memory_cgroup_limited",
        "1 when a cgroup's limit, not the machine's RAM, bounds what is available.",
    )
    cgroup.add_metric([], 1.0 if m.limit_source == "cgroup" else 0.0)
    out.append(cgroup)
    return out


def gpu_families(held: Held) -> List[Metric]:
    gpus = held.snapshot.gpus
    count = _gauge("headroom_gpu_count", "GPUs the engine sees (0 without NVML or a GPU).")
    count.add_metric([], len(gpus))
    keys = ["gpu", "uuid", "name"]
    table: List[Tuple[str, str, Callable[[Any], Optional[float]]]] = [
        ("headroom_gpu_memory_total_bytes", "A GPU's memory.", lambda g: g.memory_total_bytes),
        ("headroom_gpu_memory_used_bytes", "A GPU's memory in use.", lambda g: g.memory_used_bytes),
        ("headroom_gpu_memory_free_bytes", "A GPU's free memory.", lambda g: g.memory_free_bytes),
        (
            "headroom_gpu_utilization_ratio",
            "Share of the last sample period a kernel ran on the GPU.",
            lambda g: _ratio(g.utilization_percent),
        ),
        ("headroom_gpu_temperature_celsius", "A GPU's temperature.", lambda g: g.temperature_c),
        ("headroom_gpu_power_watts", "A GPU's power draw.", lambda g: g.power_watts),
    ]
    out: List[Metric] = [count]
    for name, doc, read in table:
        family = _gauge(name, doc, keys)
        for g in gpus:
            _add(family, [str(g.index), label(g.uuid), label(g.name)], read(g))
        out.append(family)
    return out


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def guard_families(held: Held) -> List[Metric]:
    g = held.guard
    state = _gauge(
        "headroom_guard_state",
        "The guard's level, as a state set: 1 on the "
        "current one (ok, warn, pause, park), 0 on the others.",
        ["state"],
    )
    current = str(g.get("state", GuardLevel.OK))
    for level in GuardLevel:
        state.add_metric([level.value], 1.0 if level.value == current else 0.0)
    mode = _gauge(
        "headroom_guard_mode", "The guard's mode, as a state set (act, dry-run, off).", ["mode"]
    )
    for m in GuardMode:
        mode.add_metric([m.value], 1.0 if m.value == g.get("mode") else 0.0)
    tte = _gauge(
        "headroom_guard_seconds_to_exhaustion",
        "Seconds until available memory runs "
        "out at the measured fill rate (absent when it is not filling).",
    )
    _add(tte, [], _number(g.get("seconds_to_exhaustion")))
    rate = _gauge(
        "headroom_guard_fill_rate_bytes_per_second",
        "How fast available memory shrinks (negative: it grows), fitted over the recent samples.",
    )
    _add(rate, [], _number(g.get("fill_rate_bytes_per_s")))
    steps = _gauge(
        "headroom_guard_threshold_bytes",
        "Available memory at which the guard "
        "takes each step (warn, pause, park, stop; resume above it).",
        ["step"],
    )
    thresholds = g.get("thresholds")
    if isinstance(thresholds, Mapping):
        for key, value in sorted(thresholds.items()):
            if isinstance(key, str) and key.endswith("_bytes"):
                _add(steps, [key[: -len("_bytes")]], _number(value))
    actions = CounterMetricFamily(
        "headroom_guard_actions",
        "What the guard did since the engine started, by action (dry-run ones not counted).",
        labels=["action"],
    )
    for action in GUARD_ACTIONS:
        actions.add_metric([action], float(held.actions.get(action, 0)))
    return [state, mode, tte, rate, steps, actions]


def progress_ratio(job: JobRecord) -> Optional[float]:
    """Training done as a share of the fit, or None when the runner reports no progress."""
    if job.state == JobState.FINISHED and job.epochs:
        return 1.0
    done, total = progress_units(job)
    if done is None or not total:
        return None
    return max(0.0, min(1.0, done / total))


def job_families(held: Held) -> List[Metric]:
    keys = ["job", "name"]
    memory = _gauge(
        "headroom_job_memory_bytes",
        'A job\'s memory: its process tree\'s RAM (kind="ram") and its GPU memory (kind="vram").',
        [*keys, "kind"],
    )
    budget = _gauge(
        "headroom_job_memory_budget_bytes",
        "A job's guard budget, where it has one.",
        [*keys, "kind"],
    )
    state = _gauge(
        "headroom_job_state",
        "1 for a job's current state (live and parked jobs only: an ended job drops out).",
        [*keys, "state"],
    )
    progress = _gauge("headroom_job_progress_ratio", "Share of a job's training done.", keys)
    started = _gauge("headroom_job_start_time_seconds", "When a job started.", keys)
    eta = _gauge("headroom_job_eta_seconds", "Seconds a job's training has left, estimated.", keys)
    answering = _gauge(
        "headroom_job_answering",
        "0 for a live job whose runner does not read "
        "what the engine sends (cut off: handled by signals), else 1.",
        keys,
    )
    protection = _gauge(
        "headroom_job_protection_info",
        "1, labelled with what guards a job "
        "besides the guard: brake-v1 or brake-v2 (its cgroup's limit held by the "
        "kernel: cgroup v1, or a systemd scope on cgroup v2) or guard (the guard "
        "alone).",
        [*keys, "protection"],
    )
    for job in held.jobs[:JOBS_MAX]:
        ids = [label(job.id), label(job.name)]
        _add(memory, [*ids, "ram"], job.rss_bytes)
        _add(memory, [*ids, "vram"], job.vram_bytes)
        _add(budget, [*ids, "ram"], job.ram_budget_bytes)
        _add(budget, [*ids, "vram"], job.vram_budget_bytes)
        state.add_metric([*ids, label(job.state)], 1.0)
        _add(progress, ids, progress_ratio(job))
        _add(started, ids, job.started)
        _add(eta, ids, job.eta_seconds)
        if job.is_live:
            answering.add_metric(ids, 1.0 if job.answering else 0.0)
        if job.protection:
            protection.add_metric([*ids, label(tag_of(job.protection))], 1.0)
    return [memory, budget, state, progress, started, eta, answering, protection]


def families(held: Held) -> List[Metric]:
    """Every metric family of one held reading (pure: nothing is read)."""
    return [
        *engine_families(held),
        *memory_families(held),
        *gpu_families(held),
        *guard_families(held),
        *job_families(held),
    ]


class HeldCollector(Collector):
    """Collects ``families(held())``; before the loop's first reading, nothing."""

    def __init__(self, held: Callable[[], Optional[Held]]):
        self._held = held

    def collect(self) -> Iterator[Metric]:
        held = self._held()
        if held is not None:
            yield from families(held)


# -- the server -----------------------------------------------------------------------------------


class _Handler(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT  # a connection that sends nothing does not hold a thread for long

    def setup(self) -> None:
        super().setup()
        if isinstance(self.connection, ssl.SSLSocket):
            self.connection.do_handshake()  # here, in the connection's thread, under the timeout

    def parse_request(self) -> bool:
        parsed = bool(super().parse_request())  # the request line and the headers
        self.server.request_read(self.request)  # type: ignore[attr-defined]
        return parsed

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a scrape a second would flood the log


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 64  # a burst of connections waits to be taken, not refused by the system

    def __init__(self, address: Tuple[Any, ...], family: int):
        self.address_family = family
        self._slots = threading.BoundedSemaphore(CONNECTIONS_MAX)
        self._waiting: Dict[Any, float] = {}  # connections yet to send their request: since
        self._waiting_lock = threading.Lock()
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer's own asks DNS for the host's full name, which can hang without a network.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]
        self.setup_environ()

    def process_request(self, request: Any, client_address: Any) -> None:
        """A connection gets a slot; when all are taken, the one that has waited longest for
        its request line is cut to make room (connections that send nothing, or a byte now
        and then, cannot hold every slot: a scraper sends its request at once)."""
        if not self._slots.acquire(blocking=False):
            if not self._cut_oldest_waiting() or not self._slots.acquire(timeout=EVICT_WAIT):
                self.shutdown_request(request)
                return
        with self._waiting_lock:
            self._waiting[request] = time.monotonic()
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.request_read(request)
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.request_read(request)
            self._slots.release()

    def request_read(self, request: Any) -> None:
        """``request`` has sent its request line (or is done): it is no longer cut for room."""
        with self._waiting_lock:
            self._waiting.pop(request, None)

    def _cut_oldest_waiting(self) -> bool:
        with self._waiting_lock:
            if not self._waiting:
                return False
            oldest = min(self._waiting, key=self._waiting.__getitem__)
            del self._waiting[oldest]
        try:
            oldest.shutdown(socket.SHUT_RDWR)  # its thread reads the end and frees the slot
        except OSError:
            pass
        return True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hangs up or speaks no TLS is its own business: no traceback


def _app(registry: CollectorRegistry) -> Callable[..., Any]:
    metrics = make_wsgi_app(registry)

    def app(environ: Dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if environ.get("PATH_INFO") not in ("/metrics", "/"):
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"Headroom serves its metrics at /metrics\n"]
        return metrics(environ, start_response)

    return app


def _no_passphrase() -> bytes:
    """Called by OpenSSL for a key with a passphrase, which would otherwise be asked for on the
    engine's terminal (the engine's start waiting there)."""
    raise ValueError(
        "the TLS key has a passphrase, which the engine cannot be given: write it "
        "without one (openssl pkey -in KEY -out KEY2) and keep that file 0600"
    )


class MetricsServer:
    """Serves ``families(held())`` at ``/metrics`` on ``listen`` (HTTPS with ``cert`` and
    ``key``), from threads of its own. The constructor binds: it raises OSError (a port in use,
    an address this machine does not have, a name that does not resolve) or ssl.SSLError / a
    missing file for the TLS files."""

    def __init__(
        self, listen: Listen, held: Callable[[], Optional[Held]], *, cert: str = "", key: str = ""
    ):
        registry = CollectorRegistry(auto_describe=False)
        registry.register(HeldCollector(held))
        family, _, _, _, address = socket.getaddrinfo(
            listen.host, listen.port, type=socket.SOCK_STREAM
        )[0]
        self.server = _Server(address, family)
        try:
            if cert:
                context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                context.minimum_version = ssl.TLSVersion.TLSv1_2
                context.load_cert_chain(certfile=cert, keyfile=key or None, password=_no_passphrase)
                self.server.socket = context.wrap_socket(
                    self.server.socket, server_side=True, do_handshake_on_connect=False
                )
            self.server.set_app(_app(registry))
        except BaseException:
            self.server.server_close()
            raise
        self.port = int(self.server.server_address[1])
        # No polling between scrapes (an idle engine wakes for nothing); close() wakes it.
        self.thread = threading.Thread(
            target=self.server.serve_forever, args=(IDLE_POLL,), name="metrics", daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        """Stop serving and free the port. The serving thread sleeps in select(): it is woken
        by connections of our own until it has seen the request to stop."""
        stopper = threading.Thread(target=self.server.shutdown, name="metrics-stop", daemon=True)
        stopper.start()
        deadline = time.monotonic() + 5
        while stopper.is_alive() and time.monotonic() < deadline:
            self._wake()
            stopper.join(0.05)
        self.server.server_close()
        self.thread.join(timeout=1)

    def _wake(self) -> None:
        host, port = self.server.server_address[:2]
        unspecified = {"0.0.0.0": "127.0.0.1", "::": "::1"}
        try:
            with socket.socket(self.server.address_family, socket.SOCK_STREAM) as s:
                s.settimeout(0.5)
                s.connect((unspecified.get(str(host), str(host)), port))
        except OSError:
            pass
