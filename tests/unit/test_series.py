"""The history's series: one definition for the engine (its readings) and the dashboard (the
status's JSON of them), the VRAM of each GPU split into the guard's jobs and the rest."""

from __future__ import annotations

from trayapp import series
from trayapp.engine.service import sample_values
from trayapp.jobs.record import JobRecord
from trayapp.readings import GpuProcess, GpuReading, GpuStatus, MemoryReading, Snapshot

GiB = 1024**3


def snapshot() -> Snapshot:
    memory = MemoryReading(time=5.0, total_bytes=16 * GiB, available_bytes=10 * GiB,
                           used_bytes=6 * GiB, swap_total_bytes=2 * GiB, swap_used_bytes=0,
                           psi_some_avg10=1.5, psi_full_avg10=None)
    gpu = GpuReading(index=1, name="GPU", uuid=None, memory_total_bytes=12 * GiB,
                     memory_used_bytes=7 * GiB, memory_free_bytes=5 * GiB,
                     utilization_percent=90.0, temperature_c=70.0, power_watts=None,
                     processes=(GpuProcess(41, "python", 3 * GiB), GpuProcess(42, "python", GiB),
                                GpuProcess(50, "Xorg", GiB, "graphics"),
                                GpuProcess(43, "python", None)))
    return Snapshot(time=5.0, memory=memory, gpus=(gpu,), gpu_status=GpuStatus("nvml"))


JOBS = [{"id": "a1", "pid": 41, "pids": [41, 42, 43], "rss_bytes": 2 * GiB, "vram_bytes": 4 * GiB},
        {"id": "b2", "pid": 60, "pids": [], "rss_bytes": None, "vram_bytes": None}]


def test_a_sample_as_named_series() -> None:
    values = sample_values(snapshot(), JOBS)
    assert values == {
        "mem.total": 16 * GiB, "mem.available": 10 * GiB, "mem.used": 6 * GiB,
        "swap.total": 2 * GiB, "swap.used": 0, "psi.some": 1.5, "psi.full": None,
        "job.a1.rss": 2 * GiB, "job.a1.vram": 4 * GiB,
        "gpu1.total": 12 * GiB, "gpu1.used": 7 * GiB, "gpu1.util": 90.0, "gpu1.temp": 70.0,
        "gpu1.power": None,
        # The job's tree (41 and 42; 43 reports no use), and everything else on the GPU.
        "gpu1.job.a1": 4 * GiB, "gpu1.other": 3 * GiB,
    }


def test_the_status_json_and_job_records_give_the_same_series() -> None:
    snap = snapshot()
    status = snap.to_json()
    records = [JobRecord.from_json(j) for j in JOBS]
    assert series.sample_values(status["memory"], status["gpus"], records) == \
        sample_values(snap, JOBS)


def test_vram_layers_without_a_reading_of_the_use() -> None:
    gpu = {"index": 0, "memory_used_bytes": None,
           "processes": [{"pid": 7, "used_memory_bytes": GiB}]}
    assert series.vram_layers(gpu, {7: "j"}) == {"job.j": GiB}  # no "other" without a total
    assert series.vram_layers({"memory_used_bytes": GiB}, {}) == {"other": GiB}
    assert series.layer_job("job.j") == "j" and series.layer_job(series.OTHER) is None
    assert series.gpu_series(0, series.job_layer("j")) == "gpu0.job.j"
