"""The Machines window against a real Prometheus scraping two real engines (two state folders,
two exporter ports: two machines) and a port with no engine: each machine shows the values its
own ``headroom status --json`` gives, a job that ends leaves the window, and the shipped rules
evaluate on what the engines serve."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, Iterator, List
from unittest import mock

import pytest

from tests.conftest import REPO, EngineProcess, end_processes_of, run_cli
from tests.integration.test_prometheus_files import DASHBOARD, dashboard_exprs, metric_names
from tests.prometheus_server import PrometheusServer, free_port
from trayapp.config import get_paths
from trayapp.ui.machines import MachinesWindow
from trayapp.ui.machines_query import Machine

pytestmark = pytest.mark.qt_log_ignore(r"This plugin does not support propagateSizeHints")
TICKER = str(REPO / "tests" / "scripts" / "jobs" / "ticker.py")
RULES = REPO / "resources" / "prometheus" / "headroom.rules.yml"


class Fleet:
    """Two engines (A with simulated GPUs and a running job, B without GPUs) and Prometheus."""

    def __init__(self, homes: List[Path], instances: List[str], engines: List[EngineProcess],
                 prom: PrometheusServer, job_id: str, dead: str):
        self.homes, self.instances, self.engines = homes, instances, engines
        self.prom, self.job_id, self.dead = prom, job_id, dead

    def status(self, i: int) -> Dict[str, Any]:
        done = run_cli("status", "--json", env={"HEADROOM_HOME": str(self.homes[i])})
        assert done.returncode == 0, done.stderr
        status: Dict[str, Any] = json.loads(done.stdout)
        return status


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    homes, instances, engines = [], [], []
    try:
        for demo in (True, False):
            home = tmp_path_factory.mktemp("machine")
            with mock.patch.dict(os.environ, {"HEADROOM_HOME": str(home)}):
                paths = get_paths()
            port = free_port()
            paths.config_file.write_text(f'[metrics]\nlisten = "127.0.0.1:{port}"\n')
            homes.append(home)
            instances.append(f"127.0.0.1:{port}")
            engines.append(EngineProcess(paths, demo=demo))
        for e in engines:
            e.wait_ready()
        with engines[0].client() as c:
            job_id = c.job_start({"script": TICKER, "args": ["0", "0.2"], "name": "ticker"}).id
        dead = f"127.0.0.1:{free_port()}"
        with PrometheusServer([*instances, dead], rule_files=[RULES]) as prom:
            prom.wait_for("up", lambda r: len(r) == 3)
            yield Fleet(homes, instances, engines, prom, job_id, dead)
    finally:
        for e in engines:
            e.stop()
        for h in homes:
            end_processes_of(h)


def shown(w: MachinesWindow) -> Dict[str, Machine]:
    return {m.instance: m for m in (w.fleet.machines if w.fleet else ())}


def wait_for_fleet(qtbot: Any, w: MachinesWindow, fleet: Fleet, with_job: bool) -> None:
    def ready() -> bool:
        machines = shown(w)
        if sorted(machines) != sorted([*fleet.instances, fleet.dead]):
            return False
        machines.pop(fleet.dead)
        a = machines[fleet.instances[0]]
        has_job = any(j.id == fleet.job_id and j.ram_bytes for j in a.jobs)
        return all(m.ram_available_bytes for m in machines.values()) and has_job == with_job

    qtbot.waitUntil(ready, timeout=30000)


def test_both_machines_show_what_their_engines_say(qtbot: Any, fleet: Fleet) -> None:
    w = MachinesWindow(None)
    qtbot.addWidget(w)
    w.configure(fleet.prom.url, 1)
    w.show()
    wait_for_fleet(qtbot, w, fleet, with_job=True)
    machines = shown(w)
    for i, instance in enumerate(fleet.instances):
        m, status = machines[instance], fleet.status(i)
        memory = status["memory"]
        assert m.up is True
        assert m.ram_total_bytes == memory["total_bytes"]
        # Scraped within a second or two of the status: the same machine's memory, nearly.
        assert abs((m.ram_available_bytes or 0) - memory["available_bytes"]) < \
            0.05 * memory["total_bytes"]
        assert m.guard == status["guard"]["state"]
        assert [(g.index, g.name, g.total_bytes) for g in m.gpus] == \
            [(str(g["index"]), g["name"], g["memory_total_bytes"]) for g in status["gpus"]]
        live = [(j["id"], j["name"], j["state"]) for j in status["jobs"]
                if j["state"] == "running"]
        assert [(j.id, j.name, j.state) for j in m.jobs] == live
    a, b = machines[fleet.instances[0]], machines[fleet.instances[1]]
    assert len(a.gpus) == 2 and b.gpus == []
    job = next(j for j in a.jobs if j.id == fleet.job_id)
    rss = next(j["rss_bytes"] for j in fleet.status(0)["jobs"] if j["id"] == fleet.job_id)
    assert job.ram_bytes and abs(job.ram_bytes - rss) < max(rss, 1) * 0.5
    assert job.progress_ratio is None  # a plain script reports no training progress
    assert machines[fleet.dead].up is False
    rows = w.rows()
    assert w.status_label.text().startswith("3 machines, 1 not answering, from Prometheus at ")
    assert any("ticker (job " in r[0] and r[3] == "running" for r in rows)
    assert [r[2] for r in rows if not r[0].startswith("  ")].count("no GPU") == 1

    # The job ends: it leaves the exporter, Prometheus and then the window.
    with fleet.engines[0].client() as c:
        c.job_action(fleet.job_id, "stop")
    wait_for_fleet(qtbot, w, fleet, with_job=False)
    assert not any("ticker (job " in r[0] for r in w.rows())


def test_the_rules_evaluate_on_what_the_engines_serve(fleet: Fleet) -> None:
    """The recording rules give one value per machine and the engine-down alert is pending
    for the port with no engine (its ``for:`` is minutes): the rules' names and labels match
    the exporter's, not only their syntax."""
    prom = fleet.prom
    ratios = prom.wait_for("instance:headroom_memory_available:ratio",
                           lambda r: len(r) == 2, timeout=30)
    assert all(0 < float(s["value"][1]) <= 1 for s in ratios)
    levels = prom.wait_for("instance:headroom_guard_level:max", lambda r: len(r) == 2)
    for s in levels:
        i = fleet.instances.index(s["metric"]["instance"])
        state = fleet.status(i)["guard"]["state"]
        assert float(s["value"][1]) == ["ok", "warn", "pause", "park"].index(state)
    gpus = prom.wait_for("instance:headroom_gpu_memory_used:ratio", lambda r: len(r) == 1)
    assert gpus[0]["metric"]["instance"] == fleet.instances[0]
    down = prom.wait_for('ALERTS{alertname="HeadroomEngineDown"}', lambda r: len(r) == 1)
    assert down[0]["metric"]["instance"] == fleet.dead
    assert down[0]["metric"]["alertstate"] == "pending"


def test_the_dashboard_queries_run_on_what_the_engines_serve(fleet: Fleet) -> None:
    """Every query of the Grafana dashboard, with its variables filled in as Grafana does,
    parses in the real Prometheus; those about memory, GPUs and the guard give data."""
    exprs = dashboard_exprs(json.loads(DASHBOARD.read_text()))
    may_be_empty = ("headroom_job_", "headroom_guard_seconds_to_exhaustion")
    for expr in exprs:
        if expr.startswith("label_values("):
            continue
        query = expr.replace("$instance", ".+").replace("$__rate_interval", "1m")
        if any(name.startswith(may_be_empty) for name in metric_names(expr)):
            fleet.prom.query(query)  # raises on a query Prometheus refuses
        else:
            # Data, once enough scrapes are in for a rate (a loaded machine scrapes late).
            assert fleet.prom.wait_for(query, timeout=30), expr
