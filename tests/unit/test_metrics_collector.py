"""The exporter's metrics from a held reading (no engine): what the hardware cannot give is
absent, not 0; job labels are bounded and survive hostile names; the text Prometheus reads
parses back to the same values. And the exporter's service in this process: a port in use, an
address this machine does not have, a TLS file missing, a non-loopback address's warning."""

from __future__ import annotations

import logging
import socket
import urllib.request
from typing import Any, Dict, List, Optional

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.prometheus_server import free_port
from trayapp import config as cfg
from trayapp.engine.metrics import ActionTally, MetricsService
from trayapp.engine.metrics_export import JOBS_MAX, LABEL_MAX, Held, HeldCollector
from trayapp.jobs.record import JobRecord
from trayapp.readings import GpuReading, GpuStatus, MemoryReading, Snapshot

GIB = 1024**3


def memory(**over: Any) -> MemoryReading:
    base: Dict[str, Any] = dict(time=100.0, total_bytes=16 * GIB, available_bytes=9 * GIB,
                                used_bytes=7 * GIB, swap_total_bytes=2 * GIB,
                                swap_used_bytes=GIB // 2, psi_some_avg10=12.5,
                                psi_full_avg10=None)
    base.update(over)
    return MemoryReading(**base)


def gpu(index: int = 0, **over: Any) -> GpuReading:
    base: Dict[str, Any] = dict(index=index, name="RTX 4070", uuid=f"GPU-{index}",
                                memory_total_bytes=12 * GIB, memory_used_bytes=3 * GIB,
                                memory_free_bytes=9 * GIB, utilization_percent=None,
                                temperature_c=61.0, power_watts=None)
    base.update(over)
    return GpuReading(**base)


def held(jobs: tuple = (), gpus: tuple = (), guard: Optional[Dict[str, Any]] = None,
         **mem: Any) -> Held:
    snap = Snapshot(100.0, memory(**mem), gpus, GpuStatus("nvml" if gpus else "none"))
    g = guard if guard is not None else {"state": "warn", "mode": "act",
                                         "seconds_to_exhaustion": None,
                                         "fill_rate_bytes_per_s": 1000,
                                         "thresholds": {"warn_bytes": 2 * GIB, "odd": 5}}
    return Held(snap, g, jobs, {"pause": 2}, "1.2.3", "box", 50.0)


