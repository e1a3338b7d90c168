"""Asking Prometheus about the machines that run Headroom (no Qt here).

``fetch_fleet(url)`` makes two instant queries of Prometheus's HTTP API (``/api/v1/query``):
every ``headroom_*`` series, and ``up`` of the scrape job "headroom" (so a machine whose engine
stopped answering still shows). ``parse_fleet`` turns the answers into one ``Fleet``: a
``Machine`` per ``instance`` with its RAM, GPUs, guard state and jobs. Every failure is a
``PrometheusError`` with one line for the user: no traceback, no empty window.
"""

from __future__ import annotations

import base64
import http.client
import json
import math
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from trayapp.text import one_line
from trayapp.vocab import GuardLevel

# What the engines are scraped as (the rules, the dashboard and the scrape example agree).
SCRAPE_JOB = "headroom"
SERIES_QUERY = '{__name__=~"headroom_.+"}'
UP_QUERY = f'up{{job="{SCRAPE_JOB}"}}'
TIMEOUT_SECONDS = 5.0
# An answer larger than this is not one a handful of machines give.
MAX_ANSWER_BYTES = 16 * 1024 * 1024
MAX_SERIES = 50_000
MAX_LABELS = 64  # labels of one series kept (an exporter's have a handful)
MAX_LABEL = 200  # characters of a label's name or value kept (one printable line)
GUARD_LEVELS = frozenset(level.value for level in GuardLevel)  # the exporter's state set


class PrometheusError(Exception):
    """Prometheus cannot be asked, or its answer cannot be read; ``str()`` is one line."""


@dataclass(frozen=True)
class Gpu:
    index: str
    name: str
    used_bytes: Optional[float] = None
    total_bytes: Optional[float] = None
    utilization_ratio: Optional[float] = None


@dataclass(frozen=True)
class Job:
    id: str
    name: str
    state: Optional[str] = None
    progress_ratio: Optional[float] = None
    ram_bytes: Optional[float] = None
    vram_bytes: Optional[float] = None


@dataclass
class Machine:
    """One engine Prometheus scrapes, by its ``instance`` label. A value it does not serve is
    None, never 0."""

    instance: str
    up: Optional[bool] = None
    host: str = ""
    version: str = ""
    ram_total_bytes: Optional[float] = None
    ram_available_bytes: Optional[float] = None
    swap_used_bytes: Optional[float] = None
    guard: Optional[str] = None
    seconds_to_exhaustion: Optional[float] = None
    gpus: List[Gpu] = field(default_factory=list)
    jobs: List[Job] = field(default_factory=list)

    @property
    def vram_used_bytes(self) -> Optional[float]:
        used = [g.used_bytes for g in self.gpus if g.used_bytes is not None]
        return sum(used) if used else None

    @property
    def vram_total_bytes(self) -> Optional[float]:
        total = [g.total_bytes for g in self.gpus if g.total_bytes is not None]
        return sum(total) if total else None


@dataclass(frozen=True)
class Fleet:
    url: str
    time: Optional[float]  # Prometheus's evaluation time of the answer
    machines: Tuple[Machine, ...]


# -- asking ---------------------------------------------------------------------------------------


def query_url(base: str, promql: str) -> str:
    """The instant-query URL of ``promql`` on the server at ``base`` (a path prefix is kept;
    a user name and password in ``base`` are not: they go in a header, ``credentials``)."""
    parts = urllib.parse.urlsplit(base.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PrometheusError(f"{shown_url(base)!r} is not an http:// or https:// URL")
    path = parts.path.rstrip("/") + "/api/v1/query"
    return urllib.parse.urlunsplit(
        (parts.scheme, _netloc(parts), path, urllib.parse.urlencode({"query": promql}), "")
    )


def _netloc(parts: urllib.parse.SplitResult) -> str:
    return parts.netloc.rpartition("@")[2]


def shown_url(base: str) -> str:
    """``base`` as the window and the log may show it: without a user name or password."""
    try:
        parts = urllib.parse.urlsplit(base.strip())
    except ValueError:
        return "(a URL that does not parse)"
    if "@" not in parts.netloc:
        return base.strip()
    return urllib.parse.urlunsplit(parts._replace(netloc=_netloc(parts)))


def credentials(base: str) -> Optional[str]:
    """The ``Authorization`` header for a ``user:password@`` in ``base`` (basic auth, as
    Prometheus's own web config and the proxies in front of it take it), or None."""
    parts = urllib.parse.urlsplit(base.strip())
    if "@" not in parts.netloc:
        return None
    userinfo = parts.netloc.rpartition("@")[0]
    user, _, password = userinfo.partition(":")
    pair = f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password)}"
    return "Basic " + base64.b64encode(pair.encode("utf-8")).decode("ascii")


