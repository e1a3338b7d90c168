"""The Prometheus exporter for real: an engine serving its metrics on a free loopback port, a
real Prometheus server (Debian's package) scraping it every second, and what Prometheus then
says compared with ``headroom status --json``; a job launched here appears with its memory
and drops out when it ends. Off by default nothing listens; on, only where told; a port in
use is one line and the engine goes on; a setting edited by hand turns it on and off; TLS with
a certificate made here."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List

import psutil
import pytest

from tests.conftest import REPO, EngineProcess, end_processes_of, run_cli, wait_for
from tests.prometheus_server import PrometheusServer, free_port
from trayapp.config import Paths, get_paths
from trayapp.jobs.options import JobSpec

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="Prometheus from Debian")
TICKER = REPO / "tests" / "scripts" / "jobs" / "ticker.py"
# The guard records what it would do and does nothing: this machine's memory cannot move the
# test's job, and the guard's state is still the one it computes.
CONFIG = '[guard]\nmode = "dry-run"\n\n[metrics]\nlisten = "127.0.0.1:{port}"\n'


def new_home(tmp_path_factory: pytest.TempPathFactory, name: str,
             monkeypatch: pytest.MonkeyPatch) -> Paths:
    home = tmp_path_factory.mktemp(name)
    monkeypatch.setenv("HEADROOM_HOME", str(home))
    return get_paths()


def listening(pid: int) -> List[Any]:
    return [c.laddr for c in psutil.Process(pid).net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN]


def status(paths: Paths) -> Dict[str, Any]:
    r = run_cli("status", "--json", env={"HEADROOM_HOME": str(paths.home)})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def scrape(url: str, context: Any = None) -> str:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                         urllib.request.HTTPSHandler(context=context))
    with opener.open(url, timeout=10) as r:
        return r.read().decode()


# -- one engine, one Prometheus, for the module ----------------------------------------------


@dataclass
class Exporting:
    engine: EngineProcess
    port: int

    @property
    def paths(self) -> Paths:
        return self.engine.paths


@pytest.fixture(scope="module")
def exporting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Exporting]:
    with pytest.MonkeyPatch.context() as mp:
        paths = new_home(tmp_path_factory, "exporting", mp)
        port = free_port()
        paths.config_file.write_text(CONFIG.format(port=port))
        engine = EngineProcess(paths)
        try:
            yield Exporting(engine.wait_ready(), port)
        finally:
            engine.stop()
            end_processes_of(paths.home)


@pytest.fixture(scope="module")
def prom(exporting: Exporting) -> Iterator[PrometheusServer]:
    with PrometheusServer([f"127.0.0.1:{exporting.port}"]) as server:
        server.wait_up(timeout=60)
        yield server


def test_prometheus_sees_memory_and_the_guard_as_status_says(
        exporting: Exporting, prom: PrometheusServer) -> None:
    st = status(exporting.paths)
    assert prom.wait_for("headroom_memory_total_bytes")
    assert prom.value("headroom_memory_total_bytes") == st["memory"]["total_bytes"]
    # Available memory moves on a shared machine: the two readings a moment apart agree.
    total = st["memory"]["total_bytes"]

    def close(samples: List[Any]) -> bool:
        now = status(exporting.paths)["memory"]["available_bytes"]
        return bool(samples) and abs(float(samples[0]["value"][1]) - now) < 0.03 * total

    prom.wait_for("headroom_memory_available_bytes", close, timeout=30)
    state = st["guard"]["state"]

    def same_state(samples: List[Any]) -> bool:
        return [s["metric"]["state"] for s in samples] == [status(exporting.paths)["guard"]
                                                           ["state"]]

    assert prom.wait_for("headroom_guard_state == 1", same_state, timeout=30)
    states = prom.query("headroom_guard_state")
    assert sorted(s["metric"]["state"] for s in states) == ["ok", "park", "pause", "warn"]
    assert state in {"ok", "warn", "pause", "park"}
    assert prom.value('headroom_guard_mode{mode="dry-run"}') == 1
    info = prom.query("headroom_info")
    assert info[0]["metric"]["host"] == socket.gethostname()
    assert info[0]["metric"]["instance"] == f"127.0.0.1:{exporting.port}"
    # No GPU on this machine: a count of 0, and no made-up GPU readings.
    assert prom.value("headroom_gpu_count") == len(st["gpus"])
    if not st["gpus"]:
        assert prom.query("headroom_gpu_memory_used_bytes") == []


def test_a_job_appears_with_its_memory_and_drops_out_when_it_ends(
        exporting: Exporting, prom: PrometheusServer) -> None:
    spec = JobSpec(script=str(TICKER), args=("0", "0.2"), cwd=str(REPO),
                   name='tick "one" \\ ü').to_json()
    with exporting.engine.client(timeout=30.0) as c:
        job = c.job_start(spec)
        jid = job.id
        try:
            # The exporter's ``job`` label meets the scrape job's own: Prometheus keeps it
            # as ``exported_job``.
            of_job = f'exported_job="{jid}"'
            ram = prom.wait_for(f'headroom_job_memory_bytes{{{of_job},kind="ram"}}', timeout=30)
            rss = wait_for(lambda: c.job_get(jid).rss_bytes, 20, "the job's RSS")
            assert 0.5 * rss < float(ram[0]["value"][1]) < 2 * rss
            assert ram[0]["metric"]["name"] == 'tick "one" \\ ü'  # quoted and escaped as it is
            prom.wait_for(f'headroom_job_state{{{of_job},state="running"}} == 1', timeout=30)
            # One state at a time: 1 for the current one, no series for the others.
            assert len(prom.query(f'headroom_job_state{{{of_job}}}')) == 1
        finally:
            c.job_action(jid, "stop")
        wait_for(lambda: c.job_get(jid).state in ("stopped", "finished"), 30, "the stop")
    prom.wait_for(f'headroom_job_memory_bytes{{exported_job="{jid}"}}', lambda r: r == [],
                  timeout=30)
    assert prom.query(f'headroom_job_state{{exported_job="{jid}"}}') == []


def test_it_listens_only_where_told(exporting: Exporting) -> None:
    port = exporting.port
    assert [(a.ip, a.port) for a in listening(exporting.engine.proc.pid)] == [("127.0.0.1", port)]
    assert status(exporting.paths)["engine"]["metrics"] == {
        "listen": f"127.0.0.1:{port}", "tls": False, "error": None}
    with pytest.raises(urllib.error.HTTPError):
        scrape(f"http://127.0.0.1:{port}/elsewhere")


def test_metrics_given_to_a_second_engine_are_said_not_applied(exporting: Exporting) -> None:
    other = free_port()
    done = run_cli("engine", "--stay", "--metrics", str(other),
                   env={"HEADROOM_HOME": str(exporting.paths.home)}, timeout=30)
    assert done.returncode == 0, done.stderr
    assert "already running" in done.stderr and "apply to a new engine only" in done.stderr
    assert "[metrics] listen" in done.stderr and "Traceback" not in done.stderr
    assert [a.port for a in listening(exporting.engine.proc.pid)] == [exporting.port]


# -- engines of their own -------------------------------------------------------------------


def test_off_by_default_a_port_in_use_and_a_hand_edit(
        tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = new_home(tmp_path_factory, "edits", monkeypatch)
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    engine = EngineProcess(paths).wait_ready()
    try:
        assert listening(engine.proc.pid) == []  # off by default
        paths.config_file.write_text(f'[metrics]\nlisten = "{port}"\n')
        st = wait_for(lambda: (s := status(paths)["engine"]["metrics"])["error"] and s, 20,
                      "the exporter's error")
        assert st["listen"] is None and f"127.0.0.1:{port}" in st["error"]
        assert "in use" in st["error"], st
        assert listening(engine.proc.pid) == []
        lines = [ln for ln in engine.stderr.splitlines() if "cannot serve metrics" in ln]
        assert len(lines) == 1 and "Traceback" not in engine.stderr
        taken.close()
        free = free_port()
        paths.config_file.write_text(f'[metrics]\nlisten = "127.0.0.1:{free}"\n')
        wait_for(lambda: listening(engine.proc.pid), 20, "the exporter on the new port")
        # Served from the loop's next reading on (a tick away).
        wait_for(lambda: "headroom_memory_available_bytes" in
                 scrape(f"http://127.0.0.1:{free}/metrics"), 20, "the first reading served")
        paths.config_file.write_text('[metrics]\nlisten = ""\n')
        wait_for(lambda: listening(engine.proc.pid) == [], 20, "the exporter to stop")
        assert engine.proc.poll() is None
    finally:
        taken.close()
        engine.stop()


def make_certificate(folder: Path) -> Any:
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    os.chmod(key, 0o600)
    return cert, key


def test_an_engine_serving_metrics_does_not_end_when_idle(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """Without --stay an engine ends when it has no client and no job; serving metrics, it is
    watched all the same, so it stays (and one without the exporter beside it ends)."""
    with pytest.MonkeyPatch.context() as mp:
        serving = new_home(tmp_path_factory, "idle-serving", mp)
        quiet = new_home(tmp_path_factory, "idle-quiet", mp)
    port = free_port()
    idle = '[guard]\nmode = "dry-run"\n\n[engine]\nidle_exit_seconds = 1.0\n'
    serving.config_file.write_text(idle + f'\n[metrics]\nlisten = "127.0.0.1:{port}"\n')
    quiet.config_file.write_text(idle)
    engines = [EngineProcess(serving, stay=False), EngineProcess(quiet, stay=False)]
    try:
        for engine in engines:
            engine.wait_ready()
        # The quiet one ends within its idle time (the test's own pings are its clients)...
        assert engines[1].proc.wait(30) == 0
        # ... and the one serving metrics outlives it by far (three idle times more), and
        # still serves.
        time.sleep(3.0)
        assert engines[0].proc.poll() is None
        wait_for(lambda: "headroom_memory_total_bytes" in scrape(f"http://127.0.0.1:{port}/metrics"),
                 10, "a scrape of the idle engine")
        assert engines[0].proc.poll() is None
    finally:
        for engine in engines:
            engine.stop()
        end_processes_of(serving.home)
        end_processes_of(quiet.home)


def test_tls_with_a_certificate_made_here(tmp_path_factory: pytest.TempPathFactory,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    paths = new_home(tmp_path_factory, "tls", monkeypatch)
    cert, key = make_certificate(paths.home)
    port = free_port()
    paths.config_file.write_text(f'[metrics]\nlisten = "{port}"\ntls_cert = "{cert}"\n'
                                 f'tls_key = "{key}"\n')
    engine = EngineProcess(paths).wait_ready()
    try:
        context = ssl.create_default_context(cafile=str(cert))
        url = f"https://127.0.0.1:{port}/metrics"
        text = wait_for(lambda: "headroom_memory_total_bytes" in scrape(url, context) and
                        scrape(url, context), 20, "a scrape over TLS")
        assert "headroom_guard_state" in text
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            scrape(f"http://127.0.0.1:{port}/metrics")  # no plain HTTP beside it
        with pytest.raises(urllib.error.URLError):
            scrape(url, ssl.create_default_context())  # not a certificate this machine trusts
        assert status(paths)["engine"]["metrics"]["tls"] is True
        assert engine.proc.poll() is None
    finally:
        engine.stop()


def test_a_non_loopback_address_is_said_with_a_warning(
        tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = new_home(tmp_path_factory, "wide", monkeypatch)
    port = free_port("0.0.0.0")
    log = paths.home / "engine.err"
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "trayapp", "engine", "--stay",
                                 "--metrics", f"0.0.0.0:{port}"], stdout=subprocess.DEVNULL,
                                stderr=err, cwd=str(REPO), start_new_session=True,
                                env=dict(os.environ, HEADROOM_HOME=str(paths.home)))
    try:
        wait_for(lambda: listening(proc.pid), 20, "the exporter")
        assert [(a.ip, a.port) for a in listening(proc.pid)] == [("0.0.0.0", port)]
        text = log.read_text()
        warning = [ln for ln in text.splitlines() if "WARNING" in ln and "other machines" in ln]
        assert len(warning) == 1 and "without TLS" in warning[0], text
        wait_for(lambda: run_cli("status", env={"HEADROOM_HOME": str(paths.home)})
                 .returncode == 0, 20, "the engine")
        assert status(paths)["engine"]["metrics"]["listen"] == f"0.0.0.0:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_guard_pauses_a_hog_while_the_exporter_is_attacked(
        tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    """Connections that drip a byte now and then, and scrapers that never rest, cost the
    engine's loop nothing that matters: the guard pauses a job over its budget all the same,
    the exporter still answers, and nothing in the engine fails."""
    from tests.integration.test_boundary_properties import hog_is_paused_by_the_guard

    with pytest.MonkeyPatch.context() as mp:
        paths = new_home(tmp_path_factory, "attacked", mp)
    port = free_port()
    paths.config_file.write_text(f'[metrics]\nlisten = "127.0.0.1:{port}"\n')
    url = f"http://127.0.0.1:{port}/metrics"
    engine = EngineProcess(paths).wait_ready()
    done = threading.Event()
    drips: List[socket.socket] = []

    def drip() -> None:
        while not done.is_set():
            for s in list(drips):
                with contextlib.suppress(OSError):
                    s.send(b"X")
            done.wait(0.5)

    def hammer() -> None:
        while not done.is_set():
            with contextlib.suppress(OSError, urllib.error.URLError):
                scrape(url)

    workers = [threading.Thread(target=drip, daemon=True)] + \
        [threading.Thread(target=hammer, daemon=True) for _ in range(2)]
    try:
        wait_for(lambda: "headroom_memory_total_bytes" in scrape(url), 20, "the exporter")
        for _ in range(16):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.send(b"GET /metrics HTTP/1.1\r\n")
            drips.append(s)
        for w in workers:
            w.start()
        hog_is_paused_by_the_guard({"engine": engine}, tmp_path)
        assert "headroom_guard_state" in scrape(url)
        assert engine.proc.poll() is None
        assert "Traceback" not in engine.stderr, engine.stderr[-5000:]
    finally:
        done.set()
        for w in workers:
            w.join(15)
        for s in drips:
            s.close()
        engine.stop()
        end_processes_of(paths.home)
