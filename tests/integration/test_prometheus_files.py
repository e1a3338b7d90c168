"""The Prometheus rules, the scrape example and the Grafana dashboard that ship in resources/:
promtool accepts them (and refuses a broken copy), the alerts fire as their unit tests say, and
every metric they name is one the exporter serves."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path
from typing import Any, Iterator, List, Set
from unittest import mock

import pytest

from tests.conftest import REPO, EngineProcess, end_processes_of, wait_for
from tests.prometheus_server import free_port
from trayapp.config import get_paths

PROMETHEUS = REPO / "resources" / "prometheus"
RULES = PROMETHEUS / "headroom.rules.yml"
RULE_TESTS = PROMETHEUS / "headroom.rules.test.yml"
SCRAPE = PROMETHEUS / "scrape-example.yml"
DASHBOARD = REPO / "resources" / "grafana" / "headroom.json"

# A name in an expression: a metric, a recording rule (with colons), a function or a keyword.
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_LABELS = re.compile(r"\{[^{}]*\}")


def promtool() -> str:
    found = shutil.which("promtool") or ("/usr/bin/promtool"
                                         if Path("/usr/bin/promtool").exists() else None)
    if found is None:
        pytest.fail("promtool is missing: install Debian's prometheus package "
                    "(scripts/setup.sh test)")
    return found


def run_promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=60)


def metric_names(expr: str) -> Set[str]:
    """The headroom_ metric names an expression reads (not recording rules, labels or strings)."""
    bare = _LABELS.sub("", _STRING.sub('""', expr))
    return {n for n in _NAME.findall(bare) if n.startswith("headroom_") and ":" not in n}


def dashboard_exprs(node: Any) -> List[str]:
    """Every PromQL expression in a dashboard: targets' ``expr`` and template queries."""
    out: List[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("expr", "definition") and isinstance(value, str):
                out.append(value)
            elif key == "query" and isinstance(value, dict) and isinstance(value.get("query"),
                                                                             str):
                out.append(value["query"])
            else:
                out += dashboard_exprs(value)
    elif isinstance(node, list):
        for item in node:
            out += dashboard_exprs(item)
    return out


def rule_exprs() -> List[str]:
    text = RULES.read_text()
    # The rules file is YAML; its expressions are the `expr:` values (one line or folded).
    exprs, current = [], None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("expr:"):
            current = [stripped[len("expr:"):].strip().lstrip(">").strip()]
            exprs.append(current)
            indent = len(line) - len(line.lstrip())
            continue
        if current is not None and stripped and len(line) - len(line.lstrip()) > indent:
            current.append(stripped)
        else:
            current = None
    return [" ".join(parts) for parts in exprs]


def served_names(metrics_text: str) -> Set[str]:
    """The sample names in an exporter's /metrics page."""
    from prometheus_client.parser import text_string_to_metric_families

    names: Set[str] = set()
    for family in text_string_to_metric_families(metrics_text):
        names.add(family.name)
        if family.type == "counter":  # the parser names a counter's family without _total
            names.add(family.name + "_total")
        names.update(s.name for s in family.samples)
    return names


# -- promtool ---------------------------------------------------------------------------------


def test_the_rules_pass_promtool_and_a_broken_copy_does_not(tmp_path: Path) -> None:
    ok = run_promtool("check", "rules", str(RULES))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "SUCCESS" in ok.stdout
    broken = tmp_path / "broken.rules.yml"
    broken.write_text(RULES.read_text().replace(
        "instance:headroom_memory_available:ratio < 0.10",
        "instance:headroom_memory_available:ratio < < 0.10"))
    bad = run_promtool("check", "rules", str(broken))
    assert bad.returncode != 0
    assert "HeadroomMemoryLow" in bad.stdout + bad.stderr or "parse" in bad.stdout + bad.stderr


def test_the_alerts_fire_as_their_unit_tests_say(tmp_path: Path) -> None:
    """promtool evaluates the rules on the series of headroom.rules.test.yml: low memory, an
    engine down, a guard holding, a job held, each after its ``for:`` and not before."""
    ok = run_promtool("test", "rules", str(RULE_TESTS))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # The same tests against rules that wait longer fail: the test checks the durations.
    for name in ("headroom.rules.yml", "headroom.rules.test.yml"):
        shutil.copy(PROMETHEUS / name, tmp_path / name)
    slower = tmp_path / "headroom.rules.yml"
    slower.write_text(slower.read_text().replace("for: 10m", "for: 20m"))
    bad = run_promtool("test", "rules", str(tmp_path / "headroom.rules.test.yml"))
    assert bad.returncode != 0
    assert "HeadroomGuardHolding" in bad.stdout + bad.stderr


def test_the_scrape_example_passes_promtool_and_a_broken_copy_does_not(tmp_path: Path) -> None:
    ok = run_promtool("check", "config", str(SCRAPE))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "1 rule files found" in ok.stdout
    shutil.copy(RULES, tmp_path / RULES.name)
    broken = tmp_path / "prometheus.yml"
    broken.write_text(SCRAPE.read_text().replace("scrape_interval: 5s", "scrape_interval: 5 s"))
    bad = run_promtool("check", "config", str(broken))
    assert bad.returncode != 0


# -- the dashboard ----------------------------------------------------------------------------


def test_the_dashboard_is_a_dashboard_with_a_machine_selector() -> None:
    d = json.loads(DASHBOARD.read_text())
    assert isinstance(d["schemaVersion"], int) and d["schemaVersion"] >= 36
    assert d["title"] and d["uid"]
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["instance"]["type"] == "query"
    assert "instance" in variables["instance"]["query"]["query"]
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    graphs = [p for p in d["panels"] if p["type"] != "row"]
    titles = {p["title"] for p in graphs}
    assert {"RAM available", "VRAM used", "Guard state", "Guard actions", "Job progress",
            "Job memory"} <= titles
    for p in graphs:
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["expr"] and t["refId"], p["title"]
            # Every panel follows the machine selector.
            assert '$instance' in t["expr"], p["title"]
        grid = p["gridPos"]
        assert grid["x"] + grid["w"] <= 24


def test_the_name_finder_finds_names_and_skips_the_rest() -> None:
    assert metric_names('sum by (instance) (rate(headroom_guard_actions_total{action="pause",'
                        ' x="headroom_fake"}[5m])) / instance:headroom_other:ratio') == \
        {"headroom_guard_actions_total"}
    assert len(rule_exprs()) >= 8
    assert len(dashboard_exprs(json.loads(DASHBOARD.read_text()))) >= 15


# The names the issue and the exporter's interface promise (checked against what it serves).
PROMISED = {
    "headroom_info", "headroom_gpu_count", "headroom_memory_total_bytes",
    "headroom_memory_available_bytes", "headroom_swap_used_bytes",
    "headroom_memory_pressure_full_ratio", "headroom_gpu_memory_total_bytes",
    "headroom_gpu_memory_used_bytes", "headroom_gpu_utilization_ratio", "headroom_guard_state",
    "headroom_guard_seconds_to_exhaustion", "headroom_guard_actions_total",
    "headroom_job_memory_bytes", "headroom_job_state", "headroom_job_progress_ratio",
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Set[str]]:
    """The metric names a real engine's exporter serves (it declares every family, jobs' and
    GPUs' included, even while it has no sample for one)."""
    home = tmp_path_factory.mktemp("exporter-home")
    with mock.patch.dict(os.environ, {"HEADROOM_HOME": str(home)}):
        paths = get_paths()
    port = free_port()
    paths.config_file.write_text(f'[metrics]\nlisten = "127.0.0.1:{port}"\n')
    engine = EngineProcess(paths, demo=True).wait_ready()

    def page() -> str:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                return str(r.read().decode())
        except OSError:
            return ""

    try:
        text = wait_for(page, 30, "the exporter's /metrics page")
    finally:
        engine.stop()
        end_processes_of(home)
    yield served_names(text)


def test_the_exporter_serves_what_it_promises(served: Set[str]) -> None:
    assert not PROMISED - served, sorted(PROMISED - served)


def test_every_metric_the_dashboard_and_the_rules_use_is_served(served: Set[str]) -> None:
    used = set()
    for expr in dashboard_exprs(json.loads(DASHBOARD.read_text())) + rule_exprs():
        used |= metric_names(expr)
    assert len(used) >= 12
    missing = sorted(used - served)
    assert not missing, f"not served by the exporter: {missing}"
    # The test can fail: a made-up name is caught.
    assert metric_names("headroom_memory_free_bytes") - served