class _SameServerOnly(urllib.request.HTTPRedirectHandler):
    """Follows a redirect on the same server only (``/prometheus`` -> ``/prometheus/``): not to
    another host, port or scheme, which would get the password and answer for the server."""

    def redirect_request(
        self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> Any:
        old, new = (
            urllib.parse.urlsplit(req.full_url),
            urllib.parse.urlsplit(urllib.parse.urljoin(req.full_url, newurl)),
        )
        if (old.scheme, old.hostname, old.port) != (new.scheme, new.hostname, new.port):
            raise PrometheusError(
                f"it sends the query on to another server "
                f"({one_line(shown_url(new.geturl()), limit=120)}); give "
                "that server's URL instead"
            )
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_OPENER = urllib.request.build_opener(_SameServerOnly())


def _read(url: str, timeout: float, authorization: Optional[str] = None) -> Tuple[int, bytes]:
    headers = {"Accept": "application/json"}
    if authorization:
        headers["Authorization"] = authorization
    request = urllib.request.Request(url, headers=headers)
    deadline = time.monotonic() + timeout
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            return response.status, _read_body(response, deadline, timeout)
    except urllib.error.HTTPError as e:  # 400/422/503 carry Prometheus's own reason
        with e:
            return e.code, _read_body(e, deadline, timeout)


def _read_body(response: Any, deadline: float, timeout: float) -> bytes:
    """At most ``MAX_ANSWER_BYTES + 1`` bytes, all before ``deadline``: a server that sends a
    byte now and then (under the socket's timeout) is given up on all the same."""
    chunks: List[bytes] = []
    size = 0
    while size <= MAX_ANSWER_BYTES:
        if time.monotonic() > deadline:
            raise PrometheusError(f"no whole answer within {timeout:g} s")
        chunk = (
            response.read1(min(1 << 16, MAX_ANSWER_BYTES + 1 - size))
            if hasattr(response, "read1")
            else response.read(MAX_ANSWER_BYTES + 1 - size)
        )
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def instant_query(
    base: str, promql: str, timeout: float = TIMEOUT_SECONDS
) -> Tuple[Optional[float], List[Dict[str, Any]]]:
    """Run ``promql`` as an instant query; returns (evaluation time, the vector's samples).

    Raises PrometheusError saying what went wrong: unreachable, refused, not Prometheus, an
    error Prometheus reports, or an answer that is not a vector."""
    url = query_url(base, promql)
    try:
        status, body = _read(url, timeout, credentials(base))
    except PrometheusError:
        raise
    except urllib.error.URLError as e:
        raise PrometheusError(f"cannot reach it: {_reason(e.reason)}") from None
    except (socket.timeout, TimeoutError):
        raise PrometheusError(f"no answer within {timeout:g} s") from None
    except (OSError, ValueError, http.client.HTTPException) as e:  # resets, bad status lines
        raise PrometheusError(f"cannot reach it: {_said(e, base)}") from None
    if len(body) > MAX_ANSWER_BYTES:
        raise PrometheusError("its answer is too large to be a Prometheus answer")
    try:
        answer = json.loads(body)
    except (ValueError, RecursionError):
        raise PrometheusError(
            f"its answer (HTTP {status}) is not JSON: is this the address of a Prometheus server?"
        ) from None
    if not isinstance(answer, dict):
        raise PrometheusError("its answer is not a Prometheus answer")
    if answer.get("status") != "success":
        error = answer.get("error")
        why = error if isinstance(error, str) else f"HTTP {status}"
        raise PrometheusError(f"it refused the query: {one_line(why)}")
    return _vector(answer.get("data"))


def _said(e: BaseException, base: str) -> str:
    """What an error says, without the URL's password (http.client quotes the host part)."""
    text = one_line(str(e)) or type(e).__name__
    userinfo = urllib.parse.urlsplit(base.strip()).netloc.rpartition("@")[0]
    for secret in {userinfo, userinfo.partition(":")[2]} - {""}:
        text = text.replace(secret, "***")
    return text


def _reason(reason: Any) -> str:
    """ "connection refused", not "[Errno 111] Connection refused"."""
    text = reason.strerror if isinstance(reason, OSError) and reason.strerror else str(reason)
    text = one_line(text).rstrip(".") or type(reason).__name__
    return text[:1].lower() + text[1:]


def _vector(data: Any) -> Tuple[Optional[float], List[Dict[str, Any]]]:
    if (
        not isinstance(data, dict)
        or data.get("resultType") != "vector"
        or not isinstance(data.get("result"), list)
    ):
        raise PrometheusError("its answer is not an instant vector")
    result = data["result"]
    if len(result) > MAX_SERIES:
        raise PrometheusError(f"its answer has more than {MAX_SERIES} series")
    when: Optional[float] = None
    samples = []
    for item in result:
        if not isinstance(item, dict) or not isinstance(item.get("metric"), dict):
            raise PrometheusError("its answer has a series without labels")
        value = item.get("value")
        if not isinstance(value, list) or len(value) != 2:
            raise PrometheusError("its answer has a series without a value")
        labels = {
            one_line(str(k), limit=MAX_LABEL): one_line(str(v), limit=MAX_LABEL)
            for k, v in list(item["metric"].items())[:MAX_LABELS]
            if isinstance(v, (str, int, float))
        }
        samples.append({"metric": labels, "value": _number(value[1])})
        if isinstance(value[0], (int, float)) and not isinstance(value[0], bool):
            when = float(value[0])
    return when, samples


def _number(text: Any) -> Optional[float]:
    """A sample's value (Prometheus writes them as strings); NaN and infinities are None."""
    try:
        v = float(text)
    except (TypeError, ValueError):
        raise PrometheusError(f"its answer has a value that is not a number: {text!r}") from None
    return v if math.isfinite(v) else None


def fetch_fleet(base: str, timeout: float = TIMEOUT_SECONDS) -> Fleet:
    """Ask Prometheus at ``base`` about every machine running Headroom (blocking: call it off
    the GUI thread). Raises PrometheusError."""
    when, series = instant_query(base, SERIES_QUERY, timeout)
    _, up = instant_query(base, UP_QUERY, timeout)
    return parse_fleet(base, when, series, up)


# -- reading --------------------------------------------------------------------------------------


def job_id(labels: Dict[str, str]) -> str:
    """A job's id: the exporter's ``job`` label, stored by Prometheus as ``exported_job``
    (the scrape job has ``job``)."""
    return labels.get("exported_job") or labels.get("job_id") or ""


def parse_fleet(
    base: str, when: Optional[float], series: List[Dict[str, Any]], up: List[Dict[str, Any]]
) -> Fleet:
    """The machines in the samples of ``SERIES_QUERY`` and ``UP_QUERY``, by instance."""
    machines: Dict[str, Machine] = {}
    gpus: Dict[Tuple[str, str], Dict[str, Any]] = {}
    jobs: Dict[Tuple[str, str], Dict[str, Any]] = {}

    def machine(instance: str) -> Machine:
        if instance not in machines:
            machines[instance] = Machine(instance)
        return machines[instance]

    for s in up:
        instance = s["metric"].get("instance")
        if instance:
            machine(instance).up = s["value"] == 1.0
    for s in series:
        labels, value = s["metric"], s["value"]
        instance = labels.get("instance")
        if not instance:
            continue
        m = machine(instance)
        name = labels.get("__name__", "")
        if name.startswith("headroom_gpu_"):
            key = (instance, labels.get("gpu", ""))
            gpus.setdefault(key, {"name": labels.get("name", "")})[name] = value
        elif name.startswith("headroom_job_"):
            key = (instance, job_id(labels))
            j = jobs.setdefault(key, {"name": labels.get("name", "")})
            if name == "headroom_job_state" and value == 1.0:
                j["state"] = labels.get("state")
            elif name == "headroom_job_memory_bytes":
                j[labels.get("kind", "")] = value
            elif name == "headroom_job_progress_ratio":
                j["progress"] = value
        else:
            _machine_value(m, name, labels, value)
    for (instance, index), g in sorted(gpus.items(), key=lambda kv: _gpu_order(kv[0][1])):
        if "headroom_gpu_memory_total_bytes" in g or "headroom_gpu_memory_used_bytes" in g:
            machines[instance].gpus.append(
                Gpu(
                    index,
                    g["name"],
                    g.get("headroom_gpu_memory_used_bytes"),
                    g.get("headroom_gpu_memory_total_bytes"),
                    g.get("headroom_gpu_utilization_ratio"),
                )
            )
    for (instance, jid), j in sorted(jobs.items()):
        machines[instance].jobs.append(
            Job(jid, j["name"], j.get("state"), j.get("progress"), j.get("ram"), j.get("vram"))
        )
    return Fleet(base, when, tuple(machines[k] for k in sorted(machines)))


def _machine_value(m: Machine, name: str, labels: Dict[str, str], value: Optional[float]) -> None:
    if name == "headroom_info":
        m.host, m.version = labels.get("host", ""), labels.get("version", "")
        if m.up is None:
            m.up = True
    elif name == "headroom_memory_total_bytes":
        m.ram_total_bytes = value
    elif name == "headroom_memory_available_bytes":
        m.ram_available_bytes = value
    elif name == "headroom_swap_used_bytes":
        m.swap_used_bytes = value
    elif name == "headroom_guard_seconds_to_exhaustion":
        m.seconds_to_exhaustion = value
    elif name == "headroom_guard_state" and value == 1.0 and labels.get("state") in GUARD_LEVELS:
        m.guard = labels["state"]


def _gpu_order(index: str) -> Tuple[int, str]:
    if index.isascii() and index.isdigit() and len(index) <= 9:
        return (int(index), "")
    return (1 << 30, index)
