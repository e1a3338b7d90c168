"""The series by process name: RAM consumers and a GPU's processes outside the guard's jobs,
kept in the engine's memory; and the scan of RAM consumers, at most once per interval."""

from __future__ import annotations

from typing import Any, List

from trayapp import series
from trayapp.engine.history import ConsumerScan
from trayapp.readings import Consumer, GpuProcess, GpuReading

GiB = 1024**3


def gpu(processes: Any) -> GpuReading:
    return GpuReading(index=1, name="GPU", uuid=None, memory_total_bytes=12 * GiB,
                      memory_used_bytes=7 * GiB, memory_free_bytes=5 * GiB,
                      utilization_percent=None, temperature_c=None, power_watts=None,
                      processes=tuple(processes))


def test_names_outside_the_jobs() -> None:
    g = gpu([GpuProcess(41, "python", 3 * GiB), GpuProcess(50, "Xorg", GiB, "graphics"),
             GpuProcess(51, "Xorg", GiB, "graphics"), GpuProcess(60, "python", GiB)])
    jobs = [{"id": "a1", "pid": 41, "pids": [41]}]
    values = series.process_values([g], jobs, [Consumer("firefox", 5 * GiB, 12)])
    # The job's python is the job's; the other python and the two Xorg by name.
    assert values == {"ram.proc.firefox": 5 * GiB, "gpu1.proc.Xorg": 2 * GiB,
                      "gpu1.proc.python": GiB}
    # The status's JSON gives the same.
    as_json = series.process_values([g.to_json()], jobs, [Consumer("firefox", 5 * GiB, 12)
                                                          .to_json()])
    assert as_json == values
    assert all(series.memory_only(n) for n in values)
    assert not any(series.memory_only(n) for n in ("mem.used", "gpu1.other", "gpu1.job.a1",
                                                   "job.a1.rss"))


def test_a_driver_that_tells_no_process_memory() -> None:
    g = gpu([GpuProcess(50, "Xorg", None), GpuProcess(60, "python", None)])
    assert series.process_values([g], []) == {}
    assert series.per_process_unknown(g) and not series.per_process_unknown(
        gpu([GpuProcess(50, "Xorg", GiB)]))


def test_the_scan_runs_at_most_once_per_interval() -> None:
    calls: List[Any] = []

    def scan(skip: Any, limit: int, min_bytes: int) -> List[Consumer]:
        calls.append(set(skip))
        return [Consumer("x", len(calls), 1)]

    s = ConsumerScan(scan, interval=5.0)
    assert s.update(100.0, {1})[0].rss_bytes == 1
    assert s.update(104.9, {1})[0].rss_bytes == 1  # the last scan's
    assert s.update(105.0, {2})[0].rss_bytes == 2 and calls[-1] == {2}
    assert s.update(90.0, ())[0].rss_bytes == 3  # the clock went back: read again
    assert s.latest[0].rss_bytes == 3
