"""What uses the memory: RAM and each GPU's memory stacked by consumer, the guard's jobs as
their own areas and the other processes by name, from statuses and from a real engine."""

from __future__ import annotations

import copy
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest
from PySide6.QtCore import QSettings

from tests.conftest import REPO
from tests.ui.statuses import GiB, job, make_status, status_json
from trayapp.engine.client import EngineClient
from trayapp.engine.status_record import Status
from trayapp.ui.dashboard import Dashboard
from trayapp.ui.dashboard_stack import REST

pytestmark = pytest.mark.qt_log_ignore(
    r"This plugin does not support (propagateSizeHints|raise)\(\)",
    r"No such signal QPlatformNativeInterface::systemTrayWindowChanged")

T0 = 1796050000.0
MiB = 1 << 20
TICKER = str(REPO / "tests" / "scripts" / "jobs" / "ticker.py")


def dashboard(qtbot: Any, tmp_path: Path) -> Dashboard:
    d = Dashboard(QSettings(str(tmp_path / "ui.ini"), QSettings.Format.IniFormat))
    qtbot.addWidget(d)
    d.show()
    return d


def status_with(consumers: List[Dict[str, Any]], **kw: Any) -> Status:
    return make_status(**kw, consumers=consumers)


def layers(d: Dashboard, key: Any) -> Dict[str, Any]:
    return {la.label: la for la in d._stacks[key].layers}


def top_of(layer: Any) -> float:
    return float(layer.item.getData()[1][-1])


