"""A real Prometheus server for tests: Debian's ``prometheus`` (scripts/debian-packages.txt), on
loopback at a free port, with its data in a temporary folder, scraping the given targets every
second. Always stopped: use it as a context manager (or call ``stop()``).

    with PrometheusServer(["127.0.0.1:9835"]) as prom:
        prom.wait_up()
        prom.wait_for('headroom_memory_available_bytes')
        value = prom.value('headroom_memory_available_bytes')

The configuration is written as JSON, which YAML reads as it is (no YAML library needed).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

PROMETHEUS = os.environ.get("HEADROOM_TEST_PROMETHEUS", "/usr/bin/prometheus")
START_SECONDS = 60.0  # a cold start on a busy machine (the TSDB, the web UI) takes seconds

Sample = Dict[str, Any]  # one result of an instant query: {"metric": {...}, "value": [t, "v"]}


class PrometheusError(RuntimeError):
    """Prometheus did not start, a query failed, or a wait ran out (with what it last saw)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the kernel's pick)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _no_proxy_opener() -> urllib.request.OpenerDirector:
    # A proxy set in the environment must not stand between a test and its loopback server.
    return urllib.request.build_opener(urllib.request.ProxyHandler({}))


class PrometheusServer:
    """``PrometheusServer(targets, scheme="http", tls_insecure=False, rule_files=(),
    jobs=None)``: ``targets`` are ``"host:port"`` strings scraped as job "headroom" (``jobs``,
    ``{job_name: [targets]}``, adds or replaces scrape jobs). ``url`` is where it answers."""

    def __init__(self, targets: Sequence[str] = (), *, scheme: str = "http",
                 tls_insecure: bool = False, rule_files: Sequence[Path] = (),
                 jobs: Optional[Dict[str, Sequence[str]]] = None,
                 scrape_interval: str = "1s"):
        self.jobs: Dict[str, List[str]] = {"headroom": list(targets)} if targets else {}
        self.jobs.update({k: list(v) for k, v in (jobs or {}).items()})
        self.scheme, self.tls_insecure = scheme, tls_insecure
        self.rule_files = [Path(p) for p in rule_files]
        self.scrape_interval = scrape_interval
        self.port = 0
        self.url = ""
        self.folder: Optional[Path] = None
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self._opener = _no_proxy_opener()

    # -- starting and stopping ------------------------------------------------------------------

    def config(self) -> Dict[str, Any]:
        scrape: List[Dict[str, Any]] = []
        for name, targets in self.jobs.items():
            job: Dict[str, Any] = {"job_name": name, "scheme": self.scheme,
                                   "scrape_interval": self.scrape_interval,
                                   "scrape_timeout": self.scrape_interval,
                                   "static_configs": [{"targets": targets}]}
            if self.tls_insecure:
                job["tls_config"] = {"insecure_skip_verify": True}
            scrape.append(job)
        return {"global": {"scrape_interval": self.scrape_interval,
                           "evaluation_interval": self.scrape_interval},
                "rule_files": [str(p) for p in self.rule_files],
                "scrape_configs": scrape}

    def start(self) -> PrometheusServer:
        """Start it and wait until it answers ``/-/ready``. Raises PrometheusError (with its
        log's end) when it does not; nothing is left running then."""
        if not os.access(PROMETHEUS, os.X_OK):
            raise PrometheusError(f"{PROMETHEUS} is missing: install Debian's prometheus package "
                                  "(scripts/setup.sh test)")
        self.folder = Path(tempfile.mkdtemp(prefix="headroom-prometheus-"))
        (self.folder / "prometheus.yml").write_text(json.dumps(self.config()), encoding="utf-8")
        for _attempt in range(3):  # another process may take the free port before it binds
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            if self._launch():
                return self
        raise PrometheusError(f"Prometheus did not start: {self.log_tail()}")

    def _launch(self) -> bool:
        assert self.folder is not None
        log = open(self.folder / "prometheus.log", "ab")
        try:
            self.proc = subprocess.Popen(
                [PROMETHEUS, f"--config.file={self.folder / 'prometheus.yml'}",
                 f"--storage.tsdb.path={self.folder / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}",
                 "--storage.tsdb.retention.time=1h", "--log.level=warn",
                 "--web.enable-lifecycle"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=self.folder,
                start_new_session=True)
        finally:
            log.close()
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.proc = None
                return False
            try:
                with self._opener.open(self.url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return True
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.1)
        self._end_process()
        raise PrometheusError(f"Prometheus was not ready in {START_SECONDS:.0f} s: "
                              f"{self.log_tail()}")

    def stop(self) -> None:
        """End it (TERM, then KILL) and remove its folder. Safe to call twice."""
        self._end_process()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def _end_process(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def __enter__(self) -> PrometheusServer:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def log_tail(self, chars: int = 2000) -> str:
        if self.folder is None:
            return ""
        try:
            return (self.folder / "prometheus.log").read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    # -- asking it ------------------------------------------------------------------------------

    def api(self, path: str, **params: str) -> Any:
        """GET ``/api/v1/<path>`` and return its ``data``; PrometheusError when it fails."""
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with self._opener.open(url, timeout=10) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as e:
            body = json.loads(e.read() or b"{}")
        except (OSError, ValueError) as e:
            raise PrometheusError(f"{url}: {e}") from e
        if body.get("status") != "success":
            raise PrometheusError(f"{url}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> List[Sample]:
        """An instant query: its samples (a vector; a scalar comes back as one sample)."""
        data = self.api("query", query=expr)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def value(self, expr: str) -> Optional[float]:
        """The value of a query that gives one sample; None when it gives none."""
        result = self.query(expr)
        if not result:
            return None
        if len(result) > 1:
            raise PrometheusError(f"{expr} gives {len(result)} samples, not one: {result}")
        return float(result[0]["value"][1])

    def targets(self) -> List[Dict[str, Any]]:
        """The active scrape targets (``health``, ``lastError``, ``labels``, ...)."""
        return list(self.api("targets", state="active")["activeTargets"])

    def wait_for(self, expr: str, accept: Optional[Callable[[List[Sample]], bool]] = None,
                 timeout: float = 30.0) -> List[Sample]:
        """Query ``expr`` until ``accept(samples)`` (default: any sample) holds; return those
        samples. Raises PrometheusError with the last answer and the targets' health when the
        time runs out."""
        accept = accept or bool
        deadline = time.monotonic() + timeout
        last: Any = None
        while True:
            try:
                last = self.query(expr)
                if accept(last):
                    return last
            except PrometheusError as e:
                last = str(e)
            if time.monotonic() > deadline:
                health = [(t["scrapeUrl"], t["health"], t["lastError"]) for t in self.targets()]
                raise PrometheusError(f"{expr}: not as expected in {timeout:.0f} s; last "
                                      f"{last!r}; targets {health}")
            time.sleep(0.2)

    def wait_up(self, timeout: float = 30.0) -> None:
        """Wait until every target has been scraped successfully at least once."""
        count = sum(len(t) for t in self.jobs.values())
        self.wait_for("up == 1", lambda r: len(r) >= count, timeout=timeout)