def scrape(h: Held) -> Dict[str, List[Any]]:
    """The exposition text as Prometheus reads it: family name -> samples."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(HeldCollector(lambda: h))
    text = generate_latest(registry).decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def values(samples: List[Any], **labels: str) -> List[float]:
    return [s.value for s in samples if all(s.labels.get(k) == v for k, v in labels.items())]


def test_machine_values_in_base_units_and_ratios() -> None:
    m = scrape(held(gpus=(gpu(0), gpu(1, uuid=None))))
    assert values(m["headroom_memory_available_bytes"]) == [9 * GIB]
    assert values(m["headroom_swap_used_bytes"]) == [GIB // 2]
    assert values(m["headroom_memory_pressure_some_ratio"]) == [0.125]
    assert values(m["headroom_gpu_count"]) == [2]
    assert values(m["headroom_gpu_memory_used_bytes"], gpu="1", uuid="", name="RTX 4070") == \
        [3 * GIB]
    assert values(m["headroom_guard_state"], state="warn") == [1]
    assert sorted(values(m["headroom_guard_state"])) == [0, 0, 0, 1]
    assert values(m["headroom_guard_actions"], action="pause") == [2]
    assert values(m["headroom_guard_actions"], action="stop") == [0]
    assert values(m["headroom_guard_threshold_bytes"], step="warn") == [2 * GIB]
    assert values(m["headroom_info"], version="1.2.3", host="box") == [1]


def test_what_the_hardware_cannot_give_is_absent_not_zero() -> None:
    m = scrape(held(gpus=(gpu(0),), psi_some_avg10=None))
    for name in ("headroom_memory_pressure_full_ratio", "headroom_memory_pressure_some_ratio",
                 "headroom_gpu_utilization_ratio", "headroom_gpu_power_watts",
                 "headroom_guard_seconds_to_exhaustion"):
        assert m.get(name, []) == [], name
    assert values(m["headroom_gpu_temperature_celsius"]) == [61.0]
    # No GPU at all: a count of 0 and no GPU series.
    none = scrape(held())
    assert values(none["headroom_gpu_count"]) == [0]
    assert none.get("headroom_gpu_memory_total_bytes", []) == []


def test_jobs_live_only_bounded_and_hostile_names_kept_in_their_label() -> None:
    hostile = 'x"} 1\nheadroom_info{host="evil"} 1 \\ \x1b[31m' + "n" * 500
    jobs = tuple(JobRecord(id=f"j{i}", name=hostile if i == 0 else f"job {i}", state="running",
                           rss_bytes=GIB + i, vram_bytes=None, epoch=2, epochs=4, step=5,
                           steps=10, started=10.0)
                 for i in range(JOBS_MAX + 30))
    m = scrape(held(jobs=jobs))
    ram = m["headroom_job_memory_bytes"]
    assert len(ram) == JOBS_MAX  # no vram series: the job has no GPU memory reading
    assert {s.labels["kind"] for s in ram} == {"ram"}
    first = [s for s in ram if s.labels["job"] == "j0"][0]
    assert first.value == GIB and len(first.labels["name"]) == LABEL_MAX
    assert "\n" not in first.labels["name"] and "\x1b" not in first.labels["name"]
    assert first.labels["name"].startswith('x"} 1\\nheadroom_info')
    assert values(m["headroom_info"]) == [1]  # nothing injected a second one
    assert values(m["headroom_job_progress_ratio"], job="j3") == [0.375]  # epoch 2 of 4, 5/10
    assert values(m["headroom_job_state"], job="j3", state="running") == [1]
    assert len(m["headroom_job_state"]) == JOBS_MAX


def test_before_the_first_reading_nothing_is_served() -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(HeldCollector(lambda: None))
    assert generate_latest(registry) == b""


def test_action_tally_counts_what_was_done_not_a_dry_run() -> None:
    tally = ActionTally()
    tally.note("guard_pause", {"cause": "mem"})
    tally.note("guard_pause", {"dry_run": True})
    tally.note("guard_warn", None)
    tally.note("job_paused", {})
    assert tally.counts() == {"pause": 1, "warn": 1}


# -- the service, in this process --------------------------------------------------------------


def service(flag: Optional[str], **values: Any) -> MetricsService:
    config = cfg.from_mapping({"metrics": values} if values else {})
    svc = MetricsService(lambda: config, flag)
    svc.start(started=1.0)
    return svc


def test_a_port_in_use_is_one_line_and_the_status_says_so(
        caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with caplog.at_level(logging.INFO, "headroom.engine"):
            svc = service(str(port))
    state = svc.state_json()
    assert state["listen"] is None and "in use" in state["error"]
    lines = [r.getMessage() for r in caplog.records]
    assert len([ln for ln in lines if "cannot serve" in ln]) == 1, lines
    svc.close()


@pytest.mark.parametrize("flag,why", [("192.0.2.1:9", "assign"),
                                      ("no-such-host.invalid:9", "")])
def test_an_address_this_machine_does_not_have(flag: str, why: str) -> None:
    svc = service(flag)
    state = svc.state_json()
    assert state["listen"] is None and flag in state["error"] and why in state["error"]


def test_a_missing_tls_file_or_half_a_pair_keeps_it_off(tmp_path: Any) -> None:
    port = free_port()
    svc = service(str(port), tls_cert=str(tmp_path / "none.pem"),
                  tls_key=str(tmp_path / "none.key"))
    assert svc.state_json()["listen"] is None and "No such file" in svc.state_json()["error"]
    half = service(str(port), tls_cert=str(tmp_path / "none.pem"))
    assert "tls_key" in half.state_json()["error"]
    with socket.socket() as s:  # neither fell back to plain HTTP
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_a_wide_address_warns_and_serves_until_closed(caplog: pytest.LogCaptureFixture) -> None:
    port = free_port("0.0.0.0")
    with caplog.at_level(logging.INFO, "headroom.engine"):
        svc = service(f"0.0.0.0:{port}")
    try:
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "other machines" in warnings[0], warnings
        assert "without TLS" in warnings[0]
        assert svc.state_json() == {"listen": f"0.0.0.0:{port}", "tls": False, "error": None}
        snap = Snapshot(1.0, memory(), (), GpuStatus("none"))
        assert svc.serving()
        svc.publish(snap, {"state": "ok", "mode": "act"}, [])
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            assert b"headroom_memory_available_bytes 9.663676416e+09" in r.read()
    finally:
        svc.close()
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_a_bad_address_handed_to_the_engine_is_its_error_not_a_crash() -> None:
    svc = service("not an address")
    state = svc.state_json()
    assert state["listen"] is None and "not an address" in state["error"]


def test_a_job_that_does_not_answer_reads_0_and_one_that_does_1() -> None:
    jobs = (JobRecord(id="a", name="fine", state="running"),
            JobRecord(id="b", name="cut", state="paused", answering=False),
            JobRecord(id="c", name="done", state="finished", answering=False))
    m = scrape(held(jobs=jobs))
    assert values(m["headroom_job_answering"], job="a") == [1]
    assert values(m["headroom_job_answering"], job="b") == [0]
    assert values(m["headroom_job_answering"], job="c") == []  # an ended job drops out


def test_what_guards_a_job_is_an_info_series() -> None:
    jobs = (JobRecord(id="a", name="wide", state="running", protection="kernel brake (cgroup v1)"),
            JobRecord(id="b", name="plain", state="running",
                      protection="none: the guard only (no cgroups on this system)"),
            JobRecord(id="c", name="older", state="running"))
    m = scrape(held(jobs=jobs))
    assert values(m["headroom_job_protection_info"], job="a", protection="brake-v1") == [1]
    assert values(m["headroom_job_protection_info"], job="b", protection="guard") == [1]
    assert values(m["headroom_job_protection_info"], job="c") == []