def test_a_job_and_foreign_processes_are_their_own_areas(qtbot, tmp_path: Path) -> None:
    d = dashboard(qtbot, tmp_path)
    consumers = [{"name": "firefox", "rss_bytes": 5 * GiB, "processes": 12},
                 {"name": "code", "rss_bytes": GiB * 3 // 2, "processes": 4}]
    # 16 GiB, 12 used: the job 3 GiB, firefox 5, code 1.5, the rest 2.5.
    for k in range(5):
        d.apply_snapshot(status_with(consumers, t=T0 + k, available=4 * GiB, jobs=[job()]))
    ram = layers(d, "ram")
    assert list(ram) == ["mnist (job j1)", "code", "firefox", "other", "available"]
    assert ram["mnist (job j1)"].job and not ram["firefox"].job
    # Stacked: each area's top edge is the sum up to it; the whole stack is the RAM used, and
    # what is available fills the rest up to the limit.
    assert [top_of(la) for la in ram.values()] == pytest.approx([3, 4.5, 9.5, 12, 16])
    title = d.ram_plot.titleLabel.text
    assert "mnist (job j1)" in title and "firefox" in title and "available" in title
    # The GPU: the job's process, the desktop's Xorg by name, and what no process accounts for.
    gpu = layers(d, 0)
    assert list(gpu) == ["mnist (job j1)", "Xorg", "other"]
    assert [top_of(la) for la in gpu.values()] == pytest.approx([4, 5, 6])
    text = d.show_values_at(T0 + 4)
    assert "mnist (job j1) 3.00 GiB (19%) · firefox 5.00 GiB (31%) · other 2.50 GiB (16%) · " \
           "code 1.50 GiB (9%) · available 4.00 GiB" in text
    assert "GPU 0 mnist (job j1) 4.00 GiB (33%) · Xorg 1.00 GiB (8%)" in text
    # A name that leaves the top few leaves the stack; its memory goes back to "other".
    d.apply_snapshot(status_with(consumers[:1], t=T0 + 6, available=4 * GiB, jobs=[job()]))
    d.apply_snapshot(status_with(consumers[:1], t=T0 + 7, available=4 * GiB, jobs=[job()]))
    ram = layers(d, "ram")
    assert "code" in ram  # its past is still drawn
    assert top_of(ram["code"]) == pytest.approx(3) and top_of(ram["firefox"]) == pytest.approx(8)
    assert top_of(ram["other"]) == pytest.approx(12)


def test_shared_pages_do_not_lift_the_stack_above_the_memory_used(qtbot, tmp_path) -> None:
    d = dashboard(qtbot, tmp_path)
    consumers = [{"name": "chrome", "rss_bytes": 20 * GiB, "processes": 40}]
    d.apply_snapshot(status_with(consumers, t=T0, available=4 * GiB, jobs=[job()]))
    ram = layers(d, "ram")
    assert top_of(ram["mnist (job j1)"]) == pytest.approx(3)
    assert top_of(ram["chrome"]) == pytest.approx(12) and top_of(ram["other"]) == pytest.approx(12)


def test_a_driver_without_memory_per_process_is_said_on_the_chart(qtbot, tmp_path) -> None:
    d = dashboard(qtbot, tmp_path)
    st = status_json(t=T0, jobs=[job()], consumers=[])
    for proc in st["gpus"][0]["processes"]:
        proc["used_memory_bytes"] = None  # Windows WDDM: NVML tells no process's memory
    st["gpus"][0]["simulated"] = False
    st2 = copy.deepcopy(st)
    st2["time"] = T0 + 1
    d.apply_snapshot(Status.from_json(st))
    d.apply_snapshot(Status.from_json(st2))
    title = d.vram_plots[0].titleLabel.text
    assert "does not report memory per process (Windows WDDM)" in title
    assert "simulated" not in title
    # The GPU's use is still there, as one area.
    assert list(layers(d, 0)) == ["other"] and top_of(layers(d, 0)["other"]) == pytest.approx(6)
    # A driver that tells it: the note goes.
    d.apply_snapshot(make_status(t=T0 + 2, jobs=[job()]))
    assert "WDDM" not in d.vram_plots[0].titleLabel.text


def test_a_real_engine_serves_ram_by_process_to_the_dashboard(qtbot, demo_engine, app_on,
                                                              paths) -> None:
    with EngineClient(paths) as c:
        job_id = c.job_start({"script": TICKER, "args": ["0", "0.2"], "name": "ticker"}).id
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                st = c.status()
                if st.consumers and any(j.id == job_id and j.rss_bytes for j in st.jobs):
                    break
                time.sleep(0.2)
            names = [x.name for x in st.consumers]
            assert names and len(names) <= 4
            assert all(x.rss_bytes >= 32 * MiB for x in st.consumers)
            time.sleep(1.2)
            # From before the engine started: the store answers, with the per-name series from
            # the engine's memory added.
            h = c.history(time.time() - 600, prefix=["ram.proc.", "job."])
            assert f"job.{job_id}.rss" in h.series
            assert any(n.startswith("ram.proc.") for n in h.series)
            app = app_on(tray_available=True)
            app.start()
            d = app.open_window("dashboard")
            qtbot.waitUntil(lambda: d.history_loads >= 1 and d.updates >= 2, timeout=20000)
            label = f"ticker (job {job_id[:4]})"  # the job's name and short id
            qtbot.waitUntil(lambda: label in layers(d, "ram"), timeout=10000)
            ram = layers(d, "ram")
            assert set(names) & set(ram), (names, list(ram))
            assert ram[label].job and np.isfinite(top_of(ram[list(ram)[-1]]))
            assert list(ram)[-2:] == ["other", "available"]
            assert d._stacks["ram"].layers[-2].key == REST
            # The simulated desktop on GPU 0, by name.
            qtbot.waitUntil(lambda: {"Xorg", "gnome-shell"} <= set(layers(d, 0)), timeout=10000)
        finally:
            c.job_action(job_id, "stop")


def test_ram_by_name_reads_a_real_process() -> None:
    if not sys.platform.startswith("linux"):
        pytest.skip("names a process with prctl")
    from trayapp.probes.consumers import ram_by_name
    code = ("import ctypes, sys, time; ctypes.CDLL(None).prctl(15, b'hr-hog-test', 0, 0, 0); "
            "b = bytearray(200 << 20); b[::4096] = b'x' * len(b[::4096]); "
            "print('ready', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        found = {c.name: c for c in ram_by_name(limit=10_000)}
        assert found["hr-hog-test"].rss_bytes >= 200 * MiB
        assert found["hr-hog-test"].processes == 1
        # The jobs' pids are left out (they are drawn as the jobs).
        assert "hr-hog-test" not in {c.name for c in ram_by_name(skip={proc.pid}, limit=10_000)}
        # Largest first, at most ``limit``, none under ``min_bytes``.
        top = ram_by_name(limit=3, min_bytes=MiB)
        assert len(top) <= 3 and [c.rss_bytes for c in top] == sorted(
            (c.rss_bytes for c in top), reverse=True)
        assert all(c.rss_bytes >= MiB for c in top)
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
